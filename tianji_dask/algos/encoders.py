"""Observation encoders: which observations are images, and the convolutional encoders that
turn them into features. The Nature-DQN encoder for frames such as Atari's stacked 84x84 uint8
(C, H, W); the MinAtar paper's small one for grids too small for it (under 36x36), such as
MinAtar's 10x10xC bool (H, W, C). Flat Box observations need none (an MLP takes them)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class ImageObs:
    """An image observation space as the networks take it: the env's array ``shape``, whether
    its channels come last (H, W, C) or first (C, H, W), and the factor to [0, 1] (1/255 for
    uint8 pixels, 1 for bool grids)."""

    shape: tuple[int, int, int]
    channels_last: bool = False
    scale: float = 1.0 / 255.0

    @property
    def chw(self) -> tuple[int, int, int]:
        h, w, c = self.shape
        return (c, h, w) if self.channels_last else self.shape

    @staticmethod
    def of(obs_space) -> ImageObs | None:
        """The image description of a Box space, or None for a flat one. Images: 3-d uint8 or
        bool. Channels come first when the first dimension is smaller than the last (Atari's
        stacked frames, 4x84x84), else last (gymnasium's convention: MinAtar's 10x10xC)."""
        shape = tuple(int(d) for d in obs_space.shape)
        if len(shape) != 3 or obs_space.dtype not in (np.uint8, np.bool_):
            return None
        return ImageObs(shape, channels_last=not shape[0] < shape[2], scale=1.0 if obs_space.dtype == np.bool_ else 1.0 / 255.0)


def check_spaces(obs_space, action_space, algo: str) -> tuple[int | ImageObs, int]:
    """(what the networks take as ``obs_dim``, number of actions): the flat observation size, or
    the ``ImageObs`` of image observations. ValueError for spaces we don't handle."""
    import gymnasium as gym

    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"{algo}: only Discrete action spaces are supported, got {action_space}")
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"{algo}: only Box observation spaces are supported, got {obs_space}")
    image = ImageObs.of(obs_space)
    if image is not None:
        return image, int(action_space.n)
    return int(np.prod(obs_space.shape)), int(action_space.n)


def _as_image(obs: torch.Tensor, image: ImageObs) -> torch.Tensor:
    """Observations (possibly flattened; uint8, bool or float) as float (B, C, H, W) in [0, 1]."""
    x = obs.reshape(-1, *image.shape).float()
    if image.channels_last:
        x = x.permute(0, 3, 1, 2)
    return x * image.scale if image.scale != 1.0 else x


class NatureCNN(nn.Module):
    """The convolutional encoder of Mnih et al. 2015 (Nature DQN): pixels in [0, 255] (or an
    ``ImageObs``'s range) -> 512 features. Input may come flattened; it is reshaped to the
    image's shape (and channels moved first). Frames must be at least 36x36."""

    features = 512
    min_size = 36  # what its strides and kernels need

    def __init__(self, shape: tuple[int, int, int] | ImageObs):
        super().__init__()
        self.image = shape if isinstance(shape, ImageObs) else ImageObs(tuple(shape))
        self.shape = self.image.shape
        c, h, w = self.image.chw
        self.convs = nn.Sequential(
            nn.Conv2d(c, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, c, h, w)).shape[1]
        self.fc = nn.Linear(flat, self.features)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(self.convs(_as_image(obs, self.image))))


class MinAtarCNN(nn.Module):
    """The network of Young & Tian 2019 (MinAtar) up to its heads: one 3x3 convolution, 16
    channels, stride 1, ReLU, then 128 ReLU units. For small grids such as MinAtar's 10x10xC
    bool observations (cast to float32); input may come flattened."""

    features = 128

    def __init__(self, image: ImageObs):
        super().__init__()
        self.image = image
        c, h, w = image.chw
        self.conv = nn.Conv2d(c, 16, 3, stride=1)
        self.fc = nn.Linear(16 * (h - 2) * (w - 2), self.features)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv(_as_image(obs, self.image)))
        return torch.relu(self.fc(x.flatten(1)))


def encoder(obs_dim: int | ImageObs | tuple[int, int, int]) -> tuple[nn.Module | None, int]:
    """(image encoder or None, width of what the MLP trunk receives). Images smaller than the
    Nature CNN takes (MinAtar's 10x10) get MinAtar's network; a bare tuple is (C, H, W) uint8."""
    if isinstance(obs_dim, tuple):
        obs_dim = ImageObs(tuple(obs_dim))
    if isinstance(obs_dim, ImageObs):
        _, h, w = obs_dim.chw
        if min(h, w) < NatureCNN.min_size:
            if min(h, w) < 3:
                raise ValueError(f"image observations {obs_dim.shape}: at least 3x3 needed")
            return MinAtarCNN(obs_dim), MinAtarCNN.features
        return NatureCNN(obs_dim), NatureCNN.features
    return None, obs_dim


def encode(enc: nn.Module | None, obs: torch.Tensor) -> torch.Tensor:
    """Features for the trunk: the encoder's, or the flattened float observation."""
    return enc(obs) if enc is not None else obs.flatten(1).float()
