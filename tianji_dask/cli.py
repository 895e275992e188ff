"""The ``tianji-dask`` command."""

from __future__ import annotations

import argparse
import math
import sys
import time

from tianji_dask.config import PipelineError

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _number(flag: str, cast, *, minimum, inclusive: bool, what: str):
    """An argparse type: ``cast`` the text and check it against ``minimum``; one-line errors."""
    allowed = f"{flag} must be {what} {'>=' if inclusive else '>'} {minimum:g}"

    def parse(text):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{allowed}, got {text!r}") from None
        if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
            raise argparse.ArgumentTypeError(f"{allowed}, got {text!r}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tianji-dask", description="Distributed deep-RL training as a Dask dataflow.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    train = sub.add_parser("train", help="train a pipeline and print its time-to-solve")
    train.add_argument("pipeline", help="a pipeline YAML file or a bundled name (e.g. cartpole_ppo)")
    train.add_argument("--mode", choices=["relaxed", "lockstep", "single"])
    train.add_argument("--explorers", type=_number("--explorers", int, minimum=1, inclusive=True, what="a whole number"), help="explorer streams")
    train.add_argument("--groups", type=_number("--groups", int, minimum=1, inclusive=True, what="a whole number"),
                       help="learner groups, each with its own explorers; their models are averaged")
    train.add_argument("--seed", type=_number("--seed", int, minimum=0, inclusive=True, what="a whole number"))
    train.add_argument("--max-seconds", type=_number("--max-seconds", float, minimum=0, inclusive=False, what="a number"), help="stop after this many seconds of training")
    train.add_argument("--scheduler", help="join an existing cluster, e.g. tcp://HOST:8786")
    train.add_argument("--out", help="results directory (default runs/NAME-MODE-TIME-ID)")
    train.add_argument("--quiet", action="store_true", help="no live progress display")
    resume = sub.add_parser("resume", help="continue a stopped or crashed run from its newest checkpoint")
    resume.add_argument("run_dir", metavar="RUN_DIR", help="the run's results directory")
    resume.add_argument("--max-seconds", type=_number("--max-seconds", float, minimum=0, inclusive=False, what="a number"), help="a new time budget (training seconds in all)")
    resume.add_argument("--scheduler", help="continue on an existing cluster, e.g. tcp://HOST:8786")
    resume.add_argument("--quiet", action="store_true", help="no live progress display")
    plot = sub.add_parser("plot", help="write PNG figures of recorded runs (several runs: one figure each, overlaid)")
    plot.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a run's results directory")
    plot.add_argument("--out", help="where the PNGs go (default RUN_DIR/plots of the first run)")
    return parser


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


def _fmt(value, spec=".1f", none="-"):
    return none if value is None else format(value, spec)


class _Progress:
    """Live progress on a terminal; a line every few seconds elsewhere (logs, CI)."""

    def __init__(self, run, quiet: bool):
        from rich.console import Console

        self.console = Console(stderr=True)
        self.run = run
        self.quiet = quiet
        self.live = None
        self.last_line = 0.0

    def line(self, s: dict) -> str:
        return (
            f"[{self.run.pipeline.mode}] {_fmt(s.get('elapsed_s'))} s  version {s.get('version', 0)}  "
            f"env steps {s.get('env_steps', 0):,}  ({_fmt(s.get('env_steps_per_s'), ',.0f')}/s)  "
            f"mean return {_fmt(s.get('mean_return'))}  staleness {_fmt(s.get('staleness_recent_mean'), '.2f')}  "
            f"in flight {s.get('chunks_in_flight', '-')}/{s.get('window') or '-'}"
            + (f"  replay ratio {s['replay_ratio']:.1f}" if s.get("replay_ratio") is not None else "")
            + (f"  groups {len(s['groups'])}, fusions {s.get('fusions', 0)}" if s.get("groups") else "")
        )

    def __enter__(self):
        if not self.quiet and self.console.is_terminal:
            from rich.live import Live

            self.live = Live("starting…", console=self.console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __call__(self, status: dict) -> None:
        from rich.text import Text

        if self.quiet or "version" not in status:
            return
        if self.live is not None:
            self.live.update(Text(self.line(status)))  # plain text: "[relaxed]" is not markup
        elif time.time() - self.last_line > 5:
            self.console.print(Text(self.line(status)), highlight=False)
            self.last_line = time.time()

    def __exit__(self, *exc):
        if self.live is not None:
            self.live.__exit__(*exc)


def cmd_train(args) -> int:
    from tianji_dask.run import Run

    overrides = {"mode": args.mode, "explorers": args.explorers, "groups": args.groups, "seed": args.seed,
                 "stop.max_seconds": args.max_seconds}
    overrides = {k: v for k, v in overrides.items() if v is not None}  # flags not given
    if args.scheduler:
        overrides.update({"cluster.kind": "address", "cluster.address": args.scheduler})
    run = Run(args.pipeline, out=args.out, overrides=overrides)
    p = run.pipeline
    groups = f"{p.groups} groups of {p.explorers} explorers" if p.groups > 1 else f"{p.explorers} explorers"
    print(f"tianji-dask: training {p.name} ({p.env.id}, {p.algo.name}, {p.mode}, {groups})", flush=True)
    if p.simulated():
        print(f"tianji-dask: simulated: each env step also costs {p.step_cost_for(0).describe()} "
              f"(env.step_cost_ms; dynamics and learning are real)", flush=True)
    return _train(run, args.quiet)


def cmd_resume(args) -> int:
    from tianji_dask.run import Run

    overrides = {"stop.max_seconds": args.max_seconds} if args.max_seconds is not None else {}
    if args.scheduler:
        overrides.update({"cluster.kind": "address", "cluster.address": args.scheduler})
    run = Run.resume(args.run_dir, overrides=overrides)
    print(f"tianji-dask: resuming {run.pipeline.name} from {run._resume_from}", flush=True)
    return _train(run, args.quiet)


def _train(run, quiet: bool) -> int:
    try:
        run.start()
    except KeyboardInterrupt:  # before the run began: nothing to keep but the cluster to close
        run.close()
        raise
    if run.dashboard_link:
        tianji_page = run.dashboard_link.rsplit("/", 1)[0] + "/tianji"
        print(f"tianji-dask: dashboard {run.dashboard_link} (this run: {tianji_page})", flush=True)
    with _Progress(run, quiet) as progress:
        try:
            results = run.wait(on_status=progress)
        except KeyboardInterrupt:
            run.stop()
            results = run.wait()
    if results.get("error"):
        print(f"tianji-dask: the run failed:\n{results['error']}", file=sys.stderr)
    if results["solved"]:
        print(
            f"tianji-dask: solved {run.pipeline.env.id} (100-episode mean >= {results['target_return']:g}) in "
            f"{results['time_to_solve_s']:.2f} s from run start ({results['time_to_solve_from_process_start_s']:.2f} s "
            f"from process start), {results['env_steps']:,} env steps"
        )
    else:
        print(
            f"tianji-dask: not solved (stopped: {results['stop_reason']}) after {results['wall_s']:.1f} s, "
            f"{results['env_steps']:,} env steps, final mean return {_fmt(results['final_mean_return'])}"
        )
    print(f"tianji-dask: results {run.results_path}")
    return 1 if results.get("error") else 0


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "train":
            return cmd_train(args)
        if args.command == "plot":
            return cmd_plot(args)
        if args.command == "resume":
            return cmd_resume(args)
    except PipelineError as err:  # CheckpointError and RunDirError are PipelineErrors too
        print(f"tianji-dask: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # while starting, or a second Ctrl-C during the clean stop
        print("tianji-dask: interrupted", file=sys.stderr)
        return 130
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
