"""Where a run's learners live: one interface, two places. ``SingleBackend`` runs the learner core
and its explorers in this process (no Dask); ``dask_backend.DaskBackend`` runs them on a
Dask cluster. ``Run`` (``handle.py``) drives either the same way: start, statuses, stop, finals,
figures, close."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from tianji_dask.config import Pipeline
from tianji_dask.dataflow.learner.report import LearnerReport
from tianji_dask.run import specs
from tianji_dask.run.checks import Prepared


@dataclass(frozen=True)
class RunPlan:
    """What the run decided before it starts, and every backend builds its learners from."""

    pipeline: Pipeline
    prepared: Prepared
    run_id: str
    out: Path
    t_process_start: float
    #: added to the pipeline's seed for the explorers' envs: a resumed run plays fresh episodes
    env_seed: int
    #: per group (or replica), the checkpoint its learner starts from (None: from scratch)
    resume_from: tuple[str | None, ...]
    #: on a cluster other runs share: the LEARNER worker and the EXPLORER workers this run may use
    learner_worker: str | None = None
    explorer_hosts: tuple[str, ...] | None = None
    #: ``Callback`` objects given from Python (each learner gets its own copy off this process)
    callbacks: tuple = ()
    #: let distributed's warnings and logs below ERROR through (``Run(verbose=True)``)
    verbose: bool = False

    @property
    def shares_cluster(self) -> bool:
        return self.learner_worker is not None or self.explorer_hosts is not None

    def core_spec(self, group: int = 0, *, explorer_workers: int = 1, **changes):
        return specs.core_spec(self.pipeline, self.prepared, out=self.out, t_process_start=self.t_process_start,
                               explorer_workers=explorer_workers, group=group, run_id=self.run_id, callbacks=self.callbacks,
                               resume_from=changes.pop("resume_from", self.resume_from[group]), **changes)


@dataclass(frozen=True)
class Gone:
    """A learner whose worker went before its final books were fetched: ``why``."""

    why: str


class Backend(ABC):
    """The learners of one run, wherever they live."""

    #: when each step of the start was reached (Unix times), beyond the run's own
    startup: dict[str, float]
    dashboard_link: str | None = None
    client = None
    cluster = None

    @abstractmethod
    def start(self) -> None:
        """Build the learners (and what they need) and let them train."""

    @abstractmethod
    def reports(self, wait_s: float) -> list[LearnerReport] | None:
        """Each learner's report (its live status, whether it is done), after at most ``wait_s``
        seconds (at once when all are done); None when a lost learner has just been rebuilt and
        should be asked again."""

    @abstractmethod
    def stop(self) -> None:
        """Ask every learner to stop; ``statuses`` says when they have."""

    @abstractmethod
    def finals(self, keep_going: bool = False) -> list:
        """Each learner's results, episodes, chunks and replay log, once it is done (None: not
        yet). ClusterLost when one's worker has gone; with ``keep_going``, a ``Gone`` in its place."""

    def fusion(self) -> dict | None:
        """Group mode: the reducer's settings and rounds."""
        return None

    def figures(self, results: dict) -> dict:
        """What this backend adds to results.json beyond the learners' own."""
        return {"learner_restarts": []}

    def close(self) -> None:
        """Release what the backend started; safe to call twice."""


class SingleBackend(Backend):
    """The single-process mode: the learner core and every explorer stream in a thread of this
    process, with no Dask at all."""

    def __init__(self, plan: RunPlan):
        from tianji_dask.run.single import SingleProcessRun

        p = plan.pipeline
        self.startup = {}
        self._run = SingleProcessRun(plan.core_spec(), explorers=p.explorers, chunk_steps=p.chunk_steps,
                                     env_id=p.env.id, num_envs=p.env.num_envs, env_kwargs_for=p.env_kwargs_for,
                                     seed=p.seed + plan.env_seed, step_cost_for=p.step_cost_for,
                                     max_failures=p.stop.max_explorer_failures)
        self._done = threading.Event()
        self._final: dict | None = None

    @property
    def core(self):
        """The learner core (its algorithm, books and version), for a caller in this process."""
        return self._run.core

    def start(self) -> None:
        threading.Thread(target=self._train, name="tianji-single", daemon=True).start()

    def _train(self) -> None:
        try:
            self._final = self._run.run().as_dict()
        finally:
            self._done.set()

    def reports(self, wait_s: float) -> list[LearnerReport]:
        self._done.wait(wait_s)
        return [LearnerReport(self._run.status(), done=self._done.is_set())]

    def stop(self) -> None:
        self._run.stop()

    def finals(self, keep_going: bool = False) -> list[dict]:
        self._done.wait()
        if self._final is None:
            raise RuntimeError("single mode: the training thread ended without results (its traceback is above)")
        return [self._final]
