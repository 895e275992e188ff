"""Deterministic policies as plain torch modules, for export (TorchScript, ONNX): a float32 batch of
observations (B, *obs_space.shape), as the env gives them, in; the env's actions out. Each wraps a
CPU copy of an algorithm's acting network; observation normalization, when on, is folded in as
constants. What each computes is what the algorithm's ``act`` (exploration off) followed by its
``env_action`` computes. A Dict or Tuple observation comes as a dict of its leaves ``{path: (B,
*leaf shape)}`` (``leaf_inputs`` makes a module of one input per leaf, for export), its
``action_mask`` leaf masking the actions as in acting. ``frozen`` makes the copy an algorithm
hands out. Pure torch, no Dask."""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from tianji_dask.algos.normalize import CLIP


def frozen(module: nn.Module) -> nn.Module:
    """A CPU copy of ``module`` in eval mode without gradients: later training does not change it."""
    return copy.deepcopy(module).cpu().eval().requires_grad_(False)


def _constant(x) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x, np.float32)).clone()


class Normalize(nn.Module):
    """``(obs - mean) / std`` clipped to [-CLIP, CLIP]: ``ObsNormalizer``'s float32 arithmetic,
    with the statistics it holds now; with ``normalizer`` None, the observations as float32."""

    def __init__(self, normalizer=None):
        super().__init__()
        self.on = normalizer is not None
        if self.on:
            self.register_buffer("mean", _constant(normalizer.mean32))
            self.register_buffer("std", _constant(normalizer.std32))

    def forward(self, obs):
        if isinstance(obs, dict):  # leaves go to the multi-input encoder as they are (never normalized)
            return obs
        obs = obs.float()
        if not self.on:
            return obs
        return torch.clamp((obs - self.mean) / self.std, -CLIP, CLIP)


class GreedyQ(nn.Module):
    """argmax_a Q(s, a): int64 (B,)."""

    def __init__(self, q: nn.Module):
        super().__init__()
        self.q = q

    def forward(self, obs) -> torch.Tensor:
        return self.q(obs if isinstance(obs, dict) else obs.float()).argmax(dim=1)


class GreedyCategorical(nn.Module):
    """The most likely action of an ``ActorCritic``'s categorical policy: int64 (B,); with its
    ``heads``, each dimension's (MultiDiscrete, (B, *shape), offset by the space's start) or each
    bit's (MultiBinary)."""

    def __init__(self, net: nn.Module, normalizer=None):
        super().__init__()
        self.normalize = Normalize(normalizer)
        self.net = net

    def forward(self, obs) -> torch.Tensor:
        logits = self.net.logits(self.normalize(obs))
        heads = getattr(self.net, "heads", None)
        return logits.argmax(dim=1) if heads is None else heads.greedy(logits)


class GaussianMean(nn.Module):
    """A ``GaussianActorCritic``'s mean action, clipped to the Box's bounds: float32 (B, A)."""

    def __init__(self, net: nn.Module, low: np.ndarray, high: np.ndarray, normalizer=None):
        super().__init__()
        self.normalize = Normalize(normalizer)
        self.net = net
        self.register_buffer("low", _constant(low))
        self.register_buffer("high", _constant(high))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        mean = self.net.mean(self.normalize(obs))
        return torch.minimum(torch.maximum(mean, self.low), self.high)


class SquashedMean(nn.Module):
    """A ``SquashedGaussianActor``'s tanh(mean), rescaled to the Box's bounds: float32 (B, A)."""

    def __init__(self, actor: nn.Module, scale: np.ndarray, bias: np.ndarray, normalizer=None):
        super().__init__()
        self.normalize = Normalize(normalizer)
        self.actor = actor
        self.register_buffer("scale", _constant(scale))
        self.register_buffer("bias", _constant(bias))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        obs = self.normalize(obs)
        mean, _ = self.actor(obs if isinstance(obs, dict) else obs.flatten(1))
        return torch.tanh(mean) * self.scale + self.bias


class LeafInputs(nn.Module):
    """``module``, which takes a dict of a Dict observation's leaves, as a module of one input per
    leaf, in the order of ``paths``: what TorchScript and ONNX export with one named input each."""

    def __init__(self, module: nn.Module, paths: list[str]):
        super().__init__()
        self.module = module
        self.paths = list(paths)

    def forward(self, *leaves: torch.Tensor):
        return self.module(dict(zip(self.paths, leaves)))


def actor_critic_policy(algo) -> nn.Module:
    """The policy module of a ``SegmentActorCritic`` algorithm (PPO, IMPALA), frozen."""
    if algo.continuous:
        return frozen(GaussianMean(algo.net, algo.action_low, algo.action_high, algo.obs_norm))
    return frozen(GreedyCategorical(algo.net, algo.obs_norm))
