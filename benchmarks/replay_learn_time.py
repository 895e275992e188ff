"""Time of one DQN ``learn()`` with uniform and with prioritized replay, the replay full.

    python benchmarks/replay_learn_time.py [--buffer 100000] [--batch 128] [--repeats 15]

Both algorithms are timed in turns, 100 calls at a time (machines here are noisy, so neighbours
share the noise); prints the median and fastest per-call time of each and the median ratio of
neighbouring repeats.
"""

from __future__ import annotations

import argparse
import timeit

import gymnasium as gym
import numpy as np
import torch

from tianji_dask.algos.dqn import DQN, DQNConfig


def full_dqn(prioritized: bool, buffer: int, batch: int) -> DQN:
    rng = np.random.default_rng(0)
    algo = DQN(gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2),
               DQNConfig(prioritized=prioritized, batch_size=batch, buffer_size=buffer), seed=0)
    algo.replay.add({"obs": rng.normal(size=(buffer, 4)).astype(np.float32), "actions": rng.integers(0, 2, buffer),
                     "rewards": rng.normal(size=buffer).astype(np.float32),
                     "next_obs": rng.normal(size=(buffer, 4)).astype(np.float32),
                     "discounts": np.full(buffer, 0.97, np.float32)})
    for _ in range(300):  # warm-up; with prioritized replay the priorities spread out
        algo.learn()
    return algo


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--buffer", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # as in the learner
    algos = {"uniform": full_dqn(False, args.buffer, args.batch), "prioritized": full_dqn(True, args.buffer, args.batch)}
    us = {name: [] for name in algos}
    for _ in range(args.repeats):
        for name, algo in algos.items():
            us[name].append(timeit.timeit(algo.learn, number=100) / 100 * 1e6)
    for name, t in us.items():
        print(f"{name:>11} learn(): median {np.median(t):.0f} us, fastest {min(t):.0f} us "
              f"(buffer {args.buffer}, batch {args.batch}, {args.repeats} x 100 calls)")
    print(f"prioritized / uniform, neighbouring repeats: median {np.median(np.divide(us['prioritized'], us['uniform'])):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
