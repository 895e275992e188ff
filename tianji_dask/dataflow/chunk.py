"""SampleChunk: the one unit of data that moves from an explorer to the learner.

A chunk is a plain dict (so Dask serialises its numpy arrays zero-copy) holding T vector steps of
N environments. Observations are stored once, as T+1 frames: frame t+1 is the next observation of
step t, so no next-observation is ever duplicated. Gymnasium's vector envs reset an env on the step
*after* it finished (autoreset NEXT_STEP); that reset step is not a transition and is marked
``valid = False``.

This module imports neither Dask nor torch.
"""

from __future__ import annotations

import numpy as np

#: arrays every chunk carries: name -> (dtype kind check, leading shape as a function of T, N)
ARRAY_FIELDS = ("obs", "actions", "rewards", "terminated", "truncated", "valid")
#: scalar stamps every chunk carries
STAMP_FIELDS = ("explorer_id", "policy_version", "env_steps", "t_start", "t_end", "nbytes")
#: finished episodes, one row each: (t_end [unix s], return, length)
EPISODE_COLUMNS = ("t_end", "return", "length")


def make_chunk(
    *,
    obs: np.ndarray,
    actions: np.ndarray,
    rewards: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    valid: np.ndarray,
    extras: dict[str, np.ndarray],
    explorer_id: int,
    policy_version: int,
    t_start: float,
    t_end: float,
    episodes: list[tuple[float, float, int]],
) -> dict:
    chunk = {
        "obs": obs,
        "actions": actions,
        "rewards": rewards.astype(np.float32, copy=False),
        "terminated": terminated.astype(bool, copy=False),
        "truncated": truncated.astype(bool, copy=False),
        "valid": valid.astype(bool, copy=False),
        **{f"extra_{k}": v for k, v in extras.items()},
        "episodes": np.asarray(episodes, dtype=np.float64).reshape(-1, 3),
        "explorer_id": int(explorer_id),
        "policy_version": int(policy_version),
        "env_steps": int(valid.sum()),
        "t_start": float(t_start),
        "t_end": float(t_end),
    }
    chunk["nbytes"] = int(sum(v.nbytes for v in chunk.values() if isinstance(v, np.ndarray)))
    return chunk


def extras(chunk: dict) -> dict[str, np.ndarray]:
    """The per-step arrays the behaviour policy added (e.g. PPO's log-probabilities and values)."""
    return {k[len("extra_"):]: v for k, v in chunk.items() if k.startswith("extra_")}


def validate_chunk(chunk: dict) -> None:
    """Raise ValueError naming the first field that breaks the schema."""
    for name in ARRAY_FIELDS + STAMP_FIELDS + ("episodes",):
        if name not in chunk:
            raise ValueError(f"chunk: missing field {name!r}")
    obs = chunk["obs"]
    if not isinstance(obs, np.ndarray) or obs.ndim < 3:
        raise ValueError("chunk.obs: must be an array of shape (T+1, N, *obs_shape)")
    if obs.dtype not in (np.float32, np.uint8):
        raise ValueError(f"chunk.obs: dtype must be float32 or uint8, got {obs.dtype}")
    t1, n = obs.shape[:2]
    for name in ("actions", "rewards", "terminated", "truncated", "valid"):
        arr = chunk[name]
        if not isinstance(arr, np.ndarray) or arr.shape[:2] != (t1 - 1, n):
            raise ValueError(f"chunk.{name}: must have leading shape (T, N) = {(t1 - 1, n)}")
    for name, arr in extras(chunk).items():
        if arr.shape[:2] != (t1 - 1, n):
            raise ValueError(f"chunk.extra_{name}: must have leading shape (T, N) = {(t1 - 1, n)}")
    for name in ("terminated", "truncated", "valid"):
        if chunk[name].dtype != bool:
            raise ValueError(f"chunk.{name}: dtype must be bool")
    if chunk["rewards"].dtype != np.float32:
        raise ValueError("chunk.rewards: dtype must be float32")
    for name, arr in chunk.items():
        if isinstance(arr, np.ndarray) and arr.dtype in (np.float64,) and name != "episodes":
            raise ValueError(f"chunk.{name}: float64 arrays are not allowed (use float32)")
    eps = chunk["episodes"]
    if not isinstance(eps, np.ndarray) or eps.ndim != 2 or eps.shape[1] != 3:
        raise ValueError("chunk.episodes: must be an array of rows (t_end, return, length)")
    if chunk["env_steps"] != int(chunk["valid"].sum()):
        raise ValueError("chunk.env_steps: must equal the number of valid steps")
    if not chunk["t_start"] <= chunk["t_end"]:
        raise ValueError("chunk.t_end: must not be before t_start")
    if chunk["policy_version"] < 0:
        raise ValueError("chunk.policy_version: must be >= 0")


def stamps(chunk: dict) -> dict:
    """The small, msgpack-friendly part of a chunk (what the controller and results record)."""
    return {k: chunk[k] for k in STAMP_FIELDS}
