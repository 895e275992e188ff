"""Group mode scaling: throughput and time-to-solve for G learner groups, side by side.

    python benchmarks/groups_scaling.py [--pipelines cartpole_dqn cartpole_ppo] [--groups 1 2]
                                        [--explorers 1] [--seeds 0 1 2] [--max-seconds 400]
                                        [--out benchmarks/results/groups_scaling]

Every (pipeline, G) runs once per seed, alternating G seed by seed (machines here are noisy, so
neighbours share the noise), each in a fresh process with an embedded LocalCluster of G learner
workers and min(G x explorers, cores) explorer workers. Reports per run and as medians over seeds:
time to solve from run start, env steps per second produced, learner updates per second (all
groups), fusion rounds, and the ratios to G = 1. On a machine with as many cores as learners plus
explorers the same command shows how far groups scale; on 2 cores they share the cores, so
G = 2 measures the cost of group mode more than its gain.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import median_of, runs_parser, write_report  # noqa: E402 - sibling scripts
from time_to_solve import run_once  # noqa: E402


def summarize(r: dict) -> dict:
    wall = max(r["wall_s"], 1e-9)
    busy = r["learner_busy_fraction"]
    return {
        "seed": r["seed"], "groups": r.get("groups", 1), "solved": r["solved"], "time_to_solve_s": r["time_to_solve_s"],
        "wall_s": wall, "env_steps": r["env_steps"], "env_steps_per_s": r["env_steps"] / wall,
        "updates_per_s": r["updates"] / wall, "fusion_rounds": len(r.get("fusion", {}).get("rounds", [])),
        "learner_busy": busy if isinstance(busy, list) else [busy],
    }


def table(rows: list[dict], groups: list[int]) -> str:
    out = ["| pipeline | G | solved | median time to solve (s) | ÷ G=1 | env steps/s | ÷ G=1 | updates/s | fusion rounds | learner busy |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for pipeline in dict.fromkeys(r["pipeline"] for r in rows):
        base = None
        for g in groups:
            rs = [r for r in rows if r["pipeline"] == pipeline and r["groups"] == g]
            solved = [r for r in rs if r["solved"]]
            tts = median_of(r["time_to_solve_s"] for r in rs) if len(solved) == len(rs) else None
            sps = median_of(r["env_steps_per_s"] for r in rs)
            if g == groups[0]:
                base = (tts, sps)
            ratio_t = f"{tts / base[0]:.2f}" if tts and base[0] else "-"
            ratio_s = f"{sps / base[1]:.2f}" if sps and base[1] else "-"
            busy = median_of(statistics.mean(r["learner_busy"]) for r in rs)
            out.append(
                f"| {pipeline} | {g} | {len(solved)}/{len(rs)} | {'-' if tts is None else f'{tts:.1f}'} | {ratio_t} | "
                f"{sps:,.0f} | {ratio_s} | {median_of(r['updates_per_s'] for r in rs):.1f} | "
                f"{median_of(r['fusion_rounds'] for r in rs):.0f} | {busy:.0%} |")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = runs_parser(__doc__, max_seconds=400)
    parser.add_argument("--pipelines", nargs="+", default=["cartpole_dqn", "cartpole_ppo"])
    parser.add_argument("--groups", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--explorers", type=int, default=1, help="explorer streams per group")
    args = parser.parse_args(argv)

    rows = []
    for seed in args.seeds:
        for pipeline in args.pipelines:
            for g in args.groups:
                r = run_once(pipeline, seed, "relaxed", args.max_seconds,
                             ["--groups", str(g), "--explorers", str(args.explorers)])
                row = {"pipeline": pipeline, **summarize(r)}
                rows.append(row)
                tts = row["time_to_solve_s"]
                print(f"{pipeline:>14} G={g} seed {seed}: "
                      + (f"solved in {tts:.1f} s" if tts is not None else f"NOT solved in {row['wall_s']:.0f} s")
                      + f", {row['env_steps_per_s']:,.0f} env steps/s, {row['updates_per_s']:.1f} updates/s, "
                      f"{row['fusion_rounds']} fusion rounds", flush=True)
    text = table(rows, args.groups)
    print(f"\nmedians over seeds {args.seeds}, {args.explorers} explorer(s) per group, {os.cpu_count()} cores:\n{text}")
    if args.out:
        write_report(args.out, "groups_scaling.py", argv, args, rows, "Group mode scaling", f"medians over seeds {args.seeds}, {args.explorers} explorer stream(s) per group", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
