"""Group mode's root reducer: a Dask actor that fuses the groups' learners into one model.

Each group's learner offers its model every ``reduce.every`` updates, tagged with a round number
that goes up by one per offer. A round is fused (element-wise mean) when every group has offered
its model for that round, so each fusion averages exactly one model per group, and a fast group
cannot put two models into one round (TianJi's reducer took the G most recent messages, so it
could). A learner offers round r + 1 only after it has taken the fused model of round r, so no
offer outlives its round. The reducer never writes checkpoints (TianJi's did at every round).

Methods are ``async`` and run on the worker's event loop; ``take`` waits there (without blocking
the loop) until its round is fused or a short timeout passes, so a learner polls with one call
in flight.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

TAKE_TIMEOUT_S = 1.0
LOG_LEN = 100_000


def average(models: list[dict]) -> dict:
    """Element-wise mean of models with the same keys and shapes (float64 sums, input dtype out)."""
    first = models[0]
    return {k: np.mean([m[k] for m in models], axis=0, dtype=np.float64).astype(first[k].dtype, copy=False) for k in first}


class Reducer:
    def __init__(self, groups: int):
        self.groups = int(groups)
        self.next_round = {g: 0 for g in range(self.groups)}  # the round each group offers next
        self.offers: dict[int, dict[int, tuple[int, dict]]] = {}  # round -> group -> (version, model)
        self.fused: dict[int, tuple[dict, dict]] = {}  # round -> (model, {group: version offered})
        self.log: list[dict] = []  # one row per fusion
        self._changed = asyncio.Event()

    async def join(self, group: int) -> int:
        """The round ``group`` offers next (a learner rebuilt after a crash goes on from there)."""
        return self.next_round[self._group(group)]

    async def offer(self, group: int, round: int, version: int, model: dict) -> int:
        """Group ``group``'s model for ``round``, made at learner version ``version``. Returns the
        number of groups that have offered for that round so far."""
        group = self._group(group)
        if round != self.next_round[group]:
            raise ValueError(f"reducer: group {group} offered round {round}, but its next round is {self.next_round[group]}")
        self.next_round[group] = round + 1
        slot = self.offers.setdefault(round, {})
        slot[group] = (int(version), model)
        if len(slot) == self.groups:
            del self.offers[round]
            versions = {g: v for g, (v, _) in sorted(slot.items())}
            self.fused[round] = (average([m for _, (_, m) in sorted(slot.items())]), versions)
            for old in [r for r in self.fused if r < round - 1]:  # every group has taken those
                del self.fused[old]
            if len(self.log) < LOG_LEN:
                self.log.append({"round": round, "versions": versions, "t": time.time()})
            self._changed.set()
            self._changed = asyncio.Event()
        return len(slot)

    async def take(self, round: int, timeout: float = TAKE_TIMEOUT_S):
        """The fused model of ``round`` and the versions it averaged, once every group has
        offered; None if that has not happened within ``timeout`` seconds (ask again)."""
        deadline = time.monotonic() + timeout
        while round not in self.fused:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except asyncio.TimeoutError:
                return None
        return self.fused[round]

    async def rounds(self) -> list[dict]:
        """Every fusion so far: ``{"round", "versions": {group: learner version offered}, "t"}``."""
        return list(self.log)

    def _group(self, group: int) -> int:
        if group not in self.next_round:
            raise ValueError(f"reducer: no group {group} (groups 0..{self.groups - 1})")
        return group
