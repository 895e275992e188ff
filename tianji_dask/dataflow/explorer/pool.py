"""Explorer side: a per-worker pool of live environments and policies (a WorkerPlugin).

The pool keeps one vector env per explorer stream, so episodes continue across chunks, and one
policy object per worker thread and learner group, loaded only when a new weights version of that
group arrives. A worker may run several explorer tasks at once, one per thread (its EXPLORER
resource says how many): each thread acts with its own policy object, and the chunks of one stream
run one at a time (``stream_lock``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from distributed import WorkerPlugin

from tianji_dask import dask_internals
from tianji_dask.dataflow import keys
from tianji_dask.envs.rollout import Rollout, stream_seed
from tianji_dask.envs.simulate import StepCostClock

#: seeds of one stream's generations lie this many rebuilds apart
GENERATION_STRIDE = 1000


@dataclass(frozen=True)
class LoadedPolicy:
    """A thread's policy object for one learner group and the weights version it holds."""

    policy: object
    version: int = -1


def worker_pool(worker, run_id: str) -> "EnvPool":
    """This worker's env pool of run ``run_id``: a worker plugin per run (``keys.pool_name``), so runs
    sharing a cluster keep their envs apart, and a run's pool goes with it (``Run.close`` unregisters it)."""
    try:
        return worker.plugins[keys.pool_name(run_id)]
    except KeyError:
        raise RuntimeError(f"explorer: this worker holds no env pool of run {run_id} (the run has ended, "
                           "or this worker joined while its pool was being handed out)") from None


def _pools(worker) -> list["EnvPool"]:
    return [p for name, p in list(worker.plugins.items()) if keys.is_pool_name(name)]


def _worker_metrics(worker) -> dict:
    """What the dashboard's worker table shows of the env pools on one worker."""
    pools = _pools(worker)
    return {"env_steps": sum(p.env_steps for p in pools),
            "policy_version": max((p.newest_version() for p in pools), default=-1),
            "streams": sum(len(p.rollouts) for p in pools)}


class EnvPool(WorkerPlugin):
    """Holds the run's environments and policies on each worker.

    ``make_policy`` is a picklable zero-argument callable returning an object with ``act`` and
    ``set_weights`` (the algorithm, built on the explorer side only for inference).
    ``step_costs``: per stream, a ``simulate.StepCost`` its env steps also spend (simulation).
    """

    def __init__(self, run_id: str, env_id: str, num_envs: int, env_kwargs: dict, make_policy, seed: int,
                 explorer_kwargs: dict | None = None, step_costs: dict | None = None):
        self.run_id = run_id
        self.env_id = env_id
        self.num_envs = num_envs
        self.env_kwargs = env_kwargs
        self.explorer_kwargs = explorer_kwargs or {}  # per stream, merged over env_kwargs
        self.step_costs = step_costs or {}
        self.make_policy = make_policy
        self.seed = seed
        self.rollouts: dict[int, Rollout] = {}
        self.env_steps = 0
        self.rebuilds: dict[tuple[int, int], int] = {}  # (stream, generation) -> envs built so far
        self._versions: dict[int, int] = {}  # newest version loaded by any thread, per group (for metrics)
        self._make_locks()

    def _make_locks(self) -> None:
        self._lock = threading.Lock()
        self._stream_locks: dict[int, threading.Lock] = {}
        self._local = threading.local()  # this thread's policies: group -> LoadedPolicy

    def __getstate__(self):
        # locks and thread-local policies stay on each worker: the plugin travels without them
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_stream_locks", "_local", "_quiet")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._make_locks()

    def setup(self, worker):
        import torch

        torch.set_num_threads(1)  # explorers do small-batch inference; threads only contend
        worker.metrics["tianji"] = _worker_metrics  # every run's pool on this worker, summed
        # what this run's explorer and evaluation tasks raise reaches the learner, which says it in
        # one line (and keeps the traceback in the run's folder): not Dask's log of it, here
        self._quiet = dask_internals.quiet_task_errors(keys.run_task_prefixes(self.run_id))

    def teardown(self, worker):
        if getattr(self, "_quiet", None) is not None:
            dask_internals.loud_task_errors(self._quiet)
            self._quiet = None
        for rollout in self.rollouts.values():
            try:
                rollout.close()
            except Exception:  # noqa: BLE001 - a broken env may not close either
                pass
        self.rollouts.clear()
        if not [p for p in _pools(worker) if p is not self]:
            worker.metrics.pop("tianji", None)

    def stream_lock(self, explorer_id: int) -> threading.Lock:
        """Held while a chunk of that stream runs: its envs step for one task at a time."""
        with self._lock:
            return self._stream_locks.setdefault(explorer_id, threading.Lock())

    def rollout(self, explorer_id: int, generation: int = 0) -> Rollout:
        """The stream's live envs (call with its stream lock held). Their seed is the stream's own,
        new for each ``generation`` (a move to another worker, counted by the learner) and for each
        rebuild within one (broken envs): a worker restarted from nothing never repeats a seed, and
        a run that loses no worker plays the same seeds every time."""
        current = self.rollouts.get(explorer_id)
        if current is not None and current.generation < generation:
            self.drop(explorer_id)  # it moved here again: envs of the new generation
        if explorer_id not in self.rollouts:
            with self._lock:
                rebuild = self.rebuilds.get((explorer_id, generation), 0)
                self.rebuilds[explorer_id, generation] = rebuild + 1
            seed = stream_seed(self.seed, explorer_id, GENERATION_STRIDE * generation + rebuild)
            kwargs = {**self.env_kwargs, **self.explorer_kwargs.get(explorer_id, {})}
            cost = self.step_costs.get(explorer_id)
            clock = StepCostClock(cost, self.num_envs, self.seed, explorer_id) if cost else None
            self.rollouts[explorer_id] = Rollout(self.env_id, self.num_envs, seed, kwargs, step_cost=clock,
                                                 generation=generation)
        return self.rollouts[explorer_id]

    def drop(self, explorer_id: int) -> None:
        """Forget a stream's envs (they may be broken): its next chunk rebuilds them."""
        rollout = self.rollouts.pop(explorer_id, None)
        if rollout is not None:
            try:
                rollout.close()
            except Exception:  # noqa: BLE001 - a broken env may not close either
                pass

    def policy_for(self, weights: dict, policy_version: int, group: int = 0):
        policies = getattr(self._local, "policies", None)
        if policies is None:
            policies = self._local.policies = {}
        entry = policies.get(group)
        if entry is None:
            entry = policies[group] = LoadedPolicy(self.make_policy())
        if policy_version != entry.version:
            entry.policy.set_weights(weights)
            entry = policies[group] = LoadedPolicy(entry.policy, policy_version)
            self._versions[group] = max(self._versions.get(group, -1), policy_version)
        return entry.policy

    def newest_version(self) -> int:
        """The newest policy version any thread of this pool acts with (-1: none yet)."""
        return max(self._versions.values(), default=-1)

    def count(self, env_steps: int) -> None:
        with self._lock:
            self.env_steps += env_steps


