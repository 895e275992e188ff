"""What the replica equivalence test trains: each algorithm case on a replica's own chunks, as a
process of its own joined to the replicas' group (``in_process_group``), or as a thread beside the
other replica's with the gradients averaged in this process (``averaged_in_threads``)."""

from __future__ import annotations

import threading

import gymnasium as gym
import numpy as np
import torch

from tianji_dask.algos import make_algorithm, optim
from tianji_dask.algos.normalize import RunningMeanStd
from tianji_dask.envs.rollout import Rollout

#: name -> (env id, env kwargs, algorithm, config, chunks a replica ingests before each update, updates)
CASES = {
    "ppo": ("CartPole-v1", {}, "ppo", {"hidden": (16, 16), "update_epochs": 2, "num_minibatches": 2,
                                        "segments_per_batch": 2}, 2, 2),
    "impala": ("CartPole-v1", {}, "impala", {"hidden": (16, 16), "segments_per_batch": 2}, 2, 2),
    "dqn": ("CartPole-v1", {}, "dqn", {"hidden": (16, 16), "batch_size": 32, "learning_starts": 1,
                                        "target_update_interval": 2}, 1, 4),
    "sac": ("Pendulum-v1", {"max_episode_steps": 50}, "sac", {"hidden": (16, 16), "batch_size": 32,
                                                              "learning_starts": 1}, 1, 4),
}
#: PPO as one learner on both replicas' batches would train it: one minibatch, no per-minibatch statistics
PPO_WHOLE_BATCH = {"num_minibatches": 1, "norm_adv": False}
CASES["ppo_whole_batch"] = (*CASES["ppo"][:3], {**CASES["ppo"][3], **PPO_WHOLE_BATCH}, *CASES["ppo"][4:])
#: running statistics the policy carries (not trained by gradients): the replicas must pool them
CASES["ppo_normalized"] = (*CASES["ppo"][:3], {**CASES["ppo"][3], "normalize_obs": True, "normalize_reward": True},
                           *CASES["ppo"][4:])


def make(case: str, rank: int = 0, **changes):
    env_id, kwargs, name, config, _, _ = CASES[case]
    env = gym.make(env_id, **kwargs)
    algo = make_algorithm(name, env.observation_space, env.action_space, {**config, **changes}, seed=0)
    if rank:  # as Replicas.attach seeds every replica but the first
        algo.seed_acting([algo.seed, rank])
    return algo


def chunks(case: str, rank: int) -> list[dict]:
    """Replica ``rank``'s chunks: acted by a fresh copy of the initial policy, seeds of its own."""
    env_id, kwargs, _, _, per_update, updates = CASES[case]
    policy = make(case)
    return [Rollout(env_id, 2, 1000 * rank + i, kwargs).run(policy, 16, policy.exploration(0, 0), policy_version=0,
                                                             explorer_id=rank) for i in range(per_update * updates)]


def train(algo, case: str, own: list[dict], per_update: int | None = None) -> dict[str, np.ndarray]:
    """Each of the case's updates made after ingesting its share of ``own`` chunks (``per_update``
    of them: the case's own by default); every floating tensor of the networks after."""
    per_update = per_update or CASES[case][4]
    for u in range(CASES[case][5]):
        for chunk in own[u * per_update:(u + 1) * per_update]:
            algo.ingest(chunk, staleness=0)
        algo.learn()
    # every network's tensors, and the weights explorers get (with the observation statistics)
    return {**algo.model_state(), **{f"published.{k}": v for k, v in algo.get_weights().items()}}


def in_process_group(rank: int, world: int, init_method: str, cases: list[str], out) -> None:
    """One replica's process: join the group, train every case on its own chunks, send the states."""
    from tianji_dask.core.replicas import ReplicaSpec, Replicas

    torch.set_num_threads(1)
    replicas = Replicas(ReplicaSpec(rank, world, init_method, timeout_s=60), torch.device("cpu"))
    # the averaging itself, on gradients known here: replica r's are all r + 1 (a parameter without
    # one counts as zeros); Adam's step barely changes with the gradients' scale, so the weights
    # alone would not tell a sum from a mean
    p, q = torch.zeros(3, requires_grad=True), torch.zeros(2, requires_grad=True)
    p.grad = torch.full((3,), float(rank + 1))
    replicas.average([p, q])
    averaged = (p.grad.tolist(), q.grad.tolist())
    states = {}
    for case in cases:
        algo = make(case)
        replicas.attach(algo)
        states[case] = train(algo, case, chunks(case, rank))
    # and running statistics (attach put the hooks in place): replica r collected r + 1 samples of
    # value 10 r; pooled, every replica folds the statistics of all of them
    stats = RunningMeanStd((2,))
    stats.observe(np.full((rank + 1, 2), 10.0 * rank))
    stats.fold()
    pooled = (stats.mean.tolist(), stats.var.tolist(), stats.count)
    out.put((rank, states, replicas.allreduce_calls - 1, averaged, pooled))
    replicas.close()


class ThreadMean:
    """The replicas' all-reduce, done in one process for two threads: each step's gradients are
    the two threads' mean (how a learner on both minibatches at once would see them)."""

    def __init__(self, world: int = 2):
        self.world = world
        self.barrier = threading.Barrier(world)
        self.grads: dict[int, list[torch.Tensor]] = {}
        self.ranks = threading.local()

    def __call__(self, params) -> None:
        rank = self.ranks.rank
        self.grads[rank] = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        self.barrier.wait()
        mean = [sum(gs) / self.world for gs in zip(*(self.grads[r] for r in range(self.world)))]
        self.barrier.wait()
        for p, g in zip(params, mean):
            p.grad = g.clone()


def averaged_in_threads(case: str, mean: ThreadMean | None = None) -> list[dict[str, np.ndarray]]:
    """Both replicas trained side by side in this process, their gradients averaged by ``mean``
    (a ``ThreadMean``)."""
    mean = mean or ThreadMean()
    results: list = [None, None]
    made = [make(case, rank) for rank in range(2)]
    own = [chunks(case, rank) for rank in range(2)]

    def run(rank):
        mean.ranks.rank = rank
        results[rank] = train(made[rank], case, own[rank])

    optim.set_grad_hook(mean)
    try:
        threads = [threading.Thread(target=run, args=(rank,)) for rank in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        optim.set_grad_hook(None)
    return results
