"""The Learner actor: owns the stream of explorer futures, trains, publishes weights.

Public methods are ``async`` and O(1): they run on the worker's event loop and only read or set
small fields. All consuming and SGD happens in one background thread that holds the worker's
client; it is the only thread that touches the algorithm, the ledger and the futures.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback
import uuid
from collections import deque

from distributed import as_completed, get_client, get_worker

from tianji_dask.dataflow.explorer import explore_chunk
from tianji_dask.dataflow.ledger import Ledger
from tianji_dask.torch_setup import prepare_torch

STATUS_EVERY_S = 0.2


class Learner:
    # a class attribute so the actor proxy can read it (proxy getattr looks on the class)
    version = 0

    def __init__(self, spec: dict):
        """``spec``: run_id, mode, explorers, chunk_steps, window, publish_every, threads,
        explorer_workers, t_process_start, stop (a StopConfig), make_algo (a picklable
        zero-argument callable building the algorithm)."""
        self._worker = get_worker()
        self._client = get_client()  # background threads have no worker context: capture it here
        sys.setswitchinterval(0.001)  # a Python-heavy learner thread otherwise slows comms 5-15x
        prepare_torch(spec["threads"])
        self.spec = spec
        self.run_id = spec["run_id"]
        self.algo = spec["make_algo"]()
        self.version = 0
        self._stop = threading.Event()
        self._weights: deque = deque(maxlen=2)  # (version, future): the last two published
        self._published_version = -1
        self._publishing: tuple | None = None  # (version, key, concurrent future) of a scatter in progress
        self._status: dict = {}
        self._final: dict | None = None
        self._in_flight: dict[str, tuple] = {}  # key -> (future, explorer_id, submit_version)
        self._client.sync(
            self._client.scheduler.tianji_begin, run_id=self.run_id, window=spec["window"],
            learner_address=self._worker.address,
        )
        self.t_run_start = time.time()  # run start: cluster up, learner built
        self.ledger = Ledger(
            spec["stop"], t_run_start=self.t_run_start, t_process_start=spec["t_process_start"],
            explorer_workers=spec["explorer_workers"],
        )
        self._thread = threading.Thread(target=self._main, name="tianji-learner", daemon=True)
        self._thread.start()

    # ---- public, O(1), on the event loop ------------------------------------------------
    async def status(self) -> dict:
        return self._status

    async def stop(self) -> None:
        self._stop.set()

    async def final(self) -> dict | None:
        """Results, episodes and chunk rows once the run has ended; None before."""
        return self._final

    # ---- background thread --------------------------------------------------------------
    def _main(self) -> None:
        error = None
        try:
            self._loop()
        except BaseException:  # noqa: BLE001 - reported to the client, never swallowed
            error = traceback.format_exc()
            self.ledger.request_stop("error")
        finally:
            self._finish(error)

    def _publish(self, wait: bool = False) -> None:
        """Scatter the current weights under a versioned key, without waiting by default.

        The scatter runs on the worker's event loop while this thread keeps training; explorer
        tasks take the newest version whose scatter has completed (``_newest_weights``), so an
        off-policy chunk's policy may lag its submission by the updates made during one scatter.
        A blocking scatter per submission cost about a quarter of the learner thread's time in
        DQN runs."""
        if self._publishing is not None:
            return  # one scatter at a time; the next submission publishes the newer version
        weights = self.algo.get_weights()
        key = f"tianji-weights-{self.run_id}-{self.version}"
        coro = self._client._scatter({key: weights}, hash=False, workers=[self._worker.address], direct=True)
        self._publishing = (self.version, key, asyncio.run_coroutine_threadsafe(coro, self._client.loop.asyncio_loop))
        self._published_version = self.version
        if wait:
            self._publishing[2].result()
        self._newest_weights()

    def _newest_weights(self) -> tuple[int, object]:
        """(version, future) of the newest weights whose scatter has completed."""
        if self._publishing is not None and self._publishing[2].done():
            version, key, done = self._publishing
            self._publishing = None
            self._weights.append((version, done.result()[key]))
        return self._weights[-1]

    def _loop(self) -> None:
        spec, algo, ledger = self.spec, self.algo, self.ledger
        lockstep = spec["mode"] == "lockstep"
        idle = deque(range(spec["explorers"]))
        reports: list[list] = []  # consumed rows not yet reported to the controller
        reported_futs: list = []  # futures kept alive until their consumption is reported
        ac = as_completed([], with_results=True, raise_errors=False)
        self._publish(wait=True)
        last_status = 0.0
        round_open = False  # lockstep: a round's chunks are out or being trained on

        while not self._stop.is_set() and ledger.check_stop() is None:
            # 1. consume whatever has arrived; block only when there is nothing else to do
            must_wait = (lockstep and round_open) or (not algo.ready() and not idle)
            batch = ac.next_batch(block=bool(must_wait)) if self._in_flight else []
            for fut, chunk in batch:
                _, eid, submit_version = self._in_flight.pop(fut.key)
                idle.append(eid)
                reported_futs.append(fut)
                if fut.status != "finished":
                    ledger.record_lost(fut.key, eid, f"{type(chunk).__name__}: {chunk}")
                    continue
                kept = algo.ingest(chunk, self.version - chunk["policy_version"])
                staleness, age_s = ledger.consume(chunk, self.version, kept, submit_version=submit_version)
                reports.append([fut.key, eid, chunk["env_steps"], chunk["nbytes"], staleness, age_s])
            del batch

            # 2. lockstep trains only when the whole round is in, then broadcasts
            if lockstep and round_open and not self._in_flight:
                while algo.ready() and ledger.check_stop() is None:
                    self._learn_once()
                round_open = False

            # 3. hand idle explorer streams new work before training, so they run while we train
            #    (lockstep: only a full round at once)
            if idle and (not lockstep or not round_open):
                if self.version - self._published_version >= spec["publish_every"] or (
                    lockstep and self._published_version != self.version
                ):
                    # on-policy data and lockstep rounds need the new version itself; off-policy
                    # explorers may start on the previous one while the scatter completes
                    self._publish(wait=lockstep or algo.on_policy)
                wref_version, wref = self._newest_weights()
                want = {f"tianji-explore-{self.run_id}-{uuid.uuid4().hex[:12]}": eid for eid in idle}
                granted = self._client.sync(
                    self._client.scheduler.tianji_cycle, consumed=reports, want=list(want),
                    learner_version=self.version,
                )
                reports, reported_futs = [], []
                explore = algo.exploration(ledger.env_steps, self.version)
                for key in granted:
                    eid = want[key]
                    idle.remove(eid)
                    fut = self._client.submit(
                        explore_chunk, self.run_id, wref, wref_version, eid, spec["chunk_steps"], explore,
                        key=key, resources={"EXPLORER": 1}, pure=False,
                    )
                    self._in_flight[key] = (fut, eid, self.version)
                    ac.add(fut)
                if lockstep and granted:
                    round_open = True
                if not granted and not self._in_flight and not algo.ready():
                    time.sleep(0.005)  # window full of another run's credits: ask again shortly

            # 4. relaxed: one update per pass, so arriving chunks are picked up between updates
            if not lockstep and algo.ready():
                self._learn_once()

            now = time.time()
            if now - last_status >= STATUS_EVERY_S:
                self._update_status(now)
                last_status = now

        # report what was consumed; cancel what is still out (its credits come back when forgotten)
        self._client.sync(self._client.scheduler.tianji_cycle, consumed=reports, want=[], learner_version=self.version)
        outstanding = [entry[0] for entry in self._in_flight.values()]
        for fut in outstanding:
            ledger.record_lost(fut.key, self._in_flight[fut.key][1], "cancelled at stop")
        if outstanding:
            self._client.cancel(outstanding)
        self._in_flight.clear()
        ac.clear()

    def _learn_once(self) -> None:
        t0 = time.perf_counter()
        metrics = self.algo.learn()
        self.ledger.record_update(metrics, time.perf_counter() - t0)
        self.version += 1

    def _update_status(self, now: float) -> None:
        status = self.ledger.status(self.version, now)
        status["chunks_in_flight"] = len(self._in_flight)
        status["done"] = self._final is not None
        self._status = status

    def _finish(self, error: str | None) -> None:
        ledger = self.ledger
        ledger.request_stop("stopped")
        ledger.t_end = time.time()
        self._update_status(ledger.t_end)
        episodes, chunks = ledger.arrays()
        results = ledger.results(self.version, extra={"error": error})
        self._weights.clear()
        if self._publishing is not None:
            self._publishing[2].cancel()
            self._publishing = None
        self._final = {"results": results, "episodes": episodes, "chunks": chunks}
        self._update_status(time.time())
