"""The V-trace study: time-to-solve against the staleness target, PPO (stale chunks dropped) vs
IMPALA (every chunk trained on, V-trace-corrected).

    python benchmarks/vtrace_study.py [--envs cartpole lunarlander] [--seeds 0 1 2]
        [--targets 0 2 8 off] [--max-seconds 150] [--out benchmarks/results/vtrace_study]

For each env it runs ``<env>_ppo`` and ``<env>_impala`` (relaxed mode, 2 explorers, one shared
embedded cluster) at every staleness target ("off": the pipeline's fixed window) for every seed,
alternating pipelines and targets seed by seed so that neighbouring runs share the machine's
noise. PPO keeps its pipeline's ``max_policy_lag`` (older segments are dropped and counted);
IMPALA drops nothing. Unsolved runs are kept and reported as such.

Writes ``<out>.json`` (every run) and ``<out>.md`` (medians over seeds).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import median_of, runs_parser  # noqa: E402 - sibling scripts
from _studies import cells, median_solved, shared_cluster, show, staleness_target, study_targets, write_study  # noqa: E402


def table(rows: list[dict], pipelines: list[str], targets: list[str]) -> str:
    out = ["### Time-to-solve against the staleness target (relaxed, median over seeds; an unsolved run counts as slowest)", "",
           "| pipeline | target | time-to-solve (s) | env steps to solve | staleness mean (versions) | chunks dropped | runs solved |",
           "|---|---|---|---|---|---|---|"]
    for (p, t), rs in cells(rows, pipeline=pipelines, target=targets):
        out.append(f"| {p} | {t} | {show(median_solved(rs))} | {show(median_solved(rs, 'env_steps'), ',.0f')} | "
                   f"{show(median_of(r['staleness_mean'] for r in rs), '.1f', '-')} | "
                   f"{median_of(r['chunks_dropped'] for r in rs):.0f} | {sum(r['solved'] for r in rs)}/{len(rs)} |")
    return "\n".join(out + [""])


def main(argv=None) -> int:
    parser = runs_parser(__doc__, max_seconds=150, out="benchmarks/results/vtrace_study")
    parser.add_argument("--envs", nargs="+", default=["cartpole"], choices=["cartpole", "lunarlander"])
    parser.add_argument("--targets", nargs="+", type=staleness_target, default=["0", "2", "8", "off"])
    args = parser.parse_args(argv)
    pipelines = [f"{env}_{algo}" for env in args.envs for algo in ("ppo", "impala")]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp, shared_cluster(2) as client:
        for seed in args.seeds:  # one seed at a time, so a partial study still covers every setting
            rows += study_targets(client, pipelines, [seed], args.targets, args.max_seconds, Path(tmp),
                                  lambda msg: print(msg, flush=True))
    write_study(args.out, "vtrace_study.py", argv, args, {"runs": rows}, table(rows, pipelines, args.targets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
