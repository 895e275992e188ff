"""Stable-Baselines3 (and sb3-contrib) as a peer: RL-Zoo's settings for a task where the zoo has
them, our pipeline's where a comparison asks for them ("sb3-same", MinAtar Breakout), and SB3's
MultiInputPolicy / sb3-contrib's MaskablePPO for Dict observations and action masks. Imported by
run_peer.py only (and sb3_updates.py, for the MinAtar network), in the peers' venv.

Episode returns come from ``Monitor`` episode infos, read by a callback at every step, which also
stops the run by the project's rule (``tasks.stop_rule``).
"""

from __future__ import annotations

import time

from tasks import TASKS, register_env_ids, stop_rule

# Stable-Baselines3 with RL-Zoo hyperparameters (hyperparams/ppo.yml and dqn.yml; LunarLander-v3
# uses the zoo's LunarLander entries). The zoo's schedules (linear learning rate and clip range,
# DQN's exploration fraction) are defined over its n_timesteps; here they follow the zoo over those
# n_timesteps and then hold their final value, so a run can go on until it solves or its time runs
# out without stretching the tuned schedule.

SB3_ZOO = {
    "cartpole_ppo": dict(n_timesteps=1e5, n_envs=8, kwargs=dict(
        n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0),
        lin={"learning_rate": 0.001, "clip_range": 0.2}),
    "cartpole_dqn": dict(n_timesteps=5e4, n_envs=1, kwargs=dict(
        learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
        target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
        exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]))),
    "lunarlander_ppo": dict(n_timesteps=1e6, n_envs=16, kwargs=dict(
        n_steps=1024, batch_size=64, gae_lambda=0.98, gamma=0.999, n_epochs=4, ent_coef=0.01)),
    "lunarlander_dqn": dict(n_timesteps=1e5, n_envs=1, kwargs=dict(
        learning_rate=6.3e-4, batch_size=128, buffer_size=50_000, learning_starts=0, gamma=0.99,
        target_update_interval=250, train_freq=4, gradient_steps=-1, exploration_fraction=0.12,
        exploration_final_eps=0.1, policy_kwargs=dict(net_arch=[256, 256]))),
    "pendulum_sac": dict(n_timesteps=2e4, n_envs=1, kwargs=dict(learning_rate=1e-3)),
    "halfcheetah_sac": dict(n_timesteps=1e6, n_envs=1, kwargs=dict(learning_starts=10_000)),
    "hopper_ppo": dict(n_timesteps=1e6, n_envs=1, normalize=True, kwargs=dict(
        batch_size=32, n_steps=512, gamma=0.999, learning_rate=9.80828e-05, ent_coef=0.00229519, clip_range=0.2,
        n_epochs=5, gae_lambda=0.99, max_grad_norm=0.7, vf_coef=0.835671,
        policy_kwargs=dict(log_std_init=-2, ortho_init=False, activation_fn="relu", net_arch=dict(pi=[256, 256], vf=[256, 256])))),
    # sb3-contrib's RecurrentPPO, RL-Zoo hyperparams/ppo_lstm.yml CartPoleNoVel-v1 (the zoo's env is
    # CartPole-v1 observing cart position and pole angle only, as ours)
    "cartpole_novel_ppo_lstm": dict(n_timesteps=1e5, n_envs=8, normalize=True, norm_reward=False, kwargs=dict(
        n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
        policy_kwargs=dict(ortho_init=False, activation_fn="relu", lstm_hidden_size=64, enable_critic_lstm=True,
                           net_arch=dict(pi=[64], vf=[64]))),
        lin={"learning_rate": 0.001, "clip_range": 0.2}),
}
# Dict observations and action masks: SB3's MultiInputPolicy (its CombinedExtractor: MiniGrid's
# grid, whose codes' bounds are not 0-255, flattened; the direction one-hot) with RL Zoo's
# hyperparams/ppo.yml MiniGrid-DoorKey-5x5-v0 entry (after rl-starter-files) without its
# VecNormalize: the zoo normalizes the vector of its FlatObsWrapper; applied to this Dict's grid
# (and the rewards) SB3 never reached the goal (5 seeds of 600 s, and 60k steps by hand against
# 0.96 without it); sb3-contrib's
# MaskablePPO with its defaults (PettingZoo's SB3 action-mask tutorial uses them) on 8 envs, the
# policy fed the board and the mask, the env's action_masks() masking its logits.
SB3_SPACES = {
    "minigrid_doorkey_ppo": dict(n_timesteps=1e5, n_envs=8,
                                 env_kwargs={"base": "MiniGrid-DoorKey-5x5-v0"}, policy="MultiInputPolicy", kwargs=dict(
        n_steps=128, batch_size=64, gae_lambda=0.95, gamma=0.99, n_epochs=10, ent_coef=0.0, learning_rate=2.5e-4,
        clip_range=0.2)),
    "tictactoe_masked_ppo": dict(n_timesteps=1e6, n_envs=8, policy="MultiInputPolicy", kwargs=dict(n_steps=256)),
}
SB3_MAX_STEPS = 50_000_000  # the learn() horizon; runs stop on solve or time long before

# "sb3-same": SB3 with our pipeline's network, batch and update ratio where the zoo's differ.
# Pendulum SAC: pendulum_sac.yaml's 64-64 networks, batch 128, warm-up 1000, buffer 100k and one
# update per env step (one env, train_freq 1, gradient_steps 1); SB3 has one learning rate for
# actor, critic and temperature, so the critic's 1e-3 (also the zoo's). What stays SB3's own: the
# actor steps every update (ours every other, twice), and the env count (ours 2 explorers x 4).
SB3_SAME = {
    "pendulum_sac": dict(n_timesteps=2e4, n_envs=1, kwargs=dict(
        learning_rate=1e-3, batch_size=128, learning_starts=1000, buffer_size=100_000, train_freq=1, gradient_steps=1,
        policy_kwargs=dict(net_arch=[64, 64]))),
}

# MinAtar Breakout is not in RL-Zoo: the settings of our pipelines minatar_breakout_dqn and
# minatar_breakout_ppo (the MinAtar paper's, Young & Tian 2019, arXiv:1903.03176, as those use
# them), with the paper's network (``sb3_minatar_extractor``) as the features extractor and no
# further hidden layers (net_arch=[]): the 128 units feed the Q head, or the policy and value heads.
# DQN: replay 100k, warm-up 5k, epsilon 1 -> 0.01 linearly over the first 100k env steps (n_timesteps
# below, as the zoo's exploration_fraction is scaled), target copy every 1000 env steps, Adam at
# 2.5e-4, 3-step returns, Huber loss (SB3's), gradient norm 10. One env, and one update of 64 per
# 4 env steps (train_freq 4, batch 64) as our pipeline does, rather than the paper's 32 every step:
# the same replayed transitions per env step (16) as our pipeline, so a comparison measures the
# systems rather than a difference in update work (the paper's ratio is twice that).
# SB3's DQN has no double-Q (our pipeline uses it). PPO: 16 envs x 128 steps, 4 epochs of 8
# minibatches (256), clip 0.2, lr 5e-4, entropy 0.01, GAE 0.99/0.95, value 0.5, gradient norm 0.5,
# no value clipping, and actor and critic each with their own network (share_features_extractor=False),
# as in our pipeline.
SB3_MINATAR = {
    "minatar_breakout_dqn": dict(n_timesteps=100_000, n_envs=1, kwargs=dict(
        learning_rate=2.5e-4, batch_size=64, buffer_size=100_000, learning_starts=5000, gamma=0.99,
        target_update_interval=1000, train_freq=4, gradient_steps=1, n_steps=3, exploration_fraction=1.0,
        exploration_initial_eps=1.0, exploration_final_eps=0.01, max_grad_norm=10)),
    "minatar_breakout_ppo": dict(n_timesteps=10_000_000, n_envs=16, kwargs=dict(
        n_steps=128, batch_size=256, n_epochs=4, learning_rate=5e-4, clip_range=0.2, ent_coef=0.01,
        gamma=0.99, gae_lambda=0.95, vf_coef=0.5, max_grad_norm=0.5)),
}
MINATAR_NETWORK = "MinAtar paper: Conv2d(C->16, 3x3, stride 1) + ReLU, flatten, Linear(->128) + ReLU"


def sb3_minatar_extractor():
    """The MinAtar paper's network as an SB3 ``BaseFeaturesExtractor``: observations (B, 10, 10, C)
    bool, arriving as float, are moved channels first; one 3x3 convolution of 16 channels, stride
    1, ReLU, flatten, 128 ReLU units. SB3's CnnPolicy (NatureCNN) rejects 10x10 images."""
    import gymnasium as gym
    import torch
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
    from torch import nn

    class MinAtarCNN(BaseFeaturesExtractor):
        def __init__(self, observation_space: gym.spaces.Box, features_dim: int = 128):
            super().__init__(observation_space, features_dim)
            h, w, c = observation_space.shape
            self.conv = nn.Sequential(nn.Conv2d(c, 16, kernel_size=3, stride=1), nn.ReLU(), nn.Flatten())
            self.linear = nn.Sequential(nn.Linear(16 * (h - 2) * (w - 2), features_dim), nn.ReLU())

        def forward(self, observations: torch.Tensor) -> torch.Tensor:
            return self.linear(self.conv(observations.float().permute(0, 3, 1, 2)))

    return MinAtarCNN


def run_sb3(task: str, seed: int, max_seconds: float, record: dict, same: bool = False) -> None:
    import stable_baselines3 as sb3
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    env_id, algo, target = TASKS[task]
    minatar = task in SB3_MINATAR
    if same and task not in SB3_SAME:
        raise ValueError(f"sb3-same: only the tasks {', '.join(SB3_SAME)}, not {task}")
    zoo = SB3_MINATAR[task] if minatar else SB3_SAME[task] if same else SB3_SPACES.get(task) or SB3_ZOO[task]
    kwargs = dict(zoo["kwargs"])
    horizon = SB3_MAX_STEPS
    frac = zoo["n_timesteps"] / horizon  # the zoo's schedule length as a fraction of learn()'s

    def zoo_linear(start: float):
        # SB3 passes progress_remaining = 1 - num_timesteps / horizon
        return lambda progress_remaining: start * max(0.0, 1.0 - (1.0 - progress_remaining) / frac)

    for name, start in zoo.get("lin", {}).items():
        kwargs[name] = zoo_linear(start)
    if "exploration_fraction" in kwargs:
        kwargs["exploration_fraction"] *= frac
    if kwargs.get("policy_kwargs", {}).get("activation_fn") == "relu":
        import torch

        kwargs["policy_kwargs"] = {**kwargs["policy_kwargs"], "activation_fn": torch.nn.ReLU}
    if minatar:
        kwargs["policy_kwargs"] = dict(features_extractor_class=sb3_minatar_extractor(),
                                       features_extractor_kwargs=dict(features_dim=128), net_arch=[])
        if algo == "ppo":
            kwargs["policy_kwargs"]["share_features_extractor"] = False
    register_env_ids(env_id)
    # each env wrapped in Monitor: raw returns
    env = make_vec_env(env_id, n_envs=zoo["n_envs"], seed=seed, env_kwargs=zoo.get("env_kwargs"))
    if zoo.get("normalize"):  # the zoo's VecNormalize, outside the Monitors
        from stable_baselines3.common.vec_env import VecNormalize

        env = VecNormalize(env, gamma=kwargs.get("gamma", 0.99), norm_reward=zoo.get("norm_reward", True),
                           **({"norm_obs_keys": zoo["norm_obs_keys"]} if "norm_obs_keys" in zoo else {}))
    if algo == "ppo_lstm":
        from sb3_contrib import RecurrentPPO

        cls, policy = RecurrentPPO, "MlpLstmPolicy"
    elif algo == "ppo_masked":
        from sb3_contrib import MaskablePPO

        cls, policy = MaskablePPO, zoo["policy"]
    else:
        cls, policy = {"ppo": sb3.PPO, "dqn": sb3.DQN, "sac": sb3.SAC}[algo], zoo.get("policy", "MlpPolicy")
    model = cls(policy, env, seed=seed, device="cpu", verbose=0, **kwargs)
    record.update(t_built=time.time(), config={"n_envs": zoo["n_envs"], "zoo_n_timesteps": zoo["n_timesteps"], **zoo["kwargs"],
                                          **{k: f"lin_{v}" for k, v in zoo.get("lin", {}).items()}})
    if same:
        record["config"].update(source="our pendulum_sac pipeline's network, batch and update ratio")
    if task in SB3_SPACES:
        record["config"].update(policy=policy, algorithm=cls.__name__,
                                source="RL Zoo ppo.yml" if cls is sb3.PPO else "sb3-contrib MaskablePPO defaults")
    if minatar:  # not RL-Zoo's: n_timesteps is the exploration schedule's length
        record["config"].update(source="our minatar_breakout pipelines (MinAtar paper)", network=MINATAR_NETWORK,
                                net_arch=[], **({"share_features_extractor": False} if algo == "ppo" else {}))
    episodes: list[tuple[float, float, int]] = record["episodes"]
    why = stop_rule(record, target, max_seconds)

    class Watch(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                ep = info.get("episode")
                if ep is not None:
                    episodes.append((time.time(), float(ep["r"]), int(ep["l"])))
            record["stop_reason"] = why(episodes)
            return record["stop_reason"] is None

    model.learn(total_timesteps=horizon, callback=Watch())
    record["env_steps"] = int(model.num_timesteps)
    env.close()
