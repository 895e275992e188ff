"""What the learner and the staleness controller say to each other, as named records.

Both sides import this module; on the wire each record is a plain dict (the scheduler's RPC
carries msgpack), made by ``to_wire`` and read back by ``from_wire``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from tianji_dask.core.consumption import Consumption


_COLUMNS = tuple(f.name for f in fields(Consumption))


def consumptions_to_wire(rows: list[Consumption]) -> dict[str, list]:
    """Columns of values, one list per field: smaller on the wire than one dict per chunk."""
    return {name: [getattr(r, name) for r in rows] for name in _COLUMNS}


def consumptions_from_wire(columns: dict[str, list] | None) -> list[Consumption]:
    if not columns:
        return []
    return [Consumption(*values) for values in zip(*(columns[name] for name in _COLUMNS))]


@dataclass(frozen=True)
class Progress:
    """A replaying learner's counters, which replay-ratio pacing admits by: env steps ingested
    past the warm-up, samples trained since, whether the warm-up is reached, and whether the
    learner is starving (cannot train: nothing in flight must then still be admitted)."""

    env_steps: int = 0
    samples_trained: int = 0
    warm: bool = False
    starving: bool = False

    @classmethod
    def of(cls, replay_progress: dict | None, starving: bool) -> "Progress | None":
        if replay_progress is None:
            return None
        return cls(int(replay_progress["env_steps"]), int(replay_progress["samples_trained"]),
                   bool(replay_progress["warm"]), starving)

    def to_wire(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ControllerParams:
    """The controller's settings the learner applies on its side: the window (how many chunks
    to ask for), the replay-ratio ceiling (the algorithm stops updating above it), the staleness
    filter, a counter that changes whenever a client reconfigures the controller, and the window
    law's verdict on its staleness target (``WindowLaw.verdict``: off, settling, held or
    unreachable, with the reason when unreachable) and the replay law's on its replay staleness
    target (``ReplayRatioLaw.verdict``), which the learner's status reports."""

    window: int
    rho_max: float | None = None
    max_staleness: int | None = None
    params_version: int = 0
    target_state: str = "off"
    target_reason: str | None = None
    replay_target_state: str = "off"
    replay_target_reason: str | None = None

    def to_wire(self) -> dict:
        return asdict(self)

    @classmethod
    def from_wire(cls, wire: dict) -> "ControllerParams":
        return cls(**wire)


@dataclass(frozen=True)
class CycleReply:
    """The controller's answer to one request: the keys it granted credits for (in the order
    asked), its current settings, and, when the replay-ratio floor would refuse one more key,
    the samples the learner must have trained before it can be granted (None: ask any time).
    ``workers_epoch`` counts the workers that joined or left the cluster: when it moves, the
    learner looks again for the explorer workers its streams run on."""

    granted: list[str]
    params: ControllerParams
    ask_again_at_samples: float | None = None
    workers_epoch: int = 0

    def to_wire(self) -> dict:
        return {"granted": list(self.granted), "params": self.params.to_wire(),
                "ask_again_at_samples": self.ask_again_at_samples, "workers_epoch": self.workers_epoch}

    @classmethod
    def from_wire(cls, wire: dict) -> "CycleReply":
        return cls(list(wire["granted"]), ControllerParams.from_wire(wire["params"]), wire.get("ask_again_at_samples"),
                   int(wire.get("workers_epoch", 0)))
