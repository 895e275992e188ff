"""One learner's books in the staleness controller: its credits, its window law, what it consumed.

The controller decides admission here and only here: the learner names the explorer task keys
it wants to submit, and ``Books.cycle`` grants credits for some of them. Every method is O(1)
or O(chunks reported) and runs on the scheduler's event loop.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass

from tianji_dask.dataflow.controller.pacing import ReplayRatioLaw, replay_gate, samples_needed
from tianji_dask.dataflow.controller.settings import LawSettings, check_live
from tianji_dask.dataflow.controller.window_law import WindowLaw
from tianji_dask.dataflow.messages import (
    ControllerParams,
    CycleReply,
    consumptions_from_wire,
)

EXPLORE_PREFIX = "tianji-explore-"
HISTORY_LEN = 2000
SERIES_LEN = 3000
WINDOW_LOG_LEN = 2000
#: the settings each law holds (its configure takes them by these names)
WINDOW_SETTINGS = ("window", "staleness_target", "window_min", "window_max", "gain")
REPLAY_SETTINGS = ("replay_ratio", "replay_staleness_target", "gain")


def explore_key(tag: str) -> str:
    """A new explorer task key, ``tianji-explore-<tag>-<12 hex digits>``; ``tag`` is the learner's
    (its run id, with ``-g<group>`` in group mode: ``LearnerSpec.tag``)."""
    return f"{EXPLORE_PREFIX}{tag}-{uuid.uuid4().hex[:12]}"


def key_tag(key: str) -> str:
    """The learner's tag an explorer task key carries (see ``explore_key``)."""
    return key[len(EXPLORE_PREFIX):].rpartition("-")[0]


@dataclass(frozen=True)
class HistoryRow:
    """One consumed chunk, as the books saw it. On the wire (``state(history=True)``) a list of
    these fields in this order, as results have always held it."""

    t: float
    learner_version: int
    chunks_in_flight: int
    window: int
    staleness_versions: int
    age_s: float

    def to_wire(self) -> list:
        return [self.t, self.learner_version, self.chunks_in_flight, self.window, self.staleness_versions, self.age_s]


@dataclass(frozen=True)
class BooksView:
    """What the dashboard and the metrics read of one group's books, as of one moment (``Books.view``)."""

    group: int
    simulated: bool
    learner_version: int
    chunks_consumed: int
    chunks_dropped: int
    env_steps_consumed: int
    credits_granted: int
    chunks_in_flight: int
    window: int
    staleness_target: float | None
    target_verdict: dict
    replay_staleness_target: float | None
    replay_target_verdict: dict
    staleness_sum: int
    staleness_max: int | None  # None before the first chunk
    staleness_hist: dict[int, int]
    per_explorer_steps: dict[int, int]
    learner: dict  # the learner's newest figures ({} before its first)


class Books:
    """One learner's admission and accounting: its window law, credits, counters and history.
    A run has one per group (one without groups has one); the plugin routes by group."""

    def __init__(self, group: int, law: LawSettings, learner_address=None, chunk_env_steps: int = 1):
        self.group = group
        self.law = WindowLaw(law.window, staleness_target=law.staleness_target, window_min=law.window_min,
                             window_max=law.window_max, gain=law.gain)
        self.replay_law = ReplayRatioLaw(law.replay_ratio, replay_staleness_target=law.replay_staleness_target,
                                         gain=law.gain)
        # samples the floor asks for the env steps booked so far, each at the floor in force when it
        # came: a floor that moves asks its new ratio of new env steps only
        self.samples_owed = 0.0
        self._env_steps_booked = 0
        self.max_staleness = law.max_staleness
        self.simulated = law.simulated  # the explorers' env steps carry a simulated cost
        self.params_version = 0
        self.chunk_env_steps = int(chunk_env_steps)
        self.learner_address = learner_address
        self.learner_lost = False
        self.learner_version = 0
        self.progress = {"env_steps": 0, "samples_trained": 0, "warm": False}
        self.credited: set[str] = set()  # keys holding a credit right now
        self.granted_total = 0
        self.refused_replay_ratio = 0
        self.returned_consumed = 0
        self.returned_erred = 0
        self.returned_forgotten = 0
        self.returned_unsubmitted = 0  # granted to a learner that died before it submitted them
        self.chunks_consumed = 0
        self.chunks_dropped = 0
        self.env_steps_consumed = 0
        self.bytes_consumed = 0
        self.staleness_hist: Counter[int] = Counter()
        self.staleness_max = 0
        self.staleness_sum = 0
        self.age_sum_s = 0.0
        self.age_max_s = 0.0
        self.per_explorer_steps: Counter[int] = Counter()
        self.history: deque[HistoryRow] = deque(maxlen=HISTORY_LEN)  # one per consumed chunk
        # (t, window, target, mean staleness of the period, updates per chunk) at every control step
        self.window_log: deque[tuple] = deque(maxlen=WINDOW_LOG_LEN)
        # the learner's own figures, sent about twice a second: dicts with "t" added
        self.learner_series: deque[dict] = deque(maxlen=SERIES_LEN)

    @property
    def window(self) -> int:
        return self.law.window

    @property
    def chunks_in_flight(self) -> int:
        return len(self.credited)

    @property
    def rho_min(self) -> float | None:
        """The floor the replay-ratio gate admits by (the band's min, or the replay law's)."""
        return self.replay_law.bounds()[0]

    @property
    def rho_max(self) -> float | None:
        """The ceiling the learner trains up to (the band's max, or the replay law's)."""
        return self.replay_law.bounds()[1]

    def _book_env_steps(self, env_steps: int) -> None:
        """Owe the floor's samples for the env steps reported since the last report."""
        rho = self.rho_min or 0.0
        new = env_steps - self._env_steps_booked
        # fewer than booked: a learner rebuilt from an older checkpoint; its counts go on from there
        self.samples_owed = rho * env_steps if new < 0 else self.samples_owed + rho * new
        self._env_steps_booked = env_steps

    def params(self) -> ControllerParams:
        """What the learner applies on its side: how many chunks to ask for, the replay-ratio
        ceiling, the staleness filter."""
        return ControllerParams(window=self.window, rho_max=self.rho_max, max_staleness=self.max_staleness,
                                params_version=self.params_version, target_state=self.law.verdict["state"],
                                target_reason=self.law.verdict["reason"],
                                replay_target_state=self.replay_law.verdict["state"],
                                replay_target_reason=self.replay_law.verdict["reason"])

    def cycle(self, consumed: dict | None = None, want: list | None = None, learner_version: int | None = None,
              progress: dict | None = None, learner_status: dict | None = None, workers_epoch: int = 0) -> dict:
        """Report consumed chunks and ask credits for new explorer task keys, in one round trip.

        ``consumed``: ``messages.Consumption`` records as columns. ``progress``: a
        ``messages.Progress``, for replaying learners. ``learner_status``: the learner's own
        figures (mean return, updates, busy time, ...), for the dashboard and metrics.
        ``workers_epoch``: the controller's count of workers joined or left, passed on. Returns a
        ``messages.CycleReply``: the keys granted, in the order asked, and the current settings.
        """
        now = time.time()
        if learner_version is not None:
            self.learner_version = int(learner_version)
        if progress:
            self._book_env_steps(progress["env_steps"])  # at the floor they came under
            self.progress = progress
        if learner_status:
            self.learner_series.append({**learner_status, "t": now})
            self.replay_law.observe(now, learner_status.get("replay_staleness_recent_mean"), learner_status.get("replay_fill"))
        staleness_seen, dropped_seen = [], 0
        for row in consumptions_from_wire(consumed):
            if row.key in self.credited:
                self.credited.discard(row.key)
                self.returned_consumed += 1
            staleness = int(row.staleness_versions)
            self.chunks_consumed += 1
            self.chunks_dropped += int(bool(row.dropped))
            self.env_steps_consumed += int(row.env_steps)
            self.bytes_consumed += int(row.nbytes)
            self.per_explorer_steps[int(row.explorer_id)] += int(row.env_steps)
            self.staleness_hist[staleness] += 1
            self.staleness_sum += staleness
            self.staleness_max = max(self.staleness_max, staleness)
            self.age_sum_s += float(row.age_s)
            self.age_max_s = max(self.age_max_s, float(row.age_s))
            self.history.append(HistoryRow(now, self.learner_version, self.chunks_in_flight, self.window, staleness,
                                           float(row.age_s)))
            staleness_seen.append(staleness)
            dropped_seen += int(bool(row.dropped))
        if staleness_seen and self.law.observe(now, self.learner_version, staleness_seen, dropped_seen):
            self.window_log.append((now, self.law.w, self.law.staleness_target, self.law.last["staleness"],
                                    self.law.last["updates_per_chunk"]))
        granted = []
        prog = self.progress
        for key in want or ():
            if self.chunks_in_flight >= self.window:
                break
            if not replay_gate(self.rho_min, prog["samples_trained"], prog["env_steps"], self.chunks_in_flight,
                               self.chunk_env_steps, prog["warm"], prog.get("starving", False), self.samples_owed):
                self.refused_replay_ratio += 1
                break
            if key.startswith(EXPLORE_PREFIX) and key not in self.credited:
                self.credited.add(key)
                granted.append(key)
        self.granted_total += len(granted)
        return CycleReply(granted, self.params(), self._next_admission_at(), workers_epoch).to_wire()

    def _next_admission_at(self) -> float | None:
        """The samples trained at which the replay-ratio floor would admit one more chunk, the
        books as they are; None when it would admit one now (or there is no floor)."""
        prog = self.progress
        if self.rho_min is None or not prog["warm"]:
            return None
        needed = samples_needed(self.rho_min, prog["env_steps"], self.chunks_in_flight, self.chunk_env_steps,
                                self.samples_owed)
        return needed if prog["samples_trained"] < needed else None

    def settings(self) -> dict:
        """Every controller setting (``settings.SETTINGS``) as the books hold it now."""
        return {
            "window": self.window, "staleness_target": self.law.staleness_target, "window_min": self.law.window_min,
            "window_max": self.law.window_max, "gain": self.law.gain,
            "replay_ratio": None if self.replay_law.band is None else list(self.replay_law.band),
            "replay_staleness_target": self.replay_law.replay_staleness_target, "max_staleness": self.max_staleness,
        }

    def check(self, **settings) -> dict:
        """The values ``configure`` would apply; ValueError, one line naming the setting, if it
        would refuse them (``settings.check_live``)."""
        return check_live(settings, self.settings())

    def configure(self, **settings) -> dict:
        """Change the law while a run goes on (``None`` for staleness_target, replay_ratio,
        replay_staleness_target or max_staleness switches that part off; an omitted setting is
        left as it is)."""
        new = self.check(**settings)
        self.law.configure(**{name: new[name] for name in WINDOW_SETTINGS if name in new})
        if new.keys() & set(REPLAY_SETTINGS):
            self.replay_law.configure(**{name: new[name] for name in REPLAY_SETTINGS if name in new})
        if "max_staleness" in new:
            self.max_staleness = new["max_staleness"]
        self.params_version += 1
        self.window_log.append((time.time(), self.law.w, self.law.staleness_target, None, None))
        return self.state()

    def view(self) -> BooksView:
        return BooksView(
            group=self.group, simulated=self.simulated, learner_version=self.learner_version,
            chunks_consumed=self.chunks_consumed, chunks_dropped=self.chunks_dropped,
            env_steps_consumed=self.env_steps_consumed, credits_granted=self.granted_total,
            chunks_in_flight=self.chunks_in_flight, window=self.window, staleness_target=self.law.staleness_target,
            target_verdict=self.law.verdict, replay_staleness_target=self.replay_law.replay_staleness_target,
            replay_target_verdict=self.replay_law.verdict, staleness_sum=self.staleness_sum,
            staleness_max=self.staleness_max if self.chunks_consumed else None,
            staleness_hist=dict(self.staleness_hist), per_explorer_steps=dict(self.per_explorer_steps),
            learner=dict(self.learner_series[-1]) if self.learner_series else {})

    def history_since(self, t: float) -> list[HistoryRow]:
        """The consumed chunks booked after ``t``, oldest first (walking back from the newest only)."""
        return _newer(self.history, t, key=lambda row: row.t)

    def learner_series_since(self, t: float) -> list[dict]:
        """The learner's figures received after ``t``, oldest first."""
        return _newer(self.learner_series, t, key=lambda row: row["t"])

    def state(self, history: bool = False) -> dict:
        n = self.chunks_consumed
        out = {
            "group": self.group,
            "simulated": self.simulated,
            **self.settings(),
            "last_period": dict(self.law.last),
            "target_verdict": dict(self.law.verdict),
            "replay_target_verdict": dict(self.replay_law.verdict),
            "replay_ratio_effective": None if self.replay_law.replay_staleness_target is None else self.replay_law.rho,
            "replay_staleness_last_period": self.replay_law.last,
            "chunks_in_flight": self.chunks_in_flight,
            "learner_version": self.learner_version,
            "learner_lost": self.learner_lost,
            "learner_progress": dict(self.progress),
            "credits_granted": self.granted_total,
            "refused_replay_ratio": self.refused_replay_ratio,
            "credits_returned": {
                "consumed": self.returned_consumed,
                "erred": self.returned_erred,
                "forgotten": self.returned_forgotten,
                "unsubmitted": self.returned_unsubmitted,
            },
            "chunks_consumed": n,
            "chunks_dropped": self.chunks_dropped,
            "env_steps_consumed": self.env_steps_consumed,
            "bytes_consumed": self.bytes_consumed,
            "staleness_mean": self.staleness_sum / n if n else None,
            "staleness_max": self.staleness_max if n else None,
            "staleness_hist": {str(k): v for k, v in sorted(self.staleness_hist.items())},
            "age_mean_s": self.age_sum_s / n if n else None,
            "age_max_s": self.age_max_s if n else None,
            "per_explorer_env_steps": {str(k): v for k, v in sorted(self.per_explorer_steps.items())},
        }
        out["learner"] = dict(self.learner_series[-1]) if self.learner_series else None
        if history:
            out["history"] = [row.to_wire() for row in self.history]
            out["window_log"] = [list(row) for row in self.window_log]
            out["learner_series"] = list(self.learner_series)
        return out


def _newer(rows, t_last: float, key) -> list:
    """Rows of a time-ordered deque newer than ``t_last`` (``key(row)``: its time), walking back
    from the end only."""
    out = []
    for row in reversed(rows):
        if key(row) <= t_last:
            break
        out.append(row)
    out.reverse()
    return out
