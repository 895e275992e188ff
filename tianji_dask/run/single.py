"""The single-process mode: the same rollout, algorithm and learner core, no Dask at all."""

from __future__ import annotations

import threading

from tianji_dask.core.learner_core import Final, LearnerCore
from tianji_dask.core.spec import CoreSpec
from tianji_dask.envs.rollout import Rollout, stream_seed
from tianji_dask.errors import EnvError


class SingleProcessRun:
    """Explorers take turns stepping their envs with the learner's own (always fresh) policy. An
    env that raises loses its chunk and is rebuilt (fresh seed), as an explorer's on a cluster:
    counted as an env error, and the run stops after ``max_failures`` of one stream in a row."""

    def __init__(self, core: CoreSpec, *, explorers: int, chunk_steps: int, env_id: str, num_envs: int,
                 env_kwargs_for, seed: int, step_cost_for=None, max_failures: int = 10):
        """``env_kwargs_for(explorer_id)``: the gymnasium kwargs of that explorer's envs;
        ``step_cost_for(explorer_id)``: its simulated cost (``simulate.StepCost``)."""
        self.core = LearnerCore(core)
        self.chunk_steps = chunk_steps
        self.env_id, self.num_envs, self.seed = env_id, num_envs, seed
        self.env_kwargs_for, self.step_cost_for = env_kwargs_for, step_cost_for
        self.max_failures = max_failures
        self.failures = [0] * explorers  # each stream's env errors in a row
        self.rebuilds = [0] * explorers
        self.rollouts: list[Rollout | None] = [None] * explorers  # each made at its stream's first turn
        self._stop = threading.Event()

    def _rollout(self, i: int) -> Rollout:
        from tianji_dask.envs.simulate import StepCostClock

        cost = self.step_cost_for(i) if self.step_cost_for is not None else None
        clock = StepCostClock(cost, self.num_envs, self.seed, i) if cost else None
        return Rollout(self.env_id, self.num_envs, stream_seed(self.seed, i, self.rebuilds[i]), self.env_kwargs_for(i),
                       step_cost=clock)

    def _drop(self, eid: int) -> None:
        """Forget a stream's envs (they may be broken); its next turn rebuilds them with a fresh seed."""
        rollout, self.rollouts[eid] = self.rollouts[eid], None
        self.rebuilds[eid] += 1
        if rollout is not None:
            try:
                rollout.close()
            except Exception:  # noqa: BLE001 - a broken env may not close either
                pass

    def _chunk(self, eid: int) -> dict | None:
        """Stream ``eid``'s next chunk, or None when its env raised (then rebuilt at its next turn)."""
        core = self.core
        try:
            if self.rollouts[eid] is None:
                self.rollouts[eid] = self._rollout(eid)
            chunk = self.rollouts[eid].run(core.policy, self.chunk_steps, core.exploration(), policy_version=core.version,
                                           explorer_id=eid)
        except EnvError as err:
            self._drop(eid)
            line = f"explorer {eid}, env {self.env_id}: {err}"
            self.failures[eid] += 1
            core.record_lost(f"single-env-error-{core.env_errors.count + 1}", eid, line)
            core.record_env_error(eid, line, err.traceback_text())
            if self.failures[eid] >= self.max_failures:
                core.fail(f"explorer {eid} failed {self.failures[eid]} chunks in a row; last: {line}", "explorer_failures",
                          detail=err.traceback_text())
            return None
        self.failures[eid] = 0
        return chunk

    def run(self) -> Final:
        core = self.core
        try:
            core.run(self._loop)
        finally:
            for rollout in self.rollouts:
                if rollout is not None:
                    rollout.close()
        return core.finish()

    def _loop(self) -> None:
        core = self.core
        while not self._stop.is_set() and core.stop_reason() is None:
            for eid in range(len(self.rollouts)):
                chunk = self._chunk(eid)
                if chunk is None:
                    if core.stop_reason() is not None:
                        return
                    continue
                core.consume(chunk)
                core.log_status(self.status())
                while core.ready():
                    core.learn_once()

    def status(self) -> dict:
        return self.core.status()

    def stop(self) -> None:
        self._stop.set()
