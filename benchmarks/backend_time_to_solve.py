"""Time-to-solve of a bundled pipeline with each env backend (env.backend: gymnasium, envpool).

    python benchmarks/backend_time_to_solve.py [--pipelines cartpole_ppo hopper_ppo] [--seeds 0 1 2 3 4]
        [--max-seconds 300] [--out benchmarks/results/backend_time_to_solve]

Each seed trains the pipeline once with each backend, the backends' order turned seed by seed so
that neither always goes first (neighbours share the machine's noise). Each run is a fresh
``tianji-dask train`` process, so "from process start" includes starting its cluster. Per
(pipeline, backend): the runs solved, the median time-to-solve from run start and from process
start with their range, the explorers' env steps/s; and per pipeline the median over seeds of
envpool's time-to-solve over gymnasium's (below 1: envpool solves sooner).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import fmt, median_of, publish, runs_parser
from time_to_solve import pipeline_copy, run_once

BACKENDS = ("gymnasium", "envpool")
KEPT = ("solved", "time_to_solve_s", "time_to_solve_from_process_start_s", "env_steps", "env_steps_per_s",
        "wall_s", "stop_reason", "updates")


def _range(values) -> str:
    values = [v for v in values if v is not None]
    return f"{min(values):.1f}–{max(values):.1f}" if values else "–"


def table(runs: list[dict], pipelines: list[str]) -> str:
    header = ("| pipeline | backend | solved | time-to-solve, median of the solved runs, s | range | "
              "from process start, median s | env steps/s, median | envpool ÷ gymnasium (median of seeds) |")
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for pipeline in pipelines:
        mine = {b: {r["seed"]: r for r in runs if r["pipeline"] == pipeline and r["backend"] == b} for b in BACKENDS}
        both = [s for s in mine["gymnasium"] if s in mine["envpool"]
                and mine["gymnasium"][s]["solved"] and mine["envpool"][s]["solved"]]
        ratio = median_of(mine["envpool"][s]["time_to_solve_s"] / mine["gymnasium"][s]["time_to_solve_s"] for s in both)
        for b in BACKENDS:
            rs = list(mine[b].values())
            tts = [r["time_to_solve_s"] for r in rs]
            lines.append(
                f"| {pipeline} | {b} | {sum(r['solved'] for r in rs)}/{len(rs)} | {fmt(median_of(tts), ',.2f')} | {_range(tts)} | "
                f"{fmt(median_of(r['time_to_solve_from_process_start_s'] for r in rs), ',.2f')} | "
                f"{fmt(median_of(r['env_steps_per_s'] for r in rs), ',.0f')} | "
                f"{fmt(ratio, ',.2f') + f' ({len(both)} seeds both solved)' if b == 'envpool' else ''} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = runs_parser(__doc__, seeds=range(5))
    parser.add_argument("--pipelines", nargs="+", default=["cartpole_ppo", "hopper_ppo"])
    args = parser.parse_args(argv)
    runs = []
    for n, seed in enumerate(args.seeds):
        for pipeline in args.pipelines:
            for backend in BACKENDS[n % 2:] + BACKENDS[:n % 2]:
                with pipeline_copy(pipeline, {"env.backend": backend}) as path:
                    result = run_once(path, seed, "relaxed", args.max_seconds, [])
                run = {"pipeline": pipeline, "backend": backend, "seed": seed, **{k: result.get(k) for k in KEPT}}
                runs.append(run)
                tts = run["time_to_solve_s"]
                print(f"{pipeline} {backend} seed {seed}: " + (
                    f"solved in {tts:.2f} s ({run['time_to_solve_from_process_start_s']:.2f} s from process start)"
                    if run["solved"] else f"NOT solved in {run['wall_s']:.0f} s"), flush=True)
    publish(table(runs, args.pipelines), args.out, "backend_time_to_solve.py", argv, args, runs,
            "Time-to-solve by env backend",
            f"medians over seeds {' '.join(map(str, args.seeds))}, the backends alternated seed by seed, "
            f"each run a fresh process with a {args.max_seconds:g} s budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())
