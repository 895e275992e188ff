"""The replay-staleness law while the buffer fills: how far past its target a replaying run's
staleness goes, and when it first holds.

    python benchmarks/replay_law.py [--pipeline cartpole_dqn] [--targets 1000 4000] [--seeds 0 1 2]
                                    [--seconds 60] [--out benchmarks/results/replay_law]

Each run trains ``--pipeline`` for ``--seconds`` (no stop on solving) with
``controller.replay_staleness_target`` set, reading ``run.status()`` twice a second: the learner's
recent replay staleness and how full its buffer is. Per run: the peak staleness over the target,
the first second within ±25% of it, the second half's mean over the target, and the controller's
last verdict. Runs alternate targets seed by seed on one embedded cluster. To compare revisions,
run this script with the other revision's package first on PYTHONPATH (the script imports only
``tianji_dask``). Writes OUT.json (every run and its series) and OUT.md (one row per run).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _report import fmt, write_report


def one_run(client, pipeline: str, target: float, seed: int, seconds: float, tmp: Path) -> dict:
    from tianji_dask.run import Run

    run = Run(pipeline, client, out=tmp / f"{pipeline}-{target:g}-{seed}-{time.time_ns()}", overrides={
        "seed": seed, "stop.target_return": None, "stop.max_seconds": seconds,
        "controller.replay_staleness_target": target})
    run.start()
    series = []
    while not (live := run.status()).get("done"):
        s = live.get("replay_staleness_recent_mean")
        if s is not None:
            series.append([live.get("elapsed_s"), s, live.get("replay_fill"), live.get("replay_ratio")])
        time.sleep(0.5)
    results = run.wait()
    within = [t for t, s, *_ in series if abs(s - target) <= 0.25 * target]
    half = [s for t, s, *_ in series if t is not None and t >= seconds / 2]
    return {"target": target, "seed": seed, "peak_over_target": max(s for _, s, *_ in series) / target if series else None,
            "first_within_s": within[0] if within else None,
            "second_half_over_target": statistics.fmean(half) / target if half else None,
            "verdict": results["controller"]["replay_target_verdict"]["state"], "env_steps": results["env_steps"],
            "series": series}


def _commit() -> str | None:
    try:
        import tianji_dask

        root = Path(tianji_dask.__file__).resolve().parent.parent
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip() or None
    except OSError:
        return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default="cartpole_dqn")
    parser.add_argument("--targets", nargs="+", type=float, default=[1000.0, 4000.0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--out", default="benchmarks/results/replay_law")
    args = parser.parse_args(argv)
    if any(t <= 0 for t in args.targets) or args.seconds <= 0:
        parser.error("--targets and --seconds must be positive")

    from distributed import Client

    from tianji_dask.config import load_pipeline
    from tianji_dask.launch.cluster import default_explorer_workers, local_cluster

    rows = []
    explorers = load_pipeline(args.pipeline).explorers
    commit = _commit()
    with (tempfile.TemporaryDirectory() as tmp,
          local_cluster(default_explorer_workers(explorers), dashboard_address=None) as cluster, Client(cluster) as client):
        for i, seed in enumerate(args.seeds):
            for target in (args.targets if i % 2 == 0 else args.targets[::-1]):
                rows.append({**one_run(client, args.pipeline, target, seed, args.seconds, Path(tmp)), "commit": commit})
                print(_line(rows[-1]), flush=True)
    lines = ["| target | seed | peak ÷ target | first within ±25% (s) | second half ÷ target | verdict |", "|---|---|---|---|---|---|"]
    lines += [_line(r) for r in rows]
    text = "\n".join(lines)
    print(text)
    write_report(args.out, "replay_law.py", argv, args, rows, "The replay law while the buffer fills",
                 f"{args.pipeline}, {args.seconds:g} s a run, the package at {commit}", text)
    return 0


def _line(r: dict) -> str:
    return (f"| {r['target']:g} | {r['seed']} | {fmt(r['peak_over_target'])} | {fmt(r['first_within_s'], '.1f')} | "
            f"{fmt(r['second_half_over_target'])} | {r['verdict']} |")


if __name__ == "__main__":
    sys.exit(main())
