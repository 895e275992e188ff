"""Full checkpoints of a run, written atomically and read back with ``torch.load(weights_only=True)``.

A checkpoint holds everything a resumed run needs to continue the learning curve where it stopped:
the algorithm's state (networks, optimizer, counters, RNG, optionally the replay), the learner's
version, the ledger (episodes, chunk log, counters), the global RNG states, the elapsed training
time, and the controller's settings. Numpy arrays travel as tensors (``weights_only`` loads only
tensors and plain containers), marked so they come back as numpy.

Dask-free: the learner core writes and restores them, in single mode and in the learner actor alike.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from tianji_dask.core.metrics import atomic_write
from tianji_dask.errors import PipelineError, TianjiError

FORMAT = 1
NAME = re.compile(r"^ckpt-(\d{9})\.pt$")
_ND = "__ndarray__"


class CheckpointError(PipelineError):
    """A missing or unreadable checkpoint; ``str()`` is the one line to show (exit 2 in the CLI)."""


class CheckpointWriteError(TianjiError, OSError):
    """A checkpoint could not be written (a full disk, a folder gone); ``str()`` is one line."""


def _pack(obj):
    if isinstance(obj, np.ndarray):
        # reshaped: ascontiguousarray makes a 0-d array 1-d, and a scalar would come back as [x]
        return {_ND: torch.from_numpy(np.ascontiguousarray(obj).reshape(obj.shape)), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: _pack(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_pack(v) for v in obj] if isinstance(obj, list) else tuple(_pack(v) for v in obj)
    return obj


def _unpack(obj):
    if isinstance(obj, dict):
        if _ND in obj:
            return obj[_ND].numpy().astype(obj["dtype"], copy=False)
        return {k: _unpack(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_unpack(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_unpack(v) for v in obj)
    return obj


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(legacy=False), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save(directory: str | os.PathLike, state: dict, keep: int = 3) -> Path:
    """Write ``ckpt-<version>.pt`` (temp file + rename), then keep only the newest ``keep``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"ckpt-{int(state['version']):09d}.pt"
    tmp = d / f".{path.name}.{os.getpid()}.tmp"
    try:
        torch.save(_pack({**state, "format": FORMAT, "saved_at": time.time()}), tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk: the part written would take what room is left
        raise
    for old in sorted(p for p in d.iterdir() if NAME.match(p.name))[:-keep]:
        old.unlink(missing_ok=True)
    return path


HANDOFF = "handoff.json"


def save_handoff(directory: str | os.PathLike, record: dict) -> None:
    """Write what a learner's handoff left (its checkpoint, version, worker) beside its checkpoints,
    atomically: a driver that asks only after the learner's worker has closed still finds it."""
    atomic_write(Path(directory) / HANDOFF, lambda fh: json.dump(record, fh))


def handoff_left(directory: str | os.PathLike) -> dict | None:
    """The newest handoff record of ``directory``; None when there is none or it does not read."""
    try:
        return json.loads((Path(directory) / HANDOFF).read_text())
    except (OSError, ValueError):
        return None


def latest(directory: str | os.PathLike) -> Path:
    d = Path(directory)
    found = sorted(p for p in d.iterdir() if NAME.match(p.name)) if d.is_dir() else []
    if not found:
        raise CheckpointError(f"run_dir: no checkpoint in {str(d)!r}")
    return found[-1]


def newest_loadable(directory: str | os.PathLike) -> tuple[Path, dict, list[str]]:
    """The newest checkpoint of ``directory`` that loads: (its path, its state, one line for each
    newer one skipped and why). CheckpointError (one line) when there is none, or none loads."""
    d = Path(directory)
    found = sorted((p for p in d.iterdir() if NAME.match(p.name)), reverse=True) if d.is_dir() else []
    if not found:
        raise CheckpointError(f"run_dir: no checkpoint in {str(d)!r}")
    skipped = []
    for path in found:
        try:
            return path, load(path), skipped
        except CheckpointError as err:
            skipped.append(str(err).removeprefix("checkpoint: "))
    raise CheckpointError(f"run_dir: none of the {len(found)} checkpoints in {str(d)!r} loads (newest: {skipped[0]})")


def load(path: str | os.PathLike) -> dict:
    if not Path(path).is_file():
        raise CheckpointError(f"checkpoint: {str(path)!r} not found (no such file)")
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")  # a GPU learner's checkpoint resumes anywhere
    except Exception as err:  # noqa: BLE001 - a truncated or foreign file
        raise CheckpointError(f"checkpoint: {str(path)!r} is damaged or not a tianji checkpoint ({type(err).__name__})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint: {str(path)!r} is not a tianji checkpoint of format {FORMAT}")
    return _unpack(state)


class Checkpointer:
    """When and what to write, for a learner core that owns ``algo`` and ``ledger``.
    ``settings``: a ``CheckpointSettings``; None: never."""

    def __init__(self, settings=None):
        self.settings = settings
        self.last_t = time.time()
        self.last_version = 0
        self.last_path: Path | None = None

    def due(self, version: int) -> bool:
        s = self.settings
        if not s:
            return False
        return bool((s.every_versions and version - self.last_version >= s.every_versions)
                    or (s.every_seconds and time.time() - self.last_t >= s.every_seconds))

    def write(self, algo, version: int, ledger, extra: dict | None = None) -> Path | None:
        s = self.settings
        if not s:
            return None
        algo.include_replay = s.replay_buffer
        state = {"version": version, "algo": algo.state_dict(), "ledger": ledger.state_dict(), "rng": rng_state(),
                 **(extra or {})}
        try:
            self.last_path = save(s.dir, state, keep=s.keep)
        except (OSError, RuntimeError) as err:  # torch.save reports a full disk as a RuntimeError
            kept = "none" if self.last_path is None else str(self.last_path)
            raise CheckpointWriteError(f"checkpoint: cannot write to {str(s.dir)!r} ({_why(err, s.dir)}); "
                                       f"the newest one kept: {kept}") from None
        self.last_t, self.last_version = time.time(), version
        return self.last_path


def _why(err: Exception, directory) -> str:
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    try:
        if shutil.disk_usage(directory).free < 1 << 20:
            return os.strerror(errno.ENOSPC)
    except OSError:
        pass
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def restore(path: str | os.PathLike, algo, ledger, t_run_start: float | None = None) -> dict:
    """Load a checkpoint into ``algo`` and ``ledger``; returns the whole state (version, extras).

    By default the run's clock resumes where the checkpoint left it (a stopped run's pause does
    not count); with ``t_run_start`` it keeps that start, so time lost to a crash counts."""
    state = load(path)
    algo.load_state_dict(state["algo"])
    now = None if t_run_start is None else t_run_start + state["ledger"]["elapsed_s"]
    ledger.load_state_dict(state["ledger"], now=now)
    set_rng_state(state["rng"])
    return state
