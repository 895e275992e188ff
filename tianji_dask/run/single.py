"""The single-process mode: the same rollout, algorithm and learner core, no Dask at all."""

from __future__ import annotations

import threading

from tianji_dask.core.learner_core import Final, LearnerCore
from tianji_dask.core.spec import CoreSpec
from tianji_dask.envs.rollout import Rollout, stream_seed


class SingleProcessRun:
    """Explorers take turns stepping their envs with the learner's own (always fresh) policy."""

    def __init__(self, core: CoreSpec, *, explorers: int, chunk_steps: int, env_id: str, num_envs: int,
                 env_kwargs_for, seed: int, step_cost_for=None):
        """``env_kwargs_for(explorer_id)``: the gymnasium kwargs of that explorer's envs;
        ``step_cost_for(explorer_id)``: its simulated cost (``simulate.StepCost``)."""
        from tianji_dask.envs.simulate import StepCostClock

        self.core = LearnerCore(core)
        self.chunk_steps = chunk_steps
        self.rollouts = []
        for i in range(explorers):
            cost = step_cost_for(i) if step_cost_for is not None else None
            clock = StepCostClock(cost, num_envs, seed, i) if cost else None
            self.rollouts.append(Rollout(env_id, num_envs, stream_seed(seed, i), env_kwargs_for(i), step_cost=clock))
        self._stop = threading.Event()

    def run(self) -> Final:
        core = self.core
        try:
            core.run(self._loop)
        finally:
            for rollout in self.rollouts:
                rollout.close()
        return core.finish()

    def _loop(self) -> None:
        core = self.core
        while not self._stop.is_set() and core.stop_reason() is None:
            for eid, rollout in enumerate(self.rollouts):
                chunk = rollout.run(core.policy, self.chunk_steps, core.exploration(), policy_version=core.version,
                                    explorer_id=eid)
                core.consume(chunk)
                core.log_status(self.status())
                while core.ready():
                    core.learn_once()

    def status(self) -> dict:
        return self.core.status()

    def stop(self) -> None:
        self._stop.set()
