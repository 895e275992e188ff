"""Where a run came from, for ``results.json``'s ``provenance``: the versions of what it ran on,
the git state of the project and of the pipeline's folder, the driver's machine, the command
line, and the env seed of every explorer stream. Nothing here fails a run: what cannot be read
is None."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np

#: distributions whose versions every run records (the env's own package is added)
DISTRIBUTIONS = ("tianji-dask", "torch", "gymnasium", "numpy", "dask", "distributed")
GIT_TIMEOUT_S = 5.0


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions(env: dict) -> dict[str, str | None]:
    """Python's version and each distribution's, keyed by distribution (``tianji-dask`` as
    ``tianji_dask``), with the packages the env comes from (``ale-py``, ``mujoco``, ...)."""
    from tianji_dask.config.extras import OPTIONAL, env_modules

    found = {"python": platform.python_version()}
    for dist in DISTRIBUTIONS:
        found[dist.replace("-", "_") if dist == "tianji-dask" else dist] = _version(dist)
    if found["tianji_dask"] is None:  # a source tree on the path, not installed
        import tianji_dask

        found["tianji_dask"] = tianji_dask.__version__
    for module in env_modules(env):
        dist = OPTIONAL[module][0]
        found[dist] = _version(dist)
    return found


def _git(folder: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(folder: str | os.PathLike | None, *, top: bool = False) -> dict | None:
    """``{"sha", "dirty"}`` of the git checkout ``folder`` is in (dirty: tracked files changed);
    None where it is none, or there is no ``git``. ``top``: only where ``folder`` is the
    checkout's top (an installed package inside some other project's checkout is not one)."""
    if folder is None or shutil.which("git") is None or not Path(folder).is_dir():
        return None
    folder = Path(folder).resolve()
    root = _git(folder, "rev-parse", "--show-toplevel")
    if root is None or (top and Path(root).resolve() != folder):
        return None
    sha, status = _git(folder, "rev-parse", "HEAD"), _git(folder, "status", "--porcelain", "--untracked-files=no")
    return None if sha is None else {"sha": sha, "dirty": None if status is None else bool(status)}


def machine() -> dict:
    """The driver's machine: logical and physical cores, memory, its first GPU's model (None
    without one), the OS."""
    import psutil
    import torch

    gpu = None
    try:
        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - a broken driver is no GPU
        gpu = None
    return {"cores": os.cpu_count(), "physical_cores": psutil.cpu_count(logical=False),
            "memory_bytes": int(psutil.virtual_memory().total), "gpu": gpu, "os": platform.platform()}


def at_start(pipeline, source: str | os.PathLike | None) -> dict:
    """What a run records as it starts: versions, git states, machine and command line.
    ``source``: the pipeline file it was loaded from (None: given as a dict or a Pipeline)."""
    import tianji_dask

    project = Path(tianji_dask.__file__).resolve().parent.parent
    folder = None if source is None else Path(source).resolve().parent
    return {
        "versions": versions(pipeline.env.model_dump()),
        "git": git_state(project, top=True),
        "pipeline_source": None if source is None else {"path": str(Path(source).resolve()), "git": git_state(folder)},
        "machine": machine(),
        "argv": list(sys.argv),
    }


def stream_seeds(pipeline, env_seed: int, finals: list[dict]) -> dict:
    """The env seeds of every explorer stream: as its consumed chunks recorded them (relaxed and
    lockstep modes, one group: each stream's seeds in the order first used; a stream rebuilt on
    another worker has several), or as ``envs.rollout.stream_seed`` gives them in single mode;
    None in group mode, whose learners keep no per-chunk seeds."""
    from tianji_dask.core.exact_replay_log import REPLAY_FIELDS
    from tianji_dask.envs.rollout import stream_seed

    base = pipeline.seed + env_seed
    record = {"run": pipeline.seed, "env_base": base, "streams": None, "from": None}
    replay = finals[0].get("replay_log") if len(finals) == 1 else None
    if replay is not None and len(replay):
        stream, seed = REPLAY_FIELDS.index("stream"), REPLAY_FIELDS.index("env_seed")
        streams: dict[str, list[int]] = {}
        for row in np.asarray(replay):
            seeds = streams.setdefault(str(int(row[stream])), [])
            if int(row[seed]) not in seeds:
                seeds.append(int(row[seed]))
        record.update(streams=dict(sorted(streams.items(), key=lambda kv: int(kv[0]))), **{"from": "chunks"})
    elif pipeline.mode == "single":
        record.update(streams={str(i): [stream_seed(base, i)] for i in range(pipeline.explorers)}, **{"from": "stream_seed"})
    return record
