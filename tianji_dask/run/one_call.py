"""``tianji_dask.train``: a run in one call, which raises when the run ends on an error."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from tianji_dask.errors import RunFailed
from tianji_dask.run.checks import PipelineLike
from tianji_dask.run.handle import Run

if TYPE_CHECKING:
    from distributed import Client


def train(pipeline: PipelineLike, client: Client | None = None, *, out: str | os.PathLike | None = None, timeout: float | None = None,
          overrides: dict | None = None, algorithm: type | str | None = None, callbacks: list | None = None,
          progress: bool | None = None, verbose: bool = False, **run_options) -> dict:
    """Start a run, wait for it to end, and return its results: the contents of ``results.json``,
    written to the run's folder (``out``; by default ``runs/NAME-MODE-DATE-TIME-RUNID``).

    Takes what ``Run`` takes: ``client``, ``out``, ``overrides``, ``algorithm``, ``callbacks``,
    ``progress`` (None: a live line in a Jupyter notebook only), ``verbose``, and any other
    keyword of ``Run``; ``timeout`` stops the run after that many seconds (its results written as
    for any other stop). Raises ``PipelineError`` (one line) for a bad pipeline before anything
    starts, and ``RunFailed`` when the run ends on an error: its message is the run's one line
    (``results["error"]``), its ``results`` the results dict; the run's folder holds the results
    files and ``error.txt`` as for any other end. A fault that stops the run or keeps it from
    starting (its cluster cannot start, its results cannot be written) is a ``RunFault``, which is
    a ``RunFailed`` too: one ``except tianji_dask.RunFailed`` catches a run that did not succeed.
    """
    run = Run(pipeline, client, out=out, overrides=overrides, algorithm=algorithm, callbacks=callbacks,
              progress=progress, verbose=verbose, **run_options)
    try:
        run.start()
        results = run.wait(timeout=timeout)
    finally:
        run.close()
    if results.get("error"):
        raise RunFailed(str(results["error"]), results)
    return results
