"""The ``tianji-dask`` command line: its flags and subcommands, and the pipeline fields they set."""

from __future__ import annotations

import argparse
import math
import re

from tianji_dask.cli.signals import EXIT_USAGE


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Help with each flag's default where it has one (a flag that leaves the pipeline's value
    alone has none to show), and the examples of the epilog as written."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "%(default)" in text or not action.option_strings:
            return text
        if not any(action.default is none for none in (None, False, argparse.SUPPRESS)):
            text += " (default: %(default)s)"
        elif isinstance(action, _Override) and action.dest != "set":
            text += " (default: the pipeline's)"
        return text


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


def _whole(text: str) -> int:
    """A whole number, also written 1e6 or 1_000_000."""
    value = float(text.replace("_", ""))
    if not value.is_integer():
        raise ValueError(text)
    return int(value)


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


def source(args) -> tuple[object, dict]:
    """(the pipeline, the settings the flags give) of ``train`` or ``show``: PIPELINE, or the one
    ``--env ID --algo NAME`` make (a bundled pipeline's settings, RL Zoo's or the algorithm's
    defaults), with a line naming which among the command's notes. PipelineError in one line when
    there is neither, only half of the pair, or both a PIPELINE and the pair."""
    from tianji_dask.errors import PipelineError

    settings = overrides(args)
    if args.env is None and args.algo is None:
        if args.pipeline is None:
            raise PipelineError(f"{args.command}: no pipeline; allowed: PIPELINE (a YAML file or a bundled name, "
                                "see tianji-dask pipelines) or --env ID --algo NAME")
        return args.pipeline, settings
    if args.pipeline is not None:
        raise PipelineError("--env/--algo: make a pipeline of their own, not a change to PIPELINE; allowed: either "
                            "PIPELINE or --env ID --algo NAME (to change a pipeline's env: --set env.id=ID)")
    if args.env is None or args.algo is None:
        raise PipelineError(f"{'--env' if args.env is None else '--algo'}: missing; --env ID and --algo NAME go together")
    import logging

    from tianji_dask.cli.output import LOGGER
    from tianji_dask.config.from_env import pipeline_source

    pipeline, line = pipeline_source(args.env, args.algo, settings)
    logging.getLogger(LOGGER).warning(line)  # a line of the command's output (stderr for show)
    return pipeline, settings


def overrides(args) -> dict:
    """The pipeline fields the flags set, in command-line order (the later setting of a field wins)."""
    overrides: dict = {}
    for key, value in getattr(args, "overrides", None) or ():
        overrides.pop(key, None)  # re-inserted last: applied after the settings given before it
        overrides[key] = value
    return overrides


SET_HELP = "set a pipeline field, dotted, to a YAML value (e.g. stop.max_seconds=60, controller.replay_ratio=null); repeatable"
PIPELINE_HELP = "a pipeline YAML file or a bundled name (e.g. cartpole_ppo)"
QUIET_HELP = "no live progress display"
VERBOSE_HELP = ("show distributed's warnings and logs below ERROR; at the end, when each step of the start was "
                "reached and how long the shutdown took")


def _scheduler(address: str) -> dict:
    return {"cluster.kind": "address", "cluster.address": address}


def _examples(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def _command(sub, name: str, help: str, *examples: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".", epilog=_examples(*examples),
                          formatter_class=_Formatter)


def _total_timesteps(parser, help: str) -> None:
    parser.add_argument("-n", "--total-timesteps", type=_number("--total-timesteps", _whole, minimum=1, what="a whole number"),
                        metavar="N", help=help, action=_Override, fields=["stop.max_env_steps"])


def _source(parser, *, budget: bool) -> None:
    """PIPELINE, or --env and --algo (a pipeline made from the algorithm's defaults)."""
    parser.add_argument("pipeline", nargs="?", help=PIPELINE_HELP + "; or give --env and --algo instead")
    parser.add_argument("--env", metavar="ID", help="a gymnasium env id to train on, with --algo instead of a PIPELINE: "
                        "the bundled pipeline of that env and algorithm, else RL Zoo's hyperparameters for them, else "
                        "the algorithm's defaults, solved at the env's reward_threshold where its spec has one")
    parser.add_argument("--algo", metavar="NAME", help="the algorithm for --env: dqn, impala, maddpg, ppo, sac (any case) "
                        "or module:Class")
    if budget:
        _total_timesteps(parser, "stop after N env steps (stop.max_env_steps; accepts 1e6)")


def build_parser() -> argparse.ArgumentParser:
    from tianji_dask import __version__

    parser = _Parser(prog="tianji-dask", description="Distributed deep-RL training as a Dask dataflow.",
                     formatter_class=_Formatter, epilog=_examples(
                         "tianji-dask train cartpole_ppo", "tianji-dask train --env Acrobot-v1 --algo ppo -n 100000",
                         "tianji-dask SUBCOMMAND --help    # its flags and an example"))
    parser.add_argument("--version", action="version", version=f"tianji-dask {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    train = _command(sub, "train", "train a pipeline and print its time-to-solve",
                     "tianji-dask train cartpole_ppo --explorers 4 --max-seconds 120",
                     "tianji-dask train --env Acrobot-v1 --algo ppo -n 200000 --seeds 0 1 2",
                     "tianji-dask train cartpole_dqn --set algo.config.lr=3e-4 --out runs/lr3e-4")
    _source(train, budget=True)
    train.add_argument("--mode", choices=["relaxed", "lockstep", "single"], help="how the learner takes chunks",
                       action=_Override, fields=["mode"])
    train.add_argument("--explorers", metavar="N", type=_number("--explorers", int, what="a whole number"), help="explorer streams",
                       action=_Override, fields=["explorers"])
    train.add_argument("--groups", metavar="G", type=_number("--groups", int, what="a whole number"),
                       help="learner groups, each with its own explorers; their models are averaged", action=_Override, fields=["groups"])
    train.add_argument("--learner-replicas", metavar="N", type=_number("--learner-replicas", int, what="a whole number"),
                       help="data-parallel learner replicas training one policy, their gradients averaged (learner.replicas)",
                       action=_Override, fields=["learner.replicas"])
    seeds = train.add_mutually_exclusive_group()
    seeds.add_argument("--seed", metavar="S", type=_number("--seed", int, what="a whole number"), help="the run's seed",
                       action=_Override, fields=["seed"])
    seeds.add_argument("--seeds", nargs="+", metavar="S", type=_number("--seeds", int, minimum=0, what="whole numbers"),
                       help="one run per seed, one after another, then a summary: each seed's time-to-solve and their IQM")
    train.add_argument("--max-seconds", metavar="T", type=_number("--max-seconds", float, minimum=0, inclusive=False, what="a number"), help="stop after this many seconds of training",
                       action=_Override, fields=["stop.max_seconds"])
    train.add_argument("--device", help="the learner's torch device: cpu, cuda or cuda:N (learner.device)",
                       action=_Override, fields=["learner.device"])
    train.add_argument("--scheduler", metavar="ADDRESS", help="join an existing cluster, e.g. tcp://HOST:8786", action=_Override, fields=_scheduler)
    train.add_argument("--set", type=_setting, metavar="KEY=VALUE", help=SET_HELP, action=_Override, fields=lambda kv: dict([kv]))
    train.add_argument("--out", metavar="DIR", help="results directory (default runs/NAME-MODE-TIME-ID; with --seeds, OUT/seed-S for each)")
    train.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    train.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    resume = _command(sub, "resume", "continue a stopped or crashed run from its newest checkpoint",
                      "tianji-dask resume runs/cartpole_ppo-relaxed-20260101-120000-1a2b3c4d --max-seconds 600")
    resume.add_argument("run_dir", metavar="RUN_DIR", help="the run's results directory")
    resume.add_argument("--max-seconds", metavar="T", type=_number("--max-seconds", float, minimum=0, inclusive=False, what="a number"), help="a new time budget (training seconds in all)",
                        action=_Override, fields=["stop.max_seconds"])
    _total_timesteps(resume, "a new env-step budget (env steps in all, stop.max_env_steps)")
    resume.add_argument("--scheduler", metavar="ADDRESS", help="continue on an existing cluster, e.g. tcp://HOST:8786", action=_Override, fields=_scheduler)
    resume.add_argument("--set", type=_setting, metavar="KEY=VALUE", help=SET_HELP + "; not env, algo.name or groups",
                        action=_Override, fields=lambda kv: dict([kv]))
    resume.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    resume.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    attach = _command(sub, "attach", "drive a run on an existing scheduler whose driver died: progress, then its results",
                      "tianji-dask attach runs/cartpole_ppo-relaxed-20260101-120000-1a2b3c4d")
    attach.add_argument("run_dir", metavar="RUN_DIR", help="the run's results directory")
    attach.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    attach.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    sw = _command(sub, "sweep", "search hyperparameters: an Optuna study (or --pbt) of trials run K at a time on one cluster",
                  "tianji-dask sweep cartpole_ppo --param algo.config.lr=loguniform:1e-4:1e-2 --trials 8 --max-seconds 60")
    sw.add_argument("pipeline", help=PIPELINE_HELP)
    sw.add_argument("--param", action="append", metavar="KEY=SPEC", default=[], dest="params",
                    help="a dotted pipeline field and its range: loguniform:LO:HI, uniform:LO:HI, int:LO:HI or choice:A,B,C; repeatable")
    sw.add_argument("--trials", type=_number("--trials", int, minimum=1, inclusive=True, what="a whole number"), default=8,
                    help="trials in all (a resumed sweep counts the ones done)")
    sw.add_argument("--concurrent", type=_number("--concurrent", int, minimum=1, inclusive=True, what="a whole number"), default=2,
                    help="trials at once (with --pbt: the population)")
    sw.add_argument("--objective", choices=["time_to_solve", "final_return", "eval_return"],
                    help="what a trial is judged by (default: time_to_solve; with --pbt, final_return)")
    sw.add_argument("--max-seconds", metavar="T", type=_number("--max-seconds", float, minimum=0, inclusive=False, what="a number"),
                    help="each trial's training budget (unsolved trials count with it)")
    sw.add_argument("--out", default=None, help="the sweep's folder (default sweeps/NAME); the same --out resumes a stopped sweep")
    sw.add_argument("--pruner", choices=["median", "hyperband", "none"], default="median", help="which trials stop early")
    sw.add_argument("--sampler", choices=["tpe", "random"], default="tpe", help="how the next trial's values are drawn")
    sw.add_argument("--seed", type=_number("--seed", int, minimum=0, inclusive=True, what="a whole number"), default=0,
                    help="the sampler's seed")
    sw.add_argument("--pbt", action="store_true", help="population-based training instead of a study")
    sw.add_argument("--pbt-interval", type=_number("--pbt-interval", float, minimum=0, inclusive=False, what="a number"),
                    default=None, help="seconds between exploit-and-explore steps (default: a fifth of --max-seconds)")
    sw.add_argument("--scheduler", metavar="ADDRESS", help="run the trials on an existing cluster, e.g. tcp://HOST:8786", action=_Override, fields=_scheduler)
    sw.add_argument("--set", type=_setting, metavar="KEY=VALUE", help=SET_HELP, action=_Override, fields=lambda kv: dict([kv]))
    sw.add_argument("--quiet", action="store_true", help="print only the final table")
    plot = _command(sub, "plot", "write PNG figures of recorded runs (several runs: one figure each, overlaid)",
                    "tianji-dask plot runs/cartpole_ppo-relaxed-* --out figures")
    plot.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a run's results directory")
    plot.add_argument("--out", help="where the PNGs go (default RUN_DIR/plots of the first run)")
    _command(sub, "pipelines", "list the bundled pipelines: name, env id, algorithm, target return", "tianji-dask pipelines")
    show = _command(sub, "show", "print a pipeline as YAML, resolved and validated (every field, defaults filled in)",
                    "tianji-dask show cartpole_ppo --set explorers=4 > mine.yaml",
                    "tianji-dask show --env Pendulum-v1 --algo sac -n 100000")
    _source(show, budget=True)
    show.add_argument("--set", type=_setting, metavar="KEY=VALUE", help=SET_HELP, action=_Override, fields=lambda kv: dict([kv]))
    ev = _command(sub, "eval", "play a run's policy (deterministic) from its newest checkpoint; optionally record videos",
                  "tianji-dask eval runs/cartpole_ppo-relaxed-20260101-120000-1a2b3c4d --episodes 20 --video videos")
    ev.add_argument("run_dir", metavar="RUN_DIR", help="the run's results directory")
    ev.add_argument("--checkpoint", help="a checkpoint file (default: the run's newest)")
    ev.add_argument("--episodes", type=_number("--episodes", int, minimum=1, inclusive=True, what="a whole number"), default=10,
                    help="episodes to play")
    ev.add_argument("--seed", type=_number("--seed", int, minimum=0, inclusive=True, what="a whole number"), default=0,
                    help="env seed of the first episode (the next ones count up)")
    ev.add_argument("--video", metavar="DIR", help="write one MP4 per episode here (needs the video extra)")
    ex = _command(sub, "export", "write a run's deterministic policy (newest checkpoint) as a TorchScript or ONNX file",
                  "tianji-dask export runs/cartpole_ppo-relaxed-20260101-120000-1a2b3c4d --format onnx --out policy.onnx")
    ex.add_argument("run_dir", metavar="RUN_DIR", help="the run's results directory")
    ex.add_argument("--format", required=True, choices=["torchscript", "onnx"], dest="fmt",
                    help="torchscript (torch.jit.load) or onnx (needs the export extra)")
    ex.add_argument("--out", required=True, metavar="FILE", help="the file to write (replaced if there)")
    ex.add_argument("--checkpoint", help="a checkpoint file (default: the run's newest)")
    rp = _command(sub, "replay", "re-execute a relaxed or lockstep run exactly, in one process, and check its final weights",
                  "tianji-dask replay runs/cartpole_ppo-relaxed-20260101-120000-1a2b3c4d")
    rp.add_argument("run_dir", metavar="RUN_DIR", help="the run's results directory")
    return parser

