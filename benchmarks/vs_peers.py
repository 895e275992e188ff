"""tianji_dask against its peers (RLlib, Stable-Baselines3) on the same tasks, side by side.

    python benchmarks/vs_peers.py solve [--tasks cartpole_ppo cartpole_dqn] [--systems tianji rllib sb3]
                                        [--seeds 3] [--max-seconds 300] [--out benchmarks/results/vs_peers] [--append]
    python benchmarks/vs_peers.py report benchmarks/results/vs_peers.json   # rebuild the markdown from the JSON
    python benchmarks/vs_peers.py curves benchmarks/results/vs_peers.json --task cartpole_ppo --out curves.png
    python benchmarks/vs_peers.py transfer [--sizes-mib 1 4 16 64] [--repeats 5]
                                           [--out benchmarks/results/vs_peers_transfer]
    python benchmarks/vs_peers.py scaling [--explorers 1 2] [--pipeline cartpole_ppo] [--seconds 30]
                                          [--out benchmarks/results/vs_peers_scaling]

``solve``: every run is a fresh process, and runs alternate systems seed by seed (the system order
also rotates from one seed to the next), so neighbouring runs share the machine's noise. Systems:

- ``tianji`` (relaxed), ``tianji-lockstep``, ``tianji-single``: ``tianji-dask train TASK --mode ...``
  with the bundled pipeline;
- ``rllib``, ``sb3``, ``cleanrl``, ``tianshou``: ``benchmarks/peers/run_peer.py`` in the peers' own
  virtual environment (``benchmarks/peers/setup`` creates ``.peers-venv``; ``--peers-python`` points
  elsewhere). ``cleanrl`` runs the PPO tasks on CartPole and LunarLander, ``tianshou`` those and
  the DQN ones; RLlib and SB3 every task, MinAtar Breakout included.
- ``sf`` (Sample Factory), ``pufferlib``, ``torchrl``: ``run_peer.py`` too, each in its own venv,
  ``.peers/<name>`` (``benchmarks/peers/setup sf|pufferlib|torchrl``; ``peers_dir`` points
  elsewhere), on the PPO tasks cartpole_ppo, lunarlander_ppo and hopper_ppo. Sample Factory and
  PufferLib pin gymnasium<1.0: they run LunarLander-v2 and Hopper-v4, and a run's ``env_id`` says so.
- ``tianji-v4``: tianji_dask (relaxed) with the task's pipeline on the gymnasium<1.0 env id those two
  run where tianji_dask's gymnasium still has it (``OURS_ON_OLDER_ENVS``: Hopper-v4 for hopper_ppo),
  a row beside theirs.

Time-to-solve is measured the same way for every system: every training episode's return and end
time is recorded, episodes are pooled and sorted by end time, and the run is solved at the first
end time at which the mean of the last 100 returns reaches the target. The clock starts when the
system is built (tianji_dask: cluster up and learner built; RLlib: ``build_algo()`` returned; SB3:
the model constructed). "From launch" counts from the moment the harness started the process.
An unsolved run is kept and reported with its budget as a lower bound. The JSON holds every run;
the markdown the medians and the ratios peer time ÷ tianji time (relaxed).

Each run also keeps its learning curve (``curve``): [seconds since the system was built, mean of the
last 100 training returns (of all so far, before 100)] at the end of each episode, episodes pooled
and sorted by end time, thinned to at most ``CURVE_POINTS`` points spread over the run's time;
``build_s_from_launch`` puts it on the launch clock. ``curves`` draws one task's curves, every
run, coloured by system, against wall time. ``run_one(..., full=True)`` (what ``benchmarks/suite.py``
records) also returns every episode unthinned (``episode_rows``) and, for tianji_dask, the env steps
consumed in each second of the run (``throughput_per_s``).

``transfer``: bandwidth of sample chunks (>= 1 MiB) moved worker to worker by Dask and by the direct
path, against plain socket pairs (loopback TCP, Unix) measured in the same invocation.
``scaling``: env steps/s produced by a run with 1, 2, ... explorers (no target, fixed seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEER_RUNNER = ROOT / "benchmarks" / "peers" / "run_peer.py"
DEFAULT_PEERS_PYTHON = ROOT / ".peers-venv" / "bin" / "python"
#: where ``benchmarks/peers/setup sf|pufferlib|torchrl`` puts the venvs of the peers that have their own
DEFAULT_PEERS_DIR = ROOT / ".peers"

TASKS = {  # task -> (env id, algorithm, target); the task name is also the bundled pipeline's name
    "cartpole_ppo": ("CartPole-v1", "ppo", 475.0),
    "cartpole_dqn": ("CartPole-v1", "dqn", 475.0),
    "lunarlander_ppo": ("LunarLander-v3", "ppo", 200.0),
    "lunarlander_dqn": ("LunarLander-v3", "dqn", 200.0),
    "pendulum_sac": ("Pendulum-v1", "sac", -200.0),
    "halfcheetah_sac": ("HalfCheetah-v5", "sac", 3000.0),
    "hopper_ppo": ("Hopper-v5", "ppo", 2000.0),
    "minatar_breakout_dqn": ("MinAtar/Breakout-v1", "dqn", 10.0),
    "minatar_breakout_ppo": ("MinAtar/Breakout-v1", "ppo", 10.0),
    "cartpole_novel_ppo_lstm": ("CartPoleNoVel-v1", "ppo_lstm", 475.0),
    "minigrid_doorkey_ppo": ("MiniGridDict-v0", "ppo", 0.9),
    "tictactoe_masked_ppo": ("TicTacToe-v0", "ppo_masked", 0.75),
}
OURS = {"tianji": "relaxed", "tianji-lockstep": "lockstep", "tianji-single": "single"}
PEERS = ("rllib", "sb3", "sb3-same", "cleanrl", "tianshou")
#: peers each in their own venv, DEFAULT_PEERS_DIR / <name>
OWN_VENV_PEERS = ("sf", "pufferlib", "torchrl")
#: tianji_dask on the env id of gymnasium<1.0 (Sample Factory's and PufferLib's): system -> (mode, task -> env id)
OURS_ON_OLDER_ENVS = {"tianji-v4": ("relaxed", {"hopper_ppo": "Hopper-v4"})}
SYSTEMS = (*OURS, *PEERS, *OWN_VENV_PEERS, *OURS_ON_OLDER_ENVS)
REFERENCE = "tianji"
#: the columns of every run in the JSON (and what the CI smoke test checks)
RUN_FIELDS = (
    "system", "task", "seed", "solved", "time_to_solve_s", "time_to_solve_from_launch_s", "max_seconds",
    "wall_s", "process_wall_s", "env_steps", "episodes", "final_mean_return", "stop_reason",
    "learner_busy_fraction", "env_steps_per_s", "samples_per_s_consumed", "error", "curve",
)
#: a run that outlives its budget by this much (startup, teardown, one last iteration) is killed
GRACE_S = 240
#: a run's learning curve in the JSON keeps at most this many points
CURVE_POINTS = 400
WINDOW = 100


# ---------------------------------------------------------------------------------------------
# one run

def _clean(text: str | None) -> str | None:
    """Error text without this machine's paths (it goes into the JSON and markdown, which get shared)."""
    if not text:
        return text
    return text.replace(str(ROOT), ".").replace(tempfile.gettempdir(), "$TMPDIR").replace(str(Path.home()), "~")


def learning_curve(episodes, t0: float, window: int = WINDOW, points: int = CURVE_POINTS) -> list[list[float]]:
    """[seconds since ``t0``, mean of the last ``window`` returns] at the end of each episode
    ((end time, return) pairs, pooled and sorted by end time; before ``window`` episodes, the mean
    of all so far), thinned to at most ``points``: the last episode of each of ``points`` equal
    slices of the run's time, and the last episode always."""
    eps = sorted((float(ep[0]), float(ep[1])) for ep in episodes)
    if not eps:
        return []
    means, total = [], 0.0
    for i, (_, r) in enumerate(eps):
        total += r
        if i >= window:
            total -= eps[i - window][1]
        means.append(total / min(i + 1, window))
    t_first, t_last = eps[0][0], eps[-1][0]
    span = (t_last - t_first) or 1.0
    keep = {}
    for i, (t, _) in enumerate(eps):  # the last episode in each time slice
        keep[min(int((t - t_first) / span * points), points - 1)] = i
    return [[round(eps[i][0] - t0, 3), round(means[i], 4)] for i in sorted(keep.values())]


def episode_rows(episodes, t0: float, t_process: float | None = None) -> list[list[float]]:
    """Every episode, sorted by end time, as [seconds since ``t0``, return], and when the episodes
    carry their length ((end time, return, length) triples) the env steps of all episodes ended so
    far as a third column, and with ``t_process`` the seconds since then as the last: the full
    record that ``learning_curve`` thins. ``episode_fields`` names the columns."""
    rows, steps = [], 0
    for ep in sorted(episodes):
        row = [round(ep[0] - t0, 3), round(ep[1], 4)]
        if len(ep) > 2:
            steps += int(ep[2])
            row.append(steps)
        if t_process is not None:
            row.append(round(ep[0] - t_process, 3))
        rows.append(row)
    return rows


def episode_fields(episodes, t_process: float | None = None) -> list[str]:
    """The names of ``episode_rows``' columns."""
    return ["seconds_since_built", "return", *(["env_steps"] if episodes and len(episodes[0]) > 2 else []),
            *(["seconds_since_process_start"] if t_process is not None else [])]


def _our_episodes(run_dir: Path, lengths: bool = False) -> list[tuple]:
    """(end time, return) of every training episode in a run folder's episodes.csv (columns
    t_end, return, length, explorer_id; end times in seconds since the epoch), with the length
    as a third item when ``lengths``."""
    import csv

    path = run_dir / "episodes.csv"
    if not path.exists():
        return []
    with open(path, newline="") as fh:
        return [(float(row["t_end"]), float(row["return"]), *((float(row["length"]),) if lengths else ()))
                for row in csv.DictReader(fh)]


def _our_throughput(run_dir: Path, t0: float, wall_s: float) -> list[int]:
    """Env steps the learner consumed in each whole second since ``t0`` (chunks.csv's t_consumed
    and env_steps), over the run's ``wall_s``."""
    import csv
    import math

    path = run_dir / "chunks.csv"
    per_s = [0] * max(1, math.ceil(wall_s or 0))
    if path.exists():
        with open(path, newline="") as fh:
            for row in csv.DictReader(fh):
                i = int(float(row["t_consumed"]) - t0)
                if 0 <= i < len(per_s):
                    per_s[i] += int(float(row["env_steps"]))
    return per_s


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
    episodes = _our_episodes(out, lengths=True)
    return {
        **row,
        "env_id": env[1].split("=", 1)[1] if env else TASKS[task][0],
        "build_s_from_launch": r["t_run_start"] - t_launch,
        "curve": learning_curve([ep[:2] for ep in episodes], r["t_run_start"]),
        "episode_rows": episode_rows(episodes, r["t_run_start"]),
        "episode_fields": episode_fields(episodes),
        "throughput_per_s": _our_throughput(out, r["t_run_start"], r["wall_s"]),
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
    with tempfile.TemporaryDirectory(prefix="vs-peers-") as tmp:
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
    base["error"] = _clean(base["error"])
    if not full:
        base.pop("episode_rows", None)
        base.pop("episode_fields", None)
        base.pop("throughput_per_s", None)
    return base


# ---------------------------------------------------------------------------------------------
# medians and ratios

def _median(runs: list[dict], key: str) -> tuple[float | None, bool]:
    """Median of ``key`` over runs, an unsolved run counting as +inf (its budget a lower bound).
    Returns (value, is_lower_bound); value None when there are no runs."""
    if not runs:
        return None, False
    vals = sorted((r[key] if r["solved"] and r.get(key) is not None else float("inf")) for r in runs)
    n = len(vals)
    med = vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2
    if med == float("inf"):
        budget = max(r["max_seconds"] for r in runs)
        return budget, True
    return med, False


def _fmt_time(value: float | None, lower: bool) -> str:
    if value is None:
        return "–"
    return f"> {value:.0f} s (unsolved)" if lower else f"{value:.2f} s"


def _fmt_ratio(num: tuple, den: tuple) -> str:
    (a, a_lb), (b, b_lb) = num, den
    if a is None or b is None:
        return "–"
    if a_lb and b_lb:
        return "both unsolved"
    if b_lb:
        return f"< {a / b:.2f}" if not a_lb else "–"
    return f"≥ {a / b:.2f}" if a_lb else f"{a / b:.2f}"


def summarise(runs: list[dict]) -> list[dict]:
    """One row per (task, system): counts, medians, ratio against tianji (relaxed)."""
    tasks = [t for t in TASKS if any(r["task"] == t for r in runs)]
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in runs)]
    rows = []
    for task in tasks:
        ref = [r for r in runs if r["task"] == task and r["system"] == REFERENCE]
        ref_med = _median(ref, "time_to_solve_s")
        ref_wall = _median(ref, "process_wall_s")
        for system in systems:
            rs = [r for r in runs if r["task"] == task and r["system"] == system]
            if not rs:
                continue
            med = _median(rs, "time_to_solve_s")
            med_launch = _median(rs, "time_to_solve_from_launch_s")
            med_wall = _median(rs, "process_wall_s")  # the whole command, as the user waits for it
            pairs = []
            for r in rs:
                mate = next((q for q in ref if q["seed"] == r["seed"]), None)
                if mate and r["solved"] and mate["solved"]:
                    pairs.append(r["time_to_solve_s"] / mate["time_to_solve_s"])
            busy = [r["learner_busy_fraction"] for r in rs if r.get("learner_busy_fraction") is not None]
            sps = [r["env_steps_per_s"] for r in rs if r.get("env_steps_per_s") is not None]
            rows.append({
                "task": task, "system": system, "runs": len(rs), "solved": sum(bool(r["solved"]) for r in rs),
                "seeds": sorted(r["seed"] for r in rs),
                "times": [r["time_to_solve_s"] if r["solved"] else None for r in rs],
                "median_time_to_solve_s": med[0], "median_is_lower_bound": med[1],
                "median_time_to_solve_from_launch_s": med_launch[0], "median_from_launch_is_lower_bound": med_launch[1],
                "ratio_vs_tianji": None if system == REFERENCE else _fmt_ratio(med, ref_med),
                "median_process_wall_s": med_wall[0], "median_process_wall_is_lower_bound": med_wall[1],
                "process_walls": [r.get("process_wall_s") if r["solved"] else None for r in rs],
                "process_wall_ratio_vs_tianji": None if system == REFERENCE else _fmt_ratio(med_wall, ref_wall),
                "pair_ratios": pairs, "median_pair_ratio": statistics.median(pairs) if pairs else None,
                "median_learner_busy_fraction": statistics.median(busy) if busy else None,
                "median_env_steps_per_s": statistics.median(sps) if sps else None,
            })
    return rows


def render_markdown(doc: dict) -> str:
    runs, meta = doc["runs"], doc["meta"]
    rows = summarise(runs)
    out = [
        "# tianji_dask vs RLlib and Stable-Baselines3: time-to-solve",
        "",
        "Generated by `benchmarks/vs_peers.py` (do not edit by hand; `python benchmarks/vs_peers.py report "
        "OUT.json` rebuilds it from the JSON of the same name, which holds every run).",
        "",
        f"Command: `{meta.get('command', '?')}`. Machine: {meta.get('machine', '?')}. "
        f"Started {meta.get('started', '?')}, finished {meta.get('finished', '?')}; load average "
        f"{meta.get('load_start', '?')} at start, {meta.get('load_end', '?')} at end.",
        "",
        "Time-to-solve: seconds from the moment the system is built (tianji_dask: cluster up and learner "
        "built; RLlib: `build_algo()` returned; SB3: model constructed) to the end of the training episode at "
        "which the mean of the last 100 training-episode returns first reaches the target, all episodes "
        "pooled and sorted by end time, the same rule for every system. \"From launch\" adds process start, "
        "imports and building. \"Whole process\" is the command's wall time, launch to exit, shutdown included: "
        "what a user waits for. Unsolved runs count as slower than any solved one; a median that falls on "
        "one is shown as more than the budget.",
        "",
        "## Medians",
        "",
        "| task | system | solved | time-to-solve by seed | median | median from launch | ratio (system ÷ tianji) "
        "| median per-seed ratio | whole process by seed | whole process, median | ratio, whole process "
        "| learner busy | env steps/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        by_seed = ", ".join(f"{t:.1f}" if t is not None else "unsolved" for t in row["times"])
        out.append(
            f"| {row['task']} | {row['system']} | {row['solved']}/{row['runs']} | {by_seed} | "
            f"**{_fmt_time(row['median_time_to_solve_s'], row['median_is_lower_bound'])}** | "
            f"{_fmt_time(row['median_time_to_solve_from_launch_s'], row['median_from_launch_is_lower_bound'])} | "
            f"{row['ratio_vs_tianji'] or '1 (reference)'} | "
            f"{'–' if row['median_pair_ratio'] is None else format(row['median_pair_ratio'], '.2f')} | "
            f"{', '.join('unsolved' if t is None else format(t, '.1f') for t in row.get('process_walls', []))} | "
            f"{_fmt_time(row.get('median_process_wall_s'), row.get('median_process_wall_is_lower_bound', False))} | "
            f"{row.get('process_wall_ratio_vs_tianji') or '1 (reference)'} | "
            f"{'–' if row['median_learner_busy_fraction'] is None else format(row['median_learner_busy_fraction'], '.0%')} | "
            f"{'–' if row['median_env_steps_per_s'] is None else format(row['median_env_steps_per_s'], ',.0f')} |"
        )
    out += ["", "Ratio: the system's median time-to-solve ÷ tianji (relaxed)'s median on the same task; "
            "above 1 means tianji_dask is faster. Per-seed ratio: the median over seeds of the same ratio "
            "taken run by run (both solved). Learner busy comes from tianji_dask's own results "
            "(`results.json`); the peers do not report it. Env steps/s: env steps ÷ seconds from build to "
            "the end of the run, tianji_dask's from its results, a peer's from its own step count.", ""]
    rl = [r for r in runs if r["system"] == "rllib" and r.get("rllib_iterations")]
    if rl:
        out += ["## RLlib's own metric", "",
                "`env_runners/episode_return_mean` as RLlib reports it after each `train()` iteration, next to the "
                "mean of the last 100 training episodes from the callback (the rule above). RLlib's metric is "
                "smoothed its own way and is not the same number; it is recorded, not used.", "",
                "| task | seed | RLlib metric first ≥ target (s from build) | RLlib metric at the end | last-100 mean at the end | "
                "time-to-solve (rule above) |", "|---|---|---|---|---|---|"]
        for r in rl:
            target = TASKS[r["task"]][2]
            its = r["rllib_iterations"]
            hit = next((i["t"] for i in its if (i.get("episode_return_mean") or float("-inf")) >= target), None)
            last = its[-1].get("episode_return_mean")
            out.append(f"| {r['task']} | {r['seed']} | {'never' if hit is None else format(hit, '.1f')} | "
                       f"{'–' if last is None else format(last, '.1f')} | "
                       f"{'–' if r.get('final_mean_return') is None else format(r['final_mean_return'], '.1f')} | "
                       f"{format(r['time_to_solve_s'], '.1f') if r['solved'] else 'unsolved'} |")
        out.append("")
    errors = [r for r in runs if r.get("error")]
    if errors:
        out += ["## Errors", ""]
        out += [f"- {r['task']} {r['system']} seed {r['seed']}: `{r['error'].strip().splitlines()[-1][:300]}`"
                for r in errors]
        out.append("")
    if meta.get("run_notes"):
        out += ["## Notes on this run", ""] + [f"- {n}" for n in meta["run_notes"]] + [""]
    if meta.get("versions"):
        out += ["## Versions", "", ", ".join(f"{k} {v}" for k, v in sorted(meta["versions"].items())), ""]
    if meta.get("notes"):
        out += ["## How each peer is run", ""] + [f"- {n}" for n in meta["notes"]] + [""]
    return "\n".join(out)


PEER_NOTES = [
    "RLlib: new API stack, the settings of RLlib's own tuned examples for CartPole PPO (lr 3e-4, 6 epochs, "
    "vf_loss_coeff 0.01, one linear 32-unit layer shared by policy and value) and CartPole DQN (lr 5e-4, "
    "batch 32, prioritized episode replay 50k, n-step 2-5, double and dueling Q, 256 tanh + 256 post, "
    "epsilon 1 → 0.02 over 10k steps); LunarLander with RLlib's default PPO/DQN config. "
    "Per-episode returns and end times come from an `on_episode_end` callback in every env runner "
    "(appended to a file the driver reads after each `train()` iteration), so the 100-episode mean is "
    "computed by the harness, not taken from RLlib's smoothed metric (which is also recorded per "
    "iteration in the JSON). The run stops at the first iteration boundary after it has solved.",
    "Stable-Baselines3: RL-Zoo hyperparameters for CartPole-v1 and LunarLander (PPO and DQN). The zoo's "
    "schedules (linear learning rate and clip range, DQN's exploration fraction) follow the zoo over its "
    "n_timesteps and then hold their final value, so runs can continue until solved or out of time. "
    "Episode returns come from `Monitor` episode infos, read by a callback at every step.",
    "Threads: every tianji_dask role (learner, each explorer) runs torch with 1 intra-op thread; the peers "
    "get the same (`--peer-threads`, OMP_NUM_THREADS and torch.set_num_threads, inherited by Ray's "
    "workers). With the library default (as many threads as cores) on a small machine shared with other "
    "jobs, torch ops spin-wait for busy cores.",
    "tianji_dask: the bundled pipelines unchanged (`tianji-dask train TASK --mode relaxed|lockstep|single`); "
    "episodes come from its own `episodes.csv` rule, which is the same as above.",
    "MinAtar Breakout (RLlib and SB3): the MinAtar paper's network (one 3x3 convolution of 16 channels, "
    "stride 1, ReLU, 128 ReLU units; Young & Tian 2019) and the settings of our minatar_breakout_dqn and "
    "minatar_breakout_ppo pipelines. DQN: replay 100k, 5k warm-up, epsilon 1 → 0.01 over 100k env steps, "
    "target copy every 1000 env steps, Adam 2.5e-4, 3-step returns, one update of 64 per 4 env steps "
    "(double-Q in RLlib and ours; SB3's DQN has none). PPO: 16 envs x 128 steps, 4 epochs x 8 minibatches, "
    "clip 0.2, lr 5e-4, entropy 0.01, separate actor and critic networks. SB3: a custom features extractor "
    "with MlpPolicy and net_arch=[]; RLlib: its default CNN encoder with conv_filters=[[16, 3, 1, \"valid\"]] "
    "and head_fcnet_hiddens=[128], the env registered with register_env (MinAtar's gymnasium ids exist only "
    "after minatar.gym.register_envs()).",
    "CleanRL-style PPO (`benchmarks/peers/cleanrl_ppo.py`): CleanRL's ppo.py defaults on CartPole; on "
    "LunarLander the settings of our lunarlander_ppo pipeline (CleanRL publishes none for it). Tianshou 2 "
    "PPO (`tianshou_ppo.py`): its CartPole PPO test's settings; on LunarLander our lunarlander_ppo pipeline's "
    "(Tianshou publishes none). Tianshou 2 DQN (`tianshou_dqn.py`): its examples' settings, "
    "examples/discrete/discrete_dqn.py on CartPole and examples/box2d/lunarlander_dqn.py on LunarLander.",
    "Sample Factory 2 (`benchmarks/peers/sf_appo.py`), PufferLib 3 (`pufferlib_ppo.py`, a patched build: see "
    "`benchmarks/peers/setup`) and TorchRL (`torchrl_ppo.py`), each in its own venv: on CartPole their "
    "published settings (Sample Factory's gym example), RL-Zoo's on PufferLib's trainer and TorchRL's MuJoCo "
    "PPO script adapted; on LunarLander RL-Zoo's (Sample Factory, PufferLib) and TorchRL's MuJoCo script "
    "adapted; on Hopper their MuJoCo settings. Sample Factory and PufferLib pin gymnasium<1.0 and run "
    "LunarLander-v2 and Hopper-v4; tianji-v4 is tianji_dask on Hopper-v4 beside them. Each file says what "
    "exactly.",
]


def _versions(peers_python: Path) -> dict:
    import importlib.metadata as md

    v = {}
    for dist in ("torch", "dask", "distributed", "gymnasium"):
        try:
            v[f"{dist} (tianji_dask)"] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    if Path(peers_python).exists():
        code = ("import importlib.metadata as m, json\n"
                "def v(d):\n"
                "    try:\n"
                "        return m.version(d)\n"
                "    except m.PackageNotFoundError:\n"
                "        return None\n"
                "print(json.dumps({d: v(d) for d in ('ray', 'stable-baselines3', 'sb3-contrib', 'tianshou', 'minatar', 'torch', "
                "'gymnasium')}))")
        try:
            out = subprocess.run([str(peers_python), "-c", code], capture_output=True, text=True, timeout=60)
            v.update({f"{k} (peers)": val for k, val in json.loads(out.stdout).items() if val is not None})
        except Exception:  # noqa: BLE001 - versions are informative only
            pass
    return v


def _machine() -> str:
    return f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}"


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def cmd_solve(args) -> int:
    out_json, out_md = Path(f"{args.out}.json"), Path(f"{args.out}.md")
    out_json.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(out_json.read_text())["runs"] if args.append and out_json.exists() else []
    seeds = list(range(args.seed_start, args.seed_start + args.seeds))
    meta = {"command": "python benchmarks/vs_peers.py " + " ".join(args.argv), "machine": _machine(),
            "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_start": _load(),
            "versions": _versions(args.peers_python), "notes": PEER_NOTES}
    runs = list(previous)
    for i, seed in enumerate(seeds):
        for task in args.tasks:
            k = i % len(args.systems)
            for system in args.systems[k:] + args.systems[:k]:  # alternate, and rotate who goes first
                row = run_one(system, task, seed, args.max_seconds, args.peers_python, args.peer_threads)
                runs.append(row)
                tts = row["time_to_solve_s"]
                print(f"{task:>16} {system:>16} seed {seed}: "
                      + (f"solved in {tts:.2f} s ({row['time_to_solve_from_launch_s']:.2f} s from launch)" if row["solved"]
                         else f"NOT solved ({row.get('stop_reason')}, budget {args.max_seconds:g} s)")
                      + (f"  ERROR {row['error'].strip().splitlines()[-1][:200]}" if row.get("error") else ""), flush=True)
                meta.update(finished=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), load_end=_load())
                doc = {"meta": meta, "runs": runs}
                out_json.write_text(json.dumps(doc, indent=1))
                out_md.write_text(render_markdown(doc))
    print(f"\nwrote {out_json} and {out_md}")
    print(render_markdown({"meta": meta, "runs": runs}).split("## Medians", 1)[1].split("Ratio:")[0])
    return 0


def cmd_report(args) -> int:
    doc = json.loads(Path(args.json).read_text())
    for run in doc["runs"]:
        run["error"] = _clean(run.get("error"))
    for note in args.note:
        if note not in doc["meta"].setdefault("run_notes", []):
            doc["meta"]["run_notes"].append(note)
    Path(args.json).write_text(json.dumps(doc, indent=1))
    md = Path(args.json).with_suffix(".md")
    md.write_text(render_markdown(doc))
    print(f"wrote {md}")
    return 0


def cmd_curves(args) -> int:
    """One task's learning curves from a solve JSON: every run's running mean against wall time,
    one line per run, one colour per system, the target as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.loads(Path(args.json).read_text())
    runs = [r for r in doc["runs"] if r["task"] == args.task]
    if not runs:
        print(f"no runs of {args.task} in {args.json}", file=sys.stderr)
        return 1
    # a system's colour is the same in every task's figure
    others = sorted({r["system"] for r in runs} - set(SYSTEMS))
    colours = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate((*SYSTEMS, *others))}
    fig, ax = plt.subplots(figsize=(8, 4.5))
    drawn = set()
    for r in runs:
        curve = r.get("curve") or []
        if not curve:
            continue
        shift = 0.0
        if args.clock == "launch":
            if r.get("build_s_from_launch") is None:
                continue
            shift = r["build_s_from_launch"]
        ax.plot([t + shift for t, _ in curve], [m for _, m in curve], color=colours[r["system"]], linewidth=1.2,
                alpha=0.85, label=None if r["system"] in drawn else r["system"])
        drawn.add(r["system"])
    env_id, _, target = TASKS.get(args.task, (args.task, None, None))
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax.set_xlabel("seconds since the system was built" if args.clock == "build"
                  else "seconds since the process was launched")
    ax.set_ylabel(f"mean of the last {WINDOW} training returns")
    ax.set_title(f"{args.task} ({env_id}): one line per run")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    plt.close(fig)
    missing = [f"{r['system']} seed {r['seed']}" for r in runs if not r.get("curve")]
    print(f"wrote {args.out}: {len(runs) - len(missing)} run(s) of {args.task}"
          + (f"; no curve for {', '.join(missing)}" if missing else ""))
    return 0


# ---------------------------------------------------------------------------------------------
# (a) chunk transfer bandwidth through Dask vs a raw loopback socket pair

def _make_chunk_of(mib: float, salt: int) -> dict:
    import numpy as np

    from tianji_dask.chunk import make_chunk

    t, n = 128, 16
    dim = max(1, int(mib * 2**20 / ((t + 1) * n * 4)))
    rng = np.random.default_rng(salt)
    return make_chunk(obs=rng.standard_normal((t + 1, n, dim), dtype=np.float32), actions=np.zeros((t, n), np.int64),
                      rewards=np.ones((t, n), np.float32), terminated=np.zeros((t, n), bool),
                      truncated=np.zeros((t, n), bool), valid=np.ones((t, n), bool),
                      extras={"logp": np.zeros((t, n), np.float32)}, explorer_id=0, policy_version=0,
                      t_start=0.0, t_end=0.0, episodes=[])


def _chunk_nbytes(chunk: dict) -> int:
    return chunk["nbytes"]


def _start_sink(dask_worker) -> tuple:
    """A direct-path sink in this worker's process, as a learner has one (tianji_dask/dataflow/direct/sink.py)."""
    from tianji_dask.dataflow.direct.sink import ChunkSink, sink_host

    dask_worker.bench_sink = ChunkSink(sink_host(dask_worker.address))
    return dask_worker.bench_sink.address, dask_worker.bench_sink.secret


def _send_direct(chunk: dict, address: tuple, key: str, secret: bytes) -> str:
    from tianji_dask.dataflow.direct.send import send_chunk

    send_chunk(address, key, chunk, secret=secret)
    return key


def _sink_take(key: str, dask_worker) -> tuple[int, float]:
    """(bytes, seconds from the send's start to the message received and decoded) of ``key``."""
    sink = dask_worker.bench_sink
    if sink.take(key, timeout=60) is None:
        raise RuntimeError(f"direct chunk {key} never arrived: {sink.stats()}")
    return next((nbytes, seconds) for k, nbytes, seconds in reversed(sink.recent) if k == key)


def _raw_peer(port: int, unix_name: str | None, nbytes: int) -> None:
    """Send a timestamp and ``nbytes`` on the connection each request names (b"t": TCP, b"u": Unix)."""
    import socket
    import struct

    message = bytearray(8) + os.urandom(nbytes)
    tcp = socket.create_connection(("127.0.0.1", port))
    tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    unix = None
    if unix_name is not None:
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.connect("\0" + unix_name)
    while (op := tcp.recv(1)) in (b"t", b"u"):
        conn = tcp if op == b"t" else unix
        struct.pack_into("!d", message, 0, time.time())  # the clock starts as the send does, as a direct send's
        conn.sendall(message)
    tcp.close()
    if unix is not None:
        unix.close()


class RawLoopback:
    """A plain socket pair to a spawned process, over loopback TCP and (on Linux) an abstract Unix
    socket: the raw figures the transfers are compared with. Each message is timed like a direct
    send, from the sender's clock as it starts to the last byte received here."""

    def __init__(self, nbytes: int):
        import multiprocessing as mp
        import socket

        self.nbytes = nbytes
        self._buf = bytearray(8 + nbytes)
        srv = socket.create_server(("127.0.0.1", 0))
        unix_name, usrv = None, None
        if sys.platform.startswith("linux"):
            unix_name = f"tianji-bench-{os.getpid()}-{time.time_ns()}"
            usrv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            usrv.bind("\0" + unix_name)
            usrv.listen(1)
        self._proc = mp.get_context("spawn").Process(target=_raw_peer, args=(srv.getsockname()[1], unix_name, nbytes))
        self._proc.start()
        self._conns = {"tcp": srv.accept()[0]}
        self._conns["tcp"].setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if usrv is not None:
            self._conns["unix"] = usrv.accept()[0]
            usrv.close()
        srv.close()

    def rate(self, way: str) -> float | None:
        """Bytes/s of one message over ``way`` ("tcp" or "unix"); None where there is no such way."""
        import struct

        if way not in self._conns:
            return None
        self._conns["tcp"].sendall(b"t" if way == "tcp" else b"u")
        conn, view, got = self._conns[way], memoryview(self._buf), 0
        while got < len(self._buf):
            k = conn.recv_into(view[got:], len(self._buf) - got)
            if not k:
                raise ConnectionError("raw loopback: the sender went away")
            got += k
        return self.nbytes / (time.time() - struct.unpack_from("!d", self._buf)[0])

    def close(self) -> None:
        self._conns["tcp"].sendall(b"q")
        self._proc.join(timeout=30)
        for conn in self._conns.values():
            conn.close()


def _comm_server(queue, mib: float, repeats: int) -> None:
    """Answer each request on one Dask comm with the same chunk, as a worker answers get_data."""
    import asyncio

    from distributed.comm import listen
    from distributed.protocol import to_serialize

    async def serve():
        chunk = _make_chunk_of(mib, 0)
        done = asyncio.Event()

        async def handle(comm):
            for _ in range(repeats + 1):  # one warm-up
                await comm.read()
                await comm.write({"status": "OK", "data": {"chunk": to_serialize(chunk)}})
            await comm.read()  # the client's goodbye: everything it asked for has arrived
            await comm.close()
            done.set()

        listener = listen("tcp://127.0.0.1:0", handle, deserialize=True)
        await listener.start()
        queue.put(listener.contact_address)
        await done.wait()
        listener.stop()

    asyncio.run(serve())


def dask_comm_bandwidth(mib: float, nbytes: int, repeats: int) -> list[float]:
    """Bytes/s of the chunk sent over one Dask TCP comm (msgpack framing, serialization, tornado),
    request to reply, without a scheduler or worker: Dask's transport alone."""
    import asyncio
    import multiprocessing as mp

    from distributed.comm import connect

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_comm_server, args=(queue, mib, repeats))
    proc.start()

    async def pull(address):
        comm = await connect(address)
        rates = []
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            await comm.write({"op": "get_data"})
            await comm.read()
            dt = time.perf_counter() - t0
            if i:
                rates.append(nbytes / dt)
        await comm.write("OK")
        await comm.close()
        return rates

    try:
        return asyncio.run(pull(queue.get(timeout=60)))
    finally:
        proc.join(timeout=30)


def cmd_transfer(args) -> int:
    from distributed import Client, LocalCluster, wait

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)

    results = {"meta": {"command": "python benchmarks/vs_peers.py " + " ".join(args.argv), "machine": _machine(),
                        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_start": _load()},
               "sizes": []}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        a, b = sorted(client.scheduler_info()["workers"])
        sink_address, sink_secret = client.run(_start_sink, workers=[b])[b]
        for mib in args.sizes_mib:
            # each round sends every way back to back, so its ratios compare the same minute of a noisy machine
            dask_rates, e2e_rates, paired = [], [], {"transfer": [], "direct": [], "direct_tcp": []}
            rates = {"direct": [], "direct_tcp": [], "raw_tcp": [], "raw_unix": []}
            raw_pair = None
            for i in range(args.repeats + 1):  # one warm-up
                x = client.submit(_make_chunk_of, mib, i, workers=[a], pure=False)
                wait(x)
                t0 = time.perf_counter()
                y = client.submit(_chunk_nbytes, x, workers=[b], pure=False)
                nbytes = y.result()
                dt = time.perf_counter() - t0
                log = client.run(lambda dask_worker: list(dask_worker.transfer_incoming_log)[-1:], workers=[b])[b]
                del y
                # direct by Unix socket (one host) and by TCP (as from another), alternately first: the first is slower
                round_rates, ways = {}, [("direct", sink_address), ("direct_tcp", tuple(sink_address[:2]))]
                for way, address in ways[::-1] if i % 2 else ways:
                    key = client.submit(_send_direct, x, address, f"{way}-{mib}-{i}", sink_secret, workers=[a],
                                        pure=False).result()
                    sent, seconds = client.run(_sink_take, key, workers=[b])[b]
                    round_rates[way] = sent / seconds
                del x
                if raw_pair is None:
                    raw_pair = RawLoopback(nbytes)
                round_rates["raw_tcp"], round_rates["raw_unix"] = raw_pair.rate("tcp"), raw_pair.rate("unix")
                if not i or not log:
                    continue
                dask_rate = log[-1]["total"] / log[-1]["duration"]
                dask_rates.append(dask_rate)
                e2e_rates.append(nbytes / dt)
                for way, rate in round_rates.items():
                    if rate is not None:
                        rates[way].append(rate)
                paired["transfer"].append(dask_rate / round_rates["raw_tcp"])
                paired["direct"].append(round_rates["direct"] / round_rates["raw_tcp"])
                paired["direct_tcp"].append(round_rates["direct_tcp"] / round_rates["raw_tcp"])
            raw_pair.close()
            comm = dask_comm_bandwidth(mib, nbytes, args.repeats)
            row = {"mib": mib, "chunk_bytes": nbytes,
                   "dask_transfer_Bps": statistics.median(dask_rates),
                   "dask_end_to_end_Bps": statistics.median(e2e_rates),
                   "dask_comm_Bps": statistics.median(comm),
                   **{f"{way}_Bps": statistics.median(v) if v else None for way, v in rates.items()},
                   **{f"{way}_Bps_all": v for way, v in rates.items()},
                   "dask_transfer_Bps_all": dask_rates, "dask_end_to_end_Bps_all": e2e_rates,
                   "dask_comm_Bps_all": comm}
            row["ratio_transfer_vs_raw"] = row["dask_transfer_Bps"] / row["raw_tcp_Bps"]
            row["ratio_comm_vs_raw"] = row["dask_comm_Bps"] / row["raw_tcp_Bps"]
            row["ratio_end_to_end_vs_raw"] = row["dask_end_to_end_Bps"] / row["raw_tcp_Bps"]
            row["ratio_direct_vs_raw"] = row["direct_Bps"] / row["raw_tcp_Bps"]
            row["ratio_transfer_vs_raw_paired"] = statistics.median(paired["transfer"])
            row["ratio_direct_vs_raw_paired"] = statistics.median(paired["direct"])
            row["ratio_direct_tcp_vs_raw_paired"] = statistics.median(paired["direct_tcp"])
            results["sizes"].append(row)
            print(f"{mib:>6g} MiB chunk, MiB/s: Dask {row['dask_transfer_Bps'] / 2**20:,.0f} (worker transfer log), "
                  f"{row['dask_end_to_end_Bps'] / 2**20:,.0f} end to end, comm alone {row['dask_comm_Bps'] / 2**20:,.0f}; "
                  f"direct {row['direct_Bps'] / 2**20:,.0f}, over TCP {row['direct_tcp_Bps'] / 2**20:,.0f}; raw TCP "
                  f"{row['raw_tcp_Bps'] / 2**20:,.0f}; direct ÷ raw TCP per round {row['ratio_direct_vs_raw_paired']:.2f}, "
                  f"over TCP {row['ratio_direct_tcp_vs_raw_paired']:.2f}", flush=True)
    results["meta"]["load_end"] = _load()
    Path(f"{args.out}.json").write_text(json.dumps(results, indent=1))
    lines = ["# Chunk transfer through Dask vs raw loopback TCP", "",
             "Generated by `benchmarks/vs_peers.py transfer`. A SampleChunk of the given size is made on one "
             "worker process and consumed by a task on another (one LocalCluster, two worker processes). "
             "\"Dask comm alone\" sends the same chunk over one Dask TCP comm "
             "between two processes, request to reply, as a worker answers `get_data` but with no scheduler, "
             "worker or task around it: the part of the gap that is Dask's transport (framing, serialization, "
             "tornado) rather than its worker-to-worker gather protocol. \"Direct path\" is how tianji_dask moves chunks "
             "of at least `learner.direct_chunks_min_mib` (default 1 MiB): the task on the first worker sends the chunk "
             "(a small pickled layout, then the arrays' own memory) over a socket to a sink thread in "
             "the second worker's process, timed from the send's start to the message received and decoded there. "
             "On Linux the sink also listens on an abstract Unix socket, which a sender on its host uses: "
             "\"direct\" is that way, as a pipeline on one host sends; \"direct over TCP\" gives the sink only its "
             "host and port, as a sender on another host knows it. Raw TCP and raw Unix send the same number of "
             "bytes between two other processes, each message timed the same way as a direct send (from the "
             "sender's clock as the send starts to the last byte received) and, like it, after a pause (the "
             "rest of the round) rather than in a stream. Each round sends the chunk once through Dask, once each "
             "way directly and once each way raw, back to back; the \"per round\" columns are the medians of each "
             "round's own ratio to raw TCP (a noisy machine changes speed between minutes). Medians of the rounds "
             "after one warm-up.", "",
             f"Command: `{results['meta']['command']}`. Machine: {results['meta']['machine']}, "
             f"{results['meta']['date']}, load average {results['meta']['load_start']} → {results['meta']['load_end']}.", "",
             "| chunk | Dask transfer (worker log) | Dask end to end (submit → result) | Dask comm alone | direct path "
             "| direct over TCP | raw TCP | raw Unix | ratio comm alone ÷ raw TCP | transfer ÷ raw TCP, per round "
             "| direct ÷ raw TCP, per round | direct over TCP ÷ raw TCP, per round |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def mibs(value):
        return "–" if value is None else f"{value / 2**20:,.0f} MiB/s"

    for r in results["sizes"]:
        lines.append(f"| {r['chunk_bytes'] / 2**20:.2f} MiB | {mibs(r['dask_transfer_Bps'])} | "
                     f"{mibs(r['dask_end_to_end_Bps'])} | {mibs(r['dask_comm_Bps'])} | {mibs(r['direct_Bps'])} | "
                     f"{mibs(r['direct_tcp_Bps'])} | {mibs(r['raw_tcp_Bps'])} | {mibs(r['raw_unix_Bps'])} | "
                     f"{r['ratio_comm_vs_raw']:.2f} | {r['ratio_transfer_vs_raw_paired']:.2f} | "
                     f"{r['ratio_direct_vs_raw_paired']:.2f} | {r['ratio_direct_tcp_vs_raw_paired']:.2f} |")
    Path(f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}.json and {args.out}.md")
    return 0


# ---------------------------------------------------------------------------------------------
# (b) env steps/s produced with 1, 2, ... explorers

_SCALING_CODE = """
import json, statistics, sys, threading, time, psutil, tianji_dask
samples, done = [], threading.Event()
def sample():  # the whole machine's CPU use, a sample a second: are the cores the limit?
    psutil.cpu_percent()
    while not done.wait(1.0):
        samples.append((time.time(), psutil.cpu_percent() / 100))
threading.Thread(target=sample, daemon=True).start()
r = tianji_dask.train(sys.argv[1], overrides={"explorers": int(sys.argv[2]), "seed": int(sys.argv[3]),
                      "stop.target_return": None, "stop.max_seconds": float(sys.argv[4]),
                      "stop.max_env_steps": None, **json.loads(sys.argv[6])}, out=sys.argv[5])
done.set()
# the run's second half, by its own clock: start-up (cluster, first weights) and shutdown left out
end = r["t_run_start"] + r["wall_s"]
steady = [c for t, c in samples if end - r["wall_s"] / 2 <= t <= end]
out = {k: r.get(k) for k in ("env_steps", "wall_s", "env_steps_per_s", "samples_per_s_consumed",
                             "learner_busy_fraction", "explorer_busy_fraction", "updates", "error")}
out["machine_cpu_busy"] = statistics.median(steady) if steady else None
print(json.dumps(out))
"""


def _pct(value) -> str:
    return "-" if value is None else f"{value:.0%}"


def cmd_scaling(args) -> int:
    from _report import median_of
    from time_to_solve import parse_sets

    overrides = parse_sets(args.set)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for rep in range(args.repeats):
        for n in args.explorers:
            with tempfile.TemporaryDirectory(prefix="vs-peers-scaling-") as tmp:
                proc = subprocess.run([sys.executable, "-c", _SCALING_CODE, args.pipeline, str(n), str(rep),
                                       str(args.seconds), str(Path(tmp) / "run"), json.dumps(overrides)], capture_output=True, text=True,
                                      cwd=ROOT, timeout=args.seconds + GRACE_S)
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                return 1
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            r.update(explorers=n, repeat=rep)
            rows.append(r)
            print(f"{args.pipeline} {n} explorer(s), repeat {rep}: {r['env_steps_per_s']:,.0f} env steps/s produced, "
                  f"learner busy {r['learner_busy_fraction']:.0%}, explorers busy {r['explorer_busy_fraction']:.0%}, "
                  f"machine CPU busy {_pct(r.get('machine_cpu_busy'))}",
                  flush=True)
    by_n = {n: statistics.median(r["env_steps_per_s"] for r in rows if r["explorers"] == n) for n in args.explorers}
    base = by_n[args.explorers[0]]
    # each repeat's own ratio, its two runs minutes apart: a slow minute moves both sides of a pair
    first = {r["repeat"]: r["env_steps_per_s"] for r in rows if r["explorers"] == args.explorers[0]}
    paired = {n: statistics.median(r["env_steps_per_s"] / first[r["repeat"]] for r in rows if r["explorers"] == n)
              for n in args.explorers}
    doc = {"meta": {"command": "python benchmarks/vs_peers.py " + " ".join(args.argv), "machine": _machine(),
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load": _load()},
           "runs": rows, "median_env_steps_per_s": {str(n): v for n, v in by_n.items()},
           "scaling_per_repeat": {str(n): v for n, v in paired.items()}}
    Path(f"{args.out}.json").write_text(json.dumps(doc, indent=1))
    lines = ["# Env steps/s produced vs number of explorers", "",
             f"Generated by `benchmarks/vs_peers.py scaling`: `{args.pipeline}` in relaxed mode with no target for "
             f"{args.seconds:g} s per run, explorers {args.explorers}, {args.repeats} repeat(s) each, alternated"
             + (f", overrides {overrides}" if overrides else "") + ". "
             f"Machine: {doc['meta']['machine']}, {doc['meta']['date']}, load average {doc['meta']['load']}.", "",
             f"Machine CPU busy: all {os.cpu_count()} cores together, the median of one-second samples over the "
             "second half of each run.", "",
             "Scaling per repeat: the median over repeats of each repeat's ratio to its own run with the first "
             "count (those two runs are minutes apart, not the whole benchmark).", "",
             "| explorers | median env steps/s produced | scaling vs first (medians) | scaling per repeat | learner busy "
             "| explorers busy | machine CPU busy |",
             "|---|---|---|---|---|---|---|"]
    for n in args.explorers:
        rs = [r for r in rows if r["explorers"] == n]
        lines.append(f"| {n} | {by_n[n]:,.0f} | {by_n[n] / base:.2f}× | {paired[n]:.2f}× | "
                     f"{statistics.median(r['learner_busy_fraction'] for r in rs):.0%} | "
                     f"{statistics.median(r['explorer_busy_fraction'] for r in rs):.0%} | "
                     f"{_pct(median_of(r.get('machine_cpu_busy') for r in rs))} |")
    Path(f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}.json and {args.out}.md")
    return 0


# ---------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("solve", help="time-to-solve, every system, alternated seed by seed")
    s.add_argument("--tasks", nargs="+", choices=list(TASKS), default=["cartpole_ppo", "cartpole_dqn"])
    s.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=["tianji", "rllib", "sb3"])
    s.add_argument("--seeds", type=int, default=3, help="how many seeds (from --seed-start)")
    s.add_argument("--seed-start", type=int, default=0)
    s.add_argument("--max-seconds", type=float, default=300, help="per-run budget from build")
    s.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "vs_peers"), help="writes OUT.json and OUT.md")
    s.add_argument("--append", action="store_true", help="keep the runs already in OUT.json")
    # absolute, not resolved: a peer runs in a temporary folder, and a venv's python is a symlink into the venv
    s.add_argument("--peers-python", type=lambda p: Path(os.path.abspath(p)), default=DEFAULT_PEERS_PYTHON)
    s.add_argument("--peer-threads", type=int, default=1,
                   help="torch threads per peer process (tianji_dask's roles use 1 each); 0: library default")
    r = sub.add_parser("report", help="rebuild the markdown from a solve JSON")
    r.add_argument("json")
    r.add_argument("--note", action="append", default=[], help="add a note on the measured runs to the markdown")
    cu = sub.add_parser("curves", help="one task's learning curves (every run) against wall time, as a PNG")
    cu.add_argument("json", help="a solve JSON")
    cu.add_argument("--task", required=True)
    cu.add_argument("--out", required=True, help="the PNG to write")
    cu.add_argument("--clock", choices=["build", "launch"], default="build",
                    help="seconds since the system was built (default) or since its process was launched")
    t = sub.add_parser("transfer", help="chunk bandwidth through Dask vs raw loopback TCP")
    t.add_argument("--sizes-mib", nargs="+", type=float, default=[1, 4, 16, 64])
    t.add_argument("--repeats", type=int, default=5)
    t.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "vs_peers_transfer"))
    c = sub.add_parser("scaling", help="env steps/s produced with 1, 2, ... explorers")
    c.add_argument("--explorers", nargs="+", type=int, default=[1, 2])
    c.add_argument("--pipeline", default="cartpole_ppo")
    c.add_argument("--seconds", type=float, default=30)
    c.add_argument("--repeats", type=int, default=1)
    c.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="pipeline overrides, e.g. controller.replay_ratio=null (DQN explorers unpaced)")
    c.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "vs_peers_scaling"))
    args = parser.parse_args(argv)
    args.argv = argv
    return {"solve": cmd_solve, "report": cmd_report, "curves": cmd_curves, "transfer": cmd_transfer,
            "scaling": cmd_scaling}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
