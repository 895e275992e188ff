"""One peer training run (RLlib, Stable-Baselines3, a CleanRL-style loop, Tianshou, Sample Factory,
PufferLib or TorchRL), run by benchmarks/vs_peers.py in the peers' own virtual environment
(benchmarks/peers/setup; Sample Factory, PufferLib and TorchRL each in their own, ``setup sf`` etc.);
never imported by the project.

    python benchmarks/peers/run_peer.py --system rllib|sb3|cleanrl|tianshou|sf|pufferlib|torchrl
                                        --task cartpole_ppo --seed 0 --max-seconds 300 --out run.json

Every training episode's return and end time is recorded (RLlib: an ``on_episode_end`` callback
in each env runner appends to a file; SB3: ``Monitor`` episode infos read by a callback), and the
time-to-solve follows the project's rule: pool every training episode, sort by end time, first end
time at which the mean of the last 100 returns reaches the target. Time counts from the moment the
algorithm object is built. The run stops when solved or when ``--max-seconds`` have passed since
then (checked between training iterations, so a run may overrun by one iteration). The JSON also
holds ``t_process``, taken before anything heavy is imported: each episode's end time less it is
the second clock, seconds since the process started.

Sample Factory and PufferLib pin gymnasium<1.0, which has no LunarLander-v3 or Hopper-v5: they
run LunarLander-v2 and Hopper-v4 (``OLDER_ENV_IDS``), and the JSON's ``env_id`` says which.

MinAtar Breakout (``minatar_breakout_dqn``, ``minatar_breakout_ppo``) runs on RLlib and SB3 with the
MinAtar paper's network; MinAtar's gymnasium ids exist only after ``minatar.gym.register_envs()``,
which ``register_env_ids`` calls (and, for RLlib's env runners, the registered env creator).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, however it is loaded
import episode_log  # noqa: E402

T_PROCESS = time.time()  # close to process start: nothing heavy is imported above

TASKS = {
    "cartpole_ppo": ("CartPole-v1", "ppo", 475.0),
    "cartpole_dqn": ("CartPole-v1", "dqn", 475.0),
    "lunarlander_ppo": ("LunarLander-v3", "ppo", 200.0),
    "lunarlander_dqn": ("LunarLander-v3", "dqn", 200.0),
    "pendulum_sac": ("Pendulum-v1", "sac", -200.0),
    "halfcheetah_sac": ("HalfCheetah-v5", "sac", 3000.0),
    "hopper_ppo": ("Hopper-v5", "ppo", 2000.0),
    "minatar_breakout_dqn": ("MinAtar/Breakout-v1", "dqn", 10.0),
    "minatar_breakout_ppo": ("MinAtar/Breakout-v1", "ppo", 10.0),
    "cartpole_novel_ppo_lstm": ("CartPoleNoVel-v1", "ppo_lstm", 475.0),
    "minigrid_doorkey_ppo": ("MiniGridDict-v0", "ppo", 0.9),
    "tictactoe_masked_ppo": ("TicTacToe-v0", "ppo_masked", 0.75),
}
WINDOW = 100
ENVS = Path(__file__).resolve().parents[2] / "tianji_dask" / "envs"
MASKED_ENVS = ENVS / "masked.py"
#: the project's own env files a peer loads (each imports gymnasium, numpy and its env's package only)
OWN_ENVS = {"CartPoleNoVel-v1": MASKED_ENVS, "MiniGridDict-v0": ENVS / "minigrid.py", "TicTacToe-v0": ENVS / "tictactoe.py"}


def register_env_ids(env_id: str) -> None:
    """Make ``env_id`` known to ``gymnasium.make`` in this process: MinAtar registers its
    gymnasium ids only when ``minatar.gym.register_envs()`` is called."""
    if env_id.startswith("MinAtar/"):
        import minatar.gym

        minatar.gym.register_envs()
    if env_id in OWN_ENVS:  # the project's own env, the very file (CartPoleNoVel, MiniGrid's Dict, tic-tac-toe)
        import importlib.util

        spec = importlib.util.spec_from_file_location(f"tianji_envs_{OWN_ENVS[env_id].stem}", OWN_ENVS[env_id])
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def time_to_solve(episodes: list[tuple], target: float, window: int = WINDOW) -> float | None:
    """The absolute end time of the first episode at which the running mean of the last
    ``window`` returns (episodes pooled and sorted by end time) is >= ``target``; None if never."""
    eps = sorted(episodes)
    total = 0.0
    for i, (t_end, ret, *_) in enumerate(eps):  # a third column, the length, where recorded
        total += ret
        if i >= window:
            total -= eps[i - window][1]
        if i >= window - 1 and total / window >= target:
            return t_end
    return None


def running_mean(episodes, window: int = WINDOW) -> float | None:
    eps = sorted(episodes)[-window:]
    return sum(ep[1] for ep in eps) / len(eps) if eps else None


# ---------------------------------------------------------------------------------------------
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


def stop_rule(record: dict, target: float, max_seconds: float):
    """For a peer that checks after every step or collect: ``why(episodes)`` is "solved" once the
    last ``WINDOW`` episodes reach ``target``, "max_seconds" once that long has passed since
    ``record["t_built"]``, else None."""
    def why(episodes) -> str | None:
        if time_to_solve(episodes[-WINDOW:], target) is not None:
            return "solved"
        if time.time() - record["t_built"] >= max_seconds:
            return "max_seconds"
        return None

    return why


#: peers written as one file each in this folder, by algorithm: CleanRL-style PPO (``cleanrl_ppo.py``),
#: Tianshou 2's PPO with its CartPole test's settings (``tianshou_ppo.py``) and Tianshou 2's DQN with
#: its CartPole and LunarLander examples' settings (``tianshou_dqn.py``)
SINGLE_FILE_PEERS = {"cleanrl": {"ppo": "cleanrl_ppo"}, "tianshou": {"ppo": "tianshou_ppo", "dqn": "tianshou_dqn"}}
#: the envs the single-file peers are set up for (discrete actions, flat observations)
SINGLE_FILE_ENVS = ("CartPole-v1", "LunarLander-v3")


#: peers in their own virtual environments (``benchmarks/peers/setup sf|pufferlib|torchrl``), one file
#: each in this folder, PPO on CartPole, LunarLander and Hopper: Sample Factory's APPO
#: (``sf_appo.py``), PufferLib's own trainer (``pufferlib_ppo.py``) and TorchRL's PPO after its
#: sota-implementations (``torchrl_ppo.py``)
OWN_VENV_PEERS = {"sf": "sf_appo", "pufferlib": "pufferlib_ppo", "torchrl": "torchrl_ppo"}
OWN_VENV_TASKS = ("cartpole_ppo", "lunarlander_ppo", "hopper_ppo")
#: the env ids of gymnasium<1.0 (Sample Factory's and PufferLib's pin) for those of the tasks
OLDER_ENV_IDS = {"LunarLander-v3": "LunarLander-v2", "Hopper-v5": "Hopper-v4"}
ON_OLDER_GYMNASIUM = ("sf", "pufferlib")


def peer_env_id(system: str, env_id: str) -> str:
    """The env id ``system`` runs for a task's ``env_id``: the gymnasium<1.0 one for Sample Factory
    and PufferLib, else the task's."""
    return OLDER_ENV_IDS.get(env_id, env_id) if system in ON_OLDER_GYMNASIUM else env_id


def run_own_venv(system: str, task: str, seed: int, max_seconds: float, record: dict) -> None:
    """One of ``OWN_VENV_PEERS`` on one of ``OWN_VENV_TASKS``."""
    import importlib

    if task not in OWN_VENV_TASKS:
        raise ValueError(f"{system}: only the tasks {', '.join(OWN_VENV_TASKS)}, not {task}")
    env_id, _, target = TASKS[task]
    record["env_id"] = env_id = peer_env_id(system, env_id)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    module = importlib.import_module(OWN_VENV_PEERS[system])
    module.run(task, env_id, seed, record, stop_rule(record, target, max_seconds))


def run_single_file(system: str, task: str, seed: int, max_seconds: float, record: dict) -> None:
    """One of ``SINGLE_FILE_PEERS``: the script for the task's algorithm, CartPole and LunarLander only."""
    import importlib

    env_id, algo, target = TASKS[task]
    scripts = SINGLE_FILE_PEERS[system]
    if algo not in scripts or env_id not in SINGLE_FILE_ENVS:
        tasks = [t for t, (e, a, _) in TASKS.items() if a in scripts and e in SINGLE_FILE_ENVS]
        raise ValueError(f"{system}: only the tasks {', '.join(tasks)}, not {task}")
    register_env_ids(env_id)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    module = importlib.import_module(scripts[algo])
    module.run(env_id, seed, record, stop_rule(record, target, max_seconds))


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


# ---------------------------------------------------------------------------------------------
# RLlib, new API stack, with the settings of its own tuned examples (rllib/tuned_examples/ppo/
# cartpole_ppo.py and dqn/cartpole_dqn.py). RLlib has no tuned PPO/DQN example for LunarLander:
# its default PPO/DQN configs are used there. The PPO example's evaluation runner (greedy
# evaluation in parallel) is left out: time-to-solve here is on training episodes.

def rllib_config(task: str, seed: int):
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    env_id, algo, _ = TASKS[task]
    if task == "cartpole_ppo":
        from ray.rllib.algorithms.ppo import PPOConfig

        return (PPOConfig().environment("CartPole-v1")
                .training(gamma=0.99, lr=0.0003, num_epochs=6, vf_loss_coeff=0.01, use_kl_loss=True)
                .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[32], fcnet_activation="linear",
                                                           vf_share_layers=True)))
    if task == "cartpole_dqn":
        from ray.rllib.algorithms.dqn import DQNConfig

        return (DQNConfig().environment("CartPole-v1")
                .training(lr=0.0005, train_batch_size_per_learner=32,
                          replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": 50000,
                                                "alpha": 0.6, "beta": 0.4},
                          n_step=(2, 5), double_q=True, dueling=True, epsilon=[(0, 1.0), (10000, 0.02)])
                .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[256], fcnet_activation="tanh",
                                                           fcnet_bias_initializer="zeros_",
                                                           head_fcnet_bias_initializer="zeros_",
                                                           head_fcnet_hiddens=[256])))
    if task == "lunarlander_ppo":
        from ray.rllib.algorithms.ppo import PPOConfig

        return PPOConfig().environment("LunarLander-v3")
    if task == "lunarlander_dqn":
        from ray.rllib.algorithms.dqn import DQNConfig

        return DQNConfig().environment("LunarLander-v3")
    if task in ("minatar_breakout_dqn", "minatar_breakout_ppo"):
        return rllib_minatar_config(task)
    if task in ("pendulum_sac", "halfcheetah_sac"):  # tuned_examples/sac/pendulum_sac.py and halfcheetah_sac.py
        from ray.rllib.algorithms.sac import SACConfig
        from torch import nn

        pendulum = task == "pendulum_sac"
        training = dict(actor_lr=2e-4, critic_lr=8e-4, alpha_lr=9e-4, lr=None, n_step=(2, 5)) if pendulum else dict(actor_lr=3e-4, critic_lr=3e-4, alpha_lr=3e-4, lr=None, n_step=1)
        return (SACConfig().environment(env_id)
                .training(initial_alpha=1.001, target_entropy="auto", tau=0.005, train_batch_size_per_learner=256,
                          target_network_update_freq=1,
                          replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": 100000,
                                                "alpha": 1.0 if pendulum else 0.6, "beta": 0.0 if pendulum else 0.4},
                          num_steps_sampled_before_learning_starts=256 if pendulum else 10000, **training)
                .rl_module(model_config=DefaultModelConfig(
                    fcnet_hiddens=[256, 256], fcnet_activation="relu", fcnet_kernel_initializer=nn.init.xavier_uniform_,
                    head_fcnet_hiddens=[], head_fcnet_activation=None, head_fcnet_kernel_initializer="orthogonal_",
                    head_fcnet_kernel_initializer_kwargs={"gain": 0.01})))
    if task == "hopper_ppo":  # tuned_examples/ppo/benchmark_ppo_mujoco.py's settings, one env runner
        from ray.rllib.algorithms.ppo import PPOConfig

        return (PPOConfig().environment(env_id)
                .training(gamma=0.99, lambda_=0.95, lr=0.0003, num_epochs=15, train_batch_size_per_learner=2048,
                          minibatch_size=64, vf_loss_coeff=0.01)
                .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[64, 64], fcnet_activation="tanh",
                                                           vf_share_layers=True)))
    raise KeyError(task)


# MinAtar Breakout in RLlib: the env under a name registered with ``ray.tune.registry.register_env``
# (RLlib's documented way to use a custom env creator; the registry reaches every env runner
# process through Ray), whose creator calls ``minatar.gym.register_envs()`` in the process that
# makes the env. RLlib's default CNN encoder for a 3-d Box (``Catalog._get_encoder_config`` ->
# ``CNNEncoderConfig``) is only convolutions and a flatten; the MinAtar paper's network is then
# ``conv_filters=[[16, 3, 1, "valid"]]`` (one 3x3 convolution of 16 channels, stride 1, no padding:
# 10x10 -> 8x8, as in the paper; RLlib pads "same" unless told) with ReLU, and its 128 ReLU units
# as the head's hidden layer (``head_fcnet_hiddens=[128]``, each head its own). Settings as for SB3
# above, from our minatar_breakout pipelines, where RLlib has them.
RLLIB_MINATAR_ENV = "minatar-breakout-v1"


def _minatar_env_creator(env_config):
    import gymnasium as gym
    import minatar.gym
    import numpy as np

    minatar.gym.register_envs()
    # RLlib's CNN encoder feeds observations to its Conv2d as they come: MinAtar's bool grids fail
    # there ("Input type (bool) and bias type (float) should be the same"), so gymnasium's
    # DtypeObservation hands them over as float32 0/1 (RLlib's replay then holds float32 grids)
    return gym.wrappers.DtypeObservation(gym.make("MinAtar/Breakout-v1"), np.float32)


def rllib_minatar_config(task: str):
    import dataclasses

    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    model = DefaultModelConfig(conv_filters=[[16, 3, 1, "valid"]], conv_activation="relu",
                               head_fcnet_hiddens=[128], head_fcnet_activation="relu")
    if task == "minatar_breakout_dqn":
        from ray.rllib.algorithms.dqn import DQNConfig

        # one env on the local env runner (RLlib's DQN default), fragments of 4 steps and
        # training_intensity 16 (= 64 replayed / 4 sampled): one update of 64 per 4 env steps, as for
        # SB3. Uniform replay of 100k (RLlib's default is prioritized), 5k warm-up, epsilon 1 -> 0.01
        # over 100k env steps, target copy every 1000 env steps, lr 2.5e-4, 3-step double-Q without
        # dueling (as our pipeline), Huber loss (RLlib's default), gradient norm 10 (ours and SB3's).
        return (DQNConfig().environment(RLLIB_MINATAR_ENV)
                .env_runners(rollout_fragment_length=4)
                .training(lr=2.5e-4, gamma=0.99, train_batch_size_per_learner=64, training_intensity=16,
                          replay_buffer_config={"type": "EpisodeReplayBuffer", "capacity": 100_000},
                          num_steps_sampled_before_learning_starts=5000, epsilon=[(0, 1.0), (100_000, 0.01)],
                          target_network_update_freq=1000, n_step=3, double_q=True, dueling=False, grad_clip=10.0)
                .rl_module(model_config=model))
    from ray.rllib.algorithms.ppo import PPOConfig

    # 16 envs x 128 steps: RLlib's PPO default of 2 env runners, 8 envs each, fragments of 128;
    # 4 epochs of minibatches of 256 (8 a batch), clip 0.2, lr 5e-4, entropy 0.01, GAE 0.99/0.95,
    # value loss 0.5, gradient norm 0.5, no KL penalty (our pipeline has none), actor and critic each
    # with their own network (vf_share_layers=False), as our pipeline. RLlib's vf_clip_param (10, a
    # clamp on the value loss) is left at its default: our pipeline has no equivalent.
    return (PPOConfig().environment(RLLIB_MINATAR_ENV)
            .env_runners(num_env_runners=2, num_envs_per_env_runner=8, rollout_fragment_length=128)
            .training(lr=5e-4, gamma=0.99, lambda_=0.95, train_batch_size_per_learner=2048, minibatch_size=256,
                      num_epochs=4, clip_param=0.2, entropy_coeff=0.01, vf_loss_coeff=0.5, grad_clip=0.5,
                      use_kl_loss=False)
            .rl_module(model_config=dataclasses.replace(model, vf_share_layers=False)))


EPISODE_LOG_ENV = "PEER_EPISODE_LOG"


def _on_episode_end(*, episode, prev_episode_chunks=None, **kwargs) -> None:
    # an episode that spanned several sample() calls arrives as its last chunk plus the earlier ones
    chunks = [episode, *(prev_episode_chunks or [])]
    ret = sum(float(c.get_return()) for c in chunks)
    length = sum(len(c) for c in chunks)  # env steps
    path = os.environ.get(EPISODE_LOG_ENV)
    if path:
        with open(path, "a") as fh:  # one short line per write, appended: safe across processes
            fh.write(f"{time.time():.6f} {ret} {length}\n")


def run_rllib(task: str, seed: int, max_seconds: float, record: dict) -> None:
    log = Path(tempfile.mkdtemp(prefix="rllib-episodes-")) / "episodes.txt"
    log.touch()
    os.environ[EPISODE_LOG_ENV] = str(log)  # env runner processes inherit it from ray.init's raylet
    import ray

    ray.init(include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {EPISODE_LOG_ENV: str(log)}})
    env_id, _, target = TASKS[task]
    if env_id.startswith("MinAtar/"):
        from ray.tune.registry import register_env

        register_env(RLLIB_MINATAR_ENV, _minatar_env_creator)
    config = rllib_config(task, seed).debugging(seed=seed).callbacks(on_episode_end=_on_episode_end)
    record["config"] = {k: repr(v) for k, v in sorted(config.to_dict().items())
                        if k in ("lr", "num_epochs", "vf_loss_coeff", "train_batch_size_per_learner", "minibatch_size",
                                 "num_env_runners", "num_envs_per_env_runner", "n_step", "double_q", "dueling",
                                 "epsilon", "replay_buffer_config", "gamma", "model_config", "num_learners",
                                 "metrics_num_episodes_for_smoothing", "training_intensity", "rollout_fragment_length",
                                 "target_network_update_freq", "num_steps_sampled_before_learning_starts",
                                 "grad_clip", "clip_param", "entropy_coeff", "lambda", "use_kl_loss")}
    algo = config.build_algo()
    t_built = time.time()
    record["t_built"] = t_built
    episodes: list[tuple[float, float, int]] = record["episodes"]
    iters = record.setdefault("rllib_iterations", [])
    offset = 0
    try:
        while True:
            result = algo.train()
            offset = episode_log.read_new(log, offset, episodes)
            er = result.get("env_runners", {})
            iters.append({"t": time.time() - t_built, "episode_return_mean": er.get("episode_return_mean"),
                          "num_env_steps_sampled_lifetime": er.get("num_env_steps_sampled_lifetime",
                                                                    result.get("num_env_steps_sampled_lifetime"))})
            record["env_steps"] = iters[-1]["num_env_steps_sampled_lifetime"]
            if time_to_solve(episodes, target) is not None:
                record["stop_reason"] = "solved"
                break
            if time.time() - t_built >= max_seconds:
                record["stop_reason"] = "max_seconds"
                break
    finally:
        algo.stop()
        ray.shutdown()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--system", required=True, choices=["rllib", "sb3", "sb3-same", *SINGLE_FILE_PEERS, *OWN_VENV_PEERS])
    p.add_argument("--task", required=True, choices=sorted(TASKS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-seconds", type=float, default=300)
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (tianji_dask's learner and explorers use 1); 0: the library default")
    args = p.parse_args(argv)
    if args.threads:
        # before torch loads, and Ray's workers inherit it: more threads than free cores make every op spin-wait
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(args.threads)
        import torch

        torch.set_num_threads(args.threads)
    env_id, algo, target = TASKS[args.task]
    record = {"system": args.system, "task": args.task, "env_id": env_id, "algo": algo, "seed": args.seed,
              "target_return": target, "max_seconds": args.max_seconds, "t_process": T_PROCESS, "threads": args.threads,
              "episodes": [], "stop_reason": None, "env_steps": None, "error": None}
    try:
        if args.system in SINGLE_FILE_PEERS:
            run_single_file(args.system, args.task, args.seed, args.max_seconds, record)
        elif args.system in OWN_VENV_PEERS:
            run_own_venv(args.system, args.task, args.seed, args.max_seconds, record)
        else:
            run = {"rllib": run_rllib, "sb3": run_sb3, "sb3-same": functools.partial(run_sb3, same=True)}[args.system]
            run(args.task, args.seed, args.max_seconds, record)
        import importlib.metadata as md

        def version(dist):
            try:
                return md.version(dist)
            except md.PackageNotFoundError:
                return None

        dists = (("sample-factory", "pufferlib", "torchrl", "tensordict", "mujoco", "numpy")
                 if args.system in OWN_VENV_PEERS else ("ray", "stable-baselines3", "sb3-contrib", "tianshou", "minatar",
                                                        "minigrid", "pettingzoo"))
        record["versions"] = {d: version(d) for d in (*dists, "torch", "gymnasium") if version(d) is not None}
    except BaseException:  # noqa: BLE001 - reported in the record
        record["error"] = traceback.format_exc()
    t_end = time.time()
    t_built = record.get("t_built")
    solved_at = time_to_solve(record["episodes"], target)
    record.update(
        solved=solved_at is not None,
        time_to_solve_s=None if solved_at is None or t_built is None else solved_at - t_built,
        time_to_solve_from_process_start_s=None if solved_at is None else solved_at - T_PROCESS,
        t_solved=solved_at,
        wall_s=None if t_built is None else t_end - t_built,
        t_end=t_end,
        final_mean_return=running_mean(record["episodes"]),
        num_episodes=len(record["episodes"]),
    )
    Path(args.out).write_text(json.dumps(record))
    return 1 if record["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
