"""Continuous actions: the diagonal Gaussian actor-critic of CleanRL's ppo_continuous_action.py
(PPO, IMPALA) and the tanh-squashed Gaussian actor and Q network of its sac_continuous_action.py
(SAC), their numpy acting paths, and the log-density and entropy of a diagonal Gaussian. Their
observations go through an MLP, or first through a config's own ``encoder`` (``encoders.py``) or,
for Dict and Tuple observations, the multi-input encoder (``multi_input.py``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tianji_dask.algos.encoders import EncoderFactory, encode, encoder
from tianji_dask.algos.models import NumpyMLP, NumpyViews, as_batch, chain, layer_init, mlp
from tianji_dask.algos.spaces import OBS_ALLOWED, check_mask, observation_input

HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
#: SAC's log-std is squashed into [LOG_STD_MIN, LOG_STD_MAX] (as CleanRL does)
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


def check_box_spaces(obs_space, action_space, algo: str, finite: bool = False, images: bool = False):
    """(flat observation size, or the ``DictObs`` of a Dict or Tuple observation; action size) for
    Box actions; with ``finite`` the action bounds must be finite; with ``images`` (an own
    ``encoder`` takes them) image observations too. ValueError naming what is allowed otherwise."""
    import gymnasium as gym

    if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
        raise ValueError(f"{algo}: only Box (continuous, one-dimensional) action spaces are supported, got {action_space}")
    if finite and not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
        raise ValueError(f"{algo}: only Box action spaces with finite bounds are supported (actions are "
                         f"squashed into them), got {action_space}")
    if isinstance(obs_space, (gym.spaces.Dict, gym.spaces.Tuple)):
        obs_dim = observation_input(obs_space, algo)
        check_mask(obs_dim, None, algo)
        return obs_dim, int(action_space.shape[0])
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"{algo}: observation space {obs_space} is not supported; allowed: {OBS_ALLOWED}")
    if obs_space.dtype == np.uint8 and len(obs_space.shape) == 3 and not images:
        raise ValueError(f"{algo}: continuous actions need flat Box observations (no images) unless an own "
                         f"encoder takes them (algo.config.encoder: 'module:factory'), got {obs_space}")
    return int(np.prod(obs_space.shape)), int(action_space.shape[0])


def normal_logprob(x: torch.Tensor, mean: torch.Tensor, logstd: torch.Tensor) -> torch.Tensor:
    """log N(x; mean, exp(logstd)^2), summed over the last (action) dimension."""
    z = (x - mean) * torch.exp(-logstd)
    return (-0.5 * z * z - logstd - HALF_LOG_2PI).sum(-1)


def normal_entropy(logstd: torch.Tensor) -> torch.Tensor:
    """Entropy of a diagonal Gaussian, summed over the last (action) dimension."""
    return (0.5 + HALF_LOG_2PI + logstd).sum(-1)


def sample_gaussian(mean: np.ndarray, logstd: np.ndarray, rng: np.random.Generator,
                    greedy: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(float32 actions [B, A], float32 log-densities [B] of those actions): mean + std * N(0, 1),
    or the mean with ``greedy``."""
    if greedy:
        noise = np.zeros_like(mean)
        actions = mean
    else:
        noise = rng.standard_normal(mean.shape, dtype=np.float32)
        actions = mean + np.exp(logstd) * noise
    logp = (-0.5 * noise * noise - logstd - np.float32(HALF_LOG_2PI)).sum(-1)
    return actions.astype(np.float32, copy=False), logp.astype(np.float32, copy=False)


class GaussianActorCritic(NumpyViews, nn.Module):
    """CleanRL's continuous-action agent: separate actor and critic MLPs with orthogonal init
    (hidden gain sqrt(2), actor mean head 0.01, value head 1) and a state-independent log-std,
    initialised to 0. With an own encoder, actor and critic each get an instance."""

    def __init__(self, obs_dim: int | EncoderFactory, action_dim: int, hidden: Sequence[int] = (64, 64),
                 activation: str = "tanh"):
        super().__init__()
        self.actor_encoder, in_dim = encoder(obs_dim, ortho=True)
        self.critic_encoder = encoder(obs_dim, ortho=True)[0]
        width = hidden[-1] if hidden else in_dim
        self.actor_trunk = mlp(in_dim, hidden, activation, ortho=True)
        self.actor_head = layer_init(nn.Linear(width, action_dim), gain=0.01)
        self.actor_logstd = nn.Parameter(torch.zeros(1, action_dim))
        self.critic_trunk = mlp(in_dim, hidden, activation, ortho=True)
        self.critic_head = layer_init(nn.Linear(width, 1), gain=1.0)

    def mean(self, obs: torch.Tensor) -> torch.Tensor:
        h = chain(self.actor_trunk, encode(self.actor_encoder, obs))
        return F.linear(h, self.actor_head.weight, self.actor_head.bias)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        h = chain(self.critic_trunk, encode(self.critic_encoder, obs))
        return F.linear(h, self.critic_head.weight, self.critic_head.bias).squeeze(-1)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log-densities of ``actions`` [B], policy entropies [B], values [B])."""
        logstd = self.actor_logstd.expand(len(obs), -1)
        return normal_logprob(actions.float(), self.mean(obs), logstd), normal_entropy(logstd), self.value(obs)

    def numpy_mean(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(action means [B, A], log-std [1, A]) in numpy, for acting (see NumpyMLP); through
        torch with an own encoder."""
        if self.in_torch(self.actor_encoder, self.actor_head.weight):
            mean = self.torch_acting(self.mean, as_batch(obs), self.actor_head.weight.device)
            return mean, self.actor_logstd.detach().cpu().numpy()
        mlp_np, logstd = self.views(lambda: (NumpyMLP(self.actor_trunk, self.actor_head), self.actor_logstd.detach().numpy()))
        return mlp_np(self.features(self.actor_encoder, obs)), logstd


class SoftQNetwork(nn.Module):
    """Q(s, a) for actions in [-1, 1]: an MLP over the observation (or an own encoder's features
    of it) and the action together."""

    def __init__(self, obs_dim: int | EncoderFactory, action_dim: int, hidden: Sequence[int]):
        super().__init__()
        self.encoder, in_dim = encoder(obs_dim)
        self.trunk = mlp(in_dim + action_dim, hidden, "relu")
        self.head = nn.Linear(hidden[-1] if hidden else in_dim + action_dim, 1)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Q of flat float32 ``obs`` [B, obs_dim] and ``actions`` [B, A]."""
        x = obs if self.encoder is None else self.encoder(obs)
        h = chain(self.trunk, torch.cat([x, actions], 1))
        return F.linear(h, self.head.weight, self.head.bias).squeeze(-1)


class SquashedGaussianActor(NumpyViews, nn.Module):
    """tanh(u), u ~ N(mean(s), std(s)): actions in [-1, 1]."""

    def __init__(self, obs_dim: int | EncoderFactory, action_dim: int, hidden: Sequence[int]):
        super().__init__()
        self.encoder, in_dim = encoder(obs_dim)
        width = hidden[-1] if hidden else in_dim
        self.trunk = mlp(in_dim, hidden, "relu")
        self.mean_head = nn.Linear(width, action_dim)
        self.logstd_head = nn.Linear(width, action_dim)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean [B, A], log-std [B, A]) of the Gaussian before the squashing, for flat float32 ``obs``."""
        h = chain(self.trunk, obs if self.encoder is None else self.encoder(obs))
        log_std = torch.tanh(F.linear(h, self.logstd_head.weight, self.logstd_head.bias))
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)
        return F.linear(h, self.mean_head.weight, self.mean_head.bias), log_std

    def sample(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(actions tanh(mean + std * noise) [B, A], their log-densities log pi(a|s) [B]), the
        reparameterized sample of standard normal ``noise``."""
        mean, log_std = self(obs)
        u = mean + log_std.exp() * noise
        actions = torch.tanh(u)
        # change of variables through tanh; 1e-6 keeps the log finite where tanh saturates
        log_pi = normal_logprob(u, mean, log_std) - torch.log(1 - actions.pow(2) + 1e-6).sum(-1)
        return actions, log_pi

    def numpy_forward(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``forward`` in numpy, for acting (see NumpyMLP); through torch with an own encoder."""
        if self.in_torch(self.encoder, self.mean_head.weight):
            return self.torch_acting(self, as_batch(obs), self.mean_head.weight.device)
        trunk, mean_head, logstd_head = self.views(lambda: (NumpyMLP(self.trunk), NumpyMLP(self.mean_head),
                                                           NumpyMLP(self.logstd_head)))
        h = trunk(self.features(self.encoder, obs))
        log_std = np.tanh(logstd_head(h))
        return mean_head(h), LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)
