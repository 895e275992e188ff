"""What the command prints of a run besides its own lines: the notes a run says through the
``tianji_dask`` logger (``run/quiet.py``), each a ``tianji-dask:`` line. Imports nothing heavy."""

from __future__ import annotations

import contextlib
import logging

LOGGER = "tianji_dask"  # run.quiet.LOGGER; importing it would import the run package, torch and all


class CommandLines(logging.Handler):
    """Each record of the ``tianji_dask`` logger a ``tianji-dask:`` line on ``stream``."""

    def __init__(self, stream):
        super().__init__(logging.WARNING)
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        print(f"tianji-dask: {record.getMessage()}", file=self.stream, flush=True)


@contextlib.contextmanager
def command_lines(stream):
    """The ``tianji_dask`` logger's notes as ``tianji-dask:`` lines on ``stream`` (stdout while
    training; stderr where stdout is data) while the block runs, and nowhere else."""
    log = logging.getLogger(LOGGER)
    handler, propagate = CommandLines(stream), log.propagate
    log.addHandler(handler)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.propagate = propagate


#: why a run stopped (its results' ``stop_reason``), in words; a budget names the setting it is
STOP_WORDS = {
    "max_env_steps": "env-step budget reached (stop.max_env_steps)",
    "max_updates": "update budget reached (stop.max_updates)",
    "max_seconds": "time budget reached (stop.max_seconds)",
    "solved": "target reached",
    "error": "stopped by an error",
    "numeric_fault": "stopped on non-finite numbers",
    "disk": "stopped: a checkpoint could not be written",
    "explorer_failures": "stopped: an explorer stream failed chunk after chunk",
    "env_errors": "stopped: the envs raised too often (env.max_errors)",
    "scheduler_lost": "stopped: the scheduler was lost",
    "learner_lost": "stopped: the learner's worker was lost",
    "worker_closed": "stopped: the learner's worker closed",
    "driver_error": "stopped by an error in the driver",
    "replicas": "stopped: the learner replicas could not go on together",
}


def stop_words(reason: str | None, stopped_by: str = "Ctrl-C") -> str:
    """A ``stop_reason`` in words; ``stopped`` (asked to stop) is said as ``stopped by STOPPED_BY``
    (Ctrl-C, SIGTERM); a group's or a replica's reason (``group G: REASON``, ``replica R: REASON``)
    keeps its group or replica."""
    if reason is None:
        return "stopped"
    if reason.startswith(("group ", "replica ")) and ": " in reason:
        group, _, rest = reason.partition(": ")
        return f"{group}: {stop_words(rest, stopped_by)}"
    if reason == "stopped":
        return f"stopped by {stopped_by}"
    return STOP_WORDS.get(reason, f"stopped: {reason}")


def unsolved(results: dict, stopped_by: str = "Ctrl-C") -> str:
    """How a run that did not solve ended, in one line (without the ``tianji-dask: `` prefix):
    ``not solved: WHY after ...``, or for a run with no target ``finished (no target): WHY after ...``."""
    head = "not solved" if results.get("target_return") is not None else "finished (no target)"
    mean = results.get("final_mean_return")
    return (f"{head}: {stop_words(results.get('stop_reason'), stopped_by)} after {results['wall_s']:.1f} s, "
            f"{results['env_steps']:,} env steps, final mean return {'-' if mean is None else format(mean, '.1f')}")
