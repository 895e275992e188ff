"""RL Zoo's published hyperparameters, for ``tianji-dask train --env ID --algo NAME`` where no
bundled pipeline trains that env with that algorithm, translated to this project's fields.

Source: rl-baselines3-zoo (https://github.com/DLR-RM/rl-baselines3-zoo), ``hyperparams/ppo.yml``,
``hyperparams/sac.yml`` and ``hyperparams/dqn.yml`` as of rl_zoo3 2.9 (2026), copied below in the
zoo's own (Stable-Baselines3) names; an entry's unset keys take SB3's defaults (``SB3_DEFAULTS``,
from SB3 2.x's ``PPO``, ``SAC`` and ``DQN``), as they would in the zoo. Covered: the zoo's entries
for the classic-control, Box2D and MuJoCo envs gymnasium names (the zoo's MuJoCo entries are for
``-v4``; the ``-v5`` ids take the same entry, ``ZOO_ENTRY_OF``). The zoo has no IMPALA or MADDPG.

How the zoo's names become ours (``translate``):

- ``n_timesteps`` -> ``stop.max_env_steps`` (the zoo's training budget); the target stays the
  env spec's ``reward_threshold``
- ``n_envs`` -> ``env.num_envs`` per explorer stream (two streams, the default)
- PPO: ``n_steps`` -> ``chunk_steps`` with ``segments_per_batch: 1`` (one chunk is SB3's rollout
  of ``n_steps x n_envs``); ``batch_size`` -> ``num_minibatches = n_steps x n_envs / batch_size``;
  ``n_epochs`` -> ``update_epochs``; ``clip_range`` -> ``clip_coef``; ``learning_rate`` -> ``lr``,
  and ``lin_X`` -> ``lr: X`` with ``anneal_lr_steps: n_timesteps``; ``gamma``, ``gae_lambda``,
  ``ent_coef``, ``vf_coef``, ``max_grad_norm`` as they are; ``normalize: true`` ->
  ``normalize_obs`` and ``normalize_reward``
- SAC: ``learning_rate`` -> ``actor_lr`` and ``critic_lr``; ``ent_coef: auto`` -> ``autotune``,
  a number -> ``alpha`` with ``autotune: false``; ``train_freq``/``gradient_steps`` ->
  ``updates_per_env_step``; the actor every update (``policy_frequency: 1``, as SB3's SAC);
  ``buffer_size``, ``batch_size``, ``learning_starts`` (at least 1), ``tau``, ``gamma`` as they
  are; ``normalize`` -> ``normalize_obs``
- DQN: ``learning_rate`` -> ``lr``; ``train_freq``/``gradient_steps`` -> ``updates_per_env_step``
  (``gradient_steps: -1``: one update per env step); ``target_update_interval``, counted by SB3 in
  env steps, -> updates (times ``updates_per_env_step``); ``exploration_fraction`` ->
  ``eps_decay_steps`` (that fraction of ``n_timesteps``), ``exploration_initial_eps`` /
  ``exploration_final_eps`` -> ``eps_start`` / ``eps_final``; one-step targets without double Q
  (``n_step: 1``, ``double_q: false``, as SB3's DQN); ``buffer_size``, ``batch_size``,
  ``learning_starts`` (at least 1), ``tau``, ``gamma``, ``max_grad_norm`` as they are
- ``policy_kwargs``: ``net_arch`` -> ``hidden`` (SB3's separate ``pi``/``vf`` sizes are equal in
  every entry here), ``activation_fn`` -> ``activation`` (PPO, DQN; SB3's PPO defaults to tanh)

Not translated (no equivalent here): ``policy`` (an MLP, always), ``use_sde``, ``sde_sample_freq``,
``policy_kwargs``' ``log_std_init`` and ``ortho_init``, a ``lin_`` schedule of ``clip_range``
(its start value is used) and of SAC's learning rate (constant), VecNormalize's clipping and
epsilon, SAC's ``target_entropy`` (``auto``, -dim(A), is ours too) and ``target_update_interval``
(1 in every entry: ours moves the targets every update), ``optimize_memory_usage``.
"""

from __future__ import annotations

import math

#: where each algorithm's entries come from, as the line that names the source says it
SOURCE = "rl-baselines3-zoo hyperparams/{algo}.yml"

#: the defaults of SB3 2.x's algorithms (their constructors), under a zoo entry's own keys
SB3_DEFAULTS: dict[str, dict] = {
    "ppo": {"n_envs": 1, "learning_rate": 3e-4, "n_steps": 2048, "batch_size": 64, "n_epochs": 10, "gamma": 0.99,
            "gae_lambda": 0.95, "clip_range": 0.2, "ent_coef": 0.0, "vf_coef": 0.5, "max_grad_norm": 0.5,
            "normalize": False, "policy_kwargs": {"net_arch": [64, 64], "activation_fn": "tanh"}},
    "sac": {"n_envs": 1, "learning_rate": 3e-4, "buffer_size": 1_000_000, "learning_starts": 100, "batch_size": 256,
            "tau": 0.005, "gamma": 0.99, "train_freq": 1, "gradient_steps": 1, "ent_coef": "auto", "normalize": False,
            "policy_kwargs": {"net_arch": [256, 256]}},
    "dqn": {"n_envs": 1, "learning_rate": 1e-4, "buffer_size": 1_000_000, "learning_starts": 100, "batch_size": 32,
            "tau": 1.0, "gamma": 0.99, "train_freq": 4, "gradient_steps": 1, "target_update_interval": 10_000,
            "exploration_fraction": 0.1, "exploration_initial_eps": 1.0, "exploration_final_eps": 0.05,
            "max_grad_norm": 10, "policy_kwargs": {"net_arch": [64, 64], "activation_fn": "relu"}},
}

_PPO_MUJOCO = {"normalize": True, "n_timesteps": 1e6}  # the zoo's &mujoco-defaults (ppo.yml)
_PPO_MUJOCO_TUNED_NET = {"net_arch": [256, 256], "activation_fn": "relu"}  # log_std_init=-2, ortho_init=False: not translated
_SAC_MUJOCO = {"n_timesteps": 1e6, "learning_starts": 10000}  # the zoo's &mujoco-defaults (sac.yml)

#: the zoo's entries, per algorithm and env id, in its own keys (policy: 'MlpPolicy' left out)
ZOO: dict[str, dict[str, dict]] = {
    "ppo": {
        "CartPole-v1": {"n_envs": 8, "n_timesteps": 1e5, "n_steps": 32, "batch_size": 256, "gae_lambda": 0.8,
                        "gamma": 0.98, "n_epochs": 20, "ent_coef": 0.0, "learning_rate": "lin_0.001",
                        "clip_range": "lin_0.2"},
        "Acrobot-v1": {"normalize": True, "n_envs": 16, "n_timesteps": 1e6, "n_steps": 256, "gae_lambda": 0.94,
                       "gamma": 0.99, "n_epochs": 4, "ent_coef": 0.0},
        "MountainCar-v0": {"normalize": True, "n_envs": 16, "n_timesteps": 1e6, "n_steps": 16, "gae_lambda": 0.98,
                           "gamma": 0.99, "n_epochs": 4, "ent_coef": 0.0},
        "MountainCarContinuous-v0": {"normalize": True, "n_envs": 1, "n_timesteps": 20000, "batch_size": 256,
                                     "n_steps": 8, "gamma": 0.9999, "learning_rate": 7.77e-05, "ent_coef": 0.00429,
                                     "clip_range": 0.1, "n_epochs": 10, "gae_lambda": 0.9, "max_grad_norm": 5,
                                     "vf_coef": 0.19},  # use_sde, log_std_init=-3.29, ortho_init=False: not translated
        "Pendulum-v1": {"n_envs": 4, "n_timesteps": 1e5, "n_steps": 1024, "gae_lambda": 0.95, "gamma": 0.9,
                        "n_epochs": 10, "ent_coef": 0.0, "learning_rate": 1e-3, "clip_range": 0.2},  # use_sde: not translated
        "LunarLander-v3": {"n_envs": 16, "n_timesteps": 1e6, "n_steps": 1024, "batch_size": 64, "gae_lambda": 0.98,
                           "gamma": 0.999, "n_epochs": 4, "ent_coef": 0.01},
        "LunarLanderContinuous-v3": {"n_envs": 16, "n_timesteps": 1e6, "n_steps": 1024, "batch_size": 64,
                                     "gae_lambda": 0.98, "gamma": 0.999, "n_epochs": 4, "ent_coef": 0.01},
        "BipedalWalker-v3": {"normalize": True, "n_envs": 32, "n_timesteps": 5e6, "n_steps": 2048, "batch_size": 64,
                             "gae_lambda": 0.95, "gamma": 0.999, "n_epochs": 10, "ent_coef": 0.0,
                             "learning_rate": 3e-4, "clip_range": 0.18},
        "Ant-v4": {**_PPO_MUJOCO},
        "Swimmer-v4": {**_PPO_MUJOCO, "gamma": 0.9999, "n_envs": 4, "n_steps": 1024, "batch_size": 256,
                       "learning_rate": 6e-4, "gae_lambda": 0.98},
        "HalfCheetah-v4": {"normalize": True, "n_envs": 1, "n_timesteps": 1e6, "batch_size": 64, "n_steps": 512,
                           "gamma": 0.98, "learning_rate": 2.0633e-05, "ent_coef": 0.000401762, "clip_range": 0.1,
                           "n_epochs": 20, "gae_lambda": 0.92, "max_grad_norm": 0.8, "vf_coef": 0.58096,
                           "policy_kwargs": _PPO_MUJOCO_TUNED_NET},
        "Hopper-v4": {"normalize": True, "n_envs": 1, "n_timesteps": 1e6, "batch_size": 32, "n_steps": 512,
                      "gamma": 0.999, "learning_rate": 9.80828e-05, "ent_coef": 0.00229519, "clip_range": 0.2,
                      "n_epochs": 5, "gae_lambda": 0.99, "max_grad_norm": 0.7, "vf_coef": 0.835671,
                      "policy_kwargs": _PPO_MUJOCO_TUNED_NET},
        "Humanoid-v4": {"normalize": True, "n_envs": 1, "n_timesteps": 1e7, "batch_size": 256, "n_steps": 512,
                        "gamma": 0.95, "learning_rate": 3.56987e-05, "ent_coef": 0.00238306, "clip_range": 0.3,
                        "n_epochs": 5, "gae_lambda": 0.9, "max_grad_norm": 2, "vf_coef": 0.431892,
                        "policy_kwargs": _PPO_MUJOCO_TUNED_NET},
        "Walker2d-v4": {"normalize": True, "n_envs": 1, "n_timesteps": 1e6, "batch_size": 32, "n_steps": 512,
                        "gamma": 0.99, "learning_rate": 5.05041e-05, "ent_coef": 0.000585045, "clip_range": 0.1,
                        "n_epochs": 20, "gae_lambda": 0.95, "max_grad_norm": 1, "vf_coef": 0.871923},
    },
    "sac": {
        "MountainCarContinuous-v0": {"n_timesteps": 50000, "learning_rate": 3e-4, "buffer_size": 50000,
                                     "batch_size": 512, "ent_coef": 0.1, "train_freq": 32, "gradient_steps": 32,
                                     "gamma": 0.9999, "tau": 0.01, "learning_starts": 0,
                                     "policy_kwargs": {"net_arch": [64, 64]}},  # use_sde, log_std_init=-3.67: not translated
        "Pendulum-v1": {"n_timesteps": 20000, "learning_rate": 1e-3},
        "LunarLanderContinuous-v3": {"n_timesteps": 5e5, "batch_size": 256, "learning_rate": "lin_7.3e-4",
                                     "buffer_size": 1_000_000, "ent_coef": "auto", "gamma": 0.99, "tau": 0.01,
                                     "train_freq": 1, "gradient_steps": 1, "learning_starts": 10000,
                                     "policy_kwargs": {"net_arch": [400, 300]}},
        "BipedalWalker-v3": {"n_timesteps": 5e5, "learning_rate": 7.3e-4, "buffer_size": 300000, "batch_size": 256,
                             "ent_coef": "auto", "gamma": 0.98, "tau": 0.02, "train_freq": 64, "gradient_steps": 64,
                             "learning_starts": 10000,
                             "policy_kwargs": {"net_arch": [400, 300]}},  # use_sde, log_std_init=-3: not translated
        "HalfCheetah-v4": {**_SAC_MUJOCO},
        "Ant-v4": {**_SAC_MUJOCO},
        "Hopper-v4": {**_SAC_MUJOCO},
        "Walker2d-v4": {**_SAC_MUJOCO},
        "Humanoid-v4": {**_SAC_MUJOCO, "n_timesteps": 2e6},
        "Swimmer-v4": {**_SAC_MUJOCO, "gamma": 0.999},
    },
    "dqn": {
        "CartPole-v1": {"n_timesteps": 5e4, "learning_rate": 2.3e-3, "batch_size": 64, "buffer_size": 100000,
                        "learning_starts": 1000, "gamma": 0.99, "target_update_interval": 10, "train_freq": 256,
                        "gradient_steps": 128, "exploration_fraction": 0.16, "exploration_final_eps": 0.04,
                        "policy_kwargs": {"net_arch": [256, 256]}},
        "MountainCar-v0": {"n_timesteps": 1.2e5, "learning_rate": 4e-3, "batch_size": 128, "buffer_size": 10000,
                           "learning_starts": 1000, "gamma": 0.98, "target_update_interval": 600, "train_freq": 16,
                           "gradient_steps": 8, "exploration_fraction": 0.2, "exploration_final_eps": 0.07,
                           "policy_kwargs": {"net_arch": [256, 256]}},
        "LunarLander-v3": {"n_timesteps": 1e5, "learning_rate": 6.3e-4, "batch_size": 128, "buffer_size": 50000,
                           "learning_starts": 0, "gamma": 0.99, "target_update_interval": 250, "train_freq": 4,
                           "gradient_steps": -1, "exploration_fraction": 0.12, "exploration_final_eps": 0.1,
                           "policy_kwargs": {"net_arch": [256, 256]}},
        "Acrobot-v1": {"n_timesteps": 1e5, "learning_rate": 6.3e-4, "batch_size": 128, "buffer_size": 50000,
                       "learning_starts": 0, "gamma": 0.99, "target_update_interval": 250, "train_freq": 4,
                       "gradient_steps": -1, "exploration_fraction": 0.12, "exploration_final_eps": 0.1,
                       "policy_kwargs": {"net_arch": [256, 256]}},
    },
}

#: ids the zoo has no entry of its own for that take another id's: gymnasium's MuJoCo -v5 envs
#: (the same robots and rewards as -v4, with fixes), the zoo's -v4 entries
ZOO_ENTRY_OF = {f"{robot}-v5": f"{robot}-v4" for robot in ("HalfCheetah", "Hopper", "Walker2d", "Ant", "Swimmer", "Humanoid")}


def zoo_entry(env_id: str, algo: str) -> tuple[str, dict] | None:
    """(the zoo's env id, its entry over SB3's defaults) for ``env_id`` and the bundled algorithm
    ``algo``; None where the zoo has none."""
    entries = ZOO.get(algo, {})
    zoo_id = env_id if env_id in entries else ZOO_ENTRY_OF.get(env_id)
    if zoo_id not in entries:
        return None
    entry = {**SB3_DEFAULTS[algo], **entries[zoo_id]}
    entry["policy_kwargs"] = {**SB3_DEFAULTS[algo]["policy_kwargs"], **entries[zoo_id].get("policy_kwargs", {})}
    return zoo_id, entry


def _schedule(value) -> tuple[float, bool]:
    """(the start value, whether it falls linearly to 0) of a zoo value: X or 'lin_X'."""
    if isinstance(value, str) and value.startswith("lin_"):
        return float(value[4:]), True
    return float(value), False


def translate(algo: str, entry: dict) -> dict:
    """The pipeline fields (nested, as in a pipeline file) a zoo entry over SB3's defaults comes
    to for ``algo`` (see the module's docstring for what maps to what, and what does not)."""
    steps = int(entry["n_timesteps"])
    n_envs = int(entry["n_envs"])
    net = entry["policy_kwargs"]
    lr, lr_linear = _schedule(entry["learning_rate"])
    data: dict = {"env": {"num_envs": n_envs}, "stop": {"max_env_steps": steps}}
    if algo == "ppo":
        rollout = int(entry["n_steps"]) * n_envs
        config = {"lr": lr, "anneal_lr_steps": steps if lr_linear else None, "update_epochs": int(entry["n_epochs"]),
                  "num_minibatches": max(1, round(rollout / int(entry["batch_size"]))), "segments_per_batch": 1,
                  "gamma": entry["gamma"], "gae_lambda": entry["gae_lambda"], "clip_coef": _schedule(entry["clip_range"])[0],
                  "ent_coef": entry["ent_coef"], "vf_coef": entry["vf_coef"], "max_grad_norm": entry["max_grad_norm"],
                  "normalize_obs": bool(entry["normalize"]), "normalize_reward": bool(entry["normalize"]),
                  "hidden": list(net["net_arch"]), "activation": net["activation_fn"]}
        data["chunk_steps"] = int(entry["n_steps"])
    elif algo == "sac":
        auto = entry["ent_coef"] == "auto"
        config = {"actor_lr": lr, "critic_lr": lr, "buffer_size": int(entry["buffer_size"]),
                  "batch_size": int(entry["batch_size"]), "learning_starts": max(1, int(entry["learning_starts"])),
                  "tau": entry["tau"], "gamma": entry["gamma"], "autotune": auto, "policy_frequency": 1,
                  "updates_per_env_step": int(entry["gradient_steps"]) / int(entry["train_freq"]),
                  "normalize_obs": bool(entry["normalize"]), "hidden": list(net["net_arch"])}
        if not auto:
            config["alpha"] = float(entry["ent_coef"])
    elif algo == "dqn":
        gradient_steps = int(entry["gradient_steps"])
        per_step = 1.0 if gradient_steps < 0 else gradient_steps / int(entry["train_freq"])
        config = {"lr": lr, "buffer_size": int(entry["buffer_size"]), "batch_size": int(entry["batch_size"]),
                  "learning_starts": max(1, int(entry["learning_starts"])), "tau": entry["tau"], "gamma": entry["gamma"],
                  "updates_per_env_step": per_step, "n_step": 1, "double_q": False,
                  "target_update_interval": max(1, round(int(entry["target_update_interval"]) * per_step)),
                  "eps_start": entry["exploration_initial_eps"], "eps_final": entry["exploration_final_eps"],
                  "eps_decay_steps": max(1, math.ceil(entry["exploration_fraction"] * steps)),
                  "max_grad_norm": float(entry["max_grad_norm"]),
                  "hidden": list(net["net_arch"]), "activation": net["activation_fn"]}
    else:
        raise ValueError(f"the zoo's entries are for ppo, sac and dqn, not {algo!r}")
    data["algo"] = {"config": {k: v for k, v in config.items() if not (k == "anneal_lr_steps" and v is None)}}
    return data
