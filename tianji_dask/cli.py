"""The ``tianji-dask`` command."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import math
import os
import re
import sys

from tianji_dask.errors import PipelineError, RunFault  # not config: it imports torch, and the CLI starts first

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # as a shell reports a process ended by SIGINT
EXIT_TERMINATED = 143  # as a shell reports a process ended by SIGTERM


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


def _setting(text: str):
    """``--set KEY=VALUE``: a dotted pipeline field and its value, read as YAML (3, 0.5, null, [1, 2])."""
    import yaml

    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or not all(key.split(".")):
        raise argparse.ArgumentTypeError(f"KEY=VALUE expected, with a dotted pipeline field as KEY "
                                         f"(e.g. stop.max_seconds=60), got {text!r}")
    if re.fullmatch(r"\s*[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+\s*", raw):  # YAML 1.1 reads 3e-4 as a string
        return key, float(raw)
    try:
        return key, yaml.safe_load(raw)
    except yaml.YAMLError:
        raise argparse.ArgumentTypeError(f"{key}: {raw!r} is not a YAML value (a number, true, false, null, "
                                         "a string, [a, b] or {k: v})") from None


class _Override(argparse.Action):
    """A flag that sets pipeline fields, recorded in command-line order so that the later of two
    settings of one field wins (``--explorers 4 --set explorers=1`` trains with one)."""

    def __init__(self, *args, fields, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields = fields  # the field names the value goes to, or a function of the value giving {field: value}

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        settings = self.fields(values) if callable(self.fields) else {field: values for field in self.fields}
        # a new list each time: argparse would share a mutable default between parses
        namespace.overrides = [*(getattr(namespace, "overrides", None) or ()), *settings.items()]


def _overrides(args) -> dict:
    """The pipeline fields the flags set, in command-line order (the later setting of a field wins)."""
    overrides: dict = {}
    for key, value in getattr(args, "overrides", None) or ():
        overrides.pop(key, None)  # re-inserted last: applied after the settings given before it
        overrides[key] = value
    return overrides


SET_HELP = "set a pipeline field, dotted, to a YAML value (e.g. stop.max_seconds=60, controller.replay_ratio=null); repeatable"


def _scheduler(address: str) -> dict:
    return {"cluster.kind": "address", "cluster.address": address}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tianji-dask", description="Distributed deep-RL training as a Dask dataflow.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    train = sub.add_parser("train", help="train a pipeline and print its time-to-solve")
    train.add_argument("pipeline", help="a pipeline YAML file or a bundled name (e.g. cartpole_ppo)")
    train.add_argument("--mode", choices=["relaxed", "lockstep", "single"], action=_Override, fields=["mode"])
    train.add_argument("--explorers", type=_number("--explorers", int, minimum=1, inclusive=True, what="a whole number"), help="explorer streams",
                       action=_Override, fields=["explorers"])
    train.add_argument("--groups", type=_number("--groups", int, minimum=1, inclusive=True, what="a whole number"),
                       help="learner groups, each with its own explorers; their models are averaged", action=_Override, fields=["groups"])
    train.add_argument("--seed", type=_number("--seed", int, minimum=0, inclusive=True, what="a whole number"), action=_Override, fields=["seed"])
    train.add_argument("--max-seconds", type=_number("--max-seconds", float, minimum=0, inclusive=False, what="a number"), help="stop after this many seconds of training",
                       action=_Override, fields=["stop.max_seconds"])
    train.add_argument("--scheduler", help="join an existing cluster, e.g. tcp://HOST:8786", action=_Override, fields=_scheduler)
    train.add_argument("--set", type=_setting, metavar="KEY=VALUE", help=SET_HELP, action=_Override, fields=lambda kv: dict([kv]))
    train.add_argument("--out", help="results directory (default runs/NAME-MODE-TIME-ID)")
    train.add_argument("--quiet", action="store_true", help="no live progress display")
    train.add_argument("--verbose", action="store_true", help="print when each step of the start was reached and how long the shutdown took")
    resume = sub.add_parser("resume", help="continue a stopped or crashed run from its newest checkpoint")
    resume.add_argument("run_dir", metavar="RUN_DIR", help="the run's results directory")
    resume.add_argument("--max-seconds", type=_number("--max-seconds", float, minimum=0, inclusive=False, what="a number"), help="a new time budget (training seconds in all)",
                        action=_Override, fields=["stop.max_seconds"])
    resume.add_argument("--scheduler", help="continue on an existing cluster, e.g. tcp://HOST:8786", action=_Override, fields=_scheduler)
    resume.add_argument("--set", type=_setting, metavar="KEY=VALUE", help=SET_HELP + "; not env, algo.name or groups",
                        action=_Override, fields=lambda kv: dict([kv]))
    resume.add_argument("--quiet", action="store_true", help="no live progress display")
    resume.add_argument("--verbose", action="store_true", help="print when each step of the start was reached and how long the shutdown took")
    plot = sub.add_parser("plot", help="write PNG figures of recorded runs (several runs: one figure each, overlaid)")
    plot.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a run's results directory")
    plot.add_argument("--out", help="where the PNGs go (default RUN_DIR/plots of the first run)")
    sub.add_parser("pipelines", help="list the bundled pipelines: name, env id, algorithm, target return")
    ev = sub.add_parser("eval", help="play a run's policy (deterministic) from its newest checkpoint; optionally record videos")
    ev.add_argument("run_dir", metavar="RUN_DIR", help="the run's results directory")
    ev.add_argument("--checkpoint", help="a checkpoint file (default: the run's newest)")
    ev.add_argument("--episodes", type=_number("--episodes", int, minimum=1, inclusive=True, what="a whole number"), default=10)
    ev.add_argument("--seed", type=_number("--seed", int, minimum=0, inclusive=True, what="a whole number"), default=0,
                    help="env seed of the first episode (the next ones count up)")
    ev.add_argument("--video", metavar="DIR", help="write one MP4 per episode here (needs the video extra)")
    rp = sub.add_parser("replay", help="re-execute a relaxed or lockstep run exactly, in one process, and check its final weights")
    rp.add_argument("run_dir", metavar="RUN_DIR", help="the run's results directory")
    sw = sub.add_parser("sweep", help="search hyperparameters: an Optuna study (or --pbt) of trials run K at a time on one cluster")
    sw.add_argument("pipeline", help="a pipeline YAML file or a bundled name (e.g. cartpole_ppo)")
    sw.add_argument("--param", action="append", metavar="KEY=SPEC", default=[], dest="params",
                    help="a dotted pipeline field and its range: loguniform:LO:HI, uniform:LO:HI, int:LO:HI or choice:A,B,C; repeatable")
    sw.add_argument("--trials", type=_number("--trials", int, minimum=1, inclusive=True, what="a whole number"), default=8,
                    help="trials in all (a resumed sweep counts the ones done)")
    sw.add_argument("--concurrent", type=_number("--concurrent", int, minimum=1, inclusive=True, what="a whole number"), default=2,
                    help="trials at once (with --pbt: the population)")
    sw.add_argument("--objective", choices=["time_to_solve", "final_return", "eval_return"],
                    help="what a trial is judged by (default: time_to_solve; with --pbt, final_return)")
    sw.add_argument("--max-seconds", type=_number("--max-seconds", float, minimum=0, inclusive=False, what="a number"),
                    help="each trial's training budget (unsolved trials count with it)")
    sw.add_argument("--out", default=None, help="the sweep's folder (default sweeps/NAME); the same --out resumes a stopped sweep")
    sw.add_argument("--pruner", choices=["median", "hyperband", "none"], default="median")
    sw.add_argument("--sampler", choices=["tpe", "random"], default="tpe")
    sw.add_argument("--seed", type=_number("--seed", int, minimum=0, inclusive=True, what="a whole number"), default=0,
                    help="the sampler's seed")
    sw.add_argument("--pbt", action="store_true", help="population-based training instead of a study")
    sw.add_argument("--pbt-interval", type=_number("--pbt-interval", float, minimum=0, inclusive=False, what="a number"),
                    default=None, help="seconds between exploit-and-explore steps (default: a fifth of --max-seconds)")
    sw.add_argument("--scheduler", help="run the trials on an existing cluster, e.g. tcp://HOST:8786", action=_Override, fields=_scheduler)
    sw.add_argument("--set", type=_setting, metavar="KEY=VALUE", help=SET_HELP, action=_Override, fields=lambda kv: dict([kv]))
    sw.add_argument("--quiet", action="store_true", help="print only the final table")
    show = sub.add_parser("show", help="print a pipeline as YAML, resolved and validated (every field, defaults filled in)")
    show.add_argument("pipeline", help="a pipeline YAML file or a bundled name (e.g. cartpole_ppo)")
    show.add_argument("--set", type=_setting, metavar="KEY=VALUE", help=SET_HELP, action=_Override, fields=lambda kv: dict([kv]))
    return parser


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
    from tianji_dask.evaluate import evaluate

    ev = evaluate(args.run_dir, checkpoint_path=args.checkpoint, episodes=args.episodes, seed=args.seed,
                  video_dir=args.video)
    print(f"tianji-dask: {len(ev.returns)} episodes, deterministic policy of {ev.checkpoint} (version {ev.version}): "
          f"mean return {ev.mean:.2f} ± {ev.std:.2f}")
    print("tianji-dask: returns " + ", ".join(f"{r:.1f}" for r in ev.returns))
    for video in ev.videos:
        print(f"tianji-dask: video {video}")
    return 0


def cmd_replay(args) -> int:
    from tianji_dask.replay import ReplayMismatch, replay

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
    from tianji_dask.config import load_pipeline, pipeline_yaml

    print(pipeline_yaml(load_pipeline(args.pipeline, overrides=_overrides(args))), end="")
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


def main(argv=None) -> int:
    """The CLI. Run as the program (``argv`` None), it ends the process as soon as every exit
    handler has run (see ``_exit_now``)."""
    if argv is not None:
        return _command(argv)
    atexit.register(_exit_now)  # the first registered runs last, after every other exit handler
    _exit_now.code = _command(None)
    return _exit_now.code


def _exit_now() -> None:
    """Skip what would follow the exit handlers: Python's teardown (a full garbage collection
    over every object torch and bokeh made) and torch's C++ destructors, seconds on a small
    machine, with the results written, the cluster closed and nothing left to free."""
    code = getattr(_exit_now, "code", None)
    if code is None:  # main raised: the usual exit, with its traceback
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _keep_traceback() -> str:
    """Write the exception being handled to ``error.txt`` in the run's folder, or a temporary
    file when the run has none; returns where."""
    import tempfile
    import traceback

    text = traceback.format_exc()
    out = _keep_traceback.run_out
    if out is not None and os.path.isdir(out):
        with contextlib.suppress(OSError):
            path = os.path.join(out, "error.txt")
            with open(path, "w") as fh:
                fh.write(text)
            return path
    fd, path = tempfile.mkstemp(prefix="tianji-dask-error-", suffix=".txt")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return path


_keep_traceback.run_out = None


def _command(argv) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command in ("train", "resume"):
            from tianji_dask.cli_train import SigTerm, cmd_resume, cmd_train

            with SigTerm.handled():
                return (cmd_train if args.command == "train" else cmd_resume)(args)
        if args.command == "sweep":
            from tianji_dask.cli_sweep import cmd_sweep
            from tianji_dask.cli_train import SigTerm

            with SigTerm.handled():  # SIGTERM stops the running trials as Ctrl-C does
                return cmd_sweep(args, _overrides(args))
        if args.command == "plot":
            return cmd_plot(args)
        if args.command == "pipelines":
            return cmd_pipelines(args)
        if args.command == "show":
            return cmd_show(args)
        if args.command == "eval":
            return cmd_eval(args)
        if args.command == "replay":
            return cmd_replay(args)
    except PipelineError as err:  # CheckpointError and RunDirError are PipelineErrors too
        print(f"tianji-dask: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except RunFault as err:
        print(f"tianji-dask: error: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # noqa: BLE001 - a fault with no line of its own: one line, its traceback in a file
        first = (str(err).strip().splitlines() or [""])[0][:300]
        print(f"tianji-dask: error: {type(err).__name__}: {first} (traceback: {_keep_traceback()})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # while starting, or a second Ctrl-C (or SIGTERM) during the clean stop
        from tianji_dask.cli_train import SigTerm

        print("tianji-dask: interrupted" + (" (SIGTERM)" if SigTerm.received else ""), file=sys.stderr)
        return EXIT_TERMINATED if SigTerm.received else EXIT_INTERRUPTED
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
