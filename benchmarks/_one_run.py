"""One system on one task with one seed, in a fresh process, as one row of ``RUN_FIELDS``: what
``benchmarks/suite.py`` runs for every cell of a suite and every run of ``solve``.

Time-to-solve is measured the same way for every system: every training episode's return and end
time is recorded, episodes are pooled and sorted by end time, and the run is solved at the first
end time at which the mean of the last 100 returns reaches the target. The clock starts when the
system is built (tianji_dask: cluster up and learner built; RLlib: ``build_algo()`` returned; SB3:
the model constructed). "From launch" counts from the moment the harness started the process;
``build_s_from_launch`` puts the learning curve on that clock. A run that fails is kept as an
unsolved row with its error, the paths of this machine taken out of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _episodes import episode_fields, episode_rows, learning_curve, our_episodes, our_throughput
from _report import ROOT
from _systems import OURS, OURS_ON_OLDER_ENVS, OWN_VENV_PEERS, TASKS

PEER_RUNNER = ROOT / "benchmarks" / "peers" / "run_peer.py"
DEFAULT_PEERS_PYTHON = ROOT / ".peers-venv" / "bin" / "python"
#: where ``benchmarks/peers/setup sf|pufferlib|torchrl`` puts the venvs of the peers that have their own
DEFAULT_PEERS_DIR = ROOT / ".peers"
#: the columns of every run in a solve JSON (and what the CI smoke test checks)
RUN_FIELDS = (
    "system", "task", "seed", "solved", "time_to_solve_s", "time_to_solve_from_launch_s", "max_seconds",
    "wall_s", "process_wall_s", "env_steps", "episodes", "final_mean_return", "stop_reason",
    "learner_busy_fraction", "env_steps_per_s", "samples_per_s_consumed", "error", "curve",
)
#: a run that outlives its budget by this much (startup, teardown, one last iteration) is killed
GRACE_S = 240


def portable_error(text: str | None) -> str | None:
    """Error text without this machine's paths (it goes into the JSON and markdown, which get shared)."""
    if not text:
        return text
    return text.replace(str(ROOT), ".").replace(tempfile.gettempdir(), "$TMPDIR").replace(str(Path.home()), "~")


def _run_ours(system: str, task: str, seed: int, max_seconds: float, tmp: Path) -> dict:
    out = tmp / "run"
    if system in OURS_ON_OLDER_ENVS:
        mode, env_ids = OURS_ON_OLDER_ENVS[system]
        if task not in env_ids:
            return {"solved": False, "error": f"{system}: only the tasks {', '.join(env_ids)}, not {task}"}
        env = ["--set", f"env.id={env_ids[task]}"]
    else:
        mode, env = OURS[system], []
    cmd = [sys.executable, "-m", "tianji_dask", "train", task, "--mode", mode, "--seed", str(seed),
           "--max-seconds", str(max_seconds), "--out", str(out), "--quiet", *env]
    t_launch = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max_seconds + GRACE_S, cwd=ROOT)
    t_exit = time.time()
    row = {"t_launch": t_launch, "process_wall_s": t_exit - t_launch}
    results_path = out / "results.json"
    if not results_path.exists():
        return {**row, "solved": False, "error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-2000:]}"}
    r = json.loads(results_path.read_text())
    tts = r["time_to_solve_s"]
    episodes = our_episodes(out, lengths=True)
    return {
        **row,
        "env_id": env[1].split("=", 1)[1] if env else TASKS[task][0],
        "build_s_from_launch": r["t_run_start"] - t_launch,
        "curve": learning_curve([ep[:2] for ep in episodes], r["t_run_start"]),
        "episode_rows": episode_rows(episodes, r["t_run_start"]),
        "episode_fields": episode_fields(episodes),
        "throughput_per_s": our_throughput(out, r["t_run_start"], r["wall_s"]),
        "solved": bool(r["solved"]),
        "time_to_solve_s": tts,
        "time_to_solve_from_launch_s": None if tts is None else r["t_run_start"] + tts - t_launch,
        "time_to_solve_from_process_start_s": r.get("time_to_solve_from_process_start_s"),
        "wall_s": r["wall_s"],
        "env_steps": r["env_steps"],
        "episodes": r["episodes"],
        "final_mean_return": r["final_mean_return"],
        "stop_reason": r["stop_reason"],
        "learner_busy_fraction": r.get("learner_busy_fraction"),
        "explorer_busy_fraction": r.get("explorer_busy_fraction"),
        "env_steps_per_s": r.get("env_steps_per_s"),
        "samples_per_s_consumed": r.get("samples_per_s_consumed"),
        "bytes_per_s": r.get("bytes_per_s"),
        "updates": r.get("updates"),
        "error": r.get("error") or (None if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr[-2000:]}"),
    }


def peer_python(system: str, peers_python: Path, peers_dir: Path | None = None) -> Path:
    """The python that runs ``system``: its own venv's for ``OWN_VENV_PEERS``, else ``peers_python``."""
    if system in OWN_VENV_PEERS:
        return Path(peers_dir or DEFAULT_PEERS_DIR) / system / "bin" / "python"
    return Path(peers_python)


def _run_peer(system: str, task: str, seed: int, max_seconds: float, tmp: Path, peers_python: Path,
              threads: int, peers_dir: Path | None = None) -> dict:
    peers_python = peer_python(system, peers_python, peers_dir)
    if not peers_python.exists():
        setup = f"benchmarks/peers/setup {system}" if system in OWN_VENV_PEERS else "benchmarks/peers/setup"
        return {"solved": False, "error": f"no peers virtual environment at {peers_python}: run {setup}"}
    out = tmp / "peer.json"
    cmd = [str(peers_python), str(PEER_RUNNER), "--system", system, "--task", task, "--seed", str(seed),
           "--max-seconds", str(max_seconds), "--out", str(out), "--threads", str(threads)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of the project's leaks in
    t_launch = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max_seconds + GRACE_S, env=env, cwd=tmp)
        rc, tail = proc.returncode, (proc.stderr or proc.stdout)[-2000:]
    except subprocess.TimeoutExpired:
        rc, tail = None, f"killed: still running {max_seconds + GRACE_S:.0f} s after launch"
    t_exit = time.time()
    row = {"t_launch": t_launch, "process_wall_s": t_exit - t_launch}
    if not out.exists():
        return {**row, "solved": False, "error": f"exit {rc}: {tail}"}
    r = json.loads(out.read_text())
    episodes = r.pop("episodes")
    returns = [ep[1] for ep in sorted(episodes)]
    keep = {k: r.get(k) for k in ("solved", "time_to_solve_s", "wall_s", "env_steps", "final_mean_return",
                                  "stop_reason", "error", "config", "versions", "env_id")}
    # the second clock, from the peer process's own start, where the run records it (the peers with their own venv)
    t_process = r.get("t_process") if system in OWN_VENV_PEERS else None
    return {
        **row, **keep,
        "time_to_solve_from_launch_s": None if r.get("t_solved") is None else r["t_solved"] - t_launch,
        "build_s_from_launch": None if r.get("t_built") is None else r["t_built"] - t_launch,
        **({} if t_process is None else {
            "time_to_solve_from_process_start_s": None if r.get("t_solved") is None else r["t_solved"] - t_process,
            "build_s_from_process_start": None if r.get("t_built") is None else r["t_built"] - t_process}),
        "episodes": len(returns),
        "curve": [] if r.get("t_built") is None else learning_curve(episodes, r["t_built"]),
        "episode_rows": [] if r.get("t_built") is None else episode_rows(episodes, r["t_built"], t_process),
        "episode_fields": episode_fields(episodes, t_process),
        "env_steps_per_s": None if not r.get("env_steps") or not r.get("wall_s") else r["env_steps"] / r["wall_s"],
        "rllib_iterations": r.get("rllib_iterations"),
        "error": r.get("error") or (None if rc == 0 else f"exit {rc}: {tail}"),
    }


def run_one(system: str, task: str, seed: int, max_seconds: float, peers_python: Path, threads: int = 1,
            full: bool = False, peers_dir: Path | None = None) -> dict:
    """One run in a fresh process, as a row with every field of ``RUN_FIELDS``; with ``full``, also
    ``episode_rows``, ``episode_fields`` (their columns' names) and ``throughput_per_s`` (left out of
    the solve JSON, which keeps curves only)."""
    with tempfile.TemporaryDirectory(prefix="suite-run-") as tmp:
        try:
            if system in OURS or system in OURS_ON_OLDER_ENVS:
                row = _run_ours(system, task, seed, max_seconds, Path(tmp))
            else:
                row = _run_peer(system, task, seed, max_seconds, Path(tmp), peers_python, threads, peers_dir)
        except subprocess.TimeoutExpired:
            row = {"solved": False, "error": f"killed: still running {max_seconds + GRACE_S:.0f} s after launch"}
    base = {f: None for f in RUN_FIELDS}
    base.update(system=system, task=task, seed=seed, max_seconds=max_seconds)
    base.update(row)
    base["error"] = portable_error(base["error"])
    if not full:
        base.pop("episode_rows", None)
        base.pop("episode_fields", None)
        base.pop("throughput_per_s", None)
    return base
