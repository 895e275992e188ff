"""What the Tianshou peers (``tianshou_ppo.py``, ``tianshou_dqn.py``) share: the seeded envs their
algorithm trains on, and a ``Collector`` over them whose step hook records each training episode as
it ends (Tianshou's trainers keep no per-episode record). Imported by those two only.
"""

from __future__ import annotations

import time


def seeded_envs(env_id: str, n: int, seed: int):
    """numpy and torch seeded, one env for the spaces and ``n`` training envs in a seeded
    ``DummyVectorEnv``: ``(env, train_envs)``."""
    import gymnasium as gym
    import numpy as np
    import torch
    from tianshou.env import DummyVectorEnv

    np.random.seed(seed)
    torch.manual_seed(seed)
    env = gym.make(env_id)
    train_envs = DummyVectorEnv([lambda: gym.make(env_id) for _ in range(n)])
    train_envs.seed(seed)
    return env, train_envs


def recording_collector(algorithm, train_envs, n: int, buffer_size: int, episodes: list, **kwargs):
    """A ``Collector`` of ``algorithm`` over the ``n`` envs of ``train_envs`` into a
    ``VectorReplayBuffer`` of ``buffer_size``, reset, appending each finished training episode to
    ``episodes`` as (end time, return, length)."""
    import numpy as np
    from tianshou.data import Collector, VectorReplayBuffer

    ep_ret, ep_len = np.zeros(n), np.zeros(n, dtype=np.int64)

    def on_step(action_batch, rollout_batch) -> None:
        # DummyVectorEnv without wait_num: every env steps every time, in env order
        rew = np.asarray(rollout_batch.rew, dtype=float)
        assert len(rew) == n, len(rew)
        ep_ret[:] += rew
        ep_len[:] += 1
        done = np.asarray(rollout_batch.done, dtype=bool)
        if done.any():
            now = time.time()
            for i in np.flatnonzero(done):
                episodes.append((now, float(ep_ret[i]), int(ep_len[i])))
                ep_ret[i], ep_len[i] = 0.0, 0

    collector = Collector(algorithm, train_envs, VectorReplayBuffer(buffer_size, n), on_step_hook=on_step, **kwargs)
    collector.reset()
    return collector
