"""PufferLib 3 (its own trainer, ``pufferlib.pufferl.PuffeRL``), as a peer for benchmarks/suite.py.
Imported by run_peer.py only, in PufferLib's own venv (``benchmarks/peers/setup pufferlib``: a
PATCHED BUILD of pufferlib 3.0.0, whose published sdist does not install (see that script): built
with NO_OCEAN=1, so without its C Ocean envs, and its advantage kernel the CPU one. It pins
gymnasium<=0.29.1, so LunarLander-v2 and Hopper-v4 stand in for LunarLander-v3 and Hopper-v5).

The loop is the one ``pufferlib.pufferl.train`` runs (``evaluate()`` collects a batch, ``train()``
updates on it), on a ``pufferlib.vector.make`` vector env and PufferLib's ``Default`` policy (one
128-unit GELU layer shared by actor and critic, an LSTM on top where its config names one), with
its config files' defaults (``config/default.ini``) for everything the task's settings leave. The
vector backend is its Serial one (``BACKEND``: its Multiprocessing backend, one busy-waiting
process per physical core, ran slower on a 2-core machine). Settings by task (``settings``):

- hopper_ppo ("tuned", Hopper-v4): PufferLib's ``config/mujoco.ini`` (512 envs, batch 32768 in
  64-step segments, 10 epochs of minibatches of 4096, lr 3e-4 cosine-annealed over 5M steps, gamma
  0.99, GAE 0.95, value 0.5, gradient norm 0.5, an LSTM) and its MuJoCo env wrappers
  (``environments/mujoco``: clipped actions, normalized and clipped observations, normalized and
  clipped rewards, in its order; written there for gymnasium 1.0's ``TransformObservation``).
- cartpole_ppo and lunarlander_ppo ("zoo"): PufferLib publishes no settings that run for them
  (``config/classic_control.ini`` names cartpole but sets only ``[train] num_envs``, which its
  trainer does not read: with default.ini's 2 envs and minibatches of 8192 the trainer refuses its
  batch of 128; its classic-control env creator imports ``pufferlib.postprocess``, which 3.0.0 does
  not have; there is nothing for LunarLander), so RL-Zoo's PPO settings for the task with SB3's
  defaults the zoo leaves (Adam, lr 3e-4 unless the zoo sets it, clip 0.2, value coefficient 0.5,
  gradient norm 0.5): CartPole 8 envs x 32 steps, minibatch 256, 20 epochs, gamma 0.98, GAE 0.8, lr
  1e-3 annealed over the zoo's 1e5 steps (PufferLib anneals by cosine, not linearly), entropy 0;
  LunarLander 16 envs x 1024 steps, minibatches of 64, 4 epochs, gamma 0.999, GAE 0.98, entropy
  0.01. The env as PufferLib's creators for plain gymnasium envs make it (``EpisodeStats`` in a
  ``GymnasiumPufferEnv``). What has no SB3 counterpart stays PufferLib's: its prioritized segment
  sampling, V-trace clipping, value clipping (0.2), its Adam betas and epsilon, GAE within 64-step
  segments (LunarLander; the zoo's minibatch of 64 must hold whole segments), and its clamp of
  rewards to [-1, 1] in the trainer.

As for SB3's zoo schedules, a schedule holds its final value once the config's total_timesteps have
passed (the cosine would otherwise rise again): the run goes on until it solves or its time runs out.
The terminal dashboard PufferLib redraws after every update is switched off (as verbose=0 for SB3).

Episodes: a wrapper innermost around each gymnasium env appends every finished episode's raw return,
length and end time to a file this process reads after each ``evaluate()`` (a file, so that it
works in the Multiprocessing backend's worker processes too).
"""

from __future__ import annotations

import os
import time

import episode_log

EPISODE_LOG_ENV = "PEER_EPISODE_LOG"

ZOO = {
    "cartpole_ppo": dict(num_envs=8, bptt_horizon=32, batch_size=256, minibatch_size=256, update_epochs=20,
                         gamma=0.98, gae_lambda=0.8, ent_coef=0.0, learning_rate=1e-3, anneal_lr=True,
                         total_timesteps=100_000),
    "lunarlander_ppo": dict(num_envs=16, bptt_horizon=64, batch_size=16384, minibatch_size=64, update_epochs=4,
                            gamma=0.999, gae_lambda=0.98, ent_coef=0.01, learning_rate=3e-4, anneal_lr=False,
                            total_timesteps=1_000_000),
}
#: SB3's PPO defaults the zoo entries leave as they are, on PufferLib's knobs
SB3_DEFAULTS = dict(optimizer="adam", clip_coef=0.2, vf_coef=0.5, max_grad_norm=0.5)
MUJOCO_ENVS = 512
#: PufferLib's vector backend here. Its Multiprocessing backend (the default) runs one busy-waiting
#: worker process per physical core and refuses more: on a 2-core machine, beside the trainer's
#: process, it collected CartPole at 1.0k env steps/s against Serial's 8.1k, and Hopper at 3.3k
#: against 5.1k (one measurement each, 8 and 512 envs).
BACKEND = "Serial"


def _log_episode(ret: float, length: int) -> None:
    path = os.environ.get(EPISODE_LOG_ENV)
    if path:
        episode_log.append(path, ret, length)


def _episode_log_wrapper(env):
    import gymnasium

    return episode_log.recording(gymnasium, _log_episode)(env)


def make_plain(env_id: str, buf=None, seed=0):
    """The env as PufferLib's creators for gymnasium envs without preprocessing make it (its box2d one):
    ``EpisodeStats`` in a ``GymnasiumPufferEnv``."""
    import gymnasium
    import pufferlib
    import pufferlib.emulation

    env = pufferlib.EpisodeStats(_episode_log_wrapper(gymnasium.make(env_id)))
    return pufferlib.emulation.GymnasiumPufferEnv(env=env, buf=buf, seed=seed)


def make_mujoco(env_id: str, gamma: float, buf=None, seed=0):
    """PufferLib's MuJoCo creator (``environments/mujoco``, ``single_env_creator`` with pufferl=True),
    its wrappers in its order; written for gymnasium 1.0's ``TransformObservation(env, f, space)``, here
    gymnasium 0.29's ``TransformObservation(env, f)``."""
    import gymnasium
    import numpy as np
    import pufferlib
    import pufferlib.emulation

    env = _episode_log_wrapper(gymnasium.make(env_id, render_mode="rgb_array"))
    env = pufferlib.ClipAction(env)
    env = pufferlib.EpisodeStats(env)
    env = gymnasium.wrappers.NormalizeObservation(env)
    env = gymnasium.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10))
    env = gymnasium.wrappers.NormalizeReward(env, gamma=gamma)
    env = gymnasium.wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))
    return pufferlib.emulation.GymnasiumPufferEnv(env=env, buf=buf, seed=seed)


def _ini(name: str) -> dict:
    """PufferLib's config for ``name`` as ``pufferl.load_config`` reads it (config/default.ini, then
    the file whose ``env_name`` lists ``name``), without its command line."""
    import sys

    import pufferlib.pufferl

    argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        return pufferlib.pufferl.load_config(name)
    finally:
        sys.argv = argv


def settings(task: str, env_id: str):
    """(args as ``load_config`` gives them, env creator, config to record)."""
    import functools

    if task == "hopper_ppo":
        args = _ini(env_id)
        args["vec"].update(num_envs=MUJOCO_ENVS, backend=BACKEND)
        creator = functools.partial(make_mujoco, env_id, args["train"]["gamma"])
        source = (f"PufferLib's config/mujoco.ini on {env_id}, its MuJoCo env wrappers; its {BACKEND} vector backend "
                  f"(the config's: Multiprocessing, 16 workers)")
        return args, creator, source
    z = ZOO[task]
    args = _ini("default")
    args["train"].update({k: v for k, v in z.items() if k != "num_envs"}, **SB3_DEFAULTS)
    args["vec"].update(num_envs=z["num_envs"], backend=BACKEND)
    args["policy"], args["rnn_name"] = {}, None
    args["train"]["use_rnn"] = False
    creator = functools.partial(make_plain, env_id)
    source = (f"RL-Zoo's {env_id.split('-')[0]} PPO settings on PufferLib's trainer (PufferLib publishes none that "
              f"run), SB3's defaults where the zoo sets none")
    return args, creator, source


def run(task: str, env_id: str, seed: int, record: dict, stop) -> None:
    """Train until ``stop(episodes)`` names a reason (tasks.stop_rule); episodes go to
    ``record["episodes"]`` as (end time, return, length)."""
    import tempfile

    import numpy as np
    import torch

    log = os.path.join(tempfile.mkdtemp(prefix="pufferlib-episodes-", dir="."), "episodes.txt")
    open(log, "w").close()
    os.environ[EPISODE_LOG_ENV] = os.path.abspath(log)  # the worker processes inherit it

    import pufferlib.pufferl
    import pufferlib.vector
    from pufferlib.models import Default, LSTMWrapper

    args, creator, source = settings(task, env_id)
    train = dict(args["train"], env=env_id, device="cpu", seed=seed, compile=False)
    np.random.seed(seed)
    torch.manual_seed(seed)
    vecenv = pufferlib.vector.make(creator, num_envs=args["vec"]["num_envs"], seed=seed,
                                   backend=getattr(pufferlib.vector, BACKEND))
    policy = Default(vecenv.driver_env, **args["policy"])
    if args["rnn_name"]:
        policy = LSTMWrapper(vecenv.driver_env, policy, **args["rnn"])
    pufferlib.pufferl.PuffeRL.print_dashboard = lambda self, *a, **k: None  # no terminal dashboard
    trainer = pufferlib.pufferl.PuffeRL(train, vecenv, policy)
    record.update(t_built=time.time(), config={
        "source": source, "package_build": "pufferlib 3.0.0, patched build (NO_OCEAN=1, CPU advantage kernel)",
        "train": {k: v for k, v in train.items() if k not in ("name", "project", "data_dir")},
        "vec": {"backend": BACKEND, "num_envs": args["vec"]["num_envs"]}, "policy": type(policy).__name__,
        "rnn": args["rnn_name"]})
    episodes = record["episodes"]
    offset = 0
    try:
        while True:
            trainer.evaluate()
            offset = episode_log.read_new(log, offset, episodes)
            record["env_steps"] = int(trainer.global_step)
            record["stop_reason"] = stop(episodes)
            if record["stop_reason"] is not None:
                break
            if trainer.epoch >= trainer.total_epochs:  # the schedule has run its course: hold its end
                trainer.config["anneal_lr"] = False
            trainer.train()
    finally:
        trainer.utilization.stop()
        vecenv.close()
