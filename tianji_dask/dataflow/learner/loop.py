"""The learner's loop: the steps both strategies (``relaxed.py``, ``lockstep.py``) are made of.

Each pass takes what has arrived, consumes it, asks for more work, trains, fuses and reports
status. The parts do the work: the core trains and keeps the books, the stream submits and
receives, the publisher makes weights available, the admission client talks to the controller.
A strategy only decides the order and when to wait.
"""

from __future__ import annotations

import time
from collections import deque

from distributed.comm import CommClosedError

from tianji_dask.core.consumption import Consumption
from tianji_dask.dataflow.messages import Progress

STATUS_EVERY_S = 0.2
REPORT_EVERY_S = 0.1  # consumed chunks reach the controller at least this often
LEARNER_STATUS_EVERY_S = 0.5  # the learner's figures reach the scheduler (dashboard, metrics) this often
WAIT_S = 1.0  # the longest the learner blocks on arrivals before it checks its stop rules and explorers
#: this long before its handoff a learner asks for no more chunks and takes in those still out
HANDOFF_DRAIN_S = 5.0


class Loop:
    """What both strategies share, built from the learner's parts (keywords only).
    ``on_status(status)`` receives the learner's status dict."""

    needs_current_weights = True  # granted work acts with the version just trained
    weights_each_round = True  # a request publishes the current version (lockstep's broadcast)

    def __init__(self, *, spec, core, stream, publisher, admission, fusion, stop_event, on_status):
        self.spec, self.core, self.stream, self.publisher = spec, core, stream, publisher
        self.admission, self.fusion, self._stop, self._on_status = admission, fusion, stop_event, on_status
        self.timed = core.timed
        self._pending: deque = deque()  # arrivals received, not yet consumed
        self._consumed: list[Consumption] = []  # consumed, not yet reported to the controller
        self._held: list = []  # their futures, alive until the controller has them on record
        self._must_publish = False  # a fused model was installed
        self._agreed = False  # this pass made an agreement among the replicas
        self._last_report = time.time()
        self._last_sent_status = 0.0
        self._last_status = 0.0
        self.evaluation = None  # an ``EvalClient`` when the pipeline evaluates during training
        #: when this learner hands off to one on a fresh worker (unix s; None: never)
        self.handoff_at: float | None = None
        #: set when the loop ended for a handoff: when it stopped, and the chunks that went with it
        self.handoff: dict | None = None
        self.first_update_t: float | None = None  # when this learner made its first update
        #: its worker is closing (its scheduler lost): stop at once and say nothing more to Dask
        self.worker_closing = False
        # the core's books hold a resumed learner's earlier chunks too: this learner's are those since
        self._consumed_at_start, self._lost_at_start = core.chunks_consumed, core.chunks_lost

    def run(self) -> None:
        self._publish(wait=True)
        replicas = self.core.replicas
        try:
            # replicas leave together, on an agreement (``_may_learn``): one that left on its own
            # would leave the others waiting in their next collective
            while not (self._wants_stop() if replicas is None else replicas.ended):
                if self._expired():
                    self.handoff = {"t_expiry": time.time(), "deadline": self.handoff_at, "version": self.core.version}
                    break
                self._agreed = False
                try:
                    self.step()
                except CommClosedError:
                    # the scheduler's connection broke under a request (it is lost): the worker closes
                    # next (closing.py), and this learner ends as on a closing worker, its state kept
                    self.worker_closing = True
                    break
                if replicas is not None and not self._agreed:
                    self.core.agree(False, self._wants_stop())  # every pass votes, so a stop reaches all
            if replicas is not None:
                replicas.leave()
            if self.worker_closing:
                self.core.request_stop("worker_closed")
            self.drain()
        except BaseException:
            if replicas is not None:
                replicas.leave()  # the others stop with this one rather than wait for it
            # whatever ended the loop or its drain (the error goes to the run's results; the
            # scheduler may be gone), its books balance
            self._lose_all("received, not trained on: the learner's loop stopped on an error",
                           "in flight when the learner's loop stopped on an error")
            raise

    def _wants_stop(self) -> bool:
        """This learner would end its loop now: asked to stop, or its stop rules say so (between rounds)."""
        return self._stop.is_set() or (self.core.stop_reason() is not None and self._between_rounds())

    def _may_learn(self) -> bool:
        """May the loop make an update now? Alone: the algorithm is ready, no fusion barrier holds
        and no stop rule has fired. With replicas, every replica must say so (an agreement, which
        also carries each one's stop): all update, or none does."""
        ready = self.core.ready() and not self._holding() and self.core.stop_reason() is None
        if self.core.replicas is None:
            return ready
        self._agreed = True
        return self.core.agree(ready, self._wants_stop())

    def _between_rounds(self) -> bool:
        """May the stop rules end the loop now? (Lockstep's: not while a round is half in.)"""
        return True

    def _draining(self, now: float) -> bool:
        """Its handoff is near: no more chunks are asked for."""
        return self.handoff_at is not None and now >= self.handoff_at - HANDOFF_DRAIN_S

    def _expired(self) -> bool:
        """Time to hand off: the deadline has come, or the drain has taken in every chunk out."""
        if self.handoff_at is None:
            return False
        now = time.time()
        return now >= self.handoff_at or (self._draining(now) and not self.stream.in_flight and not self.admission.waiting)

    def step(self) -> None:
        """One pass: take what has arrived, consume it, ask for more work, train (the strategy's order)."""
        raise NotImplementedError

    @property
    def chunks_waiting(self) -> int:
        """Chunks received and not yet consumed (on-policy ones wait for the update that takes them)."""
        return len(self._pending)

    # ---- steps --------------------------------------------------------------------------
    def _receive(self, wait: bool) -> None:
        with self.timed("wait"):
            arrivals = self.stream.arrivals(WAIT_S if wait else 0.0)
        for arrival in arrivals:
            if arrival.chunk is not None:
                self._pending.append(arrival)
                continue
            self.core.record_lost(arrival.key, arrival.stream, arrival.lost)
            if arrival.env_error:  # counted, its traceback kept for the run's env_errors.txt; env.max_errors judged
                self.core.record_env_error(arrival.stream, arrival.lost, arrival.detail)
            if arrival.failed and arrival.failures >= self.spec.max_explorer_failures:
                self.core.fail(f"explorer {arrival.stream} failed {arrival.failures} chunks in a row; last: {arrival.lost}",
                               "explorer_failures", detail=arrival.detail)

    def _ingest(self, arrival, dropped: str | None) -> None:
        """Consume an arrival (``dropped``: why the filters drop it, None: the algorithm takes it)."""
        self._consumed.append(self.core.consume(arrival.chunk, key=arrival.key, dropped=dropped,
                                                submit_version=arrival.submit_version, explore=arrival.explore))
        self._held.append(arrival.future)

    def chunk_books(self) -> dict:
        """This learner's own account of its chunks: every task it submitted was consumed or
        lost (the controller's books say the same from the scheduler's side, while it lives)."""
        lost = self.core.chunks_lost - self._lost_at_start
        consumed = self.core.chunks_consumed - self._consumed_at_start
        submitted, out = self.stream.submitted, self.stream.in_flight + len(self._pending)
        return {"submitted": submitted, "consumed": consumed, "lost": lost, "in_flight": out,
                "balanced": submitted == consumed + lost + out}

    def _filter(self, chunk: dict) -> str | None:
        """Why the dataflow's filters drop ``chunk`` (the core's ``filter_reason``), None: kept.
        TianJi's explorer takes new weights between sends and drops what it had not sent."""
        superseded = self.spec.drop_on_refresh and self.publisher.superseded_before(chunk["policy_version"], chunk["t_end"])
        return self.core.filter_reason(chunk, max_staleness=self.admission.params.max_staleness, superseded=superseded)

    def _publish_due(self) -> bool:
        return self._must_publish or self.core.version - self.publisher.version >= self.spec.publish_every

    def _publish(self, wait: bool = False) -> None:
        if self.publisher.scattering:
            return  # one scatter at a time; the next submission publishes the newer version
        self.publisher.publish(self.core.version, self.core.weights(), wait)
        self._must_publish = False

    def _ask(self, n_want: int, now: float) -> None:
        """Report what was consumed and ask credits for ``n_want`` chunks, in one request."""
        if self._draining(now):
            n_want = 0  # a handoff is near: what is out comes in, nothing new goes out
        if n_want and not self.publisher.inline and (
                self._publish_due() or (self.weights_each_round and self.publisher.version != self.core.version)):
            # scattered weights start on their way while the controller answers (inline ones are
            # taken at the answer, just before the submission: nothing to start early)
            with self.timed("publish"):
                self._publish(wait=self.needs_current_weights)
        want = self.stream.choose(n_want)
        status = None
        if now - self._last_sent_status >= LEARNER_STATUS_EVERY_S:
            status, self._last_sent_status = self._learner_status(now), now
        with self.timed("cycle"):
            self.admission.request(consumed=self._consumed, held=self._held, want=want, version=self.core.version,
                                   progress=self._progress(), status=status)
        self._consumed, self._held, self._last_report = [], [], now

    def _report_due(self, n_want: int, now: float) -> bool:
        since = now - self._last_report
        return not self.admission.waiting and (
            n_want > 0 or (bool(self._consumed) and since >= REPORT_EVERY_S) or since >= LEARNER_STATUS_EVERY_S)

    def _take_reply(self) -> bool:
        """Take the controller's answer and submit the tasks it granted, with the newest
        published weights; True when it granted something."""
        asked = self.admission.asked
        rho_max = self.admission.params.rho_max
        # the consumed chunks' futures go only after the submission: releasing them sends a message
        # through the client's batched stream, and a submission right behind it waits one
        # batching interval (10 ms) before it leaves this process
        granted, release_after_submit = self.admission.reply()
        if self.admission.params.rho_max != rho_max:
            self.core.set_replay_ratio_max(self.admission.params.rho_max)
        if granted and self.needs_current_weights and self.publisher.version != self.core.version:
            with self.timed("publish"):  # it trained meanwhile: this work needs this version
                self._publish(wait=True)
        elif granted and self.publisher.inline and self._publish_due():
            with self.timed("publish"):  # inline weights cost only a copy: off-policy work gets them fresh too
                self._publish()
        newest = self.publisher.newest()
        explore = self.core.exploration()
        with self.timed("submit"):
            self.stream.workers_moved(self.admission.workers_epoch)
            self.stream.submit(granted, newest.version, newest.weights, explore, self.core.version)
        del release_after_submit
        if asked and not granted and not self.stream.in_flight and not self.core.ready():
            with self.timed("wait"):
                time.sleep(0.005)  # window full of another run's credits: ask again shortly
        return bool(granted)

    def _learn_once(self) -> None:
        self.core.learn_once()
        if self.first_update_t is None:
            self.first_update_t = time.time()
        if self.fusion is not None:
            self.fusion.updated()
            with self.timed("fuse"):
                self._poll_fusion()

    def _holding(self) -> bool:
        return self.fusion is not None and self.fusion.holding

    def _poll_fusion(self) -> None:
        if self.fusion.poll(self.core, stopping=self._stop.is_set()):
            self._must_publish = True

    def _housekeeping(self, n_want: int, now: float) -> None:
        """Fusion and status, at the end of every pass."""
        if self.fusion is not None:
            with self.timed("fuse"):
                self._poll_fusion()
            if self._holding() and not n_want:
                with self.timed("wait"):
                    time.sleep(0.001)  # the barrier: nothing to do until the fused model is in
        if self.evaluation is not None:
            with self.timed("eval"):
                self._evaluate(now)
        if now - self._last_status >= STATUS_EVERY_S:
            with self.timed("status"):
                self._on_status(self.status(now))
            self._last_status = now

    def _evaluate(self, now: float) -> None:
        """Take a finished evaluation; start the next when one is due (never waits for either)."""
        done = self.evaluation.poll()
        if done is not None:
            self.core.record_eval(done["t_end"], done["version"], done["returns"])
        if self.evaluation.due(now, self.core.version):
            newest = self.publisher.newest()
            self.evaluation.submit(newest.weights, newest.version, self.core.version, now)

    def drain(self) -> None:
        """Report what was consumed; cancel what is still out (its credits come back when forgotten).
        At a handoff, the chunks that go this way are counted in ``handoff``. On a closing worker
        nothing goes to the scheduler: what is still out is lost with it."""
        if self.worker_closing:
            self._lose_all("received, not trained on: the learner's worker closed",
                           "in flight when the learner's worker closed")
            return
        when = "at stop" if self.handoff is None else "at handoff"
        lost0 = self.core.chunks_lost
        if self.admission.waiting:
            self._take_reply()  # what it grants is submitted, then cancelled below
        self.admission.final(consumed=self._consumed, version=self.core.version, progress=self._progress(),
                             status=self._learner_status(time.time()))
        self._consumed, self._held = [], []
        for arrival in self._pending:
            self.core.record_lost(arrival.key, arrival.stream, f"received, not trained on {when}")
        self._pending.clear()
        for key, stream in self.stream.cancel_all():
            self.core.record_lost(key, stream, f"cancelled {when}")
        if self.evaluation is not None:
            self.evaluation.cancel()
        if self.handoff is not None:
            self.handoff["chunks_lost"] = self.core.chunks_lost - lost0

    def _lose_all(self, why_received: str, why_out: str) -> None:
        """Record every chunk received and not trained on, and every task still out, as lost,
        without a word to the scheduler (it may be gone): the tasks' futures are dropped."""
        for arrival in self._pending:
            self.core.record_lost(arrival.key, arrival.stream, why_received)
        for key, stream in self.stream.forget_all():
            self.core.record_lost(key, stream, why_out)
        self._pending.clear()
        self._consumed, self._held = [], []

    # ---- reading --------------------------------------------------------------------------
    def _progress(self) -> Progress | None:
        return Progress.of(self.core.replay_progress(), starving=not self.core.ready())

    def _learner_status(self, now: float) -> dict:
        return self.core.learner_figures(now)

    def status(self, now: float) -> dict:
        """The learner's live status (what ``Run.status`` returns), logged to TensorBoard."""
        core = self.core
        status = core.status(now)
        status["chunks_in_flight"] = self.stream.in_flight
        status["explorer_homes"] = self.stream.homes_by_stream()
        if self.fusion is not None:
            status.update(group=self.spec.group, fusions=len(self.fusion.installed), waiting_for_fusion=self.fusion.waiting,
                          recent_episodes=core.recent_episodes())
        elif core.replicas is not None:  # the run pools the replicas' episodes and judges their stop
            status.update(group=self.spec.group, recent_episodes=core.recent_episodes())
        params = self.admission.params
        status["window"] = params.window
        status["staleness_target"] = {"state": params.target_state, "reason": params.target_reason}
        status["replay_staleness_target"] = {"state": params.replay_target_state, "reason": params.replay_target_reason}
        status["replay_ratio"] = core.replay_ratio()
        core.log_status(status)
        return status
