"""What is read of one learner's books in the staleness controller (no Dask): the series kept for the
dashboard and the results (one row per consumed chunk, the window's moves, the learner's figures),
the ``BooksView`` the dashboard and Prometheus read, and the ``BooksState`` that ``tianji_state``
answers and results.json keeps. Built from admission's and accounting's public figures; it
decides and counts nothing."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, fields

from tianji_dask.dataflow.controller.accounting import Accounting
from tianji_dask.dataflow.controller.admission import Admission

HISTORY_LEN = 2000
SERIES_LEN = 3000
WINDOW_LOG_LEN = 2000


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


class Series:
    """The books' bounded time series: ``history`` (a ``HistoryRow`` per consumed chunk),
    ``window_log`` ((t, window, target, mean staleness of the period, updates per chunk) at every
    control step and configure) and ``learner`` (the learner's own figures, about twice a second,
    dicts with "t" added)."""

    def __init__(self):
        self.history: deque[HistoryRow] = deque(maxlen=HISTORY_LEN)
        self.window_log: deque[tuple] = deque(maxlen=WINDOW_LOG_LEN)
        self.learner: deque[dict] = deque(maxlen=SERIES_LEN)

    def learner_now(self) -> dict:
        """The learner's newest figures ({} before its first)."""
        return dict(self.learner[-1]) if self.learner else {}

    def history_since(self, t: float) -> list[HistoryRow]:
        """The consumed chunks booked after ``t``, oldest first (walking back from the newest only)."""
        return _newer(self.history, t, key=lambda row: row.t)

    def learner_since(self, t: float) -> list[dict]:
        """The learner's figures received after ``t``, oldest first."""
        return _newer(self.learner, t, key=lambda row: row["t"])

    def to_wire(self) -> dict:
        """The series as ``state(history=True)`` adds them."""
        return {"history": [row.to_wire() for row in self.history], "window_log": [list(row) for row in self.window_log],
                "learner_series": list(self.learner)}


@dataclass(frozen=True)
class BooksView:
    """What the dashboard and the metrics read of one group's books, as of one moment (``of``)."""

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

    @classmethod
    def of(cls, group: int, learner_version: int, admission: Admission, accounting: Accounting,
           series: Series) -> "BooksView":
        a, settings = accounting, admission.settings
        return cls(
            group=group, simulated=settings.simulated, learner_version=learner_version,
            chunks_consumed=a.chunks_consumed, chunks_dropped=a.chunks_dropped, env_steps_consumed=a.env_steps_consumed,
            credits_granted=a.credits_granted, chunks_in_flight=admission.chunks_in_flight, window=admission.window,
            staleness_target=settings.staleness_target, target_verdict=admission.law.verdict,
            replay_staleness_target=settings.replay_staleness_target, replay_target_verdict=admission.replay_law.verdict,
            staleness_sum=a.staleness_sum, staleness_max=a.staleness_max if a.chunks_consumed else None,
            staleness_hist=dict(a.staleness_hist), per_explorer_steps=dict(a.per_explorer_steps),
            learner=series.learner_now())


@dataclass(frozen=True)
class BooksState:
    """One group's books as ``tianji_state`` answers them (``to_wire``: these fields in this order,
    ``settings`` spread out as its settings), which results.json keeps under "controller" and the
    run's accounting reads: the wire format the dashboard's clients, the tests and past results know."""

    group: int
    simulated: bool
    settings: dict = field(metadata={"spread": True})  # every controller setting now (``LawSettings.values``)
    last_period: dict
    target_verdict: dict
    replay_target_verdict: dict
    replay_ratio_effective: float | None
    replay_staleness_last_period: float | None
    chunks_in_flight: int
    learner_version: int
    learner_lost: bool
    learner_progress: dict
    credits_granted: int
    refused_replay_ratio: int
    credits_returned: dict[str, int]
    chunks_consumed: int
    chunks_dropped: int
    env_steps_consumed: int
    bytes_consumed: int
    staleness_mean: float | None  # None before the first chunk, as every figure of the chunks
    staleness_max: int | None
    staleness_hist: dict[str, int]  # keys as strings, sorted by staleness
    age_mean_s: float | None
    age_max_s: float | None
    per_explorer_env_steps: dict[str, int]
    learner: dict | None  # the learner's newest figures (None before its first)

    @classmethod
    def of(cls, group: int, learner_version: int, learner_lost: bool, admission: Admission, accounting: Accounting,
           series: Series) -> "BooksState":
        a, n, replay = accounting, accounting.chunks_consumed, admission.replay_law
        return cls(
            group=group, simulated=admission.settings.simulated, settings=admission.values(),
            last_period=dict(admission.law.last), target_verdict=admission.law.verdict,
            replay_target_verdict=replay.verdict,
            replay_ratio_effective=None if admission.settings.replay_staleness_target is None else replay.rho,
            replay_staleness_last_period=replay.last, chunks_in_flight=admission.chunks_in_flight,
            learner_version=learner_version, learner_lost=learner_lost, learner_progress=dict(admission.progress),
            credits_granted=a.credits_granted, refused_replay_ratio=a.refused_replay_ratio,
            credits_returned=dict(a.credits_returned), chunks_consumed=n, chunks_dropped=a.chunks_dropped,
            env_steps_consumed=a.env_steps_consumed, bytes_consumed=a.bytes_consumed,
            staleness_mean=a.staleness_sum / n if n else None, staleness_max=a.staleness_max if n else None,
            staleness_hist={str(k): v for k, v in sorted(a.staleness_hist.items())},
            age_mean_s=a.age_sum_s / n if n else None, age_max_s=a.age_max_s if n else None,
            per_explorer_env_steps={str(k): v for k, v in sorted(a.per_explorer_steps.items())},
            learner=series.learner_now() or None)

    def to_wire(self) -> dict:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.metadata.get("spread"):
                out.update(value)
            else:
                out[f.name] = value
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
