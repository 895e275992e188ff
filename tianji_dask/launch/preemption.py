"""Preloaded into a batch job's learner worker: the batch system's SIGTERM becomes a handoff.

A queue that preempts a job, a job at its walltime, and ``scancel --signal=TERM`` send SIGTERM to
every process of the job, and SIGKILL some seconds later (Slurm's KillWait, 30 s by default).
``dask worker`` answers SIGTERM by closing its nanny, which closes the worker process within 10 s;
the worker's close runs this preload's teardown before it drops its connections. So: on SIGTERM
the learner this worker hosts hands off at once (no drain: what is out is cancelled, its credits
come back; a checkpoint is written), and the teardown waits for that to end, at most
``TEARDOWN_WAIT_S``. The driver rebuilds the learner from that checkpoint on a fresh learner job.

The embedded cluster's workers do not load this: their SIGTERM is the driver's (worker_preload).
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time

TEARDOWN_WAIT_S = 7.0  # within the nanny's 10 s close (it kills the process at 8)


def _learners(worker) -> list:
    from tianji_dask.dask_internals import worker_actors

    return [actor for actor in worker_actors(worker) if hasattr(actor, "hand_off_now")]


def dask_setup(worker) -> None:
    if threading.current_thread() is not threading.main_thread():  # signal handlers are set there only
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):
        worker.loop.add_callback(_hand_off, worker)
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, on_term)


async def _hand_off(worker) -> None:
    for learner in _learners(worker):
        await learner.hand_off_now()


async def dask_teardown(worker) -> None:
    """The worker closes: let a learner that is handing off finish its checkpoint first."""
    deadline = time.time() + TEARDOWN_WAIT_S
    while time.time() < deadline and any(learner.handing_off for learner in _learners(worker)):
        await asyncio.sleep(0.05)
