"""Which observation and action spaces the bundled algorithms take, checked once when one is
built: what the networks take as ``obs_dim`` (a flat size, an ``ImageObs``, or a ``DictObs`` for
Dict and Tuple observations) and the action distribution; a space refused is one line naming it
and what is allowed. No Dask."""

from __future__ import annotations

import numpy as np

from tianji_dask.algos.encoders import ImageObs
from tianji_dask.algos.heads import ActionHeads
from tianji_dask.algos.multi_input import MASK, DictObs

OBS_ALLOWED = "Box, or a Dict or Tuple (nested) of Box, Discrete, MultiBinary and MultiDiscrete leaves"


def observation_input(obs_space, algo: str) -> int | ImageObs | DictObs:
    """What the networks take as ``obs_dim`` for ``obs_space``: the flat size of a flat Box, the
    ``ImageObs`` of an image Box, the ``DictObs`` of a Dict or Tuple. ValueError otherwise."""
    import gymnasium as gym

    if isinstance(obs_space, gym.spaces.Box):
        image = ImageObs.of(obs_space)
        return image if image is not None else int(np.prod(obs_space.shape))
    if isinstance(obs_space, (gym.spaces.Dict, gym.spaces.Tuple)):
        return DictObs.of(obs_space, algo)
    raise ValueError(f"{algo}: observation space {obs_space} is not supported; allowed: {OBS_ALLOWED}")


def check_mask(obs_dim, heads: ActionHeads | None, algo: str) -> bool:
    """Whether the observations carry an ``action_mask`` leaf, checked against the actions: it is
    for Discrete and MultiDiscrete actions, one entry per choice. ValueError otherwise."""
    width = getattr(obs_dim, "mask", None)
    if width is None:
        return False
    if heads is None or heads.kind == "binary":
        kind = "Box" if heads is None else "MultiBinary"
        raise ValueError(f"{algo}: {MASK} masks Discrete or MultiDiscrete actions; allowed with {kind} actions: "
                         f"observations without {MASK}")
    if width != heads.width:
        raise ValueError(f"{algo}: {MASK} has {width} entries; allowed: one per action choice ({heads.width}: "
                         f"{' + '.join(map(str, heads.nvec))})")
    return True


def check_spaces(obs_space, action_space, algo: str) -> tuple[int | ImageObs | DictObs, int]:
    """(what the networks take as ``obs_dim``, number of actions) for Discrete actions (DQN's
    Q-values). ValueError, one line, for spaces we don't handle."""
    heads = ActionHeads.of(action_space, algo, allowed="Discrete")
    obs_dim = observation_input(obs_space, algo)
    check_mask(obs_dim, heads, algo)
    return obs_dim, heads.width


def refuse_normalize(obs_dim, algo: str) -> None:
    """``normalize_obs`` is for flat Box observations: ValueError (one line) for the others."""
    if not isinstance(obs_dim, int):
        kind = "images" if isinstance(obs_dim, ImageObs) else "Dict or Tuple observations"
        raise ValueError(f"{algo}: normalize_obs is for flat Box observations, not {kind}; allowed: normalize_obs false")
