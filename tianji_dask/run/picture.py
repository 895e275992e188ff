"""``learning_curve.png``, the picture a run leaves in its folder as it ends (``logging.plot``).

Drawn on a thread of its own once the results are written, while the run's cluster closes, so
the line that says how the run ended waits for it little; written whole or not at all. A run
whose picture cannot be drawn (no matplotlib, any error drawing it) says so in one line and
ends as it would have: the picture is never the run's fault.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from tianji_dask.errors import first_line
from tianji_dask.run import quiet

NAME = "learning_curve.png"
#: how long a run's end waits for its picture once the cluster has closed; past it, the picture is
#: left to finish (or not) on its own, as the run's results are already written
WAIT_S = 60.0


def start(plot: bool, out: Path, results: dict, episodes: np.ndarray, chunks: np.ndarray) -> threading.Thread | None:
    """Begin drawing the picture of a run that ``plot``s and has at least one episode; the
    thread drawing it (``finish`` waits for it), or None."""
    if not plot or not len(episodes):
        return None
    thread = threading.Thread(target=_draw, args=(Path(out), results, episodes, chunks), name="tianji-learning-curve",
                              daemon=True)
    thread.start()
    return thread


def finish(thread: threading.Thread | None, timeout: float = WAIT_S) -> None:
    """Wait for the picture ``start`` began (at most ``timeout`` s)."""
    if thread is not None:
        thread.join(timeout)


def _draw(out: Path, results: dict, episodes: np.ndarray, chunks: np.ndarray) -> None:
    try:
        import matplotlib  # noqa: F401 - a dependency of tianji-dask, but an environment may lack it
    except ImportError:
        quiet.say(f"no {NAME}: matplotlib is not installed (pip install matplotlib, or reinstall tianji-dask, "
                  "which depends on it); set logging.plot: false to skip it")
        return
    try:
        from tianji_dask.observe.plots import write_learning_curve

        write_learning_curve(out / NAME, results, episodes, chunks)
    except Exception as err:  # noqa: BLE001 - the picture is never the run's fault: one line, and the run ends as it would
        quiet.say(f"no {NAME}: {first_line(err)}")
