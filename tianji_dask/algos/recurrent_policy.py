"""The deterministic policy of a recurrent actor-critic (``recurrent`` of PPO) as a plain torch
module, for export: ``forward(obs, state) -> (action, new_state)``, one step of a batch. ``obs``
float32 (B, *obs_space.shape) as the env gives them, ``state`` float32 (B, S) the state that step
acts from (``initial_state``, zeros, at an episode's first step); ``action`` int64 (B,), the most
likely action, for Discrete, float32 (B, A), the Gaussian's mean clipped to the Box, for Box; and
``new_state`` (B, S), the state the next step acts from. What it computes is what the algorithm's
``act_recurrent`` with exploration off, then ``env_action``, computes; observation normalization
is folded in as constants (``policy.Normalize``). Pure torch, no Dask."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from tianji_dask.algos.policy import Normalize, frozen


class GreedyRecurrent(nn.Module):
    """The most likely action of a ``RecurrentActorCritic``'s categorical policy, and the state after."""

    def __init__(self, net: nn.Module, normalizer=None):
        super().__init__()
        self.normalize = Normalize(normalizer)
        self.net = net

    def forward(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features, new_state = self.net.step(self.normalize(obs), state.float())
        return self.net.logits(features).argmax(dim=1), new_state


class RecurrentGaussianMean(nn.Module):
    """A ``RecurrentActorCritic``'s Gaussian mean, clipped to the Box's bounds, and the state after."""

    def __init__(self, net: nn.Module, low: np.ndarray, high: np.ndarray, normalizer=None):
        super().__init__()
        self.normalize = Normalize(normalizer)
        self.net = net
        self.register_buffer("low", torch.tensor(np.asarray(low, np.float32)))
        self.register_buffer("high", torch.tensor(np.asarray(high, np.float32)))

    def forward(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features, new_state = self.net.step(self.normalize(obs), state.float())
        return torch.minimum(torch.maximum(self.net.mean(features), self.low), self.high), new_state


def recurrent_policy(algo) -> nn.Module:
    """The policy module of a recurrent ``SegmentActorCritic`` algorithm, frozen."""
    if algo.continuous:
        return frozen(RecurrentGaussianMean(algo.net, algo.action_low, algo.action_high, algo.obs_norm))
    return frozen(GreedyRecurrent(algo.net, algo.obs_norm))
