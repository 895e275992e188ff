"""One learner's accounting in the staleness controller: what it consumed (chunks, env steps,
bytes, staleness, age, per explorer) and what became of the credits admission granted (no Dask).
It counts and decides nothing; ``books.py`` feeds it, ``view.py`` reads it."""

from __future__ import annotations

from collections import Counter

from tianji_dask.core.consumption import Consumption

#: why a credit came back: its chunk consumed, its task erred or forgotten unconsumed, or granted to
#: a learner that died before it submitted the key (the order the results have always listed them)
RETURNED = ("consumed", "erred", "forgotten", "unsubmitted")


class Accounting:
    """The counters of one learner's books. The learner counts the chunks it consumed too
    (``LearnerCore.chunks_consumed``): that count lives in the learner's process, this one in the
    scheduler's, and each outlives the other (a lost learner, a lost scheduler), so both are kept."""

    def __init__(self):
        self.credits_granted = 0
        self.refused_replay_ratio = 0  # asks the replay-ratio floor refused
        self.credits_returned = dict.fromkeys(RETURNED, 0)
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

    def granted(self, n: int, refused: bool) -> None:
        """Admission granted ``n`` credits, and its replay-ratio floor refused the next (``refused``)."""
        self.credits_granted += n
        self.refused_replay_ratio += int(refused)

    def returned(self, why: str, n: int = 1) -> None:
        """``n`` credits came back (``why``: one of ``RETURNED``)."""
        self.credits_returned[why] += n

    def book(self, row: Consumption) -> int:
        """One consumed chunk; returns its staleness (versions)."""
        staleness, age_s = int(row.staleness_versions), float(row.age_s)
        self.chunks_consumed += 1
        self.chunks_dropped += int(bool(row.dropped))
        self.env_steps_consumed += int(row.env_steps)
        self.bytes_consumed += int(row.nbytes)
        self.per_explorer_steps[int(row.explorer_id)] += int(row.env_steps)
        self.staleness_hist[staleness] += 1
        self.staleness_sum += staleness
        self.staleness_max = max(self.staleness_max, staleness)
        self.age_sum_s += age_s
        self.age_max_s = max(self.age_max_s, age_s)
        return staleness
