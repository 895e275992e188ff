"""PPO on one-version-old segments or on fresh ones: what the lag costs per update and in time.

    python benchmarks/ppo_lag_study.py [--pipeline minatar_breakout_ppo] [--variants lag1 lag0]
        [--seeds 0 1 2] [--max-seconds 600] [--out benchmarks/results/ppo_lag_study]

A variant is ``lagN`` (relaxed mode, ``algo.config.max_policy_lag: N``: segments more than N versions
old are dropped) or ``lockstep`` (each update waits for segments of the version just published).
Variants alternate run by run within each seed, on one embedded cluster of two workers, so
neighbouring runs share the machine's noise. For each run: time-to-solve from run start, the
updates and env steps it took, env steps per update (above the batch when segments were dropped
as too old), updates per second and the learner's busy fraction. The medians over seeds answer
whether PPO's updates go further on fresh data, and whether that pays in wall time.

Writes ``<out>.json`` (every run) and ``<out>.md`` (per-run rows and medians).
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import median_of, runs_parser, write_report  # noqa: E402 - sibling scripts
from _studies import run_summary, shared_cluster  # noqa: E402


def variant_overrides(variant: str, seed: int, max_seconds: float) -> dict:
    ov = {"seed": seed, "stop.max_seconds": max_seconds}
    if variant == "lockstep":
        ov["mode"] = "lockstep"
    else:
        ov["mode"] = "relaxed"
        ov["algo.config.max_policy_lag"] = int(variant[3:])
    return ov


def _run(client, pipeline: str, variant: str, seed: int, max_seconds: float, tmp: Path) -> dict:
    row = run_summary(client, pipeline, variant_overrides(variant, seed, max_seconds), tmp)
    updates = row["updates"] or 0
    row.update(variant=variant, updates=updates,
               env_steps_per_update=row["env_steps"] / updates if updates else None,
               updates_per_s=updates / row["wall_s"] if row["wall_s"] else None)
    return row


def _fmt(x, spec=".0f", none="-"):
    return none if x is None else format(x, spec)


def table(rows: list[dict], variants: list[str]) -> str:
    out = ["| variant | seed | solved | time-to-solve (s) | updates | env steps | env steps / update | updates/s | learner busy |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['variant']} | {r['seed']} | {'yes' if r['solved'] else 'no'} | {_fmt(r['time_to_solve_s'], '.1f')} | "
                   f"{r['updates']} | {r['env_steps']:,} | {_fmt(r['env_steps_per_update'])} | "
                   f"{_fmt(r['updates_per_s'], '.2f')} | {_fmt(r['learner_busy'], '.2f')} |")
    out += ["", "Medians over seeds (time-to-solve and updates of solved runs only; the solved count beside):", "",
            "| variant | solved | time-to-solve (s) | updates to solve | env steps to solve | env steps / update | updates/s |",
            "|---|---|---|---|---|---|---|"]
    for v in variants:
        rs = [r for r in rows if r["variant"] == v]
        ok = [r for r in rs if r["solved"]]
        out.append(f"| {v} | {len(ok)}/{len(rs)} | {_fmt(median_of(r['time_to_solve_s'] for r in ok), '.1f')} | "
                   f"{_fmt(median_of(r['updates'] for r in ok))} | {_fmt(median_of(r['env_steps'] for r in ok), ',.0f')} | "
                   f"{_fmt(median_of(r['env_steps_per_update'] for r in rs))} | "
                   f"{_fmt(median_of(r['updates_per_s'] for r in rs), '.2f')} |")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = runs_parser(__doc__, max_seconds=600, out="benchmarks/results/ppo_lag_study")
    parser.add_argument("--pipeline", default="minatar_breakout_ppo")
    parser.add_argument("--variants", nargs="+", default=["lag1", "lag0"])
    args = parser.parse_args(argv)
    for v in args.variants:
        if v != "lockstep" and not re.fullmatch(r"lag\d+", v):
            parser.error(f"--variants: {v!r} is not lagN (N >= 0) or lockstep")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, shared_cluster(2) as client:
        for i, seed in enumerate(args.seeds):
            k = i % len(args.variants)  # the first variant rotates from seed to seed
            for variant in args.variants[k:] + args.variants[:k]:
                row = _run(client, args.pipeline, variant, seed, args.max_seconds, Path(tmp))
                rows.append(row)
                print(f"{variant} seed {seed}: tts {_fmt(row['time_to_solve_s'], '.1f', 'unsolved')} s, "
                      f"{row['updates']} updates, {row['env_steps']:,} env steps", flush=True)
    text = table(rows, args.variants)
    write_report(args.out, "ppo_lag_study.py", argv, args, rows, f"PPO policy lag on {args.pipeline}",
                 "one embedded cluster of two workers, variants alternated within each seed", text)
    print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
