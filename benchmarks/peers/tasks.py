"""The tasks a peer trains on and the project's rule for when a run has solved one. Plain Python
(gymnasium imported only to register an env): every peer's venv loads it beside run_peer.py, and
benchmarks/suite.py (``_systems.py``) reads the same ``TASKS``.

Time-to-solve follows the project's rule: pool every training episode, sort by end time, first end
time at which the mean of the last ``WINDOW`` returns reaches the target.
"""

from __future__ import annotations

import time
from pathlib import Path

TASKS = {  # task -> (env id, algorithm, target); the task name is also tianji_dask's bundled pipeline's
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
#: the project's own env files a peer loads (each imports gymnasium, numpy and its env's package only)
OWN_ENVS = {"CartPoleNoVel-v1": ENVS / "masked.py", "MiniGridDict-v0": ENVS / "minigrid.py",
            "TicTacToe-v0": ENVS / "tictactoe.py"}


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
