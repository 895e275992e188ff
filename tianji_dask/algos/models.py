"""Small MLPs for the algorithms: a Q-network (optionally dueling) and an actor-critic.

Only flat Box observations and Discrete actions are supported for now.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh}


def check_spaces(obs_space, action_space, algo: str) -> tuple[int, int]:
    """(flat observation size, number of actions); ValueError for spaces we don't handle."""
    import gymnasium as gym

    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"{algo}: only Discrete action spaces are supported, got {action_space}")
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"{algo}: only Box observation spaces are supported, got {obs_space}")
    return int(np.prod(obs_space.shape)), int(action_space.n)


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


class QNetwork(nn.Module):
    """Q(s, ·) for Discrete actions; with ``dueling`` Q = V + A - mean(A)."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: Sequence[int] = (64, 64),
                 activation: str = "relu", dueling: bool = False):
        super().__init__()
        self.trunk = mlp(obs_dim, hidden, activation)
        width = hidden[-1] if hidden else obs_dim
        self.dueling = dueling
        if dueling:
            self.value = nn.Linear(width, 1)
            self.advantage = nn.Linear(width, n_actions)
        else:
            self.head = nn.Linear(width, n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = self.trunk(obs.flatten(1))
        if self.dueling:
            adv = self.advantage(h)
            return self.value(h) + adv - adv.mean(dim=1, keepdim=True)
        return self.head(h)


class ActorCritic(nn.Module):
    """Categorical policy logits and state values, with separate trunks (CleanRL's default) or a
    shared one. Orthogonal init: hidden gain sqrt(2), policy head 0.01, value head 1."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: Sequence[int] = (64, 64),
                 activation: str = "tanh", shared: bool = False):
        super().__init__()
        width = hidden[-1] if hidden else obs_dim
        self.shared = shared
        self.actor_trunk = mlp(obs_dim, hidden, activation, ortho=True)
        self.critic_trunk = None if shared else mlp(obs_dim, hidden, activation, ortho=True)
        self.actor_head = layer_init(nn.Linear(width, n_actions), gain=0.01)
        self.critic_head = layer_init(nn.Linear(width, 1), gain=1.0)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor_head(self.actor_trunk(obs.flatten(1)))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        trunk = self.actor_trunk if self.shared else self.critic_trunk
        return self.critic_head(trunk(obs.flatten(1))).squeeze(-1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, A], values [B])."""
        obs = obs.flatten(1)
        h = self.actor_trunk(obs)
        hv = h if self.shared else self.critic_trunk(obs)
        return self.actor_head(h), self.critic_head(hv).squeeze(-1)


def seeded_init(seed: int, build):
    """Call ``build()`` with torch's global RNG seeded, restoring that RNG afterwards, so that
    making an algorithm neither depends on nor disturbs anyone else's random stream."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def weights_of(module: nn.Module, keys=None) -> dict[str, np.ndarray]:
    """Parameters and buffers (all, or those named in ``keys``) as independent CPU float32
    numpy arrays."""
    state = module.state_dict()
    keys = state.keys() if keys is None else keys
    return {k: state[k].detach().to("cpu", torch.float32).numpy().copy() for k in keys}


def load_weights(module: nn.Module, weights: dict[str, np.ndarray], keys=None) -> None:
    """Copy a ``weights_of`` dict into ``module`` in place; it must hold exactly ``keys`` (default:
    every entry of the module's state dict), with matching shapes."""
    state = module.state_dict()
    expected = set(state.keys() if keys is None else keys)
    missing = expected - weights.keys()
    extra = weights.keys() - expected
    if missing or extra:
        raise ValueError(f"weights do not match the network: missing {sorted(missing)}, unexpected {sorted(extra)}")
    with torch.no_grad():
        for k in expected:
            v = state[k]
            src = torch.as_tensor(np.asarray(weights[k]))
            if src.shape != v.shape:
                raise ValueError(f"weights[{k!r}]: shape {tuple(src.shape)} != {tuple(v.shape)}")
            v.copy_(src)
