"""MiniGrid's gridworlds with their Dict observation, as the networks take it.

``MiniGridDict-v0`` (``env.kwargs: {base: MiniGrid-DoorKey-5x5-v0}``, any MiniGrid id) is the
MiniGrid env observing ``{"image": (7, 7, 3) uint8, "direction": Discrete(4)}``: the agent's
partial 7x7 view, each cell coded as (object, colour, state), and the way it faces. MiniGrid's
third key, ``mission``, a sentence (a text space no network here takes, the same in every episode
of a DoorKey or Empty env), is left out, and the image's bounds are its codes' true ones (object
0-10, colour 0-5, state 0-2; MiniGrid declares 0-255): the image encoder then scales by the codes'
range, and SB3's MultiInputPolicy flattens the grid rather than feeding its NatureCNN a 7x7 image
it cannot take. Importing this module registers the id
(``tianji_dask.envs.minigrid:MiniGridDict-v0``); it needs minigrid (``tianji-dask[minigrid]``).
Only gymnasium, numpy and minigrid are imported (the peers' benchmarks load this very file)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

#: the largest object, colour and state codes of a MiniGrid cell (minigrid.core.constants)
CODE_HIGH = (10, 5, 2)
KEYS = ("image", "direction")


def minigrid_dict(base: str = "MiniGrid-DoorKey-5x5-v0", **kwargs) -> gym.Env:
    """``gym.make(base, **kwargs)`` observing its image and direction (see the module docstring)."""
    try:
        import minigrid  # noqa: F401 - registers the MiniGrid ids
    except ImportError:
        raise ValueError("MiniGridDict-v0: needs minigrid (pip install 'tianji-dask[minigrid]')") from None
    env = gym.wrappers.FilterObservation(gym.make(base, **kwargs), list(KEYS))
    image = env.observation_space["image"]
    high = np.broadcast_to(np.asarray(CODE_HIGH, np.uint8), image.shape)
    space = gym.spaces.Dict({"direction": env.observation_space["direction"],
                             "image": gym.spaces.Box(np.zeros(image.shape, np.uint8), high, dtype=np.uint8)})
    return gym.wrappers.TransformObservation(env, lambda obs: {"direction": obs["direction"], "image": obs["image"]}, space)


if "MiniGridDict-v0" not in gym.registry:
    gym.register("MiniGridDict-v0", entry_point=minigrid_dict)
