"""When a learner's worker closes under it: Dask closes a worker the moment its connection to the
scheduler breaks (``Worker.handle_scheduler``). A learner still training then has its state only
in that process. This worker plugin, on every worker of a run, holds the worker's close (the
worker awaits its plugins' ``teardown`` before its process ends) while the
learner it hosts stops without a word to the scheduler, writes a checkpoint, and writes its final
books (results, episodes, chunks) into the run folder, where the driver reads them back
(``finals.read_final``)."""

from __future__ import annotations

import asyncio

from distributed import WorkerPlugin

from tianji_dask import dask_internals

#: at most this long the worker's close waits for its learner: a learner stops within a pass of
#: its loop, then writes a checkpoint and its books; a busy machine can take tens of seconds
CLOSE_WAIT_S = 60.0


class LearnerCloseGuard(WorkerPlugin):
    """Registered on every worker of a run; only a worker hosting one of its learners waits."""

    def __init__(self, run_id: str):
        self.run_id = run_id

    async def teardown(self, worker) -> None:
        from tianji_dask.dataflow.learner.actor import Learner

        for learner in dask_internals.worker_actors(worker):
            if isinstance(learner, Learner) and learner.spec.run_id == self.run_id:
                ended = learner.worker_closing()
                await asyncio.to_thread(ended.wait, CLOSE_WAIT_S)
