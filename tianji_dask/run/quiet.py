"""What a run lets through to the user's terminal or notebook: its own one-line notes (the logger
``tianji_dask``), and none of distributed's warnings and logs below ERROR unless ``verbose``."""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings

LOGGER = "tianji_dask"  # the command line prints its records as its own lines (cli/output.py)


def say(line: str) -> None:
    """One line for the user: through the ``tianji_dask`` logger where logging is set up for it
    (the CLI's handler, a notebook's ``logging.basicConfig``), else on stderr."""
    log = logging.getLogger(LOGGER)
    if log.hasHandlers():
        log.warning(line)
    else:
        print(f"tianji_dask: {line}", file=sys.stderr, flush=True)


def distributed_log_level(verbose: bool) -> int:
    """The level below which the logs of the cluster a run starts (its scheduler here, its worker
    processes) are not shown: ERROR, or with ``verbose`` WARNING (per-task failures, ports)."""
    return logging.WARNING if verbose else logging.ERROR


@contextlib.contextmanager
def kept_quiet(verbose: bool):
    """distributed's Python warnings (e.g. a dashboard port already in use: ``dashboard_moved``
    says it in one line instead) kept from the user while the block runs, unless ``verbose``."""
    with warnings.catch_warnings():
        if not verbose:
            warnings.filterwarnings("ignore", module=r"distributed(\.|$)")
        yield


def dashboard_moved(wanted: str | None, link: str | None) -> tuple[int, int] | None:
    """(wanted, taken) when a cluster the run started could not have the dashboard port it asked for."""
    from urllib.parse import urlsplit

    if not link or not wanted or not wanted.rpartition(":")[2].isdigit():
        return None
    port, taken = int(wanted.rpartition(":")[2]), urlsplit(link).port
    return (port, taken) if port and taken and taken != port else None
