"""TorchRL PPO after its ``sota-implementations/ppo/ppo_mujoco.py``, as a peer for
benchmarks/suite.py. Imported by run_peer.py only, in TorchRL's own venv
(``benchmarks/peers/setup torchrl``).

The script's pieces, as it puts them together: a ``Collector`` over a ``TransformedEnv`` (a
gymnasium env, observations normalized by ``VecNorm`` (decay 0.99999, eps 1e-2) and clipped to
[-10, 10], ``RewardSum``, ``StepCounter``, ``DoubleToFloat`` where observations are float64), a
``ProbabilisticActor`` and a ``ValueOperator`` on separate 64-64 tanh MLPs (orthogonal
initialization, gains 1 and 0.01), ``GAE`` (not averaged), ``ClipPPOLoss`` with normalized
advantages, one Adam (eps 1e-5) each for actor and critic, both learning rates (and the clip when
annealed) decreasing linearly over the config's total frames, and per batch ``ppo_epochs`` passes,
each recomputing GAE and drawing minibatches without replacement from a ``LazyTensorStorage``. The
script's test episodes (deterministic, on a separate env) are left out: time-to-solve is on training
episodes. Settings by task (``CONFIGS``), ``config_mujoco.yaml``'s (the PPO paper's MuJoCo settings:
1 env, 2048 frames a batch, 10 epochs of minibatches of 64, lr 3e-4 annealed over 1M frames, gamma
0.99, GAE 0.95, clip 0.2, critic coefficient 0.25, entropy 0, L2 critic loss, no gradient clipping):

- hopper_ppo ("tuned"): ``config_mujoco.yaml`` with ``env_name: Hopper-v5`` (its default is
  HalfCheetah-v4): the policy a ``TanhNormal`` with a state-independent scale, as the script.
- cartpole_ppo and lunarlander_ppo ("adapted"): TorchRL's sota PPO for discrete actions is the Atari
  one (``ppo_atari.py``: CNN, frame stacks, sign-clipped rewards, 8 envs); for these low-dimensional
  envs the MuJoCo script and config instead, its policy head a ``Categorical`` over the MLP's
  logits (as ``utils_atari.py`` builds it for discrete action specs).

Episodes: a wrapper innermost around the gymnasium env (in this process: the collector steps it
here) records every finished episode's raw return, length and end time as it ends; the stop rule is
checked after each collected batch.
"""

from __future__ import annotations

import time

import episode_log

CONFIG_MUJOCO = {"frames_per_batch": 2048, "total_frames": 1_000_000, "lr": 3e-4, "eps": 1e-5, "anneal_lr": True,
                 "gamma": 0.99, "mini_batch_size": 64, "ppo_epochs": 10, "gae_lambda": 0.95, "clip_epsilon": 0.2,
                 "anneal_clip_epsilon": False, "critic_coeff": 0.25, "entropy_coeff": 0.0, "loss_critic_type": "l2",
                 "normalize_observation": True, "num_cells": [64, 64]}
CONFIGS = {
    "hopper_ppo": {**CONFIG_MUJOCO, "source": "sota-implementations/ppo config_mujoco.yaml and ppo_mujoco.py, "
                                                "env_name Hopper-v5"},
    "cartpole_ppo": {**CONFIG_MUJOCO, "source": "sota-implementations/ppo config_mujoco.yaml and ppo_mujoco.py "
                                                  "(TorchRL's MuJoCo PPO), a Categorical policy head for discrete actions"},
    "lunarlander_ppo": {**CONFIG_MUJOCO, "source": "sota-implementations/ppo config_mujoco.yaml and ppo_mujoco.py "
                                                     "(TorchRL's MuJoCo PPO), a Categorical policy head for discrete "
                                                     "actions"},
}


def run(task: str, env_id: str, seed: int, record: dict, stop) -> None:
    """Train until ``stop(episodes)`` names a reason (tasks.stop_rule); episodes go to
    ``record["episodes"]`` as (end time, return, length)."""
    import gymnasium as gym
    import torch
    from tensordict.nn import AddStateIndependentNormalScale, TensorDictModule
    from torchrl.collectors import Collector
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
    from torchrl.envs import (ClipTransform, DoubleToFloat, ExplorationType, GymWrapper, RewardSum, StepCounter,
                              TransformedEnv, VecNorm)
    from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
    from torchrl.objectives import ClipPPOLoss, group_optimizers
    from torchrl.objectives.value.advantages import GAE

    c = CONFIGS[task]
    torch.manual_seed(seed)
    episodes = record["episodes"]

    EpisodeLog = episode_log.recording(gym, lambda ret, length: episodes.append((time.time(), ret, length)))

    discrete = isinstance(gym.make(env_id).action_space, gym.spaces.Discrete)

    def make_env(log: bool):
        base = gym.make(env_id)
        env = TransformedEnv(GymWrapper(EpisodeLog(base) if log else base, device="cpu",
                                        categorical_action_encoding=discrete))
        if c["normalize_observation"]:
            env.append_transform(VecNorm(in_keys=["observation"], decay=0.99999, eps=1e-2))
            env.append_transform(ClipTransform(in_keys=["observation"], low=-10, high=10))
        env.append_transform(RewardSum())
        env.append_transform(StepCounter())
        if env.observation_spec["observation"].dtype is torch.float64:
            env.append_transform(DoubleToFloat(in_keys=["observation"]))
        return env

    # the models, on a proof env as make_ppo_models does
    proof = make_env(log=False)
    n_obs = proof.observation_spec["observation"].shape[-1]
    action_spec = proof.action_spec_unbatched
    if discrete:
        policy_mlp = MLP(in_features=n_obs, activation_class=torch.nn.Tanh, out_features=action_spec.space.n,
                         num_cells=c["num_cells"])
        out_keys, dist_class, dist_kwargs = ["logits"], torch.distributions.Categorical, {}
    else:
        policy_mlp = MLP(in_features=n_obs, activation_class=torch.nn.Tanh, out_features=action_spec.shape[-1],
                         num_cells=c["num_cells"])
        out_keys, dist_class = ["loc", "scale"], TanhNormal
        dist_kwargs = {"low": action_spec.space.low, "high": action_spec.space.high, "tanh_loc": False}
    for layer in policy_mlp.modules():
        if isinstance(layer, torch.nn.Linear):
            torch.nn.init.orthogonal_(layer.weight, 1.0)
            layer.bias.data.zero_()
    if not discrete:
        policy_mlp = torch.nn.Sequential(policy_mlp, AddStateIndependentNormalScale(action_spec.shape[-1],
                                                                                    scale_lb=1e-8))
    actor = ProbabilisticActor(TensorDictModule(policy_mlp, in_keys=["observation"], out_keys=out_keys),
                               in_keys=out_keys, spec=proof.full_action_spec_unbatched,
                               distribution_class=dist_class, distribution_kwargs=dist_kwargs, return_log_prob=True,
                               default_interaction_type=ExplorationType.RANDOM)
    value_mlp = MLP(in_features=n_obs, activation_class=torch.nn.Tanh, out_features=1, num_cells=c["num_cells"])
    for layer in value_mlp.modules():
        if isinstance(layer, torch.nn.Linear):
            torch.nn.init.orthogonal_(layer.weight, 0.01)
            layer.bias.data.zero_()
    critic = ValueOperator(value_mlp, in_keys=["observation"])
    proof.close()

    train_env = make_env(log=True)
    train_env.set_seed(seed)
    collector = Collector(create_env_fn=train_env, policy=actor, frames_per_batch=c["frames_per_batch"],
                          total_frames=-1, device="cpu", max_frames_per_traj=-1)
    buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(c["frames_per_batch"]),
                                    sampler=SamplerWithoutReplacement(), batch_size=c["mini_batch_size"])
    adv_module = GAE(gamma=c["gamma"], lmbda=c["gae_lambda"], value_network=critic, average_gae=False)
    loss_module = ClipPPOLoss(actor_network=actor, critic_network=critic, clip_epsilon=c["clip_epsilon"],
                              loss_critic_type=c["loss_critic_type"], entropy_coeff=c["entropy_coeff"],
                              critic_coeff=c["critic_coeff"], normalize_advantage=True)
    optim = group_optimizers(torch.optim.Adam(actor.parameters(), lr=c["lr"], eps=c["eps"]),
                             torch.optim.Adam(critic.parameters(), lr=c["lr"], eps=c["eps"]))
    num_mini_batches = c["frames_per_batch"] // c["mini_batch_size"]
    total_updates = (c["total_frames"] // c["frames_per_batch"]) * c["ppo_epochs"] * num_mini_batches
    record.update(t_built=time.time(), config={k: v for k, v in c.items()})
    record["config"]["policy"] = "Categorical" if discrete else "TanhNormal"

    updates = 0
    frames = 0
    try:
        for data in collector:
            frames += data.numel()
            record["env_steps"] = frames
            record["stop_reason"] = stop(episodes)
            if record["stop_reason"] is not None:
                break
            for _ in range(c["ppo_epochs"]):
                with torch.no_grad():
                    data = adv_module(data)
                buffer.extend(data.reshape(-1))
                for batch in buffer:
                    alpha = max(0.0, 1.0 - updates / total_updates) if c["anneal_lr"] else 1.0
                    for group in optim.param_groups:
                        group["lr"] = c["lr"] * alpha
                    if c["anneal_clip_epsilon"]:
                        loss_module.clip_epsilon.copy_(c["clip_epsilon"] * alpha)
                    updates += 1
                    optim.zero_grad(set_to_none=True)
                    loss = loss_module(batch)
                    (loss["loss_critic"] + loss["loss_objective"] + loss["loss_entropy"]).backward()
                    optim.step()
            collector.update_policy_weights_()
    finally:
        collector.shutdown()
