"""Recurrent actor-critic (``algo.config.recurrent`` of PPO and IMPALA): an encoder for image
observations (the built-in convolutional one or the config's own ``encoder``), an MLP trunk, an
LSTM or GRU core shared by the policy and value heads; a categorical head for Discrete actions, a
diagonal Gaussian one (state-independent log-std, as ``gaussian.py``) for Box actions. Also how a
whole segment is unrolled, and the burn-in that recomputes its start state.

The state of each env is a float32 row (N, S): LSTM ``[h, c]`` (S = 2 x hidden), GRU ``h``. The
rule both sides follow: a step acts from the state the previous step left, except that the step
after an invalid (autoreset) one starts from the initial state (zeros). A chunk's ``state0`` is
the state its first step acted from, so the learner unrolls a segment exactly as the explorer
stepped it. With ``burn_in`` K the chunk also carries the K steps before its first (``burn_obs``,
``burn_valid``, ``burn_state``: the state the first of them acted from), and the learner replaces
``state0`` by unrolling those with its current weights (R2D2's remedy for stale stored states)."""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from tianji_dask.algos.base import AlgoConfig
from tianji_dask.algos.encoders import EncoderFactory, ImageObs, encode, encoder
from tianji_dask.algos.gaussian import normal_entropy, normal_logprob
from tianji_dask.algos.models import chain, layer_init, mlp


class RecurrentSpec(AlgoConfig):
    """``{kind: lstm|gru, hidden: N, burn_in: K}``: the recurrent core, its width, and the burn-in
    that recomputes each segment's start state."""

    #: the core: an LSTM (its state [h, c]) or a GRU (its state h)
    kind: Literal["lstm", "gru"] = "lstm"
    #: the core's width (the state per env: 2 x hidden floats for an LSTM, hidden for a GRU)
    hidden: int = Field(64, ge=1)
    #: steps before each segment that the learner unrolls with its current weights (no gradient) to
    #: recompute the segment's start state (R2D2's burn-in; chunks carry those K observations);
    #: 0: the learner unrolls from the state the explorer stored
    burn_in: int = Field(0, ge=0)


class RecurrentActorCritic(nn.Module):
    """Policy and values from encoder(obs) -> trunk -> core(state) -> heads: categorical logits, or
    with ``continuous`` a Gaussian mean and a state-independent log-std."""

    def __init__(self, obs_dim: int | ImageObs | EncoderFactory, action_dim: int, hidden, activation: str,
                 spec: RecurrentSpec, continuous: bool = False):
        super().__init__()
        self.kind, self.size, self.continuous = spec.kind, spec.hidden, continuous
        self.actor_encoder, in_dim = encoder(obs_dim, ortho=True)  # None for flat observations
        self.actor_trunk = mlp(in_dim, hidden, activation, ortho=True)
        width = hidden[-1] if hidden else in_dim
        self.actor_core = (nn.LSTMCell if spec.kind == "lstm" else nn.GRUCell)(width, spec.hidden)
        self.actor_head = layer_init(nn.Linear(spec.hidden, action_dim), gain=0.01)
        if continuous:
            self.actor_logstd = nn.Parameter(torch.zeros(1, action_dim))
        self.critic_head = layer_init(nn.Linear(spec.hidden, 1), gain=1.0)

    @property
    def state_size(self) -> int:
        return 2 * self.size if self.kind == "lstm" else self.size

    def trunk(self, obs: torch.Tensor) -> torch.Tensor:
        """What the core takes [B, width] for a batch of observations (possibly flattened; uint8
        and bool images as they come, the encoder scales them)."""
        return chain(self.actor_trunk, encode(self.actor_encoder, obs))

    def core(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(core output [B, hidden], state after the step [B, S]) from trunk features ``x``."""
        if self.kind == "lstm":
            h, c = self.actor_core(x, (state[:, :self.size], state[:, self.size:]))
            return h, torch.cat([h, c], dim=1)
        h = self.actor_core(x, state)
        return h, h

    def step(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(core output [B, hidden], state after the step [B, S]) for one step of a batch."""
        return self.core(self.trunk(obs), state)

    def _run(self, obs: torch.Tensor, state: torch.Tensor, keep: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """(core outputs of each step, the state after the last) for obs [T, B, ...] from ``state``
        [B, S]; ``keep`` [T, B] (float) is 0 where the state entering that step is reset to zeros.
        The encoder and trunk take all T x B frames at once, the core then steps through time."""
        T, B = obs.shape[:2]
        x = self.trunk(obs.reshape(T * B, *obs.shape[2:])).reshape(T, B, -1)
        outs = []
        for t in range(T):
            out, state = self.core(x[t], state * keep[t].unsqueeze(1))
            outs.append(out)
        return outs, state

    def unroll(self, obs: torch.Tensor, state0: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Core outputs [T, B, hidden] for obs [T, B, ...] from ``state0`` [B, S] (see ``_run``)."""
        return torch.stack(self._run(obs, state0, keep)[0])

    def final_state(self, obs: torch.Tensor, state0: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """The state [B, S] after stepping obs [T, B, ...] from ``state0`` (see ``_run``)."""
        return self._run(obs, state0, keep)[1]

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Categorical logits (Discrete actions)."""
        return F.linear(features, self.actor_head.weight, self.actor_head.bias)

    def mean(self, features: torch.Tensor) -> torch.Tensor:
        """The Gaussian's mean (Box actions); its log-std is ``actor_logstd``."""
        return F.linear(features, self.actor_head.weight, self.actor_head.bias)

    def value(self, features: torch.Tensor) -> torch.Tensor:
        return F.linear(features, self.critic_head.weight, self.critic_head.bias).squeeze(-1)

    def evaluate(self, features: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probabilities, or log-densities for Box actions, of ``actions`` [...], policy
        entropies [...]) for core outputs [..., hidden] and actions [...] ([..., A] for Box)."""
        if self.continuous:
            mean = self.mean(features)
            logstd = self.actor_logstd.expand_as(mean)
            return normal_logprob(actions.float(), mean, logstd), normal_entropy(logstd)
        logp_all = torch.log_softmax(self.logits(features), dim=-1)
        logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        return logp, -(logp_all.exp() * logp_all).sum(-1)


def keep_mask(valid: np.ndarray) -> np.ndarray:
    """[T+1, N] float32: 0 at step t+1 where step t was invalid (the env reset there), else 1;
    step 0's state is the chunk's ``state0`` as stored."""
    keep = np.ones((valid.shape[0] + 1, valid.shape[1]), dtype=np.float32)
    keep[1:] = valid
    return keep


def frames(obs: np.ndarray) -> np.ndarray:
    """Observations [T, N, ...] as the networks take them, one flat row per frame: uint8 and bool
    images keep their dtype (the encoder scales them), anything else becomes float32."""
    flat = obs.reshape(obs.shape[0], obs.shape[1], -1)
    return flat if flat.dtype in (np.uint8, np.bool_) else flat.astype(np.float32, copy=False)


def segment_features(net: RecurrentActorCritic, obs: np.ndarray, seg: dict, device) -> torch.Tensor:
    """Core outputs [T+1, N, hidden] of a whole segment (every frame, obs[T] included), unrolled
    from its ``state0``."""
    return net.unroll(torch.as_tensor(frames(obs)).to(device), torch.as_tensor(seg["state0"]).to(device),
                      torch.as_tensor(keep_mask(seg["valid"])).to(device))


def segment_terms(net: RecurrentActorCritic, obs: np.ndarray, seg: dict, device) -> tuple[torch.Tensor, ...]:
    """(log-probabilities [T, N] of the segment's actions, entropies [T, N], values [T+1, N]) of a
    whole segment unrolled from its ``state0``, with gradients unless called under no_grad."""
    feats = segment_features(net, obs, seg, device)
    T = seg["rewards"].shape[0]
    logp, entropy = net.evaluate(feats[:T], torch.as_tensor(seg["actions"]).to(device))
    return logp, entropy, net.value(feats)


def with_start_state(algo, seg: dict) -> dict:
    """``seg`` as the learner unrolls it: as it is without burn-in; with ``algo.burn_in`` its
    ``state0`` recomputed from ``burn_state`` by stepping ``burn_obs`` with the current weights
    (no gradient), the state reset to zeros after each invalid step as the explorer reset it.
    ValueError for a chunk without ``state0``, or without the burn-in fields burn_in asks for."""
    name = type(algo).__name__
    if "state0" not in seg:
        raise ValueError(f"{name}: recurrent: chunk has no state0 (was it collected by a recurrent policy's act_recurrent?)")
    if not algo.burn_in:
        return seg
    if "burn_obs" not in seg:
        raise ValueError(f"{name}: recurrent.burn_in {algo.burn_in}: chunk has no burn_obs "
                         "(was it collected by a Rollout of this policy?)")
    device = algo.device
    keep = torch.as_tensor(keep_mask(seg["burn_valid"])).to(device)
    with torch.no_grad():
        state = algo.net.final_state(torch.as_tensor(frames(algo.network_obs(seg["burn_obs"]))).to(device),
                                     torch.as_tensor(seg["burn_state"]).to(device), keep[:-1])
        state0 = (state * keep[-1].unsqueeze(1)).cpu().numpy()
    return {**seg, "state0": state0}
