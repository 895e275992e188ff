"""Recurrent actor-critic for PPO (``algo.config.recurrent``): an MLP trunk, an LSTM or GRU core
shared by the policy and value heads, and the truncated-BPTT update over whole env sequences.

The state of each env is a float32 row (N, S): LSTM ``[h, c]`` (S = 2 x hidden), GRU ``h``. The
rule both sides follow: a step acts from the state the previous step left, except that the step
after an invalid (autoreset) one starts from the initial state (zeros). A chunk's ``state0`` is
the state its first step acted from, so the learner unrolls a segment exactly as the explorer
stepped it."""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from tianji_dask.algos.base import AlgoConfig
from tianji_dask.algos.models import chain, layer_init, mlp


class RecurrentSpec(AlgoConfig):
    """``{kind: lstm|gru, hidden: N}``: the recurrent core and its width."""

    kind: Literal["lstm", "gru"] = "lstm"
    hidden: int = Field(64, ge=1)


class RecurrentActorCritic(nn.Module):
    """Categorical logits and values from trunk(obs) -> core(state) -> heads."""

    def __init__(self, obs_dim: int, n_actions: int, hidden, activation: str, spec: RecurrentSpec):
        super().__init__()
        self.kind, self.size = spec.kind, spec.hidden
        self.actor_trunk = mlp(obs_dim, hidden, activation, ortho=True)
        width = hidden[-1] if hidden else obs_dim
        self.actor_core = (nn.LSTMCell if spec.kind == "lstm" else nn.GRUCell)(width, spec.hidden)
        self.actor_head = layer_init(nn.Linear(spec.hidden, n_actions), gain=0.01)
        self.critic_head = layer_init(nn.Linear(spec.hidden, 1), gain=1.0)

    @property
    def state_size(self) -> int:
        return 2 * self.size if self.kind == "lstm" else self.size

    def step(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(core output [B, hidden], state after the step [B, S]) for one step of a batch."""
        x = chain(self.actor_trunk, obs.flatten(1))
        if self.kind == "lstm":
            h, c = self.actor_core(x, (state[:, :self.size], state[:, self.size:]))
            return h, torch.cat([h, c], dim=1)
        h = self.actor_core(x, state)
        return h, h

    def unroll(self, obs: torch.Tensor, state0: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Core outputs [T, B, hidden] for obs [T, B, ...] from ``state0`` [B, S]; ``keep`` [T, B]
        (float) is 0 where the state entering that step is reset to zeros."""
        state, outs = state0, []
        for t in range(obs.shape[0]):
            state = state * keep[t].unsqueeze(1)
            out, state = self.step(obs[t], state)
            outs.append(out)
        return torch.stack(outs)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return F.linear(features, self.actor_head.weight, self.actor_head.bias)

    def value(self, features: torch.Tensor) -> torch.Tensor:
        return F.linear(features, self.critic_head.weight, self.critic_head.bias).squeeze(-1)


def keep_mask(valid: np.ndarray) -> np.ndarray:
    """[T+1, N] float32: 0 at step t+1 where step t was invalid (the env reset there), else 1;
    step 0's state is the chunk's ``state0`` as stored."""
    keep = np.ones((valid.shape[0] + 1, valid.shape[1]), dtype=np.float32)
    keep[1:] = valid
    return keep


def segment_features(net: RecurrentActorCritic, obs: np.ndarray, seg: dict, device) -> torch.Tensor:
    """Core outputs [T+1, N, hidden] of a whole segment (every frame, obs[T] included)."""
    o = torch.as_tensor(obs).to(device)
    return net.unroll(o.reshape(o.shape[0], o.shape[1], -1), torch.as_tensor(seg["state0"]).to(device),
                      torch.as_tensor(keep_mask(seg["valid"])).to(device))


def sequence_batch(algo, segments: list[dict], gae_fn) -> dict[str, torch.Tensor]:
    """Whole env sequences of all segments, stacked on the batch axis (T, B = segments x N): obs
    (T+1 frames), state0, keep, actions, logprobs, advantages, returns, valid."""
    c = algo.config
    parts: dict[str, list] = {k: [] for k in ("obs", "state0", "keep", "actions", "logprobs", "advantages", "returns", "valid")}
    T = segments[0]["rewards"].shape[0]
    for seg in segments:
        if seg["rewards"].shape[0] != T:
            raise ValueError("recurrent PPO: all segments of a batch must have the same number of steps")
        if "state0" not in seg:
            raise ValueError("recurrent PPO: chunk has no state0 (was it collected by a recurrent policy's act_recurrent?)")
        obs = seg["obs"] if algo.obs_norm is None else algo.obs_norm(seg["obs"])
        rewards = seg["rewards"] if algo.reward_scale is None else algo.reward_scale(seg["rewards"])
        with torch.no_grad():
            values = algo.net.value(segment_features(algo.net, obs, seg, algo.device)).cpu().numpy()
        adv, ret = gae_fn(rewards, values, seg["terminated"], seg["truncated"], seg["valid"], c.gamma, c.gae_lambda)
        parts["obs"].append(obs[:T].reshape(T, obs.shape[1], -1).astype(np.float32))
        parts["state0"].append(seg["state0"])
        parts["keep"].append(keep_mask(seg["valid"])[:T])
        parts["actions"].append(seg["actions"])
        parts["logprobs"].append(seg["extra_logprob"])
        parts["advantages"].append(adv)
        parts["returns"].append(ret)
        parts["valid"].append(seg["valid"])
    axis = {"state0": 0}
    return {k: torch.from_numpy(np.ascontiguousarray(np.concatenate(v, axis=axis.get(k, 1)))).to(algo.device)
            for k, v in parts.items()}


def sequence_loss(algo, mb: dict[str, torch.Tensor], with_stats: bool):
    """PPO's clipped loss over a minibatch of whole sequences, means over their valid steps."""
    c = algo.config
    feats = algo.net.unroll(mb["obs"], mb["state0"], mb["keep"])
    logp_all = torch.log_softmax(algo.net.logits(feats), dim=-1)
    newlogprob = logp_all.gather(-1, mb["actions"].long().unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    newvalue = algo.net.value(feats)
    valid = mb["valid"]
    n = valid.sum().clamp(min=1)

    def mean(x):
        return (x * valid).sum() / n

    logratio = torch.where(valid, newlogprob - mb["logprobs"], torch.zeros_like(newlogprob))
    ratio = logratio.exp()
    adv = mb["advantages"]
    if c.norm_adv and int(n) > 1:
        mu = mean(adv)
        std = torch.sqrt(((adv - mu) ** 2 * valid).sum() / (n - 1))
        adv = (adv - mu) / (std + 1e-8)
    pg_loss = mean(torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - c.clip_coef, 1 + c.clip_coef)))
    v_loss = 0.5 * mean((newvalue - mb["returns"]) ** 2)
    entropy_loss = mean(entropy)
    loss = pg_loss - c.ent_coef * entropy_loss + v_loss * c.vf_coef
    if not with_stats:
        return loss, {}
    with torch.no_grad():
        stats = {"pg_loss": pg_loss.detach(), "v_loss": v_loss.detach(), "entropy": entropy_loss.detach(),
                 "approx_kl": mean((ratio - 1) - logratio), "clipfrac": mean(((ratio - 1.0).abs() > c.clip_coef).float())}
    return loss, stats


def sequence_update(algo, batch: dict[str, torch.Tensor], clip_grad_norm) -> tuple[dict[str, torch.Tensor], int]:
    """All epochs x minibatches of whole sequences (shuffled each epoch); (summed last-epoch
    statistics, minibatches per epoch)."""
    c = algo.config
    B = batch["state0"].shape[0]
    n_mb = min(c.num_minibatches, B)
    totals: dict[str, torch.Tensor] = {}
    for epoch in range(c.update_epochs):
        perm = torch.from_numpy(algo.rng.permutation(B)).to(algo.device)
        last = epoch == c.update_epochs - 1
        for sl in algo._slices(B, n_mb):
            idx = perm[sl]
            mb = {k: (v[idx] if k == "state0" else v[:, idx]) for k, v in batch.items()}
            loss, stats = sequence_loss(algo, mb, with_stats=last)
            algo.optimizer.zero_grad()
            loss.backward()
            if c.max_grad_norm is not None:
                clip_grad_norm(algo.params, c.max_grad_norm)
            algo.optimizer.step()
            for k, v in stats.items():
                totals[k] = totals[k] + v if k in totals else v
    return totals, n_mb
