"""Scaling the learner: one learner, G groups or N replicas, side by side.

    python benchmarks/learner_scaling.py [--pipelines cartpole_dqn cartpole_ppo] [--layouts 1 g2 r2]
                                         [--explorers 1] [--seeds 0 1 2] [--max-seconds 400]
                                         [--set learner.simulated_step_ms=60 stop.target_return=10000]
                                         [--netns-rate 1gbit] [--out benchmarks/results/learner_scaling]

A layout is ``1`` (one learner), ``gG`` (G groups: G models, averaged every reduce.every updates)
or ``rN`` (N replicas: one policy, every gradient step averaged). Every learner gets
``--explorers`` explorer streams of its own. Every (pipeline, layout) runs once per seed,
alternating layouts seed by seed (machines here are noisy, so neighbours share the noise), each in
a fresh process with an embedded LocalCluster of one learner worker per group or replica.
Reports per run and as medians over seeds: time to solve from run start, env steps per second,
samples trained per second (env steps trained on, over all learners), learner updates per second
(groups: summed; replicas: the policy's), the share of the learner's time in the replicas'
all-reduces, and the ratios to the first layout. ``--set`` passes pipeline fields to every run:
``learner.simulated_step_ms`` gives each gradient step a simulated cost, so that replicas on this
machine scale as on hosts of their own (the all-reduces and the data are real), and an
unreachable ``stop.target_return`` turns the runs into fixed-time throughput measurements. With
``--netns-rate`` (root) every run goes to hosts made of network namespaces (``netns.py``): a host
per learner, one for the scheduler, explorer hosts as many as the embedded cluster's explorer
processes, links capped at that rate, so that chunks, weights and the replicas' all-reduces cross
TCP between hosts.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import median_of, runs_parser, write_report  # noqa: E402 - sibling scripts
from time_to_solve import run_once  # noqa: E402


def layout_args(layout: str, explorers: int) -> list[str]:
    """The CLI flags of ``layout`` (1, gG or rN) with ``explorers`` streams per learner."""
    if layout == "1":
        return ["--explorers", str(explorers)]
    kind, n = layout[0], int(layout[1:])
    if kind == "g":
        return ["--groups", str(n), "--explorers", str(explorers)]
    if kind == "r":
        return ["--learner-replicas", str(n), "--explorers", str(n * explorers)]
    raise SystemExit(f"--layouts: {layout!r} is not 1, gG or rN")


def netns_prefix(layout: str, explorers: int, rate: str) -> list[str]:
    """The ``netns.py`` command a run of ``layout`` goes under: a host for each learner, one for the
    scheduler, and for the explorers as many hosts as an embedded cluster here starts explorer
    processes (one per core, at most one per stream), their streams shared out in threads."""
    learners = 1 if layout == "1" else int(layout[1:])
    streams = explorers * learners
    explorer_hosts = max(1, min(streams, os.cpu_count() or 1))
    return [sys.executable, str(Path(__file__).resolve().parent / "netns.py"), "--hosts",
            str(learners + 1 + explorer_hosts), "--learners", str(learners),
            "--explorer-threads", str(-(-streams // explorer_hosts)), "--rate", rate, "--"]


def summarize(r: dict) -> dict:
    wall = max(r["wall_s"], 1e-9)
    busy = r["learner_busy_fraction"]
    replicas = (r.get("replicas") or {}).get("per_replica") or []
    learn = [x["learner_time"]["seconds"]["learn"] for x in (r.get("replica_results") or [r]) if x.get("learner_time")]
    return {
        "seed": r["seed"], "solved": r["solved"], "time_to_solve_s": r["time_to_solve_s"], "wall_s": wall,
        "env_steps": r["env_steps"], "env_steps_per_s": r["env_steps"] / wall,
        "samples_trained_per_s": r["env_steps_trained"] / wall, "updates_per_s": r["updates"] / wall,
        "fusion_rounds": len((r.get("fusion") or {}).get("rounds", [])),
        "allreduce_share": (statistics.mean(x["allreduce_s"] for x in replicas) / statistics.mean(learn)
                            if replicas and learn and statistics.mean(learn) else None),
        "learner_busy": busy if isinstance(busy, list) else [busy],
    }


def table(rows: list[dict], layouts: list[str]) -> str:
    out = ["| pipeline | layout | solved | median time to solve (s) | ÷ first | env steps/s | samples trained/s | "
           "÷ first | updates/s | all-reduce share of learning | learner busy |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for pipeline in dict.fromkeys(r["pipeline"] for r in rows):
        base = None
        for layout in layouts:
            rs = [r for r in rows if r["pipeline"] == pipeline and r["layout"] == layout]
            solved = [r for r in rs if r["solved"]]
            tts = median_of(r["time_to_solve_s"] for r in rs) if solved and len(solved) == len(rs) else None
            trained = median_of(r["samples_trained_per_s"] for r in rs)
            if base is None:
                base = (tts, trained)
            ratio_t = f"{tts / base[0]:.2f}" if tts and base[0] else "-"
            ratio_s = f"{trained / base[1]:.2f}" if trained and base[1] else "-"
            shares = [r["allreduce_share"] for r in rs if r["allreduce_share"] is not None]
            busy = median_of(statistics.mean(r["learner_busy"]) for r in rs)
            out.append(
                f"| {pipeline} | {layout} | {len(solved)}/{len(rs)} | {'-' if tts is None else f'{tts:.1f}'} | {ratio_t} | "
                f"{median_of(r['env_steps_per_s'] for r in rs):,.0f} | {trained:,.0f} | {ratio_s} | "
                f"{median_of(r['updates_per_s'] for r in rs):.1f} | "
                f"{f'{median_of(shares):.0%}' if shares else '-'} | {busy:.0%} |")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = runs_parser(__doc__, max_seconds=400)
    parser.add_argument("--pipelines", nargs="+", default=["cartpole_dqn", "cartpole_ppo"])
    parser.add_argument("--layouts", nargs="+", default=["1", "g2", "r2"])
    parser.add_argument("--explorers", type=int, default=1, help="explorer streams per learner (group or replica)")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="pipeline fields for every run")
    parser.add_argument("--netns-rate", metavar="RATE", help="run on namespace hosts with links of this rate (root)")
    args = parser.parse_args(argv)
    for layout in args.layouts:
        layout_args(layout, args.explorers)  # a bad layout stops here, before any run
    extra = [flag for setting in args.set for flag in ("--set", setting)]

    rows = []
    for seed in args.seeds:
        for pipeline in args.pipelines:
            for layout in args.layouts:
                prefix = netns_prefix(layout, args.explorers, args.netns_rate) if args.netns_rate else []
                r = run_once(pipeline, seed, "relaxed", args.max_seconds, layout_args(layout, args.explorers) + extra,
                             prefix=prefix)
                row = {"pipeline": pipeline, "layout": layout, **summarize(r)}
                rows.append(row)
                tts = row["time_to_solve_s"]
                print(f"{pipeline:>14} {layout:>3} seed {seed}: "
                      + (f"solved in {tts:.1f} s" if tts is not None else f"not solved in {row['wall_s']:.0f} s")
                      + f", {row['env_steps_per_s']:,.0f} env steps/s, {row['samples_trained_per_s']:,.0f} samples "
                      f"trained/s, {row['updates_per_s']:.1f} updates/s", flush=True)
    text = table(rows, args.layouts)
    about = f"medians over seeds {args.seeds}, {args.explorers} explorer stream(s) per learner" + (
        f", {' '.join(args.set)}" if args.set else "") + (
        f", on network-namespace hosts with {args.netns_rate} links" if args.netns_rate else "")
    print(f"\n{about}, {os.cpu_count()} cores:\n{text}")
    if args.out:
        write_report(args.out, "learner_scaling.py", argv, args, rows, "Scaling the learner", about, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
