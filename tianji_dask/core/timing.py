"""Where the learner's wall time goes besides its updates: blocks timed by part (no Dask)."""

from __future__ import annotations

import time
from collections import defaultdict


class TimeSplit:
    """Seconds by part of the learner's wall time: "ingest" (the algorithm taking data), "wait"
    (blocked on arrivals, or sleeping), and the dataflow's own work ("cycle", "submit",
    "publish", "fuse", "status", "checkpoint", "receive": taking a directly sent chunk). A part
    timed inside another counts in the inner one only."""

    def __init__(self):
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self._open: list[float] = []  # per block open now: the time of the parts timed inside it

    def timed(self, part: str) -> "_Timed":
        """A context manager adding the block's wall time to ``seconds[part]``."""
        return _Timed(self, part)

    def breakdown(self, wall: float, learn_s: float) -> dict:
        """Seconds of the learner's wall time by part, updates (``learn_s``) included; "other" is
        what no part covers (the loop itself, consuming and reporting chunks).
        "dataflow_fraction": the share of the learner's non-waiting time spent on neither updates
        nor ingesting data."""
        parts = {"learn": learn_s, **self.seconds}
        parts["other"] = max(0.0, wall - sum(parts.values()))
        busy = wall - parts.get("wait", 0.0)
        dataflow = busy - parts["learn"] - parts.get("ingest", 0.0)
        return {"seconds": {k: round(v, 4) for k, v in parts.items()},
                "dataflow_fraction": dataflow / busy if busy > 0 else None}


class _Timed:
    """``TimeSplit.timed``'s context manager: a plain class, as the learner enters a few of these per
    update and a generator-based one costs several times as much to enter."""

    __slots__ = ("split", "part", "t0")

    def __init__(self, split: TimeSplit, part: str):
        self.split, self.part = split, part

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()
        self.split._open.append(0.0)  # time of the parts timed inside this block

    def __exit__(self, *exc) -> None:
        timing = self.split._open
        inner = timing.pop()
        dt = time.perf_counter() - self.t0
        self.split.seconds[self.part] += dt - inner  # nested parts count once, in the innermost
        if timing:
            timing[-1] += dt
