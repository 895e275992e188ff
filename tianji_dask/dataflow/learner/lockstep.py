"""The lockstep strategy: one chunk from each explorer stream, wait for all, train on the round,
publish, repeat: the strict assignment TianJi is measured against (RLlib-sync, XingTian)."""

from __future__ import annotations

import time

from tianji_dask.dataflow.learner.loop import Loop


class LockstepLoop(Loop):
    def __init__(self, **parts):
        super().__init__(**parts)
        self._round_open = False  # a round's chunks are out or being trained on

    def _between_rounds(self) -> bool:
        """An env-step budget reached halfway through a round ends the run once the round is in:
        every explorer gives the same number of chunks, each round made by one policy. Any other
        stop (a failure, a time limit, a stop asked for) ends it at once."""
        return not self._round_open or self.core.stop_reason() != "max_env_steps"

    def _wanted(self) -> int:
        """A whole round at once, when the last one is trained on."""
        if (self._holding() or self._round_open or self.stream.in_flight or self.admission.asked
                or self.core.stop_reason() is not None):
            return 0
        return len(self.stream.streams)

    def step(self) -> None:
        core = self.core
        n_want = self._wanted()
        must_wait = (self._round_open or (not core.ready() and not n_want)) and not self._holding()
        if must_wait and self.admission.waiting:
            with self.timed("wait"):
                self._round_open |= self._take_reply()
            must_wait = False
        self._receive(wait=must_wait)
        if self._pending:
            for arrival in self._pending:
                self._ingest(arrival, self._filter(arrival.chunk))
            self._pending.clear()
            n_want = self._wanted()
        if self._round_open and not self.stream.in_flight:  # the whole round is in: train, then broadcast
            trained = False
            while self._may_learn():
                self._learn_once()
                trained = True
            if trained or core.replicas is None or not core.ready():
                self._round_open = False  # with replicas, a round ready here waits for the others' to be
            n_want = self._wanted()
        now = time.time()
        if self.admission.answered():
            self._round_open |= self._take_reply()
        if self._report_due(n_want, now):
            self._ask(n_want, now)
            with self.timed("cycle"):  # the round's tasks go out at once
                self._round_open |= self._take_reply()
        self._housekeeping(n_want, now)
