"""Tianshou 2 PPO (discrete actions) with the settings of Tianshou's own CartPole PPO test
(``test/discrete/test_ppo.py``), as a peer for benchmarks/vs_peers.py. Imported by run_peer.py only.

Built with Tianshou 2's procedural API: a ``DiscreteActorPolicy`` (actor on a shared 64-64 ``Net``
body, orthogonal initialization as in the test) inside the ``PPO`` algorithm, a ``Collector`` over
a ``DummyVectorEnv`` of 20 training envs and a ``VectorReplayBuffer``. The loop is the one
``OnPolicyTrainer`` runs (collect 2000 steps, ``algorithm.update(buffer, batch_size, repeat)``,
reset the buffer keeping its statistics) driven here so that each training episode is recorded
when it ends (a collector step hook sums each env's rewards) and the run stops on solve or time.
No test episodes are collected: time-to-solve is on training episodes.
"""

from __future__ import annotations

import time

import numpy as np

# test/discrete/test_ppo.py's argument defaults (CartPole); buffer 20000 as there (only 2000 are used)
CONFIG = {"training_num": 20, "buffer_size": 20000, "lr": 3e-4, "gamma": 0.99, "step_per_collect": 2000,
          "repeat_per_collect": 10, "batch_size": 64, "hidden_sizes": [64, 64], "vf_coef": 0.5, "ent_coef": 0.0,
          "eps_clip": 0.2, "max_grad_norm": 0.5, "gae_lambda": 0.95, "return_scaling": False,
          "advantage_normalization": False, "recompute_advantage": False, "dual_clip": None, "value_clip": False,
          "shared_body": True, "orthogonal_init": True}


def run(env_id: str, seed: int, record: dict, stop) -> None:
    """Train until ``stop(episodes)`` names a reason (run_peer.stop_rule); episodes go to
    ``record["episodes"]`` as (end time, return)."""
    import gymnasium as gym
    import torch

    from tianshou.algorithm import PPO
    from tianshou.algorithm.modelfree.reinforce import DiscreteActorPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv
    from tianshou.utils.net.common import ActorCritic, Net
    from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic

    c = CONFIG
    np.random.seed(seed)
    torch.manual_seed(seed)
    env = gym.make(env_id)
    n = c["training_num"]
    train_envs = DummyVectorEnv([lambda: gym.make(env_id) for _ in range(n)])
    train_envs.seed(seed)

    net = Net(state_shape=env.observation_space.shape, hidden_sizes=c["hidden_sizes"])
    actor = DiscreteActor(preprocess_net=net, action_shape=env.action_space.n, softmax_output=False)
    critic = DiscreteCritic(preprocess_net=net)
    for m in ActorCritic(actor, critic).modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.orthogonal_(m.weight)
            torch.nn.init.zeros_(m.bias)
    policy = DiscreteActorPolicy(actor=actor, action_space=env.action_space, deterministic_eval=True)
    algorithm = PPO(policy=policy, critic=critic, optim=AdamOptimizerFactory(lr=c["lr"]), gamma=c["gamma"],
                    max_grad_norm=c["max_grad_norm"], eps_clip=c["eps_clip"], vf_coef=c["vf_coef"],
                    ent_coef=c["ent_coef"], gae_lambda=c["gae_lambda"], return_scaling=c["return_scaling"],
                    dual_clip=c["dual_clip"], value_clip=c["value_clip"],
                    advantage_normalization=c["advantage_normalization"],
                    recompute_advantage=c["recompute_advantage"])

    episodes = record["episodes"]
    ep_ret = np.zeros(n)

    def on_step(action_batch, rollout_batch) -> None:
        # DummyVectorEnv without wait_num: every env steps every time, in env order
        rew = np.asarray(rollout_batch.rew, dtype=float)
        assert len(rew) == n, len(rew)
        ep_ret[:] += rew
        done = np.asarray(rollout_batch.done, dtype=bool)
        if done.any():
            now = time.time()
            for i in np.flatnonzero(done):
                episodes.append((now, float(ep_ret[i])))
                ep_ret[i] = 0.0

    collector = Collector(algorithm, train_envs, VectorReplayBuffer(c["buffer_size"], n), on_step_hook=on_step)
    collector.reset()
    record.update(t_built=time.time(), config=dict(c))

    from tianshou.utils.torch_utils import policy_within_training_step

    env_steps = 0
    while True:
        with policy_within_training_step(algorithm.policy):
            stats = collector.collect(n_step=c["step_per_collect"])
            env_steps += int(stats.n_collected_steps)
            record["stop_reason"] = stop(episodes)
            if record["stop_reason"] is not None:
                break
            algorithm.update(buffer=collector.buffer, batch_size=c["batch_size"], repeat=c["repeat_per_collect"])
            collector.reset_buffer(keep_statistics=True)
    record["env_steps"] = env_steps
    train_envs.close()
    env.close()
