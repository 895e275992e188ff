"""The ``tianji-dask`` command: ``parser`` reads the flags, ``train``, ``seeds`` and ``sweep`` run
training, ``commands`` the small subcommands, ``output`` a run's notes as lines, ``signals`` how an
invocation ends. Nothing heavy is imported
before a training command starts the process its workers fork from."""

from __future__ import annotations

import atexit
import os
import sys

from tianji_dask.cli.output import command_lines
from tianji_dask.cli.parser import build_parser, overrides
from tianji_dask.cli.signals import EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USAGE, Invocation
from tianji_dask.errors import PipelineError, RunFault, first_line  # not config: it imports torch, and the CLI starts first


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


def _command(argv) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # a bare `tianji-dask`: what it can do, as a usage error
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    invocation = Invocation()
    try:
        # a run's notes are lines of the command's output; where stdout is data (show's YAML), on stderr
        with invocation.sigterm.handled(), command_lines(sys.stderr if args.command == "show" else sys.stdout):
            return _dispatch(args, invocation)
    except PipelineError as err:  # CheckpointError and RunDirError are PipelineErrors too
        print(f"tianji-dask: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except RunFault as err:
        print(f"tianji-dask: error: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # noqa: BLE001 - a fault with no line of its own: one line, its traceback in a file
        print(f"tianji-dask: error: {first_line(err)} (traceback: {invocation.keep_traceback()})",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # while starting, or a second Ctrl-C (or SIGTERM) during the clean stop
        received = invocation.sigterm.received
        print("tianji-dask: interrupted" + (" (SIGTERM)" if received else ""), file=sys.stderr)
        return EXIT_TERMINATED if received else EXIT_INTERRUPTED


def _dispatch(args, invocation: Invocation) -> int:
    if args.command == "train" and args.seeds:
        from tianji_dask.cli.seeds import cmd_seeds

        return cmd_seeds(args, invocation)
    if args.command in ("train", "resume", "attach"):
        from tianji_dask.cli.train import cmd_attach, cmd_resume, cmd_train

        return {"train": cmd_train, "resume": cmd_resume, "attach": cmd_attach}[args.command](args, invocation)
    if args.command == "sweep":  # SIGTERM stops the running trials as Ctrl-C does
        from tianji_dask.cli.sweep import cmd_sweep

        return cmd_sweep(args, overrides(args))
    from tianji_dask.cli import commands

    return {"plot": commands.cmd_plot, "pipelines": commands.cmd_pipelines, "show": commands.cmd_show,
            "eval": commands.cmd_eval, "export": commands.cmd_export,
            "replay": commands.cmd_replay}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
