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

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _run(client, pipeline: str, overrides: dict, tmp: Path) -> dict:
    from tianji_dask.run import Run

    run = Run(pipeline, client, out=tmp / f"{pipeline}-{time.time_ns()}", overrides=overrides)
    r = run.start().wait()
    ctrl = r.get("controller", {})
    windows = [row[3] for row in ctrl.get("history", [])]
    return {
        "pipeline": pipeline, "mode": r["mode"], "seed": r["seed"], "explorers": r["explorers"],
        "solved": r["solved"], "time_to_solve_s": r["time_to_solve_s"], "wall_s": r["wall_s"],
        "env_steps": r["env_steps"], "updates": r["updates"], "chunks_dropped": sum(r["chunks_dropped"].values()),
        "staleness_mean": r["staleness_versions"]["mean"], "staleness_p95": r["staleness_versions"]["p95"],
        "window_mean": statistics.fmean(windows) if windows else None,
        "learner_busy": r["learner_busy_fraction"], "error": r["error"],
    }


def _median(rows: list[dict], key: str = "time_to_solve_s"):
    """Median over seeds, an unsolved run counting as slower than every solved one; None when
    the median itself falls on an unsolved run (or there are no runs)."""
    if not rows:
        return None
    med = statistics.median(r[key] if r["solved"] else float("inf") for r in rows)
    return None if med == float("inf") else med


def _fmt(x, spec=".1f", none="unsolved"):
    return none if x is None else format(x, spec)


def study_targets(client, pipelines, seeds, targets, max_seconds, tmp, log) -> list[dict]:
    rows = []
    for seed in seeds:
        for pipeline in pipelines:
            for target in targets:
                ov = {"seed": seed, "stop.max_seconds": max_seconds}
                if target != "off":
                    ov["controller.staleness_target"] = float(target)
                row = _run(client, pipeline, ov, tmp)
                row["target"] = target
                rows.append(row)
                log(f"{pipeline} target {target} seed {seed}: tts {_fmt(row['time_to_solve_s'])} s, "
                    f"staleness {_fmt(row['staleness_mean'], '.1f', '-')}, window {_fmt(row['window_mean'], '.1f', '-')}")
    return rows


def study_modes(explorer_counts, pipelines, seeds, max_seconds, tmp, log) -> list[dict]:
    from distributed import Client

    from tianji_dask.launch.cluster import default_explorer_workers, local_cluster

    rows = []
    for n in explorer_counts:
        cluster = local_cluster(default_explorer_workers(n), dashboard_address=None)
        client = Client(cluster)
        try:
            for seed in seeds:
                for pipeline in pipelines:
                    for mode in ("relaxed", "lockstep"):
                        row = _run(client, pipeline, {"seed": seed, "mode": mode, "explorers": n,
                                                      "stop.max_seconds": max_seconds}, tmp)
                        rows.append(row)
                        log(f"{pipeline} {mode} explorers {n} seed {seed}: tts {_fmt(row['time_to_solve_s'])} s")
        finally:
            client.close()
            cluster.close()
    return rows


def tables(target_rows, mode_rows, pipelines, targets, explorer_counts) -> str:
    out = []
    if target_rows:
        out += ["### Time-to-solve against the staleness target (relaxed, median over seeds; an unsolved run counts as slowest)", "",
                "| pipeline | target | time-to-solve (s) | staleness mean (versions) | window mean | runs solved |",
                "|---|---|---|---|---|---|"]
        for p in pipelines:
            for t in targets:
                rs = [r for r in target_rows if r["pipeline"] == p and r["target"] == t]
                if not rs:
                    continue
                stal = statistics.median(r["staleness_mean"] for r in rs if r["staleness_mean"] is not None)
                wins = [r["window_mean"] for r in rs if r["window_mean"] is not None]
                out.append(f"| {p} | {t} | {_fmt(_median(rs))} | {stal:.1f} | "
                           f"{_fmt(statistics.median(wins) if wins else None, '.1f', '-')} | "
                           f"{sum(r['solved'] for r in rs)}/{len(rs)} |")
        out.append("")
    if mode_rows:
        out += ["### Relaxed vs lockstep (median over seeds; ratio = lockstep / relaxed)", "",
                "| pipeline | explorers | relaxed (s) | lockstep (s) | ratio | runs solved (relaxed / lockstep) |",
                "|---|---|---|---|---|---|"]
        for p in pipelines:
            for n in explorer_counts:
                rel = _median([r for r in mode_rows if r["pipeline"] == p and r["explorers"] == n and r["mode"] == "relaxed"])
                loc = _median([r for r in mode_rows if r["pipeline"] == p and r["explorers"] == n and r["mode"] == "lockstep"])
                ratio = loc / rel if rel and loc else None
                solved = [sum(r["solved"] for r in mode_rows if r["pipeline"] == p and r["explorers"] == n and r["mode"] == m)
                          for m in ("relaxed", "lockstep")]
                out.append(f"| {p} | {n} | {_fmt(rel)} | {_fmt(loc)} | {_fmt(ratio, '.2f', '-')} | {solved[0]} / {solved[1]} |")
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
            med = _median(rs)
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
            ys = [_median([r for r in mode_rows if r["pipeline"] == p and r["explorers"] == n and r["mode"] == mode])
                  for n in explorer_counts]
            ax.plot(explorer_counts, [y if y is not None else float("nan") for y in ys], style, label=f"{p} {mode}")
    ax.set_xlabel("explorers")
    ax.set_ylabel("time-to-solve (s, median)")
    ax.set_title("relaxed vs lockstep")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", nargs="+", default=["cartpole_dqn", "cartpole_ppo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--targets", nargs="+", default=["0", "1", "2", "4", "8", "16", "off"])
    parser.add_argument("--explorers", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--max-seconds", type=float, default=150)
    parser.add_argument("--out", default="benchmarks/results/staleness_study")
    parser.add_argument("--skip", choices=["targets", "modes"], action="append", default=[])
    parser.add_argument("--report-only", metavar="JSON", help="rebuild the tables and plot from an earlier run's JSON")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        data = json.loads(Path(args.report_only).read_text())
        a = data["meta"]["args"]
        md = tables(data["targets"], data["modes"], a["pipelines"], a["targets"], a["explorers"])
        Path(f"{out}.md").write_text(f"<!-- generated by: {data['meta']['command']} ({data['meta']['date']}) -->\n\n{md}")
        plot(data["targets"], data["modes"], a["pipelines"], a["targets"], a["explorers"], Path(f"{out}.png"))
        print(md)
        return 0
    for t in args.targets:
        if t != "off":
            try:
                if float(t) < 0:
                    raise ValueError
            except ValueError:
                parser.error(f"--targets: {t!r} is not a number >= 0 or 'off'")

    def log(msg):
        print(msg, flush=True)

    target_rows, mode_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if "targets" not in args.skip:
            from distributed import Client

            from tianji_dask.launch.cluster import local_cluster

            cluster = local_cluster(2, dashboard_address=None)
            client = Client(cluster)
            try:
                target_rows = study_targets(client, args.pipelines, args.seeds, args.targets, args.max_seconds, tmp, log)
            finally:
                client.close()
                cluster.close()
        if "modes" not in args.skip:
            mode_rows = study_modes(args.explorers, args.pipelines, args.seeds, args.max_seconds, tmp, log)
    meta = {"command": " ".join(["python", "benchmarks/staleness_study.py", *(argv or sys.argv[1:])]),
            "date": time.strftime("%Y-%m-%d %H:%M"), "args": vars(args)}
    Path(f"{out}.json").write_text(json.dumps({"meta": meta, "targets": target_rows, "modes": mode_rows}, indent=1))
    md = tables(target_rows, mode_rows, args.pipelines, args.targets, args.explorers)
    Path(f"{out}.md").write_text(f"<!-- generated by: {meta['command']} ({meta['date']}) -->\n\n{md}")
    plot(target_rows, mode_rows, args.pipelines, args.targets, args.explorers, Path(f"{out}.png"))
    print("\n" + md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
