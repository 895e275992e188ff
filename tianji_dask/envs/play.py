"""Whole episodes played with a policy on a one-env vector env: what an evaluation is, on an
explorer worker during training or in this process for ``tianji-dask eval``."""

from __future__ import annotations

import numpy as np

DETERMINISTIC = {"greedy": True, "epsilon": 0.0}
MAX_EPISODE_STEPS = 1_000_000  # an env without a time limit would play for ever


def _frame(rendered) -> np.ndarray:
    """One RGB frame from what a one-env vector env's ``render()`` gives (a frame, or one per env)."""
    if isinstance(rendered, (list, tuple)):
        rendered = rendered[0]
    frame = np.asarray(rendered)
    return frame[0] if frame.ndim == 4 else frame


def play_episodes(policy, env, episodes: int, seed: int, explore: dict, on_episode_frames=None) -> tuple[list, list]:
    """Play ``episodes`` whole episodes on a one-env vector env (env seeds ``seed``, ``seed + 1``,
    ...); returns (returns, lengths). ``on_episode_frames(episode, frames)``: each episode's
    rendered frames, from the reset to the step before the last (the env renders ``rgb_array``).
    A recurrent policy (``initial_state(1)`` not None) acts through ``act_recurrent``: each step
    from the state the previous one left, each episode from the initial state."""
    initial = policy.initial_state(1)
    returns, lengths = [], []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        frames = [_frame(env.render())] if on_episode_frames is not None else None
        total, steps, done = 0.0, 0, False
        state = None if initial is None else initial.copy()
        while not done and steps < MAX_EPISODE_STEPS:
            if state is None:
                actions, _ = policy.act(obs, explore)
            else:
                actions, _, state = policy.act_recurrent(obs, state, explore)
            obs, reward, terminated, truncated, _ = env.step(policy.env_action(actions))
            total += float(np.sum(reward))
            steps += 1
            done = bool(np.any(terminated) or np.any(truncated))
            if frames is not None and not done:
                frames.append(_frame(env.render()))
        returns.append(total)
        lengths.append(steps)
        if frames is not None:
            on_episode_frames(episode, frames)
    return returns, lengths
