"""Group mode's client of the reducer: offer the model every ``every`` updates, install the fused one.

It never blocks: the reducer's calls are polled, one in flight at a time. Installing keeps what
this learner learnt while it waited (asynchronous mode): model = fused + (model now - model
offered); under the barrier that difference is zero, so it is the fused model itself. An install
is a new version, so explorers see the change.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tianji_dask.dataflow.learner.spec import FusionSpec


@dataclass
class _Offer:
    round: int
    offered: dict
    version: int
    t: float
    call: object
    take: object = None


@dataclass
class FusionClient:
    """``reducer``: a handle to the Reducer actor (its calls return futures)."""

    spec: FusionSpec
    group: int
    reducer: object
    installed: list[dict] = field(default_factory=list)  # one row per fused model installed

    def __post_init__(self):
        self._reducer = self.reducer
        self._round = int(self._reducer.join(self.group).result())
        self._offer: _Offer | None = None
        self._updates = 0  # since the last install

    @property
    def waiting(self) -> bool:
        """An offer is out and its round's fused model is not in yet."""
        return self._offer is not None

    @property
    def holding(self) -> bool:
        """The barrier: between an offer and the fused model's arrival, no updates, no new work."""
        return self._offer is not None and self.spec.barrier

    def updated(self) -> None:
        self._updates += 1

    def poll(self, core, stopping: bool = False) -> bool:
        """Move the round on by one step; True when a fused model was installed into ``core``."""
        offer = self._offer
        if offer is None:
            if self._updates >= self.spec.every and not stopping:
                offered = core.model_state()
                call = self._reducer.offer(self.group, self._round, core.version, offered)
                self._offer = _Offer(self._round, offered, core.version, time.time(), call)
            return False
        if offer.take is None:
            if offer.call.done():
                offer.call.result()  # raises if the reducer refused the offer
                offer.take = self._reducer.take(offer.round)
            return False
        if not offer.take.done():
            return False
        fused = offer.take.result()
        if fused is None:  # not complete yet: ask again
            offer.take = self._reducer.take(offer.round)
            return False
        model, versions = fused
        now = core.model_state()
        core.load_model_state({k: model[k] + (now[k] - offer.offered[k]) for k in model})
        core.new_version()
        self.installed.append({
            "round": offer.round, "offered_version": offer.version, "installed_version": core.version,
            "versions": {int(g): int(v) for g, v in versions.items()}, "wait_s": time.time() - offer.t,
        })
        self._round += 1
        self._updates = 0
        self._offer = None
        return True
