"""RL Zoo's published hyperparameters, for ``tianji-dask train --env ID --algo NAME`` where no
bundled pipeline trains that env with that algorithm, translated to this project's fields.

Source: rl-baselines3-zoo (https://github.com/DLR-RM/rl-baselines3-zoo), ``hyperparams/ppo.yml``,
``hyperparams/sac.yml`` and ``hyperparams/dqn.yml`` as of rl_zoo3 2.9 (2026), copied into
``zoo_hyperparams.yaml`` beside this module in the zoo's own (Stable-Baselines3) names; an
entry's unset keys take SB3's defaults (``SB3_DEFAULTS``, from SB3 2.x's ``PPO``, ``SAC`` and
``DQN``), as they would in the zoo. Covered: the zoo's entries
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
from pathlib import Path

import yaml

#: where each algorithm's entries come from, as the line that names the source says it
SOURCE = "rl-baselines3-zoo hyperparams/{algo}.yml"

_TABLE = yaml.safe_load((Path(__file__).with_name("zoo_hyperparams.yaml")).read_text())
#: the defaults of SB3 2.x's algorithms (their constructors), under a zoo entry's own keys
SB3_DEFAULTS: dict[str, dict] = _TABLE["sb3_defaults"]
#: per algorithm, per env id: the zoo's entry as published (its own keys)
ZOO: dict[str, dict[str, dict]] = _TABLE["zoo"]
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
