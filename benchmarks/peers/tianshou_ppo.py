"""Tianshou 2 PPO (discrete actions), as a peer for benchmarks/suite.py. Imported by
run_peer.py only.

Built with Tianshou 2's procedural API: a ``DiscreteActorPolicy`` (actor on a ``Net`` body,
orthogonal initialization as in Tianshou's test) inside the ``PPO`` algorithm, a ``Collector`` over
a ``DummyVectorEnv`` of training envs and a ``VectorReplayBuffer``. The loop is the one
``OnPolicyTrainer`` runs (collect ``step_per_collect`` steps, ``algorithm.update(buffer, batch_size,
repeat)``, reset the buffer keeping its statistics) driven here so that each training episode is
recorded when it ends (a collector step hook sums each env's rewards) and the run stops on solve or
time. No test episodes are collected: time-to-solve is on training episodes.

Settings by env (``CONFIGS``):

- CartPole-v1: Tianshou's own CartPole PPO test (``test/discrete/test_ppo.py``): 20 envs, 2,000
  steps a collect, 10 repeats of minibatches of 64, lr 3e-4, one 64-64 ReLU body shared by actor
  and critic.
- LunarLander-v3: Tianshou publishes no LunarLander PPO settings (its LunarLander example,
  ``examples/box2d/lunarlander_dqn.py``, is DQN), so the settings of our
  ``pipelines/lunarlander_ppo.yaml`` (RL-Zoo's LunarLander PPO, one update a 4,096-step batch):
  16 envs x 256 steps, 4 epochs of minibatches of 64, lr 3e-4, gamma 0.999, GAE lambda 0.98,
  entropy 0.01, value 0.5, clip 0.2, gradient norm 0.5, advantage normalization, no value clipping,
  and separate 64-64 tanh networks for actor and critic, as our pipeline.
"""

from __future__ import annotations

import time

# test/discrete/test_ppo.py's argument defaults (CartPole); buffer 20000 as there (only 2000 are used)
CONFIG = {"training_num": 20, "buffer_size": 20000, "lr": 3e-4, "gamma": 0.99, "step_per_collect": 2000,
          "repeat_per_collect": 10, "batch_size": 64, "hidden_sizes": [64, 64], "vf_coef": 0.5, "ent_coef": 0.0,
          "eps_clip": 0.2, "max_grad_norm": 0.5, "gae_lambda": 0.95, "return_scaling": False,
          "advantage_normalization": False, "recompute_advantage": False, "dual_clip": None, "value_clip": False,
          "shared_body": True, "orthogonal_init": True, "activation": "relu"}
CONFIGS = {
    "CartPole-v1": CONFIG,
    "LunarLander-v3": {**CONFIG, "training_num": 16, "buffer_size": 4096, "step_per_collect": 4096,
                       "repeat_per_collect": 4, "batch_size": 64, "lr": 3e-4, "gamma": 0.999, "gae_lambda": 0.98,
                       "ent_coef": 0.01, "advantage_normalization": True, "shared_body": False, "activation": "tanh",
                       "source": "pipelines/lunarlander_ppo.yaml (Tianshou has none)"},
}


def run(env_id: str, seed: int, record: dict, stop) -> None:
    """Train the PPO of ``CONFIGS[env_id]`` until ``stop(episodes)`` names a reason
    (tasks.stop_rule); ``record["episodes"]`` gets each as (end time, return, length)."""
    import torch
    from tianshou.algorithm import PPO
    from tianshou.algorithm.modelfree.reinforce import DiscreteActorPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.utils.net.common import ActorCritic, Net
    from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic
    from tianshou.utils.torch_utils import policy_within_training_step

    from tianshou_envs import recording_collector, seeded_envs

    c = CONFIGS[env_id]
    n = c["training_num"]
    env, train_envs = seeded_envs(env_id, n, seed)
    activation = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh}[c["activation"]]

    def body():
        return Net(state_shape=env.observation_space.shape, hidden_sizes=c["hidden_sizes"], activation=activation)

    net = body()
    actor = DiscreteActor(preprocess_net=net, action_shape=env.action_space.n, softmax_output=False)
    critic = DiscreteCritic(preprocess_net=net if c["shared_body"] else body())
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
    collector = recording_collector(algorithm, train_envs, n, c["buffer_size"], episodes)
    record.update(t_built=time.time(), config=dict(c))

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
