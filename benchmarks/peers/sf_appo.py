"""Sample Factory 2 (APPO), as a peer for benchmarks/suite.py. Imported by run_peer.py only, in
Sample Factory's own venv (``benchmarks/peers/setup sf``: sample-factory 2.1.1 pins gymnasium<1.0,
so LunarLander-v2 and Hopper-v4 stand in for LunarLander-v3 and Hopper-v5).

Sample Factory runs as it runs from its own scripts: ``make_runner(cfg)``, ``runner.init()``,
``runner.run()`` (``sample_factory.train.run_rl``), its learner, inference and rollout workers each
in their own process, started by the runner in this one. Settings by task (``settings``):

- cartpole_ppo ("tuned"): the command in the docstring of Sample Factory's
  ``sf_examples/train_gym_env.py`` for CartPole-v1 (APPO, no RNN, 20 envs a worker, 2 policy workers,
  batch 512, reward scale 0.1, no V-trace, checkpoints every 10 s, summaries every 10 s), on the CPU;
  the number of rollout workers is Sample Factory's default (the machine's cores).
- hopper_ppo ("tuned", Hopper-v4): ``sf_examples/mujoco/mujoco_params.py``'s defaults (synchronous
  PPO, 64-64 tanh, batch 1024 of 64-step rollouts, 2 epochs of 4 minibatches, lr 2.95e-3 decaying
  linearly, input and return normalization, ...), Sample Factory's env ``mujoco_hopper``
  (Hopper-v4). They ask for 8 rollout workers of 8 envs: here as many workers as cores, with the
  same 64 envs among them, so each training iteration gets the same samples.
- lunarlander_ppo ("zoo", LunarLander-v2): Sample Factory publishes no LunarLander settings, so
  RL-Zoo's LunarLander PPO settings (16 envs x 1024 steps between updates, minibatches of 64 (256
  of them a training iteration), 4 epochs, gamma 0.999, GAE 0.98, entropy 0.01) with SB3's defaults
  the zoo leaves as they are (lr 3e-4, clip 0.2, value coefficient 0.5, gradient norm 0.5, no input
  or return normalization, reward unscaled, shuffled minibatches), in Sample Factory's synchronous
  mode (``async_rl=False``, as its MuJoCo settings; SB3's PPO is synchronous too: asynchronous, the
  1,024 SGD steps a training iteration put the next rollouts past its ``max_policy_lag`` of 1000
  and its learner discarded them as invalid), on the gym example's no-RNN setup; everything else
  (the 512-512 ELU encoder, ...) Sample Factory's defaults. Its minibatches are whole rollouts
  (``batch_size // rollout`` of them; a rollout longer than the minibatch is refused), so an env's
  1024 steps between updates are 16 rollouts of 64: GAE bootstraps from the value every 64 steps.

Episodes: every training episode Sample Factory reports (its rollout workers send each finished
episode's raw return and length to the runner, the numbers behind its "Avg episode reward") is
recorded when it arrives; its end time comes with it, stamped in the rollout worker's env at the
step that ended it (a wrapper adds it to the info dict's ``episode_extra_stats``, which Sample
Factory forwards). Episodes that end while Sample Factory decorrelates its envs with random actions
before training are not reported by it and not recorded.

Built: when the sampler reports itself initialized (the learner has built the model in its process
and an inference worker is ready); the processes were started before, the rollout workers then make
their envs. The run stops (``runner._stop_training``, what Sample Factory calls when its own
``train_for_*`` limits are reached) after the training iteration at which the stop rule says so.
"""

from __future__ import annotations

import os
import time

#: argv of each task's settings, less --env/--experiment/--train_dir/--seed/--device, and the label
CARTPOLE_DOCSTRING = ["--algo=APPO", "--use_rnn=False", "--num_envs_per_worker=20", "--policy_workers_per_policy=2",
                      "--recurrence=1", "--with_vtrace=False", "--batch_size=512", "--reward_scale=0.1",
                      "--save_every_sec=10", "--experiment_summaries_interval=10"]
ZOO_LUNARLANDER = {"n_envs": 16, "rollout": 64, "batch_size": 64, "num_batches_per_epoch": 256, "num_epochs": 4,
                   "gamma": 0.999, "gae_lambda": 0.98, "exploration_loss_coeff": 0.01, "learning_rate": 3e-4,
                   "ppo_clip_ratio": 0.2, "value_loss_coeff": 0.5, "max_grad_norm": 0.5}
MUJOCO_ENVS = 64  # mujoco_params: 8 workers x 8 envs


def _cores() -> int:
    return os.cpu_count() or 1


def settings(task: str, env_id: str) -> tuple[list[str], dict]:
    """(Sample Factory argv, config to record) for ``task`` on ``env_id``."""
    cores = _cores()
    if task == "cartpole_ppo":
        return CARTPOLE_DOCSTRING, {"source": "sf_examples/train_gym_env.py docstring (CartPole-v1), on the CPU",
                                    "argv": CARTPOLE_DOCSTRING}
    if task == "hopper_ppo":
        workers = max(w for w in range(1, cores + 1) if MUJOCO_ENVS % (2 * w) == 0)  # envs per worker even
        argv = ["--algo=APPO", f"--num_workers={workers}", f"--num_envs_per_worker={MUJOCO_ENVS // workers}"]
        return argv, {"source": f"sf_examples/mujoco/mujoco_params.py (env mujoco_hopper, {env_id}), on the CPU; "
                                f"{workers} rollout workers x {MUJOCO_ENVS // workers} envs (theirs: 8 x 8)",
                      "argv": argv}
    if task == "lunarlander_ppo":
        z = ZOO_LUNARLANDER
        workers = max(w for w in range(1, cores + 1) if z["n_envs"] % (2 * w) == 0)
        argv = ["--algo=APPO", "--async_rl=False", "--use_rnn=False", "--recurrence=1", "--with_vtrace=False",
                f"--num_workers={workers}", f"--num_envs_per_worker={z['n_envs'] // workers}",
                f"--rollout={z['rollout']}", f"--batch_size={z['batch_size']}",
                f"--num_batches_per_epoch={z['num_batches_per_epoch']}", f"--num_epochs={z['num_epochs']}",
                f"--gamma={z['gamma']}", f"--gae_lambda={z['gae_lambda']}",
                f"--exploration_loss_coeff={z['exploration_loss_coeff']}", f"--learning_rate={z['learning_rate']}",
                f"--ppo_clip_ratio={z['ppo_clip_ratio']}", f"--value_loss_coeff={z['value_loss_coeff']}",
                f"--max_grad_norm={z['max_grad_norm']}", "--reward_scale=1.0", "--normalize_input=False",
                "--normalize_returns=False", "--shuffle_minibatches=True"]
        return argv, {"source": f"RL-Zoo's LunarLander PPO settings on Sample Factory, synchronous ({env_id}; Sample "
                                "Factory publishes none), SB3's defaults where the zoo sets none; rollouts of 64",
                      "argv": argv}
    raise KeyError(task)


def make_env(full_env_name, cfg=None, env_config=None, render_mode=None):
    """The env factory registered with Sample Factory (imported by name in its worker processes):
    the gymnasium env, its end time put in the info of the step that ends an episode."""
    import gymnasium as gym

    class EpisodeEndTime(gym.Wrapper):
        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                info = dict(info)
                info["episode_extra_stats"] = {**info.get("episode_extra_stats", {}), "t_end": time.time()}
            return obs, reward, terminated, truncated, info

    return EpisodeEndTime(gym.make(_ENV_IDS.get(full_env_name, full_env_name), render_mode=render_mode))


#: Sample Factory env name -> gymnasium id (its MuJoCo example names Hopper-v4 mujoco_hopper)
_ENV_IDS = {"mujoco_hopper": "Hopper-v4"}


def run(task: str, env_id: str, seed: int, record: dict, stop) -> None:
    """Train until ``stop(episodes)`` names a reason (tasks.stop_rule); episodes go to
    ``record["episodes"]`` as (end time, return, length)."""
    import tempfile

    from sample_factory.algo.runners.runner import AlgoObserver
    from sample_factory.algo.utils.misc import EPISODIC, ExperimentStatus
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import make_runner
    from signal_slot.signal_slot import EventLoopObject

    argv, config = settings(task, env_id)
    sf_env = "mujoco_hopper" if task == "hopper_ppo" else env_id
    train_dir = tempfile.mkdtemp(prefix="sf-train-", dir=".")
    argv = [*argv, f"--env={sf_env}", f"--experiment={task}_seed{seed}", f"--train_dir={train_dir}",
            f"--seed={seed}", "--device=cpu"]
    register_env(sf_env, make_env)
    parser, partial = parse_sf_args(argv=argv)
    if task == "hopper_ppo":
        from sf_examples.mujoco.mujoco_params import add_mujoco_env_args, mujoco_override_defaults

        add_mujoco_env_args(partial.env, parser)
        mujoco_override_defaults(partial.env, parser)
    cfg = parse_full_cfg(parser, argv)
    record["config"] = {**config, "resolved": {k: getattr(cfg, k) for k in (
        "async_rl", "num_workers", "num_envs_per_worker", "worker_num_splits", "policy_workers_per_policy", "rollout",
        "batch_size", "num_batches_per_epoch", "num_epochs", "learning_rate", "lr_schedule", "gamma", "gae_lambda",
        "ppo_clip_ratio", "value_loss_coeff", "exploration_loss_coeff", "max_grad_norm", "reward_scale",
        "normalize_input", "normalize_returns", "with_vtrace", "use_rnn", "encoder_mlp_layers", "nonlinearity",
        "serial_mode", "batched_sampling", "decorrelate_envs_on_one_worker")}}

    episodes = record["episodes"]

    def on_episode(runner, msg, policy_id) -> None:
        s = msg[EPISODIC]
        t_end = (s.get("episode_extra_stats") or {}).get("t_end", time.time())
        episodes.append((float(t_end), float(s["reward"]), int(s["len"])))

    class BuildMark(EventLoopObject):
        """Takes the time the sampler says it is initialized, in the runner's event loop."""

        def __init__(self, event_loop):
            EventLoopObject.__init__(self, event_loop, "peer_build_mark")

        def on_sampler_initialized(self, *args) -> None:
            record.setdefault("t_built", time.time())

    class Stop(AlgoObserver):
        def on_connect_components(self, runner) -> None:
            self.mark = BuildMark(runner.event_loop)
            runner.sampler.initialized.connect(self.mark.on_sampler_initialized)

        def on_training_step(self, runner, training_iteration_since_resume: int) -> None:
            if "t_built" not in record:
                return
            record["env_steps"] = int(sum(runner.env_steps.values()))
            record["stop_reason"] = stop(episodes)
            if record["stop_reason"] is not None:
                runner._stop_training()

    cfg, runner = make_runner(cfg)
    runner.register_episodic_stats_handler(on_episode)
    runner.register_observer(Stop())
    status = runner.init()
    if status != ExperimentStatus.SUCCESS:
        raise RuntimeError(f"Sample Factory's runner.init() returned {status}")
    status = runner.run()
    record["env_steps"] = int(sum(runner.env_steps.values()))
    record["sf_status"] = int(status)
    if status == ExperimentStatus.FAILURE and record.get("stop_reason") is None:
        raise RuntimeError(f"Sample Factory's runner.run() returned FAILURE ({status})")
