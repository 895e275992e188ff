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
