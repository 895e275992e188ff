"""Tianshou 2 DQN (discrete actions) with the settings of Tianshou's own examples, as a peer for
benchmarks/suite.py. Imported by run_peer.py only.

Built with Tianshou 2's procedural API, as its examples build it: a ``Net`` Q-network inside a
``DiscreteQLearningPolicy`` (epsilon-greedy), the ``DQN`` algorithm (double Q, Tianshou's default;
a hard target copy every ``target_update_freq`` gradient steps; n-step returns), a ``Collector`` with
exploration noise over a ``DummyVectorEnv`` of training envs and a ``VectorReplayBuffer``. The loop
is the one ``OffPolicyTrainer`` runs, step by step: set the training epsilon (the examples'
``train_fn``), collect ``step_per_collect`` env steps, then ``round(update_per_step * steps
collected)`` gradient steps of ``algorithm.update(buffer, sample_size=batch_size)``; both inside
``policy_within_training_step``, as the trainer does. It is driven here so that each training
episode is recorded when it ends (a collector step hook sums each env's rewards) and the run stops
on solve or time. No test episodes are collected: time-to-solve is on training episodes.

Settings by env (``CONFIGS``):

- CartPole-v1: Tianshou's ``examples/discrete/discrete_dqn.py``, the version written for Tianshou
  2's API (``tianshou.algorithm.DQN``, ``OffPolicyTrainerParams``): 10 envs, lr 1e-3, batch 64,
  gamma 0.9, 3-step returns, target copy every 320 updates, buffer 20,000, epsilon 0.1 throughout,
  10 env steps a collect and 0.1 updates an env step (one update a collect), a 128-128-128 ReLU
  Q-network. Tianshou's unit test ``test/discrete/test_dqn.py`` (as found, in versions for its
  older API) shares lr, gamma, n-step, target, buffer and batch but has four hidden layers, a
  warm-up collect and epsilon annealed from 0.1 to 0.01; the example's settings are used here.
- LunarLander-v3: Tianshou's ``examples/box2d/lunarlander_dqn.py`` ("the parameters are found by
  Optuna"; its numbers, read from a version written for Tianshou's older API, put in Tianshou 2's
  terms): 16 envs, lr 0.013, batch 128, gamma 0.99, 4-step returns, target copy every 500 updates,
  buffer 100,000, 16 env steps a collect and 0.0625 updates an env step (one update a collect), a
  dueling network (a 128-128 body, 128-128 Q and V streams), epsilon 0.73 decaying by a factor
  (1 - 5e-6) an env step down to 0.01, and a warm-up collect of batch x envs (2,048) steps before
  training, as the example does.
"""

from __future__ import annotations

import time

CONFIGS = {
    "CartPole-v1": {
        "source": "tianshou examples/discrete/discrete_dqn.py",
        "training_num": 10, "buffer_size": 20000, "lr": 1e-3, "gamma": 0.9, "n_step": 3, "target_update_freq": 320,
        "batch_size": 64, "step_per_collect": 10, "update_per_step": 0.1, "hidden_sizes": [128, 128, 128],
        "dueling": None, "eps_train": 0.1, "eps_decay": None, "eps_final": None, "warmup_steps": 0,
    },
    "LunarLander-v3": {
        "source": "tianshou examples/box2d/lunarlander_dqn.py",
        "training_num": 16, "buffer_size": 100000, "lr": 0.013, "gamma": 0.99, "n_step": 4, "target_update_freq": 500,
        "batch_size": 128, "step_per_collect": 16, "update_per_step": 0.0625, "hidden_sizes": [128, 128],
        "dueling": {"q_hidden_sizes": [128, 128], "v_hidden_sizes": [128, 128]},
        # train_fn: eps = max(eps_train * (1 - eps_decay) ** env_step, eps_test), eps_test 0.01
        "eps_train": 0.73, "eps_decay": 5e-6, "eps_final": 0.01, "warmup_steps": 128 * 16,
    },
}


def epsilon(c: dict, env_step: int) -> float:
    """The example's training epsilon after ``env_step`` env steps."""
    if c["eps_decay"] is None:
        return c["eps_train"]
    return max(c["eps_train"] * (1 - c["eps_decay"]) ** env_step, c["eps_final"])


def run(env_id: str, seed: int, record: dict, stop) -> None:
    """Train the DQN of ``CONFIGS[env_id]`` until ``stop(episodes)`` names a reason
    (tasks.stop_rule); ``record["episodes"]`` gets each as (end time, return, length)."""
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.utils.net.common import Net
    from tianshou.utils.torch_utils import policy_within_training_step

    from tianshou_envs import recording_collector, seeded_envs

    c = CONFIGS[env_id]
    n = c["training_num"]
    env, train_envs = seeded_envs(env_id, n, seed)
    dueling = None
    if c["dueling"]:
        dueling = ({"hidden_sizes": c["dueling"]["q_hidden_sizes"]}, {"hidden_sizes": c["dueling"]["v_hidden_sizes"]})
    net = Net(state_shape=env.observation_space.shape, action_shape=env.action_space.n,
              hidden_sizes=c["hidden_sizes"], dueling_param=dueling)
    policy = DiscreteQLearningPolicy(model=net, action_space=env.action_space, eps_training=epsilon(c, 0),
                                     eps_inference=0.0)
    algorithm = DQN(policy=policy, optim=AdamOptimizerFactory(lr=c["lr"]), gamma=c["gamma"],
                    n_step_return_horizon=c["n_step"], target_update_freq=c["target_update_freq"])
    episodes = record["episodes"]
    collector = recording_collector(algorithm, train_envs, n, c["buffer_size"], episodes, exploration_noise=True)
    record.update(t_built=time.time(), config=dict(c))

    env_steps = 0
    if c["warmup_steps"]:  # the example's first collect, before the trainer starts (no updates)
        with policy_within_training_step(algorithm.policy):
            env_steps += int(collector.collect(n_step=c["warmup_steps"]).n_collected_steps)
    updates = 0
    while True:
        with policy_within_training_step(algorithm.policy):
            # the trainer's env_step counts from its own start, after the warm-up collect
            policy.set_eps_training(epsilon(c, env_steps - c["warmup_steps"]))
            stats = collector.collect(n_step=c["step_per_collect"])
            collected = int(stats.n_collected_steps)
            env_steps += collected
            record["stop_reason"] = stop(episodes)
            if record["stop_reason"] is not None:
                break
            for _ in range(round(c["update_per_step"] * collected)):
                algorithm.update(buffer=collector.buffer, sample_size=c["batch_size"])
                updates += 1
    record["env_steps"] = env_steps
    record["updates"] = updates
    train_envs.close()
    env.close()
