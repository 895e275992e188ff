"""Preloaded into the embedded cluster's worker processes: Ctrl-C and SIGTERM are for the driver.

A terminal's Ctrl-C sends SIGINT to every process in its foreground group, the cluster's worker
processes too; a batch system's time limit or cancel sends SIGTERM to every process of the job.
Interrupted, the learner's worker dies mid-run, and the driver's clean stop (final state, results
written, chunks accounted for) has no learner left to stop. So the workers ignore both; the
driver catches them, stops the run, writes its results, and closes the cluster, which ends the
workers (with SIGKILL if one does not close, and at once if the driver dies).

A worker whose heartbeat races the cluster's close (the scheduler, in the driver, gone first)
leaves distributed's traceback for it out (``dask_internals.quiet_heartbeat_failures``): the
driver says how the run ended. So does a worker whose peer died while fetching a result from it
(``dask_internals.quiet_lost_peer_transfers``): the run handles that worker's loss.

A worker that has closed ends its process at once: its Python teardown (a garbage collection over
torch's objects, then torch's C++ destructors) takes about a second, and the cluster's close
waits for it.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading


def dask_setup(worker) -> None:
    from tianji_dask import dask_internals

    dask_internals.quiet_heartbeat_failures()
    dask_internals.quiet_lost_peer_transfers()
    if threading.current_thread() is threading.main_thread():  # where signal handlers may be set
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def dask_teardown(worker) -> None:
    # the worker has closed cleanly: exit status 0, and nothing of the process is needed any more
    atexit.register(os._exit, 0)
