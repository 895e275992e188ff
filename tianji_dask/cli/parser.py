"""The ``tianji-dask`` command line: its flags and subcommands, and the pipeline fields they set."""

from __future__ import annotations

import argparse
import math
import re

from tianji_dask.cli.signals import EXIT_USAGE


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _number(flag: str, cast, *, minimum=None, inclusive: bool = True, what: str):
    """An argparse type: ``cast`` the text and check it against ``minimum``; one-line errors.
    Without ``minimum`` only the type is checked here: a flag that sets a pipeline field leaves
    its range to the field's one declaration (config/)."""
    allowed = f"{flag} must be {what}" + ("" if minimum is None else f" {'>=' if inclusive else '>'} {minimum:g}")

    def parse(text):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{allowed}, got {text!r}") from None
        if not math.isfinite(value) or (minimum is not None and (value < minimum or (value == minimum and not inclusive))):
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


def overrides(args) -> dict:
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
    train.add_argument("--explorers", type=_number("--explorers", int, what="a whole number"), help="explorer streams",
                       action=_Override, fields=["explorers"])
    train.add_argument("--groups", type=_number("--groups", int, what="a whole number"),
                       help="learner groups, each with its own explorers; their models are averaged", action=_Override, fields=["groups"])
    train.add_argument("--seed", type=_number("--seed", int, what="a whole number"), action=_Override, fields=["seed"])
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
    attach = sub.add_parser("attach", help="drive a run on an existing scheduler whose driver died: progress, then its results")
    attach.add_argument("run_dir", metavar="RUN_DIR", help="the run's results directory")
    attach.add_argument("--quiet", action="store_true", help="no live progress display")
    attach.add_argument("--verbose", action="store_true",
                        help="print when each step of the start was reached and how long the shutdown took")
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
    ex = sub.add_parser("export", help="write a run's deterministic policy (newest checkpoint) as a TorchScript or ONNX file")
    ex.add_argument("run_dir", metavar="RUN_DIR", help="the run's results directory")
    ex.add_argument("--format", required=True, choices=["torchscript", "onnx"], dest="fmt",
                    help="torchscript (torch.jit.load) or onnx (needs the export extra)")
    ex.add_argument("--out", required=True, metavar="FILE", help="the file to write (replaced if there)")
    ex.add_argument("--checkpoint", help="a checkpoint file (default: the run's newest)")
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
