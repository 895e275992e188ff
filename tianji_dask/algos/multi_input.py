"""Dict and Tuple observations (nested) as the networks take them: each leaf of the space
described once (``DictObs``), and the multi-input encoder that turns a batch of them into one
feature row: image leaves (3-d uint8 or bool Boxes) through the convolutional encoders of
``encoders.py`` (the Nature-DQN one, or MinAtar's for grids under 36x36), other Box and MultiBinary
leaves flattened as floats, Discrete and MultiDiscrete leaves one-hot; the parts concatenated (as
SB3's ``CombinedExtractor`` does), then the MLP trunk. A Dict's ``action_mask`` leaf (the PettingZoo
and Gymnasium convention) masks the actions and is not fed to the encoder. Observations arrive as
``{path: array}`` (``chunk.obs_leaves``); without image leaves the explorers encode them in numpy.
Pure torch/numpy, no Dask."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from tianji_dask.algos.encoders import ImageObs, encoder, space_leaves

#: the Dict key whose leaf masks the actions (PettingZoo's and Gymnasium's convention)
MASK = "action_mask"
LEAVES_ALLOWED = "Box, Discrete, MultiBinary or MultiDiscrete leaves of a Dict or Tuple (nested)"


@dataclass(frozen=True)
class Leaf:
    """One leaf of a Dict or Tuple observation: its ``path`` (``chunk.obs_leaves``'), what the
    encoder does with it (``kind``: image, vector, categorical or binary), its ``shape`` per
    observation, an image's ``ImageObs``, a categorical leaf's sizes and starts (flattened)."""

    path: str
    kind: str
    shape: tuple[int, ...]
    image: ImageObs | None = None
    nvec: tuple[int, ...] = ()
    start: tuple[int, ...] = ()

    @property
    def width(self) -> int:
        """Features it adds without an own encoder (an image's: its encoder's width)."""
        return int(sum(self.nvec)) if self.kind == "categorical" else int(np.prod(self.shape, dtype=np.int64))

    @staticmethod
    def of(path: str, space, algo: str) -> Leaf:
        if isinstance(space, gym.spaces.Box):
            image = ImageObs.of(space)
            return Leaf(path, "vector" if image is None else "image", tuple(space.shape), image)
        if isinstance(space, gym.spaces.Discrete):
            return Leaf(path, "categorical", (), nvec=(int(space.n),), start=(int(space.start),))
        if isinstance(space, gym.spaces.MultiDiscrete):
            return Leaf(path, "categorical", tuple(space.shape), nvec=tuple(int(n) for n in space.nvec.reshape(-1)),
                        start=tuple(int(s) for s in space.start.reshape(-1)))
        if isinstance(space, gym.spaces.MultiBinary):
            return Leaf(path, "binary", tuple(space.shape))
        raise ValueError(f"{algo}: observation leaf {path!r} is {space}; allowed: {LEAVES_ALLOWED}")


@dataclass(frozen=True)
class DictObs:
    """A Dict or Tuple observation space as the networks take it (their ``obs_dim``): the
    ``leaves`` the encoder takes, in the space's order; ``mask``, the width of its ``action_mask``
    leaf (None: no mask); ``space``, the space less that leaf (what an own encoder's factory gets);
    ``shapes``, every leaf's path and shape, the mask's included (what an exported policy takes)."""

    leaves: tuple[Leaf, ...]
    mask: int | None
    space: Any = field(compare=False, repr=False)
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @staticmethod
    def of(space, algo: str) -> DictObs:
        """ValueError (one line) for a leaf the encoder does not take, a malformed ``action_mask``
        or nothing left to encode."""
        if not isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
            raise ValueError(f"{algo}: {space} is not a Dict or Tuple observation space")
        subs = space_leaves(space)
        mask = None
        if isinstance(space, gym.spaces.Dict) and MASK in space.spaces:
            mask = mask_width(space.spaces[MASK], algo)
        leaves = tuple(Leaf.of(p, s, algo) for p, s in subs.items() if p != MASK)
        if not leaves:
            raise ValueError(f"{algo}: {space} has no leaf to encode besides {MASK}; allowed: {LEAVES_ALLOWED}")
        rest = space if mask is None else gym.spaces.Dict({k: v for k, v in space.spaces.items() if k != MASK})
        shapes = tuple((p, tuple(int(d) for d in s.shape)) for p, s in subs.items())
        return DictObs(leaves, mask, rest, shapes)

    def build(self, ortho: bool = False) -> tuple[MultiInputEncoder, int]:
        """(a new multi-input encoder, its width): what ``encoders.encoder`` gives for this input."""
        enc = MultiInputEncoder(self, ortho)
        return enc, enc.width


def mask_width(space, algo: str) -> int:
    """The width of an ``action_mask`` leaf: a MultiBinary(n), or a one-dimensional Box(0, 1)."""
    if isinstance(space, gym.spaces.MultiBinary) and len(space.shape) == 1:
        return int(space.shape[0])
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1 and np.all(space.low >= 0) and np.all(space.high <= 1):
        return int(space.shape[0])
    raise ValueError(f"{algo}: {MASK} is {space}; allowed: MultiBinary(n) or Box(0, 1, (n,)), n the action count "
                     "(for MultiDiscrete actions the masks of its dimensions, concatenated)")


class MultiInputEncoder(nn.Module):
    """A batch of Dict observations ``{path: (B, *leaf shape)}`` (possibly flattened per row, of
    the env's dtypes) -> features (B, ``width``): each leaf encoded (see the module docstring),
    concatenated in ``DictObs.leaves``' order. ``numpy_ok``: no image leaf, so ``numpy_features``
    encodes a batch in numpy, as the explorers act."""

    def __init__(self, spec: DictObs, ortho: bool = False):
        super().__init__()
        self.leaves = spec.leaves
        self.convs = nn.ModuleDict()
        self.width = 0
        self._onehot: dict[str, tuple] = {}  # path -> (column of each one-hot feature, its value), numpy
        for i, leaf in enumerate(spec.leaves):
            if leaf.kind == "image":
                conv, width = encoder(leaf.image, ortho=ortho)
                self.convs[f"leaf{i}"] = conv
                self.width += width
                continue
            if leaf.kind == "categorical":
                column = np.repeat(np.arange(len(leaf.nvec)), leaf.nvec)
                value = np.concatenate([np.arange(n) + s for n, s in zip(leaf.nvec, leaf.start)])
                self._onehot[leaf.path] = (column, value.astype(np.float32))
                self.register_buffer(f"column{i}", torch.from_numpy(column), persistent=False)
                self.register_buffer(f"value{i}", torch.from_numpy(value.astype(np.float32)), persistent=False)
            self.width += leaf.width
        self.numpy_ok = not len(self.convs)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = []
        for i, leaf in enumerate(self.leaves):
            x = obs[leaf.path]
            rows = x.reshape(x.shape[0], -1)
            if leaf.kind == "image":
                parts.append(self.convs[f"leaf{i}"](x))
            elif leaf.kind == "categorical":  # one-hot by comparison: exports to ONNX as it is
                parts.append((rows.float()[:, getattr(self, f"column{i}")] == getattr(self, f"value{i}")).float())
            else:
                parts.append(rows.float())
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)

    def numpy_features(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """``forward`` in numpy, float32 (B, width), for a space without image leaves."""
        parts = []
        for leaf in self.leaves:
            x = np.asarray(obs[leaf.path])
            rows = x.reshape(len(x), -1)
            if leaf.kind == "categorical":
                column, value = self._onehot[leaf.path]
                parts.append((rows[:, column] == value).astype(np.float32))
            else:
                parts.append(rows.astype(np.float32, copy=False))
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
