"""What an exact re-execution of a run needs, recorded as the learner consumes (no Dask).

One row per consumed chunk, in consumption order: which explorer stream made it (and which of
that stream's env instances, by its seed, and which of its chunks, by serial), with which policy
version and exploration settings, how many updates the learner had made when it consumed it,
and whether it was dropped before the algorithm saw it. With the seeds (each stream's envs, each
chunk's action sampling, the learner's own), that is the whole run: ``tianji_dask.playback.exact_replay``
re-executes it in one process and must reach the same final weights (``weights_digest``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from tianji_dask.core.rows import Rows

REPLAY_FIELDS = ("stream", "stream_serial", "env_seed", "policy_version", "updates_before", "skipped",
                 "explore_0", "explore_1")
MAX_EXPLORE_KEYS = 2


def weights_digest(weights: dict[str, np.ndarray]) -> str:
    """SHA-256 of policy weights: every array's name, dtype, shape and bytes, names in order."""
    h = hashlib.sha256()
    for name in sorted(weights):
        arr = np.ascontiguousarray(weights[name])
        h.update(f"{name}|{arr.dtype.str}|{arr.shape}|".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


class ExactReplayLog:
    """``explore_keys``: the names of the algorithm's exploration settings (sorted), at most two,
    recorded as numbers (a bool as 0 or 1); more than two and the run is marked not replayable."""

    def __init__(self, explore_keys, rows_dir: str | os.PathLike | None = None):
        self.explore_keys = sorted(explore_keys)
        self.why_not: str | None = None
        if len(self.explore_keys) > MAX_EXPLORE_KEYS:
            self.why_not = f"the algorithm has {len(self.explore_keys)} exploration settings; the log holds {MAX_EXPLORE_KEYS}"
        spill = None if rows_dir is None else Path(rows_dir) / "replay.f64"
        self.rows = Rows(len(REPLAY_FIELDS), spill=spill)

    def record(self, chunk: dict, updates_before: int, skipped: bool, explore: dict | None) -> None:
        values = [float((explore or {}).get(k, np.nan)) for k in self.explore_keys[:MAX_EXPLORE_KEYS]]
        values += [np.nan] * (MAX_EXPLORE_KEYS - len(values))
        self.rows.append((chunk["explorer_id"], chunk["stream_serial"], chunk["env_seed"], chunk["policy_version"],
                          updates_before, float(skipped), *values))

    def take(self) -> np.ndarray:
        """Every row, for the results; the spill file goes."""
        rows = self.rows.all()
        self.rows.discard()
        return rows

    def not_replayable(self, why: str) -> None:
        self.why_not = self.why_not or why

    def meta(self) -> dict:
        return {"explore_keys": self.explore_keys, "replayable": self.why_not is None, "why_not": self.why_not,
                "rows": len(self.rows)}
