"""The learner actor: builds the learner's parts on its worker and runs its loop in a thread.

Public methods are ``async`` and O(1): they run on the worker's event loop and only read or set
small fields. All consuming and SGD happens in one background thread that holds the worker's
client; it is the only thread that touches the core, the stream and the publisher.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time

from distributed import get_client, get_worker

from tianji_dask import dask_internals
from tianji_dask.core import checkpoint
from tianji_dask.core.learner_core import LearnerCore
from tianji_dask.dataflow.learner.admission import AdmissionClient
from tianji_dask.dataflow.learner.evaluation import EvalClient
from tianji_dask.dataflow.learner.fusion import FusionClient
from tianji_dask.dataflow.learner.lockstep import LockstepLoop
from tianji_dask.dataflow.learner.relaxed import RelaxedLoop
from tianji_dask.dataflow.learner.report import LearnerReport
from tianji_dask.dataflow.learner.results import CpuClock, learner_extras
from tianji_dask.dataflow.learner.spec import LearnerSpec
from tianji_dask.dataflow.learner.stream import ExplorerStream
from tianji_dask.dataflow.learner.weights import WeightsPublisher


def worker_started() -> float:
    """When this worker's process started (unix s)."""
    import psutil

    return psutil.Process().create_time()


class Learner:
    def __init__(self, spec: LearnerSpec):
        worker = get_worker()
        client = get_client()  # background threads have no worker context: capture it here
        sys.setswitchinterval(0.001)  # a Python-heavy learner thread otherwise slows the worker's comms
        self.spec = spec
        self._worker_address = worker.address
        self.core = core = LearnerCore(spec.core)
        self.admission = AdmissionClient(client, run_id=spec.run_id, group=spec.group, law=spec.law,
                                         learner_address=worker.address, chunk_env_steps=spec.chunk_env_steps,
                                         rebuilt=spec.rebuilt)
        if self.admission.params.rho_max is not None:
            core.set_replay_ratio_max(self.admission.params.rho_max)
        window = core.restored.get("controller", {}).get("window")
        if window:
            self.admission.set_window(window)
        core.checkpoint_extra = lambda: {"controller": self.admission.params.to_wire(), "run_id": spec.run_id}
        self.fusion = None
        if spec.fusion is not None:
            from tianji_dask.dataflow.learner.reducer import Reducer

            reducer = dask_internals.actor_handle(Reducer, spec.fusion.reducer_address, spec.fusion.reducer_key, worker)
            self.fusion = FusionClient(spec.fusion, spec.group, reducer)
        inline = WeightsPublisher.fits_inline(core.weights(), spec.inline_weights_max_bytes)
        self.publisher = WeightsPublisher(client, worker.address, spec.tag, inline)
        self.stream = ExplorerStream(client, run_id=spec.run_id, tag=spec.tag, group=spec.group, streams=spec.streams,
                                     chunk_steps=spec.chunk_steps, worker_address=worker.address,
                                     direct_min_bytes=spec.direct_min_bytes, timed=core.timed,
                                     hosts=spec.explorer_hosts)
        self._stop = threading.Event()
        self._report = LearnerReport()
        self._final: dict | None = None
        self._ended: tuple | None = None  # (event loop, asyncio.Event) of a status call waiting for the end
        strategy = LockstepLoop if spec.mode == "lockstep" else RelaxedLoop
        self.loop = strategy(spec=spec, core=core, stream=self.stream, publisher=self.publisher,
                             admission=self.admission, fusion=self.fusion, stop_event=self._stop,
                             on_status=self._set_status)
        if spec.eval is not None:
            self.loop.evaluation = EvalClient(client, spec.eval, run_id=spec.run_id, tag=spec.tag,
                                              hosts=spec.explorer_hosts)
        if spec.lifetime_s is not None:  # counted from the worker's start: a batch job's walltime runs from there
            self.loop.handoff_at = worker_started() + spec.lifetime_s
        self._handoff: dict | None = None  # what a handoff left, once the learner has stopped for it
        self._handoff_asked = False
        self._cpu = CpuClock()
        self._ended_event = threading.Event()  # set once the final books exist (on disk too, if the worker closes)
        self._thread = threading.Thread(target=self._main, name="tianji-learner", daemon=True)
        self._thread.start()

    @property
    def version(self) -> int:
        return self.core.version

    # ---- public, O(1), on the event loop ------------------------------------------------
    async def status(self, wait_s: float = 0.0) -> LearnerReport:
        """The newest report; with ``wait_s``, once the learner has finished or ``wait_s`` seconds
        have passed, whichever is first: a driver that polls this way hears of the end at once."""
        if wait_s > 0:
            if self._ended is None:
                self._ended = (asyncio.get_running_loop(), asyncio.Event())
            if self._final is None:  # read after _ended is set: _finish sees one or the other
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._ended[1].wait(), wait_s)
        return self._report

    async def stop(self) -> None:
        self._stop.set()

    async def hand_off_now(self) -> bool:
        """Hand off at once (the worker is being preempted): no drain, a checkpoint, then stop.
        False when the learner has no handoff to make (it does not checkpoint, or it has ended)."""
        if not self.core.checkpoints or self._final is not None:
            return False
        self.loop.handoff_at = time.time()
        self._handoff_asked = True
        return True

    def worker_closing(self) -> threading.Event:
        """Its worker is closing under it (its scheduler lost: ``closing.py``): stop now, without a
        word to the scheduler, write a checkpoint and the final books into the run folder. The
        event is set once they are there (at once, for a learner that has ended). A learner
        handing off (its job preempted: the worker closes on the batch system's SIGTERM, its
        scheduler alive) goes on with the handoff, whose checkpoint the driver takes up."""
        if self._final is None and not self._handoff_asked:
            self.loop.worker_closing = True
            self._stop.set()
        return self._ended_event

    @property
    def handing_off(self) -> bool:
        """A handoff was asked for (``hand_off_now``) and the learner has not ended yet."""
        return self._handoff_asked and self._final is None

    async def final(self) -> dict | None:
        """Results, episodes and chunk rows once the run has ended; None before."""
        return self._final

    # ---- background thread --------------------------------------------------------------
    def _set_status(self, status: dict) -> None:
        self._report = LearnerReport(status, done=self._final is not None, handoff=self._handoff,
                                     handoff_at=self.loop.handoff_at, first_update_t=self.loop.first_update_t,
                                     worker_closed=self.loop.worker_closing)

    def _main(self) -> None:
        self._cpu.start()
        try:
            self.core.run(self.loop.run)
        finally:
            try:
                self._finish()
            finally:
                self._ended_event.set()

    def _finish(self) -> None:
        core = self.core
        core.request_stop("stopped")
        extras = learner_extras(cpu=self._cpu, publisher=self.publisher, stream=self.stream, fusion=self.fusion,
                                group=self.spec.group)
        extras["learner_chunks"] = self.loop.chunk_books()
        self._set_status(self.loop.status(time.time()))
        final = core.finish(extras, final_status=lambda _: self._report.status)
        closing = self.loop.worker_closing
        if closing:
            from tianji_dask.dataflow.learner.finals import write_final

            with contextlib.suppress(OSError):  # a full disk: the checkpoint, if written, stays
                write_final(core.spec.rows_dir, final.as_dict())
        else:
            self.stream.close()
            self.publisher.close()
        handoff, path = self.loop.handoff, core.last_checkpoint
        if handoff is not None and core.error is None and path is not None:  # the loop's end wrote that checkpoint
            self._handoff = {**handoff, "checkpoint": str(path), "worker": self._worker_address,
                             "cause": "preempted" if self._handoff_asked else "lifetime", "t_run_start": core.t_run_start}
            with contextlib.suppress(OSError):  # the status below still carries it to a driver that asks in time
                checkpoint.save_handoff(path.parent, self._handoff)
        self._final = final.as_dict()
        self._set_status(self.loop.status(time.time()))
        if self._ended is not None:
            loop, ended = self._ended
            loop.call_soon_threadsafe(ended.set)
