"""One peer training run (RLlib, Stable-Baselines3, a CleanRL-style loop, Tianshou, Sample Factory,
PufferLib or TorchRL), run by benchmarks/suite.py in the peers' own virtual environment
(benchmarks/peers/setup; Sample Factory, PufferLib and TorchRL each in their own, ``setup sf`` etc.);
never imported by the project.

    python benchmarks/peers/run_peer.py --system rllib|sb3|cleanrl|tianshou|sf|pufferlib|torchrl
                                        --task cartpole_ppo --seed 0 --max-seconds 300 --out run.json

Every training episode's return and end time is recorded (RLlib: an ``on_episode_end`` callback
in each env runner appends to a file; SB3: ``Monitor`` episode infos read by a callback, in
sb3_peer.py; the others in their own file here), and the time-to-solve follows the project's rule
(tasks.py). Time counts from the moment the algorithm object is built. The run stops when solved or
when ``--max-seconds`` have passed since then (checked between training iterations, so a run may
overrun by one iteration). The JSON also holds ``t_process``, taken before anything heavy is
imported: each episode's end time less it is the second clock, seconds since the process started.

Sample Factory and PufferLib pin gymnasium<1.0, which has no LunarLander-v3 or Hopper-v5: they
run LunarLander-v2 and Hopper-v4 (``OLDER_ENV_IDS``), and the JSON's ``env_id`` says which.

MinAtar Breakout (``minatar_breakout_dqn``, ``minatar_breakout_ppo``) runs on RLlib and SB3 with the
MinAtar paper's network; MinAtar's gymnasium ids exist only after ``minatar.gym.register_envs()``,
which ``tasks.register_env_ids`` calls (and, for RLlib's env runners, the registered env creator).
RLlib's pieces stay in this file, the script: Ray sends its callbacks and env creator to its env
runner processes by value only from ``__main__``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

T_PROCESS = time.time()  # close to process start: nothing heavy is imported above

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, however it is loaded
import episode_log  # noqa: E402
from tasks import TASKS, register_env_ids, running_mean, stop_rule, time_to_solve  # noqa: E402

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
    if task not in OWN_VENV_TASKS:
        raise ValueError(f"{system}: only the tasks {', '.join(OWN_VENV_TASKS)}, not {task}")
    env_id, _, target = TASKS[task]
    record["env_id"] = env_id = peer_env_id(system, env_id)
    module = importlib.import_module(OWN_VENV_PEERS[system])
    module.run(task, env_id, seed, record, stop_rule(record, target, max_seconds))


def run_single_file(system: str, task: str, seed: int, max_seconds: float, record: dict) -> None:
    """One of ``SINGLE_FILE_PEERS``: the script for the task's algorithm, CartPole and LunarLander only."""
    env_id, algo, target = TASKS[task]
    scripts = SINGLE_FILE_PEERS[system]
    if algo not in scripts or env_id not in SINGLE_FILE_ENVS:
        tasks = [t for t, (e, a, _) in TASKS.items() if a in scripts and e in SINGLE_FILE_ENVS]
        raise ValueError(f"{system}: only the tasks {', '.join(tasks)}, not {task}")
    register_env_ids(env_id)
    module = importlib.import_module(scripts[algo])
    module.run(env_id, seed, record, stop_rule(record, target, max_seconds))


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
        elif args.system in ("sb3", "sb3-same"):
            from sb3_peer import run_sb3

            run_sb3(args.task, args.seed, args.max_seconds, record, same=args.system == "sb3-same")
        else:
            run_rllib(args.task, args.seed, args.max_seconds, record)
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
