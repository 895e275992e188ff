"""Where the time goes: learner busy fraction and the dataflow's overhead, per pipeline, over seeds.

    python benchmarks/overhead.py [--pipelines cartpole_dqn cartpole_ppo] [--seeds 0 1 2]
                                  [--seconds 30] [--set KEY=VALUE ...]
                                  [--variant LABEL:KEY=VALUE[,KEY=VALUE] ...] [--out benchmarks/results/overhead]

Each run trains for a fixed time (``stop.on_solve`` off, so the figures cover learning, not only
the way to the solve) in a fresh process on an embedded LocalCluster, alternating pipelines seed
by seed, and reads from its results:

- learner busy: the fraction of wall time in updates (``learner_busy_fraction``);
- the learner's time split (``learner_time``): updates, ingesting data, waiting for data, and
  the dataflow's own work (controller requests, task submission, weight publishing, status,
  checkpoints, the loop itself);
- the explorer tasks' time as Dask's fine performance metrics split it: env stepping with
  inference vs. loading weights, waiting for the executor thread, deserializing, other;
- dataflow overhead: dataflow seconds / busy seconds, summed over the learner and the explorer
  tasks (time spent waiting is not busy; ``dataflow_overhead`` in results.json);
- CPU by process, as cores (CPU seconds / wall seconds; ``cpu`` in results.json): the learner
  thread, the rest of the learner's process (event loop, comms), the explorer workers'
  processes and the scheduler's. The wall-time overhead above counts only the roles' main
  threads; "beside the main work" is the CPU it does not see: the learner's other threads, the
  scheduler's process and the explorer processes' CPU beyond their tasks' env stepping.

``--set`` changes every run; each ``--variant`` adds a row per pipeline with its own settings on
top, run right after the plain one for the same seed, so a setting's effect is measured side by
side rather than across invocations.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import median_of, write_report  # noqa: E402 - sibling scripts
from time_to_solve import parse_sets, pipeline_copy, run_once  # noqa: E402


def run_for(pipeline: str, seed: int, seconds: float, overrides: dict) -> dict:
    """One run of ``pipeline`` for ``seconds`` with ``stop.on_solve`` off (through a copy of its YAML)."""
    with pipeline_copy(pipeline, {**overrides, "stop.on_solve": False}) as path:
        return run_once(path, seed, "relaxed", seconds, [])


def parse_variants(items: list[str]) -> dict[str, dict]:
    """``LABEL:KEY=VALUE[,KEY=VALUE]`` strings as {label: overrides}; a bad one exits 2 with one line."""
    variants = {}
    for item in items:
        label, sep, sets = item.partition(":")
        if not sep or not label or not sets:
            print(f"--variant: expected LABEL:KEY=VALUE[,KEY=VALUE] (e.g. upp4:learner.updates_per_pass=4), "
                  f"got {item!r}", file=sys.stderr)
            raise SystemExit(2)
        variants[label] = parse_sets(sets.split(","), flag=f"--variant {label}")
    return variants


def row(pipeline: str, r: dict) -> dict:
    split = r["learner_time"]["seconds"]
    wall = r["wall_s"]
    o = r["dataflow_overhead"] or {}
    return {
        "pipeline": pipeline, "seed": r["seed"], "wall_s": wall, "learner_busy": r["learner_busy_fraction"],
        "learner_split": {k: v / wall for k, v in split.items()},
        "overhead": o.get("fraction"), "learner_overhead": o.get("learner_fraction"),
        "explorer_overhead": o.get("explorer_fraction"), "explorer_task_seconds": o.get("explorer_task_seconds", {}),
        "env_steps_per_s": r["env_steps_per_s"], "updates_per_s": r["updates"] / wall,
        "cpu": r.get("cpu"), "beside_main_work": beside_main_work(r.get("cpu")),
    }


def beside_main_work(cpu: dict | None) -> float | None:
    """The share of all processes' CPU spent beside the roles' main work: the learner's other
    threads, the scheduler's process, and the explorer processes' CPU beyond the wall seconds
    their tasks spent stepping envs (so a lower bound)."""
    if not cpu or "explorer_env_step_cores" not in cpu or not cpu["cores_total"]:
        return None
    c = cpu["cores"]
    beside = c["learner_process_other"] + c["scheduler_process"] + max(0.0, c["explorer_processes"] - cpu["explorer_env_step_cores"])
    return beside / cpu["cores_total"]


def table(rows: list[dict]) -> str:
    parts = ["learn", "ingest", "wait", "cycle", "submit", "publish", "status", "checkpoint", "other"]
    head = ("| pipeline | learner busy | dataflow overhead (all roles) | learner | explorer tasks | "
            + " | ".join(f"learner {p}" for p in parts) + " |")
    out = [head, "|" + "---|" * (5 + len(parts))]
    for pipeline in dict.fromkeys(r["pipeline"] for r in rows):
        rs = [r for r in rows if r["pipeline"] == pipeline]

        def med(get):
            return median_of(get(r) for r in rs)

        def pct(v):
            return "-" if v is None else f"{v:.1%}"

        cells = [pct(med(lambda r: r["learner_busy"])), pct(med(lambda r: r["overhead"])),
                 pct(med(lambda r: r["learner_overhead"])), pct(med(lambda r: r["explorer_overhead"]))]
        cells += [pct(med(lambda r, p=p: r["learner_split"].get(p, 0.0))) for p in parts]
        out.append(f"| {pipeline} | " + " | ".join(cells) + " |")
    out += ["", "CPU by process, as cores (CPU seconds / wall seconds), medians:", "",
            "| pipeline | all processes | learner thread | learner's other threads | explorer processes "
            "| of which env stepping | scheduler's process | beside the main work |", "|" + "---|" * 8]
    for pipeline in dict.fromkeys(r["pipeline"] for r in rows):
        rs = [r for r in rows if r["pipeline"] == pipeline and r["cpu"]]
        if not rs:
            continue

        def cores(get):
            value = median_of(get(r["cpu"]) for r in rs)
            return "-" if value is None else f"{value:.2f}"

        cells = [cores(lambda c: c["cores_total"])]
        cells += [cores(lambda c, k=k: c["cores"][k]) for k in ("learner_thread", "learner_process_other", "explorer_processes")]
        cells += [cores(lambda c: c.get("explorer_env_step_cores")), cores(lambda c: c["cores"]["scheduler_process"])]
        beside = median_of(r["beside_main_work"] for r in rs)
        cells.append("-" if beside is None else f"{beside:.1%}")
        out.append(f"| {pipeline} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", nargs="+", default=["cartpole_dqn", "cartpole_ppo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a pipeline override for every run (dotted key, YAML value); repeatable")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL:KEY=VALUE[,KEY=VALUE]",
                        help="also run each pipeline with these overrides, as its own row; repeatable")
    parser.add_argument("--out", help="write OUT.json (every run) and OUT.md (the table)")
    args = parser.parse_args(argv)
    common = parse_sets(args.set)
    variants = {"": {}, **parse_variants(args.variant)}
    rows = []
    runs = [(pipeline, label, overrides) for pipeline in args.pipelines for label, overrides in variants.items()]
    for seed in args.seeds:
        for pipeline, label, overrides in runs:
            name = f"{pipeline} ({label})" if label else pipeline
            r = row(name, run_for(pipeline, seed, args.seconds, {**common, **overrides}))
            rows.append(r)
            print(f"{name:>14} seed {seed}: learner busy {r['learner_busy']:.1%}, dataflow overhead "
                  f"{r['overhead']:.1%} (learner {r['learner_overhead']:.1%}, explorer tasks {r['explorer_overhead']:.1%}); "
                  f"explorer task seconds {r['explorer_task_seconds']}; CPU cores {(r['cpu'] or {}).get('cores')}, "
                  f"beside the main work {r['beside_main_work']}", flush=True)
    text = table(rows)
    print(f"\nmedians over seeds {args.seeds}, {args.seconds:g} s each, {os.cpu_count()} cores "
          f"(learner columns: fraction of its wall time):\n{text}")
    if args.out:
        write_report(args.out, "overhead.py", argv, args, rows, "Learner busy and dataflow overhead", f"medians over seeds {args.seeds}, {args.seconds:g} s of training each; learner columns are fractions of its wall time", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
