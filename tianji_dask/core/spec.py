"""What a learner core is built from: a plain, picklable record (no Dask)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tianji_dask.callbacks.runner import CallbackPlan
from tianji_dask.core.replicas import ReplicaSpec
from tianji_dask.core.stop import StopRules


@dataclass(frozen=True)
class CheckpointSettings:
    """Where and how often full checkpoints are written (``checkpoint:`` in a pipeline)."""

    dir: str
    every_seconds: float | None = None
    every_versions: int | None = None
    keep: int = 3
    replay_buffer: bool = False  # keep the replay buffer in checkpoints (``checkpoint.replay_buffer``)


@dataclass(frozen=True)
class CoreSpec:
    """``make_algo``: a picklable zero-argument callable building the algorithm.
    ``t_process_start``: when the user's process started (the second clock of time-to-solve).
    ``rows_dir``: where the chunk log and episodes spill as the run goes (None: all in memory).
    ``resume_from``: a checkpoint to continue from; with ``keep_t_run_start`` the run keeps that
    start time (a rebuilt learner: the time lost to the crash counts), without it the clock goes
    on from the checkpoint's elapsed time (a resumed run: the pause does not count). With
    ``keep_t_run_start`` alone, a learner rebuilt from the start keeps the run's start."""

    make_algo: Callable
    stop: StopRules
    t_process_start: float
    threads: int = 1
    device: str = "cpu"
    #: ``learner.compile``: auto, on or off (core/compile.py)
    compile: str = "auto"
    explorer_workers: int = 1
    rows_dir: str | None = None
    checkpoint: CheckpointSettings | None = None
    resume_from: str | None = None
    keep_t_run_start: float | None = None
    #: a picklable zero-argument callable making the run's scalar log, written as the learner goes
    #: (TensorBoard's: ``observe.tensorboard.ScalarLog``; ``write(status, force)``, ``close()``), None: none
    scalar_log: Callable | None = None
    #: keep the log an exact re-execution needs (core/exact_replay_log.py): relaxed and lockstep, one group
    replay_log: bool = False
    #: the callbacks this learner calls (on a thread of their own), None: none
    callbacks: CallbackPlan | None = None
    #: ``env.max_errors``: env errors within 60 s that stop the run (core/env_errors.py), None: no limit
    env_max_errors: int | None = None
    #: this learner's place among the run's learner replicas (core/replicas.py), None: the only learner
    replica: ReplicaSpec | None = None
    #: ``learner.simulated_step_ms``: seconds slept per gradient step (simulated learner compute), 0: none
    simulated_step_s: float = 0.0
