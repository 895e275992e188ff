"""The Learner actor: owns the stream of explorer futures, trains, publishes weights.

Public methods are ``async`` and O(1): they run on the worker's event loop and only read or set
small fields. All consuming and SGD happens in one background thread that holds the worker's
client; it is the only thread that touches the algorithm, the ledger and the futures.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
import time
import traceback
import uuid
from collections import deque

from distributed import as_completed, get_client, get_worker

from tianji_dask import checkpoint
from tianji_dask.dataflow.controller import replay_gate
from tianji_dask.dataflow.direct import ChunkSink, DirectChunk, sink_host
from tianji_dask.dataflow.explorer import explore_chunk
from tianji_dask.dataflow.keycache import bound_key_cache
from tianji_dask.dataflow.ledger import Ledger
from tianji_dask.torch_setup import learner_device, prepare_torch

STATUS_EVERY_S = 0.2
REPORT_EVERY_S = 0.1  # consumed chunks reach the controller at least this often
LEARNER_STATUS_EVERY_S = 0.5  # the learner's figures reach the scheduler (dashboard, metrics) this often
HOMES_EVERY_S = 2.0  # how often the learner looks for explorer workers that joined or left
WAIT_S = 1.0  # the longest the learner blocks on arrivals before it checks its stop rules and explorers
# a direct chunk's task returns only once the sink holds its bytes, so they are here when its
# result is; this bounds a wait that should not happen (the chunk is then reported lost)
DIRECT_TAKE_S = 5.0


class Learner:
    # a class attribute so the actor proxy can read it (proxy getattr looks on the class)
    version = 0

    def __init__(self, spec: dict):
        """``spec``: run_id, mode, explorers, chunk_steps, chunk_env_steps, law (the controller's
        settings), publish_every, updates_per_pass, drop_on_refresh, threads, explorer_workers,
        direct_min_bytes (None: every chunk through Dask), t_process_start, stop (a StopConfig),
        make_algo (a picklable zero-argument callable building the algorithm). Group mode adds group, streams (this group's explorer stream
        ids), reduce ({"every", "barrier"}) and reducer ((address, key) of the Reducer actor)."""
        self._worker = get_worker()
        self._client = get_client()  # background threads have no worker context: capture it here
        sys.setswitchinterval(0.001)  # a Python-heavy learner thread otherwise slows comms 5-15x
        prepare_torch(spec["threads"])
        self.spec = spec
        self.run_id = spec["run_id"]
        self.group = int(spec.get("group", 0))
        self.streams = list(spec.get("streams") or range(spec["explorers"]))
        self._tag = f"{self.run_id}-g{self.group}" if spec.get("reducer") else self.run_id  # in task and data keys
        self.algo = spec["make_algo"]()
        self.algo.to_device(learner_device(spec.get("device", "cpu")))
        # small weights travel inside each explorer task (see _publish); their size never changes
        limit = spec.get("inline_weights_max_bytes")
        self._inline_weights = limit is not None and sum(w.nbytes for w in self.algo.get_weights().values()) <= limit
        self.version = 0
        self._stop = threading.Event()
        self._weights: deque = deque(maxlen=2)  # (version, future): the last two published
        self._published_version = -1
        self._publishing: tuple | None = None  # (version, key, concurrent future) of a scatter in progress
        self._cycle: tuple | None = None  # the controller request in flight: (future, want, futures reported, n_want)
        self._status: dict = {}
        self._final: dict | None = None
        self._in_flight: dict[str, tuple] = {}  # key -> (future, explorer_id, submit_version, home worker)
        self._served: dict[int, int] = {}  # explorer stream -> serial number of its last submitted chunk
        self._submissions = itertools.count(1)
        self._published_at: deque = deque(maxlen=64)  # (version, time explorer tasks could first get it)
        self._cpu0 = (0.0, 0.0)  # this thread's and this process's CPU seconds as the loop starts
        self._published = {"inline": 0, "scattered": 0}  # weights versions published, by way
        self._ctl: dict = {}
        self._error: str | None = None  # why the run ended early, for the results
        self._homes: list[str] = []
        self._homes_at = 0.0
        # large chunks come straight from the explorers (direct.py) when the comms are plain TCP
        self._sink, self._direct = None, None
        host = sink_host(self._worker.address) if spec.get("direct_min_bytes") is not None else None
        if host is not None:
            self._sink = ChunkSink(host)
            self._direct = (*self._sink.address, int(spec["direct_min_bytes"]))
        rebuilt = {"rebuilt": True} if spec.get("rebuilt") else {}
        self._apply_params(self._client.sync(
            self._client.scheduler.tianji_begin, run_id=self.run_id, law=spec["law"],
            learner_address=self._worker.address, chunk_env_steps=spec["chunk_env_steps"], group=self.group, **rebuilt,
        ))
        # group mode: the model is offered to the reducer every reduce["every"] updates
        self._reducer = None
        self._fusion: dict | None = None  # the offer waiting for its round's fused model
        self._fusions: list[dict] = []  # one row per fused model installed
        self._updates_since_fusion = 0
        self._must_publish = False
        if spec.get("reducer"):
            from distributed.actor import Actor

            from tianji_dask.dataflow.reducer import Reducer

            address, key = spec["reducer"]
            self._reducer = Actor(Reducer, address, key, worker=self._worker)
            self._round = int(self._reducer.join(self.group).result())
        self.t_run_start = time.time()  # run start: cluster up, learner built
        self.ledger = Ledger(
            spec["stop"], t_run_start=self.t_run_start, t_process_start=spec["t_process_start"],
            explorer_workers=spec["explorer_workers"], rows_dir=spec.get("rows_dir"),
        )
        self._ckpt = checkpoint.Checkpointer(spec.get("checkpoint"))
        if spec.get("resume_from"):  # continue the learning curve, the books and the clock
            state = checkpoint.restore(spec["resume_from"], self.algo, self.ledger, spec.get("keep_t_run_start"))
            self.version = self._ckpt.last_version = int(state["version"])
            self.t_run_start = self.ledger.t_run_start
            if state.get("controller", {}).get("window"):
                self._client.sync(self._client.scheduler.tianji_configure, window=int(state["controller"]["window"]))
        self._tb = None
        if spec.get("tensorboard_dir"):
            from tianji_dask.observe.tensorboard import ScalarLog

            self._tb = ScalarLog(spec["tensorboard_dir"])
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
        # CPU seconds of this thread and of the whole worker process (its event loop, comms, the
        # chunk sink) over the run, next to the wall time: what the dataflow costs off this thread
        self._cpu0 = time.thread_time(), time.process_time()
        try:
            self._loop()
            self._write_checkpoint()
        except checkpoint.NumericFault as fault:
            self._error = str(fault)
            self.ledger.request_stop("numeric_fault")
        except BaseException:  # noqa: BLE001 - reported to the client, never swallowed
            self._error = traceback.format_exc()
            self.ledger.request_stop("error")
        finally:
            self._finish(self._error)

    def _publish(self, wait: bool = False) -> None:
        """Make the current weights the ones new explorer tasks get.

        Small weights (at most ``inline_weights_max_bytes``) go inside each task: no scatter,
        no fetch by the explorers from this worker, nothing to wait for. For CartPole's PPO that
        took the learner from 84% to 93% busy (it waited for every scatter) and the CPU of this
        process's other threads from 0.20 to 0.12 cores (docs/benchmarks.md).

        Larger ones are scattered under a versioned key, without waiting by default. The scatter
        runs on the worker's event loop while this thread keeps training; explorer tasks take
        the newest version whose scatter has completed (``_newest_weights``), so an off-policy
        chunk's policy may lag its submission by the updates made during one scatter. A blocking
        scatter per submission cost about a quarter of the learner thread's time in DQN runs."""
        if self._publishing is not None:
            return  # one scatter at a time; the next submission publishes the newer version
        weights = self.algo.get_weights()
        if not checkpoint.all_finite(weights):
            raise checkpoint.NumericFault(f"numeric: non-finite weights at version {self.version}; not published, "
                                          f"the run stops, the last good checkpoint is kept")
        self._published_version = self.version
        self._must_publish = False
        if self._inline_weights:
            self._published["inline"] += 1
            self._weights.append((self.version, weights))
            self._published_at.append((self.version, time.time()))
            return
        self._published["scattered"] += 1
        key = f"tianji-weights-{self._tag}-{self.version}"
        coro = self._client._scatter({key: weights}, hash=False, workers=[self._worker.address], direct=True)
        self._publishing = (self.version, key, asyncio.run_coroutine_threadsafe(coro, self._client.loop.asyncio_loop))
        if wait:
            self._publishing[2].result()
        self._newest_weights()

    def _newest_weights(self) -> tuple[int, object]:
        """(version, weights) of the newest published weights: the dict itself when inline, else
        the future of the newest scatter that has completed."""
        if self._publishing is not None and self._publishing[2].done():
            version, key, done = self._publishing
            self._publishing = None
            self._weights.append((version, done.result()[key]))
            self._published_at.append((version, time.time()))
        return self._weights[-1]

    def _loop(self) -> None:
        spec, algo, ledger = self.spec, self.algo, self.ledger
        lockstep = spec["mode"] == "lockstep"
        streams = self.streams
        per_stream = {eid: 0 for eid in streams}  # chunks in flight per explorer stream
        failures = {eid: 0 for eid in streams}  # consecutive failed chunks per stream
        reports: list[list] = []  # consumed rows not yet reported to the controller
        reported_futs: list = []  # futures kept alive until their consumption is reported
        # received, not yet consumed: (future, explorer_id, submit_version, chunk); the future is
        # held until its consumption is reported, or its credit would come back as forgotten
        pending: deque = deque()
        last_report = time.time()
        last_sent_status = 0.0
        ac = as_completed([], with_results=True, raise_errors=False)
        self._publish(wait=True)
        last_status = 0.0
        round_open = False  # lockstep: a round's chunks are out or being trained on

        while not self._stop.is_set() and ledger.check_stop() is None:
            # 0. how many chunks to ask for (see _wanted)
            n_want = self._wanted(lockstep, round_open, len(streams), len(pending))

            # 1. receive whatever has arrived; block only when there is nothing else to do
            must_wait = ((lockstep and round_open) or (not algo.ready() and not n_want)) and not self._holding()
            if must_wait and self._cycle is not None:
                with ledger.timed("wait"):  # nothing else to do: take the controller's answer first
                    round_open |= self._cycle_reply(ac, per_stream, lockstep)
                must_wait = False
            with ledger.timed("wait"):
                batch = _next_batch(ac, WAIT_S) if must_wait and self._in_flight else ac.next_batch(block=False)
            if must_wait and not batch:  # nothing came for a while: are the explorers it waits for still there?
                self._refresh_homes(time.time())
            for fut, chunk in batch:
                _, eid, submit_version, _ = self._in_flight.pop(fut.key)
                per_stream[eid] -= 1
                if fut.status == "cancelled":
                    self._lost(fut.key, eid, "cancelled: its explorer worker left")
                    continue
                if fut.status != "finished":
                    self._lost(fut.key, eid, _describe_error(chunk))
                    failures[eid] += 1
                    if failures[eid] >= spec["stop"].max_explorer_failures:
                        ledger.request_stop("explorer_failures")
                        self._error = (f"explorer {eid} failed {failures[eid]} chunks in a row; last: "
                                       f"{_describe_error(chunk)}")
                    continue  # its credit comes back when the scheduler sees the task err
                if isinstance(chunk, DirectChunk):
                    with ledger.timed("receive"):
                        chunk = self._sink.take(fut.key, DIRECT_TAKE_S)
                    if chunk is None:
                        self._lost(fut.key, eid, f"its bytes did not reach the learner within {DIRECT_TAKE_S:g} s "
                                                 f"(direct send; sink errors: {self._sink.stats()['errors']})")
                        continue
                failures[eid] = 0
                pending.append((fut, eid, submit_version, chunk))
            del batch
            # ... and consume it: off-policy data all at once (it goes to the replay); on-policy
            # data only as the next update needs it, so a chunk's staleness is measured when it
            # is trained on and the window counts chunks waiting here too
            if pending:
                reports.extend(self._consume(pending, lockstep, reported_futs))
                n_want = self._wanted(lockstep, round_open, len(streams), len(pending))

            # 2. lockstep trains only when the whole round is in, then broadcasts
            if lockstep and round_open and not self._in_flight:
                while algo.ready() and not self._holding() and ledger.check_stop() is None:
                    self._learn_once()
                round_open = False
                n_want = self._wanted(lockstep, round_open, len(streams), len(pending))

            # 3. ask for work for the least-loaded streams before training, so explorers run
            #    while we train; report consumed chunks at least every REPORT_EVERY_S. The
            #    controller's answer is picked up on a later pass (one request in flight), so
            #    the learner trains while the scheduler answers; lockstep takes it at once
            now = time.time()
            if self._cycle is not None and self._cycle[0].done():
                round_open |= self._cycle_reply(ac, per_stream, lockstep)
            if self._cycle is None and (
                n_want or (reports and now - last_report >= REPORT_EVERY_S) or now - last_report >= LEARNER_STATUS_EVERY_S
            ):
                if n_want and not self._inline_weights and (
                    self.version - self._published_version >= spec["publish_every"] or self._must_publish
                    or (lockstep and self._published_version != self.version)
                ):
                    # scattered weights start on their way while the controller answers. On-policy
                    # data and lockstep rounds need the new version itself; off-policy explorers
                    # may start on the previous one while the scatter completes. (Inline weights
                    # are taken at the answer, just before the submission: nothing to start early.)
                    with ledger.timed("publish"):
                        self._publish(wait=lockstep or algo.on_policy)
                want = []
                for _ in range(n_want):
                    # the least-loaded stream; among equals the one served longest ago. The
                    # controller grants the head of the list: were ties broken by order, a paced
                    # learner granted one chunk at a time would give the first stream every one
                    eid = min(streams, key=lambda e: (per_stream[e] + sum(1 for _, w in want if w == e), self._served.get(e, 0)))
                    want.append((f"tianji-explore-{self._tag}-{uuid.uuid4().hex[:12]}", eid))
                status = None
                if now - last_sent_status >= LEARNER_STATUS_EVERY_S:
                    status, last_sent_status = self._learner_status(now), now
                with ledger.timed("cycle"):
                    coro = self._client.scheduler.tianji_cycle(
                        consumed=reports, want=[k for k, _ in want], learner_version=self.version,
                        progress=self._progress(), learner_status=status, group=self.group,
                    )
                    self._cycle = (asyncio.run_coroutine_threadsafe(coro, self._client.loop.asyncio_loop), want,
                                   reported_futs, n_want)
                reports, reported_futs, last_report = [], [], now
                if lockstep:
                    with ledger.timed("cycle"):
                        round_open |= self._cycle_reply(ac, per_stream, lockstep)

            # 4. relaxed: a few updates per pass (TianJi's updates per learner iteration), so
            #    arriving chunks are picked up between updates
            if not lockstep:
                for _ in range(spec["updates_per_pass"]):
                    if not algo.ready() or self._holding() or ledger.check_stop() is not None:
                        break
                    self._learn_once()

            if self._reducer is not None:
                with ledger.timed("fuse"):
                    self._fuse()
                if self._holding() and not n_want:
                    with ledger.timed("wait"):
                        time.sleep(0.001)  # the barrier: nothing to do until the fused model is in

            if now - last_status >= STATUS_EVERY_S:
                with ledger.timed("status"):
                    self._update_status(now)
                last_status = now

        # report what was consumed; cancel what is still out (its credits come back when forgotten)
        if self._cycle is not None:
            self._cycle_reply(ac, per_stream, lockstep)  # what it grants is submitted, then cancelled below
        self._client.sync(self._client.scheduler.tianji_cycle, consumed=reports, want=[], learner_version=self.version,
                          progress=self._progress(), learner_status=self._learner_status(time.time()), group=self.group)
        for fut, eid, _, _ in pending:
            ledger.record_lost(fut.key, eid, "received, not trained on at stop")
        outstanding = [entry[0] for entry in self._in_flight.values()]
        for fut in outstanding:
            self._lost(fut.key, self._in_flight[fut.key][1], "cancelled at stop")
        if outstanding:
            self._client.cancel(outstanding)
        self._in_flight.clear()
        ac.clear()

    def _cycle_reply(self, ac, per_stream: dict, lockstep: bool) -> bool:
        """Take the controller's answer to the request in flight (waiting for it if need be) and
        submit the explorer tasks it granted, with the newest published weights. True when it
        granted something (a lockstep round is then open)."""
        fut, want, _reported_futs, n_want = self._cycle
        reply = fut.result()
        self._cycle = None  # the reported futures may go now: their consumption is on record
        self._apply_params(reply)
        spec = self.spec
        if reply["granted"] and (lockstep or self.algo.on_policy) and self._published_version != self.version:
            with self.ledger.timed("publish"):  # it trained meanwhile: on-policy work needs this version
                self._publish(wait=True)
        elif reply["granted"] and self._inline_weights and (
            self._must_publish or self.version - self._published_version >= spec["publish_every"]
        ):
            with self.ledger.timed("publish"):  # inline weights cost only a copy: off-policy work gets them fresh too
                self._publish()
        wref_version, wref = self._newest_weights()
        explore = self.algo.exploration(self.ledger.env_steps, self.version)
        with self.ledger.timed("submit"):
            bound_key_cache()  # the chunks' and weights' keys pass through this process's key-name cache
            for key, eid in want[: len(reply["granted"])]:
                home = self._home(eid)
                task = self._client.submit(
                    explore_chunk, self.run_id, wref, wref_version, eid, spec["chunk_steps"], explore, self.group,
                    self._direct, key=key, resources={"EXPLORER": 1}, pure=False, workers=home,
                )
                per_stream[eid] += 1
                self._served[eid] = next(self._submissions)
                self._in_flight[key] = (task, eid, self.version, home)
                ac.add(task)
        if n_want and not reply["granted"] and not self._in_flight and not self.algo.ready():
            with self.ledger.timed("wait"):
                time.sleep(0.005)  # window full of another run's credits: ask again shortly
        return bool(reply["granted"])

    def _consume(self, pending: deque, lockstep: bool, reported_futs: list) -> list[list]:
        """Ingest received chunks; returns the controller's report rows for them.

        Off-policy or lockstep: everything at once. On-policy, relaxed: a chunk is consumed when
        an update takes it, so its staleness is that of the data trained on and it holds its
        credit until then (the window counts chunks waiting here). Chunks too stale to use are
        consumed (dropped, counted) at once to free their credits; the rest in arrival order
        until an update is ready. (Newest-version-first was tried: with a wide window older
        chunks then wait forever and hold their credits.)"""
        algo = self.algo
        rows: list[list] = []
        take = list(pending)
        if algo.on_policy and not lockstep:
            take, usable = [], []
            for item in pending:
                staleness = self.version - item[3]["policy_version"]
                if self._drop_reason(item[3], staleness) or not algo.accepts(staleness):
                    take.append(item)
                else:
                    usable.append(item)
            for item in take:
                self._ingest(item, rows)
            for item in usable:
                if algo.ready():
                    break
                self._ingest(item, rows)
                take.append(item)
        else:
            for item in take:
                self._ingest(item, rows)
        taken = {id(item) for item in take}
        reported_futs.extend(item[0] for item in take)
        waiting = [item for item in pending if id(item) not in taken]
        pending.clear()
        pending.extend(waiting)
        return rows

    def _ingest(self, item: tuple, rows: list) -> None:
        fut, eid, submit_version, chunk = item
        key = fut.key
        staleness = self.version - chunk["policy_version"]
        reason = self._drop_reason(chunk, staleness)
        if reason:
            kept = 0
        else:
            with self.ledger.timed("ingest"):
                kept = self.algo.ingest(chunk, staleness)
        if reason is None and kept == 0:
            reason = "algorithm"  # e.g. on-policy data older than max_policy_lag
        if reason is not None:
            self.ledger.record_dropped(reason)
        staleness, age_s = self.ledger.consume(chunk, self.version, kept, submit_version=submit_version)
        rows.append([key, eid, chunk["env_steps"], chunk["nbytes"], staleness, age_s, reason is not None])

    def _lost(self, key: str, explorer_id: int, why: str) -> None:
        self.ledger.record_lost(key, explorer_id, why)
        if self._sink is not None:
            self._sink.discard(key)  # its bytes may have come (or still come) directly

    def _home(self, explorer_id: int) -> list[str] | None:
        """The explorer worker a stream runs on: its envs live there, and a slow stream does not
        queue a fast one behind it. The restriction is strict (dask cannot combine loose worker
        restrictions with resources, distributed#4792), so chunks waiting for a worker that has
        left are cancelled here, reported lost, and the stream moves to another worker."""
        now = time.time()
        if now - self._homes_at > HOMES_EVERY_S:  # workers come and go (adaptive clusters)
            self._refresh_homes(now)
        return [self._homes[explorer_id % len(self._homes)]] if self._homes else None

    def _refresh_homes(self, now: float) -> None:
        """Look up the explorer workers; cancel the chunks waiting for one that has left (a
        restarted worker comes back at a new address)."""
        workers = self._client.sync(self._client.scheduler.identity, n_workers=-1).get("workers", {})
        homes = sorted(a for a, w in workers.items() if w.get("resources", {}).get("EXPLORER"))
        gone = set(self._homes) - set(homes)
        self._homes, self._homes_at = homes, now
        orphans = [entry[0] for entry in self._in_flight.values() if entry[3] and entry[3][0] in gone]
        if orphans:
            self._client.cancel(orphans)  # they come out of as_completed as cancelled

    def _wanted(self, lockstep: bool, round_open: bool, n_streams: int, waiting: int = 0) -> int:
        """Chunks to ask for now: lockstep, a whole round at once; relaxed, up to the controller's
        window, and none while the replay ratio would fall below its floor. The controller
        decides; this local pre-check only saves a scheduler round trip per update."""
        in_flight = len(self._in_flight) + (len(self._cycle[1]) if self._cycle is not None else 0)  # asked for too
        if self._holding():
            return 0  # the barrier: explorers get the fused model, not this one
        if lockstep:
            return n_streams if not round_open and not in_flight else 0
        n_want = max(0, self._ctl["window"] - in_flight - waiting)
        progress = self.algo.replay_progress()
        if n_want and progress is not None and not replay_gate(
            self._ctl["rho_min"], progress["samples_trained"], progress["env_steps"], in_flight,
            self.spec["chunk_env_steps"], progress["warm"], starving=not self.algo.ready(),
        ):
            return 0
        return n_want

    def _learner_status(self, now: float) -> dict:
        """Small and flat: what the dashboard and the Prometheus collector show of the learner."""
        ledger = self.ledger
        return {
            "version": self.version, "updates": ledger.updates, "env_steps": ledger.env_steps,
            "samples_trained": ledger.samples_trained, "learn_s": ledger.learn_s, "episodes": len(ledger.episodes),
            "mean_return": ledger.mean_return(), "elapsed_s": now - ledger.t_run_start,
            "solved_s": None if ledger.solved_online_at is None else ledger.solved_online_at - ledger.t_run_start,
            "replay_ratio": self._replay_ratio(),
        }

    def _replay_ratio(self) -> float | None:
        """Samples trained per env step past the warm-up (replaying algorithms only)."""
        progress = self.algo.replay_progress()
        return progress["samples_trained"] / progress["env_steps"] if progress and progress["env_steps"] else None

    def _progress(self) -> dict | None:
        progress = self.algo.replay_progress()
        if progress is not None:
            progress["starving"] = not self.algo.ready()
        return progress

    def _apply_params(self, params: dict) -> None:
        """Take the controller's current parameters (they change when a client configures it)."""
        if params["params_version"] == self._ctl.get("params_version") and params["window"] == self._ctl.get("window"):
            return
        if params["rho_max"] != self._ctl.get("rho_max"):
            self.algo.set_replay_ratio_max(params["rho_max"])
        self._ctl = {k: params[k] for k in ("window", "rho_min", "rho_max", "max_staleness", "params_version")}

    def _drop_reason(self, chunk: dict, staleness: int) -> str | None:
        max_staleness = self._ctl["max_staleness"]
        if max_staleness is not None and staleness > max_staleness:
            return "max_staleness"
        if self.spec["drop_on_refresh"]:
            # TianJi's explorer takes new weights between sends and drops what it had not sent:
            # here, a chunk is dropped when a newer version was published before it finished
            for version, t_published in reversed(self._published_at):
                if version <= chunk["policy_version"]:
                    break
                if t_published < chunk["t_end"]:
                    return "refresh"
        return None

    def _learn_once(self) -> None:
        t0 = time.perf_counter()
        metrics = self.algo.learn()
        checkpoint.check_finite(metrics, self.version)
        self.ledger.record_update(metrics, time.perf_counter() - t0)
        self.version += 1
        self._updates_since_fusion += 1
        if self._reducer is not None:
            with self.ledger.timed("fuse"):
                self._fuse()
        if self._ckpt.due(self.version):
            with self.ledger.timed("checkpoint"):
                self._write_checkpoint()

    # ---- group mode ---------------------------------------------------------------------
    def _holding(self) -> bool:
        """Barrier mode, between an offer and the fused model's arrival: no updates, no new work."""
        return self._fusion is not None and self.spec["reduce"]["barrier"]

    def _fuse(self) -> None:
        """Offer the model every reduce["every"] updates; install the fused model once its round
        is complete. Never blocks: the reducer's calls are polled, one in flight at a time.

        Installing keeps what this learner learnt while it waited (asynchronous mode):
        model = fused + (model now - model offered); under the barrier that difference is zero,
        so it is the fused model itself. An install is a new version (explorers see the change)."""
        f = self._fusion
        if f is None:
            if self._updates_since_fusion >= self.spec["reduce"]["every"] and not self._stop.is_set():
                offered = self.algo.model_state()
                call = self._reducer.offer(self.group, self._round, self.version, offered)
                self._fusion = {"round": self._round, "offered": offered, "version": self.version, "t": time.time(),
                                "call": call, "take": None}
            return
        if f["take"] is None:
            if f["call"].done():
                f["call"].result()  # raises if the reducer refused the offer
                f["take"] = self._reducer.take(f["round"])
            return
        if not f["take"].done():
            return
        fused = f["take"].result()
        if fused is None:  # not complete yet: ask again
            f["take"] = self._reducer.take(f["round"])
            return
        model, versions = fused
        now = self.algo.model_state()
        self.algo.load_model_state({k: model[k] + (now[k] - f["offered"][k]) for k in model})
        self.version += 1
        self._fusions.append({
            "round": f["round"], "offered_version": f["version"], "installed_version": self.version,
            "versions": {int(g): int(v) for g, v in versions.items()}, "wait_s": time.time() - f["t"],
        })
        self._round += 1
        self._updates_since_fusion = 0
        self._fusion = None
        self._must_publish = True

    def _write_checkpoint(self) -> None:
        if not checkpoint.all_finite(self.algo.get_weights()):
            raise checkpoint.NumericFault(f"numeric: non-finite weights at version {self.version}; the run stops, "
                                          f"the last good checkpoint is kept")
        self._ckpt.write(self.algo, self.version, self.ledger, {"controller": dict(self._ctl), "run_id": self.run_id})

    def _update_status(self, now: float) -> None:
        status = self.ledger.status(self.version, now)
        status["chunks_in_flight"] = len(self._in_flight)
        status["explorer_homes"] = {eid: self._homes[eid % len(self._homes)] for eid in self.streams} if self._homes else {}
        if self._reducer is not None:
            window = self.spec["stop"].window
            status.update(group=self.group, fusions=len(self._fusions), waiting_for_fusion=self._fusion is not None,
                          recent_episodes=self.ledger.episodes.tail(window)[:, :2].tolist())
        status["window"] = self._ctl.get("window")
        status["replay_ratio"] = self._replay_ratio()
        if self._tb is not None:
            self._tb.write(status)
        status["done"] = self._final is not None
        self._status = status

    def _finish(self, error: str | None) -> None:
        ledger = self.ledger
        ledger.request_stop("stopped")
        ledger.t_end = time.time()
        cpu = {"thread_s": time.thread_time() - self._cpu0[0], "process_s": time.process_time() - self._cpu0[1]}
        self._update_status(ledger.t_end)
        episodes, chunks = ledger.arrays()
        ledger.discard_spill()  # the rows go to the client with the results
        results = ledger.results(self.version, arrays=(episodes, chunks), extra={
            "error": error, "algo_counters": self.algo.counters(), "replay_progress": self.algo.replay_progress(),
            "checkpoint": None if self._ckpt.last_path is None else str(self._ckpt.last_path),
            "learner_time": ledger.time_breakdown(ledger.t_end - ledger.t_run_start),
            "learner_cpu_s": {k: round(v, 4) for k, v in cpu.items()},
            "weights_published": dict(self._published),
            "direct_chunks": None if self._sink is None else {**self._sink.stats(), "min_bytes": self._direct[-1]},
            **({"group": self.group, "fusions": self._fusions} if self._reducer is not None else {}),
        })
        if self._sink is not None:
            self._sink.close()  # chunks still held were never trained on: they are on record as lost
        self._weights.clear()
        if self._publishing is not None:
            self._publishing[2].cancel()
            self._publishing = None
        if self._tb is not None:
            self._tb.write(self._status, force=True)
            self._tb.close()
        self._final = {"results": results, "episodes": episodes, "chunks": chunks}
        self._update_status(time.time())


def _next_batch(ac, timeout: float) -> list:
    """``as_completed.next_batch(block=True)``, but waiting at most ``timeout`` seconds (empty
    then): chunks restricted to an explorer worker that has died never arrive, and the learner
    must still stop on time and notice the worker is gone."""
    deadline = time.monotonic() + timeout
    while not ac.has_ready() and time.monotonic() < deadline:
        with ac.thread_condition:  # notified when a future completes
            ac.thread_condition.wait(timeout=min(0.1, max(0.0, deadline - time.monotonic())))
    return ac.next_batch(block=False)


def _describe_error(error) -> str:
    """One line for a failed explorer task (``as_completed`` hands over ``(type, value, tb)``)."""
    if isinstance(error, tuple) and len(error) == 3:
        error = error[1]
    return f"{type(error).__name__}: {error}"
