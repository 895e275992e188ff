"""The relaxed strategy (TianJi's): chunks from any explorer in completion order; work for the
least-loaded streams is asked for before training, so explorers run while the learner trains;
a few updates a pass, so arriving chunks are picked up between updates."""

from __future__ import annotations

import time
from collections import deque

from tianji_dask.dataflow.learner.loop import Loop


class RelaxedLoop(Loop):
    weights_each_round = False

    def __init__(self, **parts):
        super().__init__(**parts)
        self.needs_current_weights = self.core.on_policy  # off-policy work may start on the previous version

    def _wanted(self) -> int:
        """Chunks to ask for: up to the controller's window, counting those asked for and those
        waiting here; none under the fusion barrier or while the controller's refusal holds."""
        if self._holding():
            return 0
        in_flight = self.stream.in_flight + self.admission.asked
        n_want = self.admission.params.window - in_flight - len(self._pending)
        if n_want > 0 and self.admission.ask_again_at is not None:
            progress = self.core.replay_progress()
            if progress is not None and not self.admission.may_ask(progress["samples_trained"], not self.core.ready(), in_flight):
                return 0
        return max(0, n_want)

    def step(self) -> None:
        core = self.core
        n_want = self._wanted()
        must_wait = not core.ready() and not n_want and not self._holding()  # nothing else to do
        if must_wait and self.admission.waiting:
            with self.timed("wait"):  # take the controller's answer first
                self._take_reply()
            must_wait = False
        self._receive(wait=must_wait)
        if self._pending:
            self._consume()
            n_want = self._wanted()
        now = time.time()
        if self.admission.answered():
            self._take_reply()
        if self._report_due(n_want, now):
            self._ask(n_want, now)
        for _ in range(self.spec.updates_per_pass):  # TianJi's updates per learner iteration
            if not self._may_learn():
                break
            self._learn_once()
        self._housekeeping(n_want, now)

    def _consume(self) -> None:
        """Off-policy data all at once (it goes to the replay). On-policy data only as the next
        update needs it, so a chunk's staleness is that of the data trained on and it holds its
        credit until then (the window counts chunks waiting here); chunks too stale to use are
        consumed (dropped, counted) at once to free their credits, the rest in arrival order.
        (Newest-version-first would leave older chunks waiting for ever, holding credits.)"""
        core = self.core
        if not core.on_policy:
            for arrival in self._pending:
                self._ingest(arrival, self._filter(arrival.chunk))
            self._pending.clear()
            return
        usable = deque()
        for arrival in self._pending:
            dropped = self._filter(arrival.chunk)
            if dropped is not None or not core.waits(arrival.chunk):
                self._ingest(arrival, dropped)  # consumed now, so its credit comes back
            else:
                usable.append(arrival)
        while usable and core.takes_more():  # up to the update's batch, then it trains
            self._ingest(usable.popleft(), None)  # kept by the filters just now
        self._pending = usable  # judged again on the next pass: an update may have made them stale
