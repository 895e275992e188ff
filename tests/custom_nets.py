"""Network factories for ``algo.config.encoder`` ("custom_nets:mlp", "custom_nets:conv" with tests/ on the path),
and factories that break the contract, each in its own way. A factory takes the observation space
and returns (torch.nn.Module, output width); the module maps float32 observations
(B, *obs_space.shape) to (B, width) features."""

from __future__ import annotations

import math

import torch
from torch import nn


class Features(nn.Sequential):
    """A Sequential that is recognisably the factory's (tests look for it in the networks)."""


def mlp(obs_space):
    """Flatten, then one 32-unit ReLU layer: any Box observation space."""
    n = math.prod(obs_space.shape)
    return Features(nn.Flatten(), nn.Linear(n, 32), nn.ReLU()), 32


def conv(obs_space):
    """One 3x3 convolution of 8 channels and 64 ReLU units, for (H, W, C) grids such as MinAtar's
    10x10x4 bool ones, or (C, H, W) images when the first dimension is the smallest."""
    shape = tuple(obs_space.shape)
    channels_last = shape[-1] <= shape[0]
    c, h, w = (shape[2], shape[0], shape[1]) if channels_last else shape
    scale = 1.0 / 255.0 if obs_space.dtype == "uint8" else 1.0
    return Features(
        ChannelsFirst(channels_last, scale),
        nn.Conv2d(c, 8, 3), nn.ReLU(), nn.Flatten(),
        nn.Linear(8 * (h - 2) * (w - 2), 64), nn.ReLU()), 64


class ChannelsFirst(nn.Module):
    """(B, H, W, C) -> (B, C, H, W) when ``channels_last``, scaled by ``scale``."""

    def __init__(self, channels_last: bool, scale: float):
        super().__init__()
        self.channels_last, self.scale = channels_last, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.permute(0, 3, 1, 2) if self.channels_last else x) * self.scale


NOT_CALLABLE = 42


def no_tuple(obs_space):
    return nn.Linear(math.prod(obs_space.shape), 8)


def not_a_module(obs_space):
    return "net", 8


def zero_width(obs_space):
    return mlp(obs_space)[0], 0


def wrong_width(obs_space):
    """Says 16, makes 32."""
    return mlp(obs_space)[0], 16


def fails(obs_space):
    raise RuntimeError("no network for you")
