"""Variants of one pipeline's settings over many seeds: how often each solves, and how fast.

    python benchmarks/variant_study.py --pipeline hopper_ppo --seeds 0-19 --max-seconds 300 \\
        --variant base --variant anneal algo.config.anneal_lr_steps=1000000 \\
        [--out benchmarks/results/variant_study/hopper_anneal]

A variant is a name and the dotted-key settings it changes (none: the pipeline as bundled). Each
seed trains every variant once, the variants' order turned seed by seed so that none always goes
first (neighbouring runs share the machine's noise); each run is a fresh ``tianji-dask train``
process. A seed that stays below its target is the question here, so every run records the best
and the last 100-episode mean it reached, and its last update's statistics (entropy, KL, rate).

Per variant: runs solved, the median time-to-solve of those solved with its range, the unsolved
runs' best means, and P(this variant solves sooner than the first), an unsolved run counting as
slower than any solved one. With ``--out``, OUT.json is rewritten after every run and a study
started again with the same arguments goes on from the runs it holds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import commit, fmt, median_of, write_atomically, write_report
from time_to_solve import parse_sets, pipeline_copy, run_once

KEPT = ("solved", "time_to_solve_s", "time_to_solve_from_process_start_s", "env_steps", "wall_s", "stop_reason",
        "final_mean_return", "updates")
STATS = ("entropy", "approx_kl", "clipfrac", "lr")
WINDOW = 100


def seeds(text: str) -> list[int]:
    """``0-19`` or ``3``: the seeds of one argument."""
    lo, sep, hi = text.partition("-")
    try:
        return list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a seed or a range like 0-19, got {text!r}") from None


def best_mean(returns: list[float]) -> float | None:
    """The highest mean of ``WINDOW`` consecutive episodes (fewer: None)."""
    if len(returns) < WINDOW:
        return None
    sums = np.convolve(np.asarray(returns, dtype=float), np.ones(WINDOW), mode="valid")
    return float(sums.max() / WINDOW)


def faster(mine: list[dict], theirs: list[dict], budget: float) -> float | None:
    """P(a run of ``mine`` solves sooner than one of ``theirs``), ties half; unsolved at the budget."""
    def t(run):
        return run["time_to_solve_s"] if run["solved"] else budget * 2
    pairs = [(t(a), t(b)) for a in mine for b in theirs]
    return sum(1.0 if a < b else 0.5 if a == b else 0.0 for a, b in pairs) / len(pairs) if pairs else None


def table(runs: list[dict], names: list[str], budget: float) -> str:
    lines = ["| variant | settings | solved | time-to-solve of the solved, median s | range | "
             "unsolved: best 100-episode mean | P(sooner than " + names[0] + ") |", "|---|---|---|---|---|---|---|"]
    first = [r for r in runs if r["variant"] == names[0]]
    for name in names:
        rs = [r for r in runs if r["variant"] == name]
        if not rs:
            continue
        tts = [r["time_to_solve_s"] for r in rs if r["solved"]]
        stuck = ", ".join(fmt(r["best_mean_return"], ",.0f") for r in rs if not r["solved"]) or "–"
        settings = " ".join(f"`{k}={v}`" for k, v in rs[0]["settings"].items()) or "as bundled"
        lines.append(f"| {name} | {settings} | {len(tts)}/{len(rs)} | {fmt(median_of(tts), ',.1f')} | "
                     f"{fmt(min(tts), ',.1f') + '–' + fmt(max(tts), ',.1f') if tts else '–'} | {stuck} | "
                     f"{'reference' if name == names[0] else fmt(faster(rs, first, budget), '.2f')} |")
    return "\n".join(lines)


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--variant", nargs="+", action="append", required=True, metavar=("NAME", "KEY=VALUE"),
                        help="a name and the settings it changes (dotted keys, YAML values); give two or more")
    parser.add_argument("--seeds", nargs="+", type=seeds, default=[[0, 1, 2]])
    parser.add_argument("--max-seconds", type=float, default=300, help="each run's budget (unsolved past it)")
    parser.add_argument("--out", help="write OUT.json (every run, after each) and OUT.md (the table)")
    args = parser.parse_args(argv)
    args.seeds = [s for group in args.seeds for s in group]
    names = [v[0] for v in args.variant]
    if len(set(names)) != len(names) or len(names) < 2:
        parser.error("--variant: give two or more, each with a name of its own")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    variants = {v[0]: parse_sets(v[1:], "--variant") for v in args.variant}
    names = list(variants)
    runs: list[dict] = []
    out = Path(args.out).with_suffix(".json") if args.out else None
    if out is not None and out.exists():  # go on from a study started with the same arguments
        held = json.loads(out.read_text())
        if {k: held["args"].get(k) for k in ("pipeline", "variant", "max_seconds")} != \
                {"pipeline": args.pipeline, "variant": args.variant, "max_seconds": args.max_seconds}:
            print(f"--out: {out} holds a study with other arguments; name another file", file=sys.stderr)
            return 2
        runs = held["runs"]
    done = {(r["variant"], r["seed"]) for r in runs}
    for n, seed in enumerate(args.seeds):
        for name in names[n % len(names):] + names[:n % len(names)]:
            if (name, seed) in done:
                continue
            with pipeline_copy(args.pipeline, variants[name]) as path:
                result = run_once(path, seed, "relaxed", args.max_seconds, [], returns=True)
            stats = result.get("last_update_metrics") or {}
            run = {"variant": name, "settings": variants[name], "seed": seed, **{k: result.get(k) for k in KEPT},
                   "best_mean_return": best_mean(result["returns"]), "episodes": len(result["returns"]),
                   "last_update": {k: stats[k] for k in STATS if k in stats}, "commit": commit()}
            runs.append(run)
            print(f"{name} seed {seed}: " + (
                f"solved in {run['time_to_solve_s']:.1f} s, {run['env_steps']:,} env steps" if run["solved"] else
                f"NOT solved in {run['wall_s']:.0f} s ({run['env_steps']:,} env steps), best mean "
                f"{fmt(run['best_mean_return'], ',.0f')}, last {fmt(run['final_mean_return'], ',.0f')}"), flush=True)
            if out is not None:  # whole or not at all: a study stopped mid-write keeps what it had
                write_atomically(out, json.dumps({"args": vars(args), "runs": runs}, indent=2))
    text = table(runs, names, args.max_seconds)
    print("\n" + text)
    if args.out:
        write_report(args.out, "variant_study.py", argv, args, runs, f"Variants of {args.pipeline}",
                     f"seeds {' '.join(map(str, args.seeds))}, the variants' order turned seed by seed, each run a "
                     f"fresh process with a {args.max_seconds:g} s budget", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
