"""Networks for the algorithms: a Q-network (optionally dueling), an actor-critic, per-agent MLPs,
and the numpy inference the explorers act with. The optimizer is in ``optim.py``, moving weights
about in ``weights.py``.

Flat Box observations go through an MLP; image observations (3-d uint8 or bool Boxes) through a
convolutional encoder first: the Nature-DQN one for frames such as Atari's stacked 84x84 uint8
(C, H, W), the MinAtar paper's small one for grids too small for that (under 36x36), such as
MinAtar's 10x10xC bool (H, W, C); Dict and Tuple observations through a multi-input encoder
(``multi_input.py``), whose ``action_mask`` leaf masks the logits and Q-values. Actions are Discrete
here, or for the actor-critic any of ``heads.ActionHeads``; continuous actions' networks are in
``gaussian.py`` (PPO, IMPALA) and ``sac.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tianji_dask.algos.encoders import ImageObs, encode, encoder  # noqa: F401 - the networks' API
from tianji_dask.algos.heads import ActionHeads, mask_numpy, mask_torch, sample_categorical  # noqa: F401 - the networks' API
from tianji_dask.algos.multi_input import MASK

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh}


def layer_init(layer: nn.Linear, gain: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights and constant bias, as in CleanRL's PPO."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, hidden: Sequence[int], activation: str = "relu", ortho: bool = False) -> nn.Sequential:
    """Hidden layers only (each Linear followed by the activation); output width is hidden[-1]."""
    act = ACTIVATIONS[activation]
    layers: list[nn.Module] = []
    for width in hidden:
        lin = nn.Linear(in_dim, width)
        layers += [layer_init(lin) if ortho else lin, act()]
        in_dim = width
    return nn.Sequential(*layers)


def chain(modules: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """``modules(x)`` without nn.Module's per-call machinery (hooks etc.), whose overhead is a
    large part of a small network's forward pass on CPU."""
    for m in modules:
        kind = type(m)
        if kind is nn.Linear:
            x = F.linear(x, m.weight, m.bias)
        elif kind is nn.ReLU:
            x = torch.relu(x)
        elif kind is nn.Tanh:
            x = torch.tanh(x)
        else:
            x = m(x)
    return x


class NumpyMLP:
    """Inference of a chain of Linear/ReLU/Tanh modules in numpy, reading the torch parameters
    through zero-copy views (so in-place updates, ``load_state_dict`` and optimiser steps are
    seen at once). For the small batches of the env-stepping loop this is about twice as fast as
    a torch forward pass, whose per-op overhead dominates there."""

    def __init__(self, *modules: nn.Module):
        self.layers: list[tuple] = []
        for m in modules:
            for layer in (m if isinstance(m, nn.Sequential) else [m]):
                if isinstance(layer, nn.Linear):
                    self.layers.append(("linear", layer.weight.detach().numpy().T, layer.bias.detach().numpy()))
                elif isinstance(layer, nn.ReLU):
                    self.layers.append(("relu",))
                elif isinstance(layer, nn.Tanh):
                    self.layers.append(("tanh",))
                else:
                    raise TypeError(f"NumpyMLP: unsupported layer {layer}")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.layers and self.layers[0][0] != "linear":
            x = x.copy()  # activations work in place: never on the caller's array
        for layer in self.layers:
            if layer[0] == "linear":
                x = x @ layer[1]
                x += layer[2]
            elif layer[0] == "relu":
                np.maximum(x, 0.0, out=x)
            else:
                np.tanh(x, out=x)
        return x


class NumpyViews:
    """What a network that acts in numpy (``NumpyMLP``) on zero-copy views of its parameters
    needs, before ``nn.Module`` among its bases: the views made on first use (``views``), made
    anew after ``.to(device)`` and friends replace the parameters, and never pickled (a pickle
    would copy them, detached from the parameters). ``in_torch``: whether to act through torch
    instead (convolutions or an own encoder, or weights off the CPU)."""

    _np = None

    def __getstate__(self):
        return {**self.__dict__, "_np": None}

    def _apply(self, *args, **kwargs):
        self._np = None
        return super()._apply(*args, **kwargs)

    def views(self, build):
        """The numpy views ``build()`` makes, made once."""
        if self._np is None:
            self._np = build()
        return self._np

    @staticmethod
    def in_torch(encoder, weight: torch.Tensor) -> bool:
        """Act through torch: an encoder numpy cannot run (convolutions, an own one), or weights off the CPU."""
        return (encoder is not None and not getattr(encoder, "numpy_ok", False)) or weight.device.type != "cpu"

    @staticmethod
    def features(encoder, obs) -> np.ndarray:
        """What the numpy MLP takes: the flat float32 observations, or a multi-input encoder's features."""
        return as_batch(obs) if encoder is None else encoder.numpy_features(obs)

    @staticmethod
    def torch_acting(fn, obs, device):
        """``fn`` on ``obs`` (an array, or a dict of leaves) through torch, without gradients;
        numpy out (each of a tuple)."""
        with torch.no_grad():
            if isinstance(obs, dict):
                x = {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in obs.items()}
            else:
                x = torch.from_numpy(np.ascontiguousarray(obs)).to(device)
            out = fn(x)
        return tuple(o.cpu().numpy() for o in out) if isinstance(out, tuple) else out.cpu().numpy()


def as_batch(obs) -> np.ndarray:
    """Observations as a float32 [B, obs_dim] array (no copy when they already are); a dict of a
    Dict observation's leaves as it is."""
    if isinstance(obs, dict):
        return obs
    obs = np.asarray(obs, dtype=np.float32)
    return obs.reshape(len(obs), -1)


class QNetwork(NumpyViews, nn.Module):
    """Q(s, ·) for Discrete actions; with ``dueling`` Q = V + A - mean(A). ``masked``: the
    observations' ``action_mask`` leaf sets masked actions' Q-values to ``heads.MASKED`` (a row
    masked entirely is left as it is), so the greedy action and a target's max are over valid ones."""

    def __init__(self, obs_dim, n_actions: int, hidden: Sequence[int] = (64, 64),
                 activation: str = "relu", dueling: bool = False, masked: bool = False):
        super().__init__()
        self.masked = masked
        self.encoder, in_dim = encoder(obs_dim)
        self.trunk = mlp(in_dim, hidden, activation)
        width = hidden[-1] if hidden else in_dim
        self.dueling = dueling
        if dueling:
            self.value = nn.Linear(width, 1)
            self.advantage = nn.Linear(width, n_actions)
        else:
            self.head = nn.Linear(width, n_actions)

    def forward(self, obs) -> torch.Tensor:
        h = chain(self.trunk, encode(self.encoder, obs))
        if self.dueling:
            adv = F.linear(h, self.advantage.weight, self.advantage.bias)
            q = F.linear(h, self.value.weight, self.value.bias) + adv - adv.mean(dim=1, keepdim=True)
        else:
            q = F.linear(h, self.head.weight, self.head.bias)
        return mask_torch(q, obs[MASK], fallback=True) if self.masked else q

    def numpy_forward(self, obs) -> np.ndarray:
        """``forward`` in numpy, for acting (see NumpyMLP); through torch with an image encoder."""
        weight = (self.advantage if self.dueling else self.head).weight
        if self.in_torch(self.encoder, weight):
            return self.torch_acting(self.forward, obs, weight.device)
        x = self.features(self.encoder, obs)
        if not self.dueling:
            q = self.views(lambda: NumpyMLP(self.trunk, self.head))(x)
        else:
            trunk, value, advantage = self.views(lambda: (NumpyMLP(self.trunk), NumpyMLP(self.value), NumpyMLP(self.advantage)))
            h = trunk(x)
            adv = advantage(h)
            q = value(h) + adv - adv.mean(axis=1, keepdims=True)
        if not self.masked:
            return q
        mask = np.asarray(obs[MASK]) > 0
        return mask_numpy(q, mask | ~mask.any(axis=1, keepdims=True))


class ActorCritic(NumpyViews, nn.Module):
    """Categorical policy logits and state values, with separate trunks (CleanRL's default) or a
    shared one. Orthogonal init: hidden gain sqrt(2), policy head 0.01, value head 1. ``heads``:
    the distribution the logits parameterize when it is not one categorical (MultiDiscrete,
    MultiBinary); ``masked``: the observations' ``action_mask`` leaf masks the logits."""

    def __init__(self, obs_dim, n_actions: int, hidden: Sequence[int] = (64, 64),
                 activation: str = "tanh", shared: bool = False, heads: ActionHeads | None = None,
                 masked: bool = False):
        super().__init__()
        self.heads = None if heads is None or heads.kind == "discrete" else heads
        self.masked = masked
        self.actor_encoder, in_dim = encoder(obs_dim, ortho=True)
        self.critic_encoder = None if shared else encoder(obs_dim, ortho=True)[0]
        width = hidden[-1] if hidden else in_dim
        self.shared = shared
        self.actor_trunk = mlp(in_dim, hidden, activation, ortho=True)
        self.critic_trunk = None if shared else mlp(in_dim, hidden, activation, ortho=True)
        self.actor_head = layer_init(nn.Linear(width, n_actions), gain=0.01)
        self.critic_head = layer_init(nn.Linear(width, 1), gain=1.0)

    def logits(self, obs) -> torch.Tensor:
        h = chain(self.actor_trunk, encode(self.actor_encoder, obs))
        logits = F.linear(h, self.actor_head.weight, self.actor_head.bias)
        return mask_torch(logits, obs[MASK]) if self.masked else logits

    def numpy_logits(self, obs) -> np.ndarray:
        """``logits`` in numpy, for acting (see NumpyMLP); through torch with an image encoder."""
        if self.in_torch(self.actor_encoder, self.actor_head.weight):
            return self.torch_acting(self.logits, obs, self.actor_head.weight.device)
        logits = self.views(lambda: NumpyMLP(self.actor_trunk, self.actor_head))(self.features(self.actor_encoder, obs))
        return mask_numpy(logits, obs[MASK]) if self.masked else logits

    def value(self, obs) -> torch.Tensor:
        if self.shared:
            h = chain(self.actor_trunk, encode(self.actor_encoder, obs))
        else:
            h = chain(self.critic_trunk, encode(self.critic_encoder, obs))
        return F.linear(h, self.critic_head.weight, self.critic_head.bias).squeeze(-1)

    def forward(self, obs) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, A], values [B])."""
        x = encode(self.actor_encoder, obs)
        h = chain(self.actor_trunk, x)
        if self.shared:
            hv = h
        else:
            hv = chain(self.critic_trunk, x if self.critic_encoder is None else encode(self.critic_encoder, obs))
        logits = F.linear(h, self.actor_head.weight, self.actor_head.bias)
        if self.masked:
            logits = mask_torch(logits, obs[MASK])
        return logits, F.linear(hv, self.critic_head.weight, self.critic_head.bias).squeeze(-1)

    def evaluate(self, obs, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log-probabilities of ``actions`` [B], policy entropies [B], values [B])."""
        logits, value = self(obs)
        if self.heads is not None:
            return (*self.heads.log_prob_entropy(logits, actions), value)
        logp_all = torch.log_softmax(logits, dim=1)
        logprob = logp_all.gather(1, actions.long().unsqueeze(1)).squeeze(1)
        return logprob, -(logp_all.exp() * logp_all).sum(1), value


class PerAgentMLP(NumpyViews, nn.Module):
    """One independent MLP per agent, all evaluated together by batched matrix products: input
    (n_agents, B, in_dim) -> output (n_agents, B, out_dim). Layers are initialised as nn.Linear's
    default; the output layer's weights are scaled by ``out_gain`` (small: near-uniform logits)."""

    def __init__(self, n_agents: int, in_dim: int, hidden: Sequence[int], out_dim: int,
                 activation: str = "relu", out_gain: float = 1.0):
        super().__init__()
        self.activation = activation
        widths = [in_dim, *hidden, out_dim]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(widths[:-1], widths[1:]):
            bound = 1.0 / math.sqrt(fan_in)
            self.weights.append(nn.Parameter(torch.empty(n_agents, fan_in, fan_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(n_agents, 1, fan_out).uniform_(-bound, bound)))
        with torch.no_grad():
            self.weights[-1].mul_(out_gain)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = torch.relu if self.activation == "relu" else torch.tanh
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = torch.baddbmm(b, x, w)
            if i < last:
                x = act(x)
        return x

    def numpy_forward(self, x: np.ndarray) -> np.ndarray:
        """``forward`` in numpy on zero-copy views of the parameters, for acting."""
        layers = self.views(lambda: [(w.detach().numpy(), b.detach().numpy()) for w, b in zip(self.weights, self.biases)])
        last = len(layers) - 1
        for i, (w, b) in enumerate(layers):
            x = np.matmul(x, w) + b
            if i < last:
                x = np.maximum(x, 0.0, out=x) if self.activation == "relu" else np.tanh(x, out=x)
        return x
