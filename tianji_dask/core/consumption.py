"""One consumed chunk as the learner core books it: the record the core returns when it consumes
a chunk, and the one the controller books (its credit comes back with it). Plain data, imported
by the scheduler's side too, so nothing heavy here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Consumption:
    """One consumed chunk, as the learner's books hold it and the controller books it (its credit
    comes back with it): its task key and stream, its size, its staleness when consumed, its age,
    the env steps the algorithm kept, and why it was not trained on (None: it was)."""

    key: str
    explorer_id: int
    env_steps: int
    nbytes: int
    staleness_versions: int
    age_s: float
    dropped: str | None
    kept_steps: int = 0
