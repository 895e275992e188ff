"""The small subcommands: ``pipelines``, ``eval``, ``export``, ``replay``, ``show`` and ``plot``."""

from __future__ import annotations

import sys

from tianji_dask.cli.parser import source
from tianji_dask.cli.signals import EXIT_USAGE


def cmd_pipelines(args) -> int:
    from tianji_dask.config import bundled_pipelines

    rows = [(r["name"], r["env_id"] or "-", r["algo"] or "-", "-" if r["target_return"] is None else f"{r['target_return']:g}")
            for r in bundled_pipelines()]
    header = ("name", "env id", "algorithm", "target return")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(3)]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3])
    return 0


def cmd_eval(args) -> int:
    from tianji_dask.playback.evaluate import evaluate

    ev = evaluate(args.run_dir, checkpoint_path=args.checkpoint, episodes=args.episodes, seed=args.seed,
                  video_dir=args.video)
    print(f"tianji-dask: {len(ev.returns)} episodes, deterministic policy of {ev.checkpoint} (version {ev.version}): "
          f"mean return {ev.mean:.2f} ± {ev.std:.2f}")
    print("tianji-dask: returns " + ", ".join(f"{r:.1f}" for r in ev.returns))
    for video in ev.videos:
        print(f"tianji-dask: video {video}")
    return 0


def cmd_export(args) -> int:
    from tianji_dask.export import check_format, export_policy, load_policy

    check_format(args.fmt)  # before the checkpoint is read
    policy = load_policy(args.run_dir, checkpoint_path=args.checkpoint)
    path = export_policy(policy, args.fmt, args.out)
    print(f"tianji-dask: wrote {path} ({args.fmt}): deterministic policy of {policy.checkpoint} (version {policy.version})")
    return 0


def cmd_replay(args) -> int:
    from tianji_dask.playback.exact_replay import ReplayMismatch, replay

    try:
        done = replay(args.run_dir)
    except ReplayMismatch as err:
        print(f"tianji-dask: replay diverged: {err}", file=sys.stderr)
        return 1
    print(f"tianji-dask: replayed {done.chunks:,} chunks and {done.updates:,} updates in one process: "
          f"final weights sha256 {done.digest}")
    if not done.same:
        print(f"tianji-dask: replay diverged: the run recorded {done.expected}", file=sys.stderr)
        return 1
    print("tianji-dask: the same as the run recorded (results.json final_weights_sha256)")
    return 0


def cmd_show(args) -> int:
    from tianji_dask.config import pipeline_yaml
    from tianji_dask.run import Run

    pipeline, settings = source(args)
    run = Run(pipeline, overrides=settings, progress=False)  # checked as train checks it: one code path
    print(pipeline_yaml(run.pipeline), end="")
    return 0


def cmd_plot(args) -> int:
    from tianji_dask.observe.plots import RunDirError, load_run, write_plots

    try:
        runs = [load_run(d) for d in args.run_dirs]
    except RunDirError as err:
        print(f"tianji-dask: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    out = args.out or str(runs[0]["dir"] / "plots")
    for path in write_plots(runs, out):
        print(f"tianji-dask: wrote {path}")
    return 0
