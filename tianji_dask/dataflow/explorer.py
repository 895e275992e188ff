"""Explorer side: a per-worker pool of live environments and the ``explore_chunk`` task.

The pool (a WorkerPlugin) keeps one vector env per explorer stream, so episodes continue across
chunks, and one policy object per learner group, loaded only when a new weights version of that
group arrives. The task itself is
short and idempotent: if its worker dies, Dask reruns it elsewhere and that stream's episode
restarts there.
"""

from __future__ import annotations

import time

from distributed import WorkerPlugin, get_worker
from distributed.metrics import context_meter

from tianji_dask.dataflow.direct import send_chunk
from tianji_dask.dataflow.keycache import bound_key_cache
from tianji_dask.rollout import Rollout

POOL_NAME = "tianji-envs"


class EnvPool(WorkerPlugin):
    """Holds the run's environments and policy on each worker.

    ``make_policy`` is a picklable zero-argument callable returning an object with ``act`` and
    ``set_weights`` (the algorithm, built on the explorer side only for inference).
    """

    name = POOL_NAME

    def __init__(self, run_id: str, env_id: str, num_envs: int, env_kwargs: dict, make_policy, seed: int,
                 explorer_kwargs: dict | None = None):
        self.run_id = run_id
        self.env_id = env_id
        self.num_envs = num_envs
        self.env_kwargs = env_kwargs
        self.explorer_kwargs = explorer_kwargs or {}  # per stream, merged over env_kwargs
        self.make_policy = make_policy
        self.seed = seed
        self.rollouts: dict[int, Rollout] = {}
        self.policies: dict[int, list] = {}  # group -> [policy, version]: groups' versions are independent
        self.env_steps = 0
        self.rebuilds = 0

    def setup(self, worker):
        import torch

        torch.set_num_threads(1)  # explorers do small-batch inference; threads only contend
        worker.metrics["tianji"] = lambda w: {
            "env_steps": self.env_steps,
            "policy_version": max((v for _, v in self.policies.values()), default=-1),
            "streams": len(self.rollouts),
        }

    def teardown(self, worker):
        for rollout in self.rollouts.values():
            rollout.close()
        self.rollouts.clear()
        worker.metrics.pop("tianji", None)

    def rollout(self, explorer_id: int) -> Rollout:
        if explorer_id not in self.rollouts:
            # a stream rebuilt on another worker gets fresh seeds, not a replay of the old episodes
            seed = self.seed * 100_003 + explorer_id * 1009 + self.rebuilds
            self.rebuilds += 1
            kwargs = {**self.env_kwargs, **self.explorer_kwargs.get(explorer_id, {})}
            self.rollouts[explorer_id] = Rollout(self.env_id, self.num_envs, seed, kwargs)
        return self.rollouts[explorer_id]

    def policy_for(self, weights: dict, policy_version: int, group: int = 0):
        entry = self.policies.get(group)
        if entry is None:
            entry = self.policies[group] = [self.make_policy(), -1]
        if policy_version != entry[1]:
            entry[0].set_weights(weights)
            entry[1] = policy_version
        return entry[0]


def explore_chunk(run_id: str, weights: dict, policy_version: int, explorer_id: int, n_steps: int, explore: dict,
                  group: int = 0, direct: tuple | None = None) -> dict:
    """Step explorer ``explorer_id``'s envs ``n_steps`` times with group ``group``'s policy
    ``policy_version``. With ``direct`` = (*sink address, min_bytes), a chunk of at least
    min_bytes goes straight to the learner's sink and the task returns its stub (see direct.py)."""
    worker = get_worker()
    pool: EnvPool = worker.plugins[POOL_NAME]
    if pool.run_id != run_id:
        raise RuntimeError(f"explorer pool belongs to run {pool.run_id}, task to run {run_id}")
    with context_meter.meter("policy-load"):
        policy = pool.policy_for(weights, policy_version, group)
    rollout = pool.rollout(explorer_id)
    t0 = time.perf_counter()
    with context_meter.meter("env-step"):
        try:
            chunk = rollout.run(policy, n_steps, explore, policy_version=policy_version, explorer_id=explorer_id)
        except Exception as err:
            # the stream's envs may be broken: the next chunk rebuilds them (fresh episodes)
            pool.rollouts.pop(explorer_id, None)
            rollout.close()
            raise RuntimeError(f"explorer {explorer_id}, env {pool.env_id}: {type(err).__name__}: {err}") from err
    chunk["explore_s"] = time.perf_counter() - t0
    pool.env_steps += chunk["env_steps"]
    context_meter.digest_metric("env-steps", chunk["env_steps"], "count")
    bound_key_cache()  # every chunk's key passes through this worker's key-name cache
    if direct is not None and chunk["nbytes"] >= direct[-1]:
        with context_meter.meter("direct-send"):
            return send_chunk(direct[:-1], worker.get_current_task(), chunk)
    return chunk
