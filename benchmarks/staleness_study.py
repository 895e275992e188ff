"""The staleness study: time-to-solve against the staleness target, and relaxed vs lockstep.

    python benchmarks/staleness_study.py [--pipelines cartpole_dqn cartpole_ppo] [--seeds 0 1 2]
        [--targets 0 1 2 4 8 16 off] [--explorers 1 2 4] [--max-seconds 150] [--out benchmarks/results/staleness_study]
        [--skip targets|modes]

Part 1 runs every pipeline at every staleness target (relaxed mode, the controller's law on; "off"
is the pipeline's fixed window) for every seed. Part 2 runs relaxed and lockstep back to back, for
every explorer count and seed, and reports lockstep / relaxed time-to-solve as a ratio measured in
the same invocation. Runs share one embedded cluster per explorer count (cluster start is not part
of time-to-solve, which counts from run start) and alternate settings seed by seed so that
neighbouring runs share the machine's noise. Unsolved runs are kept and reported as such.

Writes ``<out>.json`` (every run), ``<out>.md`` (tables of medians) and ``<out>.png``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import median_of, runs_parser  # noqa: E402 - sibling scripts
from _studies import (cells, median_solved, run_summary, shared_cluster, show, staleness_target,  # noqa: E402
                      study_targets, write_md, write_study)


def study_modes(explorer_counts, pipelines, seeds, max_seconds, tmp, log) -> list[dict]:
    """Relaxed and lockstep back to back, for every explorer count, seed and pipeline."""
    from tianji_dask.launch.cluster import default_explorer_workers

    rows = []
    for n in explorer_counts:
        with shared_cluster(default_explorer_workers(n)) as client:
            for seed in seeds:
                for pipeline in pipelines:
                    for mode in ("relaxed", "lockstep"):
                        row = run_summary(client, pipeline, {"seed": seed, "mode": mode, "explorers": n,
                                                             "stop.max_seconds": max_seconds}, tmp)
                        rows.append(row)
                        log(f"{pipeline} {mode} explorers {n} seed {seed}: tts {show(row['time_to_solve_s'])} s")
    return rows


def tables(target_rows, mode_rows, pipelines, targets, explorer_counts) -> str:
    out = []
    if target_rows:
        out += ["### Time-to-solve against the staleness target (relaxed, median over seeds; an unsolved run counts as slowest)", "",
                "| pipeline | target | time-to-solve (s) | staleness mean (versions) | window mean | runs solved |",
                "|---|---|---|---|---|---|"]
        for (p, t), rs in cells(target_rows, pipeline=pipelines, target=targets):
            out.append(f"| {p} | {t} | {show(median_solved(rs))} | {show(median_of(r['staleness_mean'] for r in rs), '.1f', '-')} | "
                       f"{show(median_of(r['window_mean'] for r in rs), '.1f', '-')} | "
                       f"{sum(r['solved'] for r in rs)}/{len(rs)} |")
        out.append("")
    if mode_rows:
        out += ["### Relaxed vs lockstep (median over seeds; ratio = lockstep / relaxed)", "",
                "| pipeline | explorers | relaxed (s) | lockstep (s) | ratio | runs solved (relaxed / lockstep) |",
                "|---|---|---|---|---|---|"]
        for (p, n), rs in cells(mode_rows, pipeline=pipelines, explorers=explorer_counts):
            by_mode = {m: [r for r in rs if r["mode"] == m] for m in ("relaxed", "lockstep")}
            rel, loc = (median_solved(by_mode[m]) for m in by_mode)
            ratio = loc / rel if rel and loc else None
            solved = [sum(r["solved"] for r in by_mode[m]) for m in by_mode]
            out.append(f"| {p} | {n} | {show(rel)} | {show(loc)} | {show(ratio, '.2f', '-')} | {solved[0]} / {solved[1]} |")
        out.append("")
    return "\n".join(out)


def plot(target_rows, mode_rows, pipelines, targets, explorer_counts, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    for p in pipelines:
        xs, ys = [], []
        for i, t in enumerate(targets):
            rs = [r for r in target_rows if r["pipeline"] == p and r["target"] == t]
            for r in rs:
                if r["solved"]:
                    ax.scatter(i, r["time_to_solve_s"], s=10, alpha=0.4)
            med = median_solved(rs)
            if med is not None:
                xs.append(i)
                ys.append(med)
        ax.plot(xs, ys, marker="o", label=p)
    ax.set_xticks(range(len(targets)), [str(t) for t in targets])
    ax.set_xlabel("staleness target (versions)")
    ax.set_ylabel("time-to-solve (s, median)")
    ax.set_title("relaxed mode, controller on")
    ax.legend()
    ax = axes[1]
    for p in pipelines:
        for mode, style in (("relaxed", "-o"), ("lockstep", "--s")):
            ys = [median_solved([r for r in mode_rows if r["pipeline"] == p and r["explorers"] == n and r["mode"] == mode])
                  for n in explorer_counts]
            ax.plot(explorer_counts, [y if y is not None else float("nan") for y in ys], style, label=f"{p} {mode}")
    ax.set_xlabel("explorers")
    ax.set_ylabel("time-to-solve (s, median)")
    ax.set_title("relaxed vs lockstep")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = runs_parser(__doc__, max_seconds=150, out="benchmarks/results/staleness_study")
    parser.add_argument("--pipelines", nargs="+", default=["cartpole_dqn", "cartpole_ppo"])
    parser.add_argument("--targets", nargs="+", type=staleness_target, default=["0", "1", "2", "4", "8", "16", "off"])
    parser.add_argument("--explorers", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--skip", choices=["targets", "modes"], action="append", default=[])
    parser.add_argument("--report-only", metavar="JSON", help="rebuild the tables and plot from an earlier run's JSON")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        data = json.loads(Path(args.report_only).read_text())
        a = data["meta"]["args"]
        md = tables(data["targets"], data["modes"], a["pipelines"], a["targets"], a["explorers"])
        write_md(out, data["meta"], md)
        plot(data["targets"], data["modes"], a["pipelines"], a["targets"], a["explorers"], Path(f"{out}.png"))
        print(md)
        return 0

    def log(msg):
        print(msg, flush=True)

    target_rows, mode_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        if "targets" not in args.skip:
            with shared_cluster(2) as client:
                target_rows = study_targets(client, args.pipelines, args.seeds, args.targets, args.max_seconds,
                                            Path(tmp), log)
        if "modes" not in args.skip:
            mode_rows = study_modes(args.explorers, args.pipelines, args.seeds, args.max_seconds, Path(tmp), log)
    md = tables(target_rows, mode_rows, args.pipelines, args.targets, args.explorers)
    write_study(out, "staleness_study.py", argv, args, {"targets": target_rows, "modes": mode_rows}, md)
    plot(target_rows, mode_rows, args.pipelines, args.targets, args.explorers, Path(f"{out}.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
