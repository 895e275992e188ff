"""Scale on one machine, simulated: many explorer streams whose env steps carry a simulated cost
(``env.step_cost_ms``: sleep standing for a simulator's CPU elsewhere; dynamics and learning stay
real), and hosts as network namespaces.

    python benchmarks/scale.py throughput [--explorers 1 2 4 8 16 32 64] [--step-cost-ms 2] [--seconds 20]
                                          [--variants dqn-ingest dqn impala] [--out benchmarks/results/scale_throughput]
    python benchmarks/scale.py stragglers [--explorers 8 16 32] [--jitter 0.5 1.0] [--step-cost-ms 1]
                                          [--pipeline cartpole_impala] [--seeds 0 1 2] [--out benchmarks/results/scale_stragglers]
    python benchmarks/scale.py staleness  [--targets 1 2 4 8 16 64] [--explorers 8 32 64] [--jitter 0 1.0] [--step-cost-ms 1]
                                          [--pipelines cartpole_impala cartpole_ppo] [--seeds 0 1 2]
                                          [--out benchmarks/results/scale_staleness]
    python benchmarks/scale.py hosts      [--hosts 1 2 4 8] [--explorers-per-host 8] [--step-cost-ms 2] [--seconds 20]
                                          [--out benchmarks/results/scale_hosts]          # needs root

Every run is a fresh ``tianji-dask train`` process on an embedded LocalCluster (``hosts``: on
namespace hosts), and runs alternate the settings they compare seed by seed. Each subcommand
writes OUT.json (every run's figures), OUT.md (the table) and OUT.png (its plot); ``staleness``
(``_scale_staleness.py``) also keeps one file per run under ``--cells`` (committed, as the suite's
raw files are) and reads those instead of rerunning them, so a grid of seeds can be spread over
several sittings.

- ``throughput``: consumed env steps/s at each explorer count, and its fraction of linear
  (count x the one-explorer rate), for an ingest-only learner (DQN that never reaches its warm-up)
  and training learners; with the per-chunk costs that set the ceiling (the scheduler's CPU, the
  learner's dataflow time, bytes) and the projection of how many explorers one learner feeds.
- ``stragglers``: relaxed against lockstep time-to-solve with per-chunk jitter (TianJi's claim).
- ``staleness``: mean staleness held at each target (the second half of each run, past the start's
  transient), the controller's verdict on it, and time-to-solve against the target.
- ``hosts``: throughput with 1, 2, 4, 8 explorer hosts of ``--explorers-per-host`` streams each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import median_of, write_report  # noqa: E402 - sibling scripts
from _scale_runs import explorer_threads, figures, plot, train_cell  # noqa: E402
from _scale_staleness import staleness  # noqa: E402
from time_to_solve import pipeline_copy  # noqa: E402

VARIANTS = {  # throughput variants: (pipeline, overrides)
    "dqn-ingest": ("cartpole_dqn", {"algo.config.learning_starts": 10**12, "controller.replay_ratio": None}),
    "dqn": ("cartpole_dqn", {}),
    "impala": ("cartpole_impala", {}),
    # a busy learner takes every waiting chunk, up to 8, into one update
    "impala-batched": ("cartpole_impala", {"algo.config.max_segments_per_batch": 8}),
    "ppo": ("cartpole_ppo", {}),
}


def throughput(args, argv) -> int:
    rows = []
    for n in args.explorers:
        for variant in args.variants:
            pipeline, overrides = VARIANTS[variant]
            o = {**overrides, "explorers": n, "env.step_cost_ms": args.step_cost_ms, "stop.target_return": None,
                 "stop.on_solve": False, "cluster.explorer_threads": explorer_threads(n), "chunk_steps": args.chunk_steps,
                 **args.set}
            row = {"variant": variant, **figures(train_cell(pipeline, o, 0, "relaxed", args.seconds))}
            rows.append(row)
            print(f"{variant:>10} x{n:>3}: {row['env_steps_per_s']:,.0f} env steps/s, learner busy {row['learner_busy']:.0%}, "
                  f"scheduler {row['scheduler_cpu_ms_per_chunk']:.2f} ms CPU/chunk, learner dataflow "
                  f"{row['learner_dataflow_ms_per_chunk']:.2f} ms/chunk", flush=True)
    lines = ["| variant | explorers | env steps/s consumed | fraction of linear | learner busy | chunks/s | scheduler CPU ms/chunk "
             "| learner dataflow ms/chunk | learner ingest ms/chunk | memory per stream (MiB) |", "|" + "---|" * 10]
    series, linear = {}, {}
    for variant in args.variants:
        rs = sorted((r for r in rows if r["variant"] == variant), key=lambda r: r["explorers"])
        base = next((r["env_steps_per_s"] / r["explorers"] for r in rs if r["explorers"] == min(args.explorers)), None)
        series[variant] = [(r["explorers"], r["env_steps_per_s"]) for r in rs]
        for r in rs:
            r["fraction_of_linear"] = r["env_steps_per_s"] / (base * r["explorers"]) if base else None
            mem = r["explorer_bytes_per_stream"]
            lines.append(f"| {variant} | {r['explorers']} | {r['env_steps_per_s']:,.0f} | {r['fraction_of_linear']:.2f} | "
                         f"{r['learner_busy']:.0%} | {r['chunks_per_s']:.1f} | {r['scheduler_cpu_ms_per_chunk']:.2f} | "
                         f"{r['learner_dataflow_ms_per_chunk']:.2f} | {r['learner_ingest_ms_per_chunk']:.2f} | "
                         f"{'-' if mem is None else f'{mem / 2**20:.1f}'} |")
        if base:
            linear[f"linear ({variant})"] = [(n, base * n) for n in args.explorers]
    text = "\n".join(lines) + "\n\n" + projection(rows)
    print("\n" + text)
    if args.out:
        write_report(args.out, "scale.py", argv, args, rows, "Consumed throughput against explorers (simulated env cost)",
                     f"{args.seconds:g} s a run, env.step_cost_ms {args.step_cost_ms:g}", text)
        plot(Path(args.out).with_suffix(".png"), series, "explorers", "env steps/s consumed",
              f"env.step_cost_ms {args.step_cost_ms:g} (simulated)", logx=True, linear=linear)
    return 0


def per_chunk_costs(rows: list[dict]) -> dict:
    """Seconds of work per chunk as the slope of each total against the chunks consumed, over
    runs at different explorer counts (the intercept is what costs the same however many chunks:
    heartbeats, the client, the nannies)."""
    import numpy as np

    x = np.array([r["chunks"] for r in rows], float)
    out = {}
    for name, key in (("scheduler CPU", "scheduler_cpu_s"), ("learner dataflow", "learner_dataflow_s"),
                      ("learner ingest", "learner_ingest_s")):
        slope, intercept = np.polyfit(x, np.array([r[key] for r in rows], float), 1) if len(set(x)) > 1 else (0.0, 0.0)
        out[name] = (float(slope), float(intercept))
    return out


def projection(rows: list[dict]) -> str:
    """How many explorers one learner feeds when the scheduler and the learner have a core each:
    the chunk rate at which the busier of the two is saturated by per-chunk work alone."""
    ingest = [r for r in rows if r["variant"] == "dqn-ingest"] or rows
    costs = per_chunk_costs(ingest)
    scheduler_s = costs["scheduler CPU"][0]
    learner_s = costs["learner dataflow"][0] + costs["learner ingest"][0]
    per_chunk_s = max(scheduler_s, learner_s, 1e-9)
    one = min(x["explorers"] for x in ingest)
    per_explorer = min(r["env_steps_per_s"] / r["explorers"] for r in ingest if r["explorers"] == one)
    out = ["Per-chunk costs (slope against chunks consumed, over the ingest-only runs): " + "; ".join(
               f"{name} {1e3 * slope:.2f} ms a chunk (+{intercept:.1f} s a run)" for name, (slope, intercept) in costs.items()) + ".",
           f"The busier of scheduler and learner needs {1e3 * per_chunk_s:.2f} ms a chunk, so with a core each they take "
           f"at most {1 / per_chunk_s:,.0f} chunks/s.", "",
           "| chunk size (env steps) | env steps/s one learner can take in | explorers fed at this run's per-explorer rate "
           f"({per_explorer:,.0f} env steps/s) |", "|---|---|---|"]
    for steps in (1_000, 10_000):
        ceiling = steps / per_chunk_s
        out.append(f"| {steps:,} | {ceiling:,.0f} | {ceiling / per_explorer:,.0f} |")
    return "\n".join(out)


def stragglers(args, argv) -> int:
    rows = []
    for seed in args.seeds:
        for n in args.explorers:
            for jitter in args.jitter:
                for mode in ("relaxed", "lockstep"):
                    o = {"explorers": n, "env.step_cost_ms": args.step_cost_ms, "env.step_cost_jitter": jitter,
                         "cluster.explorer_threads": explorer_threads(n), **args.set}
                    r = figures(train_cell(args.pipeline, o, seed, mode, args.max_seconds))
                    rows.append({**r, "jitter": jitter})
                    print(f"seed {seed} x{n} jitter {jitter} {mode}: solved {r['solved']} in {r['time_to_solve_s']} s", flush=True)
    lines = ["| explorers | jitter | relaxed time-to-solve (median, s) | lockstep | lockstep ÷ relaxed, median of seeds | relaxed staleness |",
             "|---|---|---|---|---|---|"]
    series: dict[str, list] = {}
    for jitter in args.jitter:
        for n in args.explorers:
            get = {m: {r["seed"]: r for r in rows if r["explorers"] == n and r["jitter"] == jitter and r["mode"] == m}
                   for m in ("relaxed", "lockstep")}
            t = {m: [r["time_to_solve_s"] if r["solved"] else args.max_seconds for r in get[m].values()] for m in get}
            ratios = [get["lockstep"][s]["time_to_solve_s"] / get["relaxed"][s]["time_to_solve_s"] for s in get["relaxed"]
                      if get["relaxed"][s]["solved"] and s in get["lockstep"] and get["lockstep"][s]["solved"]]
            unsolved = sum(1 for m in get for r in get[m].values() if not r["solved"])
            lines.append(f"| {n} | {jitter:g} | {median_of(t['relaxed']):.1f} | {median_of(t['lockstep']):.1f} | "
                         f"{'-' if not ratios else f'{median_of(ratios):.2f}'}{f' ({unsolved} unsolved, at the budget)' if unsolved else ''} | "
                         f"{median_of(r['staleness_mean'] for r in get['relaxed'].values()):.1f} |")
            series.setdefault(f"lockstep ÷ relaxed, jitter {jitter:g}", []).append((n, median_of(ratios) or 0))
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        write_report(args.out, "scale.py", argv, args, rows, "Relaxed against lockstep with stragglers (simulated env cost)",
                     f"seeds {args.seeds}, {args.pipeline}, env.step_cost_ms {args.step_cost_ms:g}", text)
        plot(Path(args.out).with_suffix(".png"), series, "explorers", "lockstep time-to-solve ÷ relaxed",
              f"{args.pipeline}, stragglers (simulated)", logx=True)
    return 0


def hosts(args, argv) -> int:
    import netns

    if os.geteuid() != 0:
        print("scale.py hosts: needs root (network namespaces)", file=sys.stderr)
        return 2
    rows = []
    for n in args.hosts:
        explorers = n * args.explorers_per_host
        o = {"explorers": explorers, "env.step_cost_ms": args.step_cost_ms, "stop.target_return": None, "stop.on_solve": False,
             **args.set}
        with pipeline_copy("cartpole_dqn" if args.pipeline is None else args.pipeline, o) as path, \
                tempfile.TemporaryDirectory() as tmp, \
                netns.dask_on_hosts(n + 2, args.rate, args.explorers_per_host) as (h, scheduler):
            out = Path(tmp) / "run"
            proc = h.start(0, [sys.executable, "-m", "tianji_dask", "train", path, "--max-seconds", str(args.seconds),
                               "--out", str(out), "--quiet", "--scheduler", scheduler], stdout=subprocess.DEVNULL)
            proc.wait()
            r = figures(json.loads((out / "results.json").read_text()))
        rows.append({**r, "hosts": n})
        print(f"{n} explorer hosts x {args.explorers_per_host}: {r['env_steps_per_s']:,.0f} env steps/s", flush=True)
    base = rows[0]["env_steps_per_s"] / rows[0]["hosts"]
    lines = ["| explorer hosts | explorers | env steps/s consumed | ÷ one host | fraction of linear |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['hosts']} | {r['explorers']} | {r['env_steps_per_s']:,.0f} | {r['env_steps_per_s'] / rows[0]['env_steps_per_s']:.2f} | "
                     f"{r['env_steps_per_s'] / (base * r['hosts']):.2f} |")
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        write_report(args.out, "scale.py", argv, args, rows, "Throughput against namespace hosts (simulated env cost)",
                     f"{args.seconds:g} s a run, {args.explorers_per_host} explorers a host", text)
        plot(Path(args.out).with_suffix(".png"), {"consumed": [(r["hosts"], r["env_steps_per_s"]) for r in rows]},
              "explorer hosts", "env steps/s consumed", "namespace hosts (simulated)", logx=True,
              linear={"linear": [(r["hosts"], base * r["hosts"]) for r in rows]})
    return 0


def _sets(items):
    from time_to_solve import parse_sets

    return parse_sets(items or [])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--step-cost-ms", type=float, default=2.0)
    common.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides for every run")
    common.add_argument("--out")
    t = sub.add_parser("throughput", parents=[common])
    t.add_argument("--explorers", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64])
    t.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=["dqn-ingest", "dqn", "impala"])
    t.add_argument("--seconds", type=float, default=30)
    t.add_argument("--chunk-steps", type=int, default=32, help="vector steps a chunk (16 envs each)")
    s = sub.add_parser("stragglers", parents=[common])
    s.add_argument("--explorers", nargs="+", type=int, default=[8, 16, 32])
    s.add_argument("--jitter", nargs="+", type=float, default=[0.5, 1.0])
    s.add_argument("--pipeline", default="cartpole_impala")
    s.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    s.add_argument("--max-seconds", type=float, default=300)
    st = sub.add_parser("staleness", parents=[common])
    st.add_argument("--targets", nargs="+", type=int, default=[1, 2, 4, 8, 16, 64])
    st.add_argument("--explorers", nargs="+", type=int, default=[8, 32, 64])
    st.add_argument("--pipelines", nargs="+", default=["cartpole_impala", "cartpole_ppo"])
    st.add_argument("--jitter", nargs="+", type=float, default=[0.0],
                    help="per-chunk env cost jitter (stragglers), as in the stragglers subcommand")
    st.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    st.add_argument("--max-seconds", type=float, default=300)
    st.add_argument("--cells", default=str(Path(__file__).resolve().parent / "results" / "scale_staleness_cells"),
                    help="one file per (cell, seed) run; a cell already there is read, not rerun")
    st.add_argument("--rerun", action="store_true", help="run every cell again, over its file")
    h = sub.add_parser("hosts", parents=[common])
    h.add_argument("--hosts", nargs="+", type=int, default=[1, 2, 4, 8])
    h.add_argument("--explorers-per-host", type=int, default=8)
    h.add_argument("--seconds", type=float, default=20)
    h.add_argument("--rate", help="cap every host's link (tc tbf), e.g. 1gbit")
    h.add_argument("--pipeline")
    args = parser.parse_args(argv)
    args.set = _sets(args.set)
    return {"throughput": throughput, "stragglers": stragglers, "staleness": staleness, "hosts": hosts}[args.command](args, argv)


if __name__ == "__main__":
    sys.exit(main())
