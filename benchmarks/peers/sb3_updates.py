"""Stable-Baselines3's learner updates per second on the networks and batches of
benchmarks/learner_roofline.py's cases, run in the peers' virtual environment (never imported by
the project). Prints one JSON list: ``[{"case", "updates_per_s", "samples", "note"}, ...]``.

    python benchmarks/peers/sb3_updates.py [--cases sac_256 dqn_minatar] [--updates 30] [--threads 1] [--device cpu]

Each model is built with the case's network and batch, its buffer filled by ``learn()`` past its
warm-up, then ``train()`` is timed: ``--updates`` gradient steps (DQN, SAC) or iterations of every
epoch and minibatch over one rollout (PPO), as one of our ``learn()`` calls does.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from sb3_peer import sb3_minatar_extractor
from tasks import register_env_ids

# case: (env id, algorithm, constructor kwargs, what differs from ours)
CASES = {
    "dqn_cartpole": ("CartPole-v1", "dqn", dict(policy_kwargs=dict(net_arch=[64, 64]), batch_size=128),
                     "SB3's DQN: no double Q, 1-step targets (ours: double Q, 3-step)"),
    "dqn_minatar": ("MinAtar/Breakout-v1", "dqn", dict(policy_kwargs="minatar", batch_size=64), "no double Q"),
    "ppo_minatar": ("MinAtar/Breakout-v1", "ppo", dict(policy_kwargs="minatar", n_steps=128, batch_size=256, n_epochs=4),
                    "16 envs x 128 steps, 4 epochs x 8 minibatches"),
    "sac_64": ("Pendulum-v1", "sac", dict(policy_kwargs=dict(net_arch=[64, 64]), batch_size=128), ""),
    "sac_256": ("Pendulum-v1", "sac", dict(policy_kwargs=dict(net_arch=[256, 256]), batch_size=256), ""),
}


def measure(case: str, updates: int, device: str = "cpu") -> dict:
    import stable_baselines3 as sb3
    import torch
    from stable_baselines3.common.env_util import make_vec_env

    env_id, algo, kwargs, note = CASES[case]
    kwargs = dict(kwargs)
    if kwargs.get("policy_kwargs") == "minatar":
        kwargs["policy_kwargs"] = dict(features_extractor_class=sb3_minatar_extractor(),
                                       features_extractor_kwargs=dict(features_dim=128), net_arch=[])
        if algo == "ppo":
            kwargs["policy_kwargs"]["share_features_extractor"] = False
    register_env_ids(env_id)
    n_envs = 16 if algo == "ppo" else 1
    env = make_vec_env(env_id, n_envs=n_envs, seed=0)
    cls = {"ppo": sb3.PPO, "dqn": sb3.DQN, "sac": sb3.SAC}[algo]
    if algo == "ppo":
        model = cls("MlpPolicy", env, seed=0, device=device, **kwargs)
        model.learn(total_timesteps=n_envs * kwargs["n_steps"])  # one rollout in the buffer, one iteration done
        samples = n_envs * kwargs["n_steps"] * kwargs["n_epochs"]
        step = model.train
    else:
        starts = 1000
        model = cls("MlpPolicy", env, seed=0, learning_starts=starts, train_freq=1, gradient_steps=1, device=device,
                    **kwargs)
        model.learn(total_timesteps=starts + 10)
        samples = kwargs["batch_size"]

        def step():
            model.train(gradient_steps=1, batch_size=kwargs["batch_size"])
    step()
    elapsed = 0.0
    for _ in range(updates):
        t0 = time.perf_counter()
        step()
        if device != "cpu":  # to the update's last kernel
            torch.cuda.synchronize()
        elapsed += time.perf_counter() - t0
    env.close()
    return {"case": case, "updates_per_s": updates / elapsed, "samples": samples, "note": note}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES))
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    print(json.dumps([measure(case, args.updates, args.device) for case in args.cases if case in CASES]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
