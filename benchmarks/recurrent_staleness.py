"""A recurrent policy under staleness: time-to-solve against the staleness target, with each
chunk's stored start state (the old policy's) or with it recomputed by burn-in (R2D2's remedy).

    python benchmarks/recurrent_staleness.py [--pipeline cartpole_novel_ppo_lstm] [--targets 1 4 8]
        [--burn-in 0 16] [--seeds 0] [--explorers 4] [--max-seconds 300] [--out benchmarks/results/recurrent_staleness]

Every (target, burn-in) cell runs in relaxed mode on one embedded cluster, the controller holding
the target, ``max_policy_lag`` raised so that no chunk is dropped for its age; cells alternate
seed by seed so that neighbouring runs share the machine's noise. Unsolved runs are kept and
reported as such. Writes ``<out>.json`` (every run) and ``<out>.md`` (the table of medians).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import median_of, runs_parser  # noqa: E402 - sibling scripts
from _studies import cells, median_solved, run_summary, shared_cluster, show, write_study  # noqa: E402


def table(rows: list[dict], targets: list[float], burn_ins: list[int]) -> str:
    out = ["| staleness target | burn-in (steps) | time-to-solve (s, median) | staleness mean (versions) | "
           "env steps to solve (median) | runs solved |", "|---|---|---|---|---|---|"]
    for (t, k), rs in cells(rows, target=targets, burn_in=burn_ins):
        steps = [r["env_steps"] for r in rs if r["solved"]]
        out.append(f"| {t:g} | {k or 'none (stored state)'} | {show(median_solved(rs))} | "
                   f"{show(median_of(r['staleness_mean'] for r in rs), '.1f', '-')} | "
                   f"{f'{median_of(steps):,.0f}' if len(steps) * 2 > len(rs) else '-'} | "
                   f"{sum(r['solved'] for r in rs)}/{len(rs)} |")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = runs_parser(__doc__, seeds=[0], out="benchmarks/results/recurrent_staleness")
    parser.add_argument("--pipeline", default="cartpole_novel_ppo_lstm")
    parser.add_argument("--targets", nargs="+", type=float, default=[1.0, 4.0, 8.0])
    parser.add_argument("--burn-in", nargs="+", type=int, default=[0, 16], dest="burn_ins")
    parser.add_argument("--explorers", type=int, default=4)
    args = parser.parse_args(argv)
    if any(t < 0 for t in args.targets) or any(k < 0 for k in args.burn_ins):
        parser.error("--targets and --burn-in: numbers >= 0")
    from tianji_dask.launch.cluster import default_explorer_workers

    rows = []
    with tempfile.TemporaryDirectory() as tmp, shared_cluster(default_explorer_workers(args.explorers)) as client:
        for i, seed in enumerate(args.seeds):
            cells_now = [(t, k) for t in args.targets for k in args.burn_ins]
            for target, k in cells_now[::-1] if i % 2 else cells_now:
                ov = {"seed": seed, "explorers": args.explorers, "stop.max_seconds": args.max_seconds,
                      "controller.staleness_target": target, "algo.config.max_policy_lag": max(16, int(4 * target)),
                      "algo.config.recurrent.burn_in": k}
                row = run_summary(client, args.pipeline, ov, Path(tmp))
                row.update(target=target, burn_in=k)
                rows.append(row)
                print(f"target {target:g} burn-in {k} seed {seed}: tts {show(row['time_to_solve_s'])} s, "
                      f"staleness {show(row['staleness_mean'], '.2f', '-')}, {row['env_steps']:,} env steps", flush=True)
    write_study(args.out, "recurrent_staleness.py", argv, args, {"runs": rows}, table(rows, args.targets, args.burn_ins))
    return 0


if __name__ == "__main__":
    sys.exit(main())
