"""The same benchmark at two revisions of this repository, alternated seed by seed in one run.

    python benchmarks/compare_revisions.py --revs BEFORE AFTER --seeds 0 1 2 3 4 5 \\
        [--out benchmarks/results/compare] -- time_to_solve --pipelines cartpole_ppo cartpole_dqn
    python benchmarks/compare_revisions.py --revs BEFORE AFTER --seeds 0 1 2 3 -- overhead --seconds 30
    python benchmarks/compare_revisions.py --revs BEFORE AFTER --seeds 0 1 2 3 4 -- learner_roofline --cases sac_64

Each revision is checked out into a temporary git worktree and runs its own copy of the
benchmark script (``time_to_solve`` or ``overhead``) with its own package first on the path, one
seed at a time (``learner_roofline``: AFTER's copy of the script for both, as an older one may
lack ``--seeds``; it imports only the package, so each revision's updates are what it times),
the revisions taking turns (the first one goes first on even seeds), so neighbouring runs share
the machine's noise. It prints, per figure and pipeline, each revision's
median and range over the seeds and the median of the per-seed ratios (AFTER / BEFORE).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import write_report  # noqa: E402 - a sibling script

ROOT = Path(__file__).resolve().parent.parent
#: per benchmark: the figures compared, each read off one run's record
FIGURES = {
    "time_to_solve": {"time-to-solve (s)": lambda r: r["time_to_solve_s"],
                      "from process start (s)": lambda r: r["time_to_solve_from_process_start_s"],
                      "learner built (s after process start)": lambda r: (r.get("startup") or {}).get("learner_built_s"),
                      "env steps": lambda r: r["env_steps"]},
    "overhead": {"dataflow overhead": lambda r: r["overhead"], "learner busy": lambda r: r["learner_busy"],
                 "env steps/s": lambda r: r["env_steps_per_s"]},
    "learner_roofline": {"updates/s": lambda r: r["updates_per_s"]},
}


@contextlib.contextmanager
def worktrees(revs: list[str]):
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        try:
            for i, rev in enumerate(revs):
                path = Path(tmp) / f"rev{i}"
                subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev], check=True,
                               capture_output=True)
                paths.append(path)
            yield paths
        finally:
            for path in paths:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], capture_output=True)


def run_one(tree: Path, benchmark: str, seed: int, rest: list[str], script_tree: Path | None = None) -> list[dict]:
    """One seed of ``benchmark`` at the revision in ``tree`` (the script from ``script_tree``,
    default ``tree``): its runs, each with its pipeline (a roofline's case) and seed."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        flag = ["--json", str(out.with_suffix(".json"))] if benchmark == "time_to_solve" else ["--out", str(out)]
        cmd = [sys.executable, str((script_tree or tree) / "benchmarks" / f"{benchmark}.py"), "--seeds", str(seed), *flag, *rest]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        subprocess.run(cmd, check=True, cwd=tree, env=env, stdout=subprocess.DEVNULL)
        data = json.loads(out.with_suffix(".json").read_text())
    if benchmark == "time_to_solve":
        return [{**r, "pipeline": pipeline} for pipeline, rs in data.items() for r in rs]
    if benchmark == "learner_roofline":
        return [{**r, "pipeline": r["case"]} for r in data["runs"] if "case" in r]
    return data["runs"]


def table(records: dict[str, list[dict]], revs: list[str], benchmark: str) -> str:
    before, after = revs
    lines = [f"| pipeline | figure | {before}: median (range) | {after}: median (range) | per-seed ratio {after} ÷ {before}, median |",
             "|---|---|---|---|---|"]
    pipelines = dict.fromkeys(r["pipeline"] for r in records[before])
    for pipeline in pipelines:
        rows = {rev: {r["seed"]: r for r in records[rev] if r["pipeline"] == pipeline} for rev in revs}
        for figure, get in FIGURES[benchmark].items():
            cells = []
            for rev in revs:
                values = [get(r) for r in rows[rev].values() if get(r) is not None]
                cells.append(f"{statistics.median(values):.4g} ({min(values):.4g}–{max(values):.4g})" if values else "-")
            ratios = [get(rows[after][s]) / get(rows[before][s]) for s in rows[before]
                      if s in rows[after] and get(rows[before][s]) and get(rows[after][s]) is not None]
            lines.append(f"| {pipeline} | {figure} | {cells[0]} | {cells[1]} | "
                         f"{statistics.median(ratios):.3f} |" if ratios else f"| {pipeline} | {figure} | {cells[0]} | {cells[1]} | - |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv and not {"-h", "--help"} & set(argv):
        print("compare_revisions: give the benchmark after --, e.g. -- time_to_solve --pipelines cartpole_ppo", file=sys.stderr)
        return 2
    split = argv.index("--") if "--" in argv else len(argv)
    own, rest = argv[:split], argv[split + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--revs", nargs=2, required=True, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", help="write OUT.json (every run) and OUT.md (the table)")
    args = parser.parse_args(own)
    if not rest or rest[0] not in FIGURES:
        print(f"compare_revisions: the benchmark must be one of {', '.join(FIGURES)}", file=sys.stderr)
        return 2
    benchmark, rest = rest[0], rest[1:]
    records: dict[str, list[dict]] = {rev: [] for rev in args.revs}
    with worktrees(args.revs) as trees:
        for i, seed in enumerate(args.seeds):
            order = list(zip(args.revs, trees))
            for rev, tree in order if i % 2 == 0 else order[::-1]:
                runs = run_one(tree, benchmark, seed, rest, trees[-1] if benchmark == "learner_roofline" else None)
                records[rev] += runs
                print(f"seed {seed} {rev}: " + "; ".join(
                    f"{r['pipeline']} " + ", ".join(f"{name} {get(r)}" for name, get in FIGURES[benchmark].items())
                    for r in runs), flush=True)
    text = table(records, args.revs, benchmark)
    print("\n" + text)
    if args.out:
        write_report(args.out, "compare_revisions.py", argv, args, [{"rev": rev, **r} for rev, rs in records.items() for r in rs],
                     f"{benchmark} at two revisions", f"seeds {args.seeds}, the revisions alternated seed by seed", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
