"""What a learner actor is built from: a plain, picklable record made by the run."""

from __future__ import annotations

from dataclasses import dataclass

from tianji_dask.core.spec import CoreSpec
from tianji_dask.dataflow.controller.settings import LawSettings
from tianji_dask.dataflow.keys import learner_tag


@dataclass(frozen=True)
class FusionSpec:
    """Group mode: the reducer actor this group's learner offers its model to (its worker
    address and key), every ``every`` updates; with ``barrier`` it waits for the fused model."""

    reducer_address: str
    reducer_key: str
    every: int
    barrier: bool


@dataclass(frozen=True)
class EvalSpec:
    """Evaluation during training (the pipeline's ``eval``); ``seed``: the evaluation envs' first seed."""

    every_s: float | None
    every_versions: int | None
    episodes: int
    deterministic: bool
    seed: int


@dataclass(frozen=True)
class LearnerSpec:
    """``streams``: the explorer stream ids this learner feeds on. ``law``: the controller's
    settings for this learner's books. ``direct_min_bytes``:
    chunks at least this big come over a direct socket (None: all through Dask).
    ``inline_weights_max_bytes``: weights at most this big travel inside each task (None:
    always scattered). ``rebuilt``: this learner replaces one whose worker was lost.
    ``explorer_hosts``: the explorer workers this learner's streams and evaluations may run on
    (None: every EXPLORER worker); runs sharing a cluster each get their own. ``lifetime_s``:
    seconds after its worker process started at which the learner hands off (checkpoint, credits
    back, stop) so that the run goes on on a fresh worker; None: never."""

    run_id: str
    mode: str
    core: CoreSpec
    streams: tuple[int, ...]
    chunk_steps: int
    chunk_env_steps: int
    law: LawSettings
    publish_every: int = 1
    updates_per_pass: int = 1
    drop_on_refresh: bool = False
    direct_min_bytes: int | None = None
    inline_weights_max_bytes: int | None = None
    max_explorer_failures: int = 10
    group: int = 0
    fusion: FusionSpec | None = None
    rebuilt: bool = False
    eval: EvalSpec | None = None
    explorer_hosts: tuple[str, ...] | None = None
    lifetime_s: float | None = None

    @property
    def tag(self) -> str:
        """What this learner's task and data keys carry: the run, and the group in group mode (a
        replica's index with learner replicas: the controller keeps each one's books apart)."""
        several = self.fusion is not None or self.core.replica is not None
        return learner_tag(self.run_id, self.group if several else None)
