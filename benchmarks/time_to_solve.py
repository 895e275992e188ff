"""Median time-to-solve of the bundled CartPole pipelines, several seeds, one invocation.

    python benchmarks/time_to_solve.py [--pipelines cartpole_ppo cartpole_dqn] [--seeds 0 1 2]
                                       [--mode relaxed] [--max-seconds 300] [--set chunk_steps=32 ...]
                                       [--json benchmarks/results/time_to_solve.json]

Runs alternate pipelines seed by seed (machines here are noisy, so neighbours share the noise) and
print, for each pipeline, every run and the median time-to-solve from run start and from process
start. Each run is a fresh process, so "process start" includes starting its cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml


def parse_sets(items: list[str], flag: str = "--set") -> dict:
    """``KEY=VALUE`` strings (dotted keys, YAML values) as a dict of pipeline overrides; a bad one
    exits 2 with one line naming ``flag``."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"{flag}: expected KEY=VALUE (e.g. chunk_steps=32), got {item!r}", file=sys.stderr)
            raise SystemExit(2)
        overrides[key] = yaml.safe_load(value)
    return overrides


@contextlib.contextmanager
def pipeline_copy(pipeline: str, overrides: dict):
    """The path of a temporary copy of ``pipeline``'s YAML with dotted-key ``overrides`` applied
    (the CLI takes pipeline files; the copy keeps the pipeline's name)."""
    from tianji_dask.config import (  # the Run API's own dotted-key rule
        apply_overrides,
        resolve_pipeline_path,
    )

    source = resolve_pipeline_path(pipeline)
    data = apply_overrides(yaml.safe_load(source.read_text()), overrides)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / source.name
        path.write_text(yaml.safe_dump(data))
        yield str(path)


def run_once(pipeline: str, seed: int, mode: str, max_seconds: float, extra: list[str],
             returns: bool = False, prefix: list[str] = ()) -> dict:
    """One ``tianji-dask train`` process's ``results.json``; with ``returns``, also ``returns``: every
    training episode's return in the order the episodes ended (``episodes.csv``). ``prefix``: what
    the command runs under (e.g. ``netns.py``'s hosts)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [*prefix, sys.executable, "-m", "tianji_dask", "train", pipeline, "--seed", str(seed), "--mode", mode,
               "--max-seconds", str(max_seconds), "--out", str(out), "--quiet", *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
        results = json.loads((out / "results.json").read_text())
        if returns:
            with open(out / "episodes.csv", newline="") as f:
                rows = sorted(csv.DictReader(f), key=lambda row: float(row["t_end"]))
            results["returns"] = [float(row["return"]) for row in rows]
        return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", nargs="+", default=["cartpole_ppo", "cartpole_dqn"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--mode", default="relaxed", choices=["relaxed", "lockstep", "single"])
    parser.add_argument("--max-seconds", type=float, default=300)
    parser.add_argument("--explorers", type=int)
    parser.add_argument("--json", help="write every run's results here")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="override pipeline settings in every run (dotted keys, YAML values)")
    args = parser.parse_args(argv)
    extra = ["--explorers", str(args.explorers)] if args.explorers else []
    overrides = parse_sets(args.set)

    runs: dict[str, list[dict]] = {p: [] for p in args.pipelines}
    for seed in args.seeds:
        for pipeline in args.pipelines:
            with pipeline_copy(pipeline, overrides) as path:
                r = run_once(path, seed, args.mode, args.max_seconds, extra)
            runs[pipeline].append(r)
            tts = r["time_to_solve_s"]
            print(f"{pipeline:>16} seed {seed}: " + (
                f"solved in {tts:.2f} s from run start ({r['time_to_solve_from_process_start_s']:.2f} s from "
                f"process start), {r['env_steps']:,} env steps, learner busy {r['learner_busy_fraction']:.0%}"
                if tts is not None else f"NOT solved in {r['wall_s']:.0f} s ({r['env_steps']:,} env steps)"
            ), flush=True)

    print(f"\nmedians over seeds {args.seeds}, mode {args.mode}:")
    for pipeline, rs in runs.items():
        solved = [r for r in rs if r["solved"]]
        if len(solved) < len(rs):
            print(f"{pipeline:>16}: {len(rs) - len(solved)} of {len(rs)} runs unsolved; median over all runs is undefined")
            continue
        med = statistics.median(r["time_to_solve_s"] for r in rs)
        med_p = statistics.median(r["time_to_solve_from_process_start_s"] for r in rs)
        print(f"{pipeline:>16}: median time-to-solve {med:.2f} s from run start, {med_p:.2f} s from process start")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
