"""A CLI run's start and shutdown, against importing torch, gymnasium and distributed.

    python benchmarks/startup.py [--rounds 5] [--pipeline cartpole_ppo] [--python PYTHON]
                                 [--checkout DIR] [--out benchmarks/results/startup]

Each round runs, in fresh processes started in this checkout, ``python -c "import torch,
gymnasium, distributed"`` and then ``python -m tianji_dask train PIPELINE --seed R`` (R the
round), so neighbours share the machine's noise. Per round:

- import: process start to the three imports done;
- startup: process start to run start (the learner built), i.e. time_to_solve_from_process_start_s
  minus time_to_solve_s in results.json, with the process's start read on this script's clock
  when it launches it (as for the import), and its ratio to that round's import;
- each step of results.json's ``startup``;
- shutdown: the learner's stop (t_run_start + wall_s) to the process's exit.

It reports the median and range of each over the rounds. ``--checkout`` times another checkout
of this repository (an older revision: the steps it does not record are left out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import publish  # noqa: E402 - a sibling script

ROOT = Path(__file__).resolve().parent.parent  # the checkout whose package is timed
IMPORT = "import torch, gymnasium, distributed"
STEPS = ("import_s", "checked_s", "cluster_s", "learner_built_s", "first_chunk_s")


def import_round(python: str, root: Path) -> dict:
    """Seconds from starting the process to its imports done (its exit, slow with torch, apart)."""
    t0 = time.time()
    proc = subprocess.run([python, "-c", f"import time; {IMPORT}; print(time.time())"], cwd=root, check=True,
                          capture_output=True, text=True)
    return {"import_s": float(proc.stdout.split()[-1]) - t0, "import_wall_s": time.time() - t0}


def train_round(python: str, root: Path, pipeline: str, seed: int, max_seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out, log = Path(tmp) / "run", Path(tmp) / "log"
        cmd = [python, "-m", "tianji_dask", "train", pipeline, "--seed", str(seed), "--max-seconds", str(max_seconds),
               "--out", str(out), "--quiet"]
        with open(log, "w") as f:  # a file, not a pipe: wait() is the process's own exit
            t_launch = time.time()
            code = subprocess.Popen(cmd, cwd=root, stdout=f, stderr=subprocess.STDOUT).wait()
        t_exit = time.time()
        if code != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({code}):\n{log.read_text()[-3000:]}")
        r = json.loads((out / "results.json").read_text())
    startup = r.get("startup") or {}
    return {
        "seed": seed, "solved": r["solved"], "time_to_solve_s": r["time_to_solve_s"],
        # time_to_solve_from_process_start_s - time_to_solve_s, on one clock for every revision
        "startup_s": r["t_run_start"] - t_launch,
        **{f"startup.{k}": startup.get(k) for k in STEPS},
        "shutdown_s": t_exit - (r["t_run_start"] + r["wall_s"]),
    }


def summary(name: str, values: list[float]) -> str:
    return f"| {name} | {statistics.median(values):.2f} | {min(values):.2f}–{max(values):.2f} |"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pipeline", default="cartpole_ppo")
    parser.add_argument("--max-seconds", type=float, default=300, help="each run's time budget")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs both")
    parser.add_argument("--checkout", default=str(ROOT), help="the checkout whose package is timed (default: this one)")
    parser.add_argument("--out", help="write OUT.json (every round) and OUT.md (the table)")
    args = parser.parse_args(argv)
    root = Path(args.checkout)
    import_round(args.python, root)  # warm the disk cache once, untimed
    rounds = []
    for r in range(args.rounds):
        row = {**import_round(args.python, root), **train_round(args.python, root, args.pipeline, r, args.max_seconds)}
        row["startup_ratio"] = row["startup_s"] / row["import_s"]
        row["startup_ratio_wall"] = row["startup_s"] / row["import_wall_s"]
        rounds.append(row)
        print(f"round {r}: import {row['import_s']:.2f} s, startup {row['startup_s']:.2f} s "
              f"({row['startup_ratio']:.2f}x), shutdown {row['shutdown_s']:.2f} s, "
              f"time to solve {row['time_to_solve_s'] if row['time_to_solve_s'] is None else round(row['time_to_solve_s'], 2)}",
              flush=True)
    lines = ["| figure | median | range |", "|---|---|---|",
             summary(f"`{IMPORT}` (s, to imports done)", [r["import_s"] for r in rounds]),
             summary(f"`{IMPORT}` (s, to its exit)", [r["import_wall_s"] for r in rounds]),
             summary("startup: process start to run start (s)", [r["startup_s"] for r in rounds]),
             summary("startup ÷ import to imports done, per round", [r["startup_ratio"] for r in rounds]),
             summary("startup ÷ import to its exit, per round", [r["startup_ratio_wall"] for r in rounds])]
    lines += [summary(f"startup step `{k}` (s after process start)", [r[f"startup.{k}"] for r in rounds])
              for k in STEPS if all(r[f"startup.{k}"] is not None for r in rounds)]
    lines.append(summary("shutdown: learner stopped to process exit (s)", [r["shutdown_s"] for r in rounds]))
    solved = [r["startup_s"] + r["time_to_solve_s"] for r in rounds if r["time_to_solve_s"] is not None]
    if solved:
        lines.append(summary(f"time to solve from process start, {len(solved)} solved (s)", solved))
    publish("\n".join(lines), args.out, "startup.py", argv, args, rounds, "Start-up and shutdown",
            f"medians over {args.rounds} alternated rounds of {args.pipeline}, each in a fresh process")
    return 0


if __name__ == "__main__":
    sys.exit(main())
