"""StalenessController: the scheduler plugin that admits explorer work and watches staleness.

There is no API to hold tasks already submitted, so throttling acts at admission: the learner
names the explorer task keys it wants to submit and the controller grants credits for some of
them (a window of chunks in flight). A credit comes back when the learner reports the chunk
consumed, or when the scheduler sees the task err or be forgotten unconsumed. Every handler is
O(1) or O(chunks reported) and never blocks the scheduler's event loop.
"""

from __future__ import annotations

import time
from collections import Counter, deque

from distributed.diagnostics.plugin import SchedulerPlugin

EXPLORE_PREFIX = "tianji-explore-"
HISTORY_LEN = 2000


class StalenessController(SchedulerPlugin):
    name = "tianji"
    idempotent = True

    def __init__(self, window: int = 2):
        self.scheduler = None
        self._reset(run_id=None, window=window, learner_address=None)

    # ---- state --------------------------------------------------------------------------
    def _reset(self, run_id, window, learner_address):
        self.run_id = run_id
        self.window = int(window)
        self.learner_address = learner_address
        self.learner_lost = False
        self.learner_version = 0
        self.credited: set[str] = set()  # keys holding a credit right now
        self.granted_total = 0
        self.returned_consumed = 0
        self.returned_erred = 0
        self.returned_forgotten = 0
        self.chunks_consumed = 0
        self.env_steps_consumed = 0
        self.bytes_consumed = 0
        self.staleness_hist: Counter[int] = Counter()
        self.staleness_max = 0
        self.staleness_sum = 0
        self.age_sum_s = 0.0
        self.age_max_s = 0.0
        self.per_explorer_steps: Counter[int] = Counter()
        # (t, learner_version, chunks_in_flight, window, staleness_versions, age_s) per consumed chunk
        self.history: deque[tuple] = deque(maxlen=HISTORY_LEN)
        self.t_reset = time.time()

    @property
    def chunks_in_flight(self) -> int:
        return len(self.credited)

    # ---- plugin hooks -------------------------------------------------------------------
    async def start(self, scheduler):
        self.scheduler = scheduler
        scheduler.handlers.update(
            {
                "tianji_begin": self.begin,
                "tianji_cycle": self.cycle,
                "tianji_state": self.state,
                "tianji_configure": self.configure,
            }
        )

    def transition(self, key, start, finish, *args, **kwargs):
        if finish not in ("erred", "forgotten") or not isinstance(key, str) or key not in self.credited:
            return
        self.credited.discard(key)
        if finish == "erred":
            self.returned_erred += 1
        else:
            self.returned_forgotten += 1

    def remove_worker(self, scheduler, worker, **kwargs):
        if self.learner_address is not None and worker == self.learner_address:
            self.learner_lost = True
            scheduler.log_event("tianji.learner_lost", {"run_id": self.run_id, "worker": worker})

    # ---- handlers (called by the learner and by clients) --------------------------------
    def begin(self, run_id: str, window: int, learner_address: str | None = None) -> dict:
        """Start a run's accounting afresh (one run at a time per scheduler)."""
        self._reset(run_id, window, learner_address)
        return self.state()

    def cycle(self, consumed: list | None = None, want: list | None = None, learner_version: int | None = None) -> list:
        """Report consumed chunks and ask credits for new explorer task keys, in one round trip.

        ``consumed``: rows ``(key, explorer_id, env_steps, nbytes, staleness_versions, age_s)``.
        Returns the keys granted, in the order asked.
        """
        now = time.time()
        if learner_version is not None:
            self.learner_version = int(learner_version)
        for key, explorer_id, env_steps, nbytes, staleness, age_s in consumed or ():
            if key in self.credited:
                self.credited.discard(key)
                self.returned_consumed += 1
            self.chunks_consumed += 1
            self.env_steps_consumed += int(env_steps)
            self.bytes_consumed += int(nbytes)
            self.per_explorer_steps[int(explorer_id)] += int(env_steps)
            self.staleness_hist[int(staleness)] += 1
            self.staleness_sum += int(staleness)
            self.staleness_max = max(self.staleness_max, int(staleness))
            self.age_sum_s += float(age_s)
            self.age_max_s = max(self.age_max_s, float(age_s))
            self.history.append((now, self.learner_version, self.chunks_in_flight, self.window, int(staleness), float(age_s)))
        granted = []
        for key in want or ():
            if self.chunks_in_flight >= self.window:
                break
            if key.startswith(EXPLORE_PREFIX) and key not in self.credited:
                self.credited.add(key)
                granted.append(key)
        self.granted_total += len(granted)
        return granted

    def configure(self, window: int | None = None) -> dict:
        if window is not None:
            if int(window) < 1:
                raise ValueError("window: must be >= 1")
            self.window = int(window)
        return self.state()

    def state(self, history: bool = False) -> dict:
        n = self.chunks_consumed
        out = {
            "run_id": self.run_id,
            "window": self.window,
            "chunks_in_flight": self.chunks_in_flight,
            "learner_version": self.learner_version,
            "learner_lost": self.learner_lost,
            "credits_granted": self.granted_total,
            "credits_returned": {
                "consumed": self.returned_consumed,
                "erred": self.returned_erred,
                "forgotten": self.returned_forgotten,
            },
            "chunks_consumed": n,
            "env_steps_consumed": self.env_steps_consumed,
            "bytes_consumed": self.bytes_consumed,
            "staleness_mean": self.staleness_sum / n if n else None,
            "staleness_max": self.staleness_max if n else None,
            "staleness_hist": {str(k): v for k, v in sorted(self.staleness_hist.items())},
            "age_mean_s": self.age_sum_s / n if n else None,
            "age_max_s": self.age_max_s if n else None,
            "per_explorer_env_steps": {str(k): v for k, v in sorted(self.per_explorer_steps.items())},
        }
        if history:
            out["history"] = [list(row) for row in self.history]
        return out
