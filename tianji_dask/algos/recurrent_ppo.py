"""PPO's update of a recurrent policy (``recurrent.py``): truncated BPTT over whole env sequences.
A batch stacks every env sequence of its segments on the batch axis, each unrolled from its start
state (the stored ``state0``, or with burn-in the one the current weights recompute); minibatches
are whole sequences, losses means over their valid steps. Pure torch/numpy, no Dask."""

from __future__ import annotations

import numpy as np
import torch

from tianji_dask.algos.recurrent import frames, keep_mask, segment_features, with_start_state
from tianji_dask.algos.segments import minibatch_slices


def sequence_batch(algo, segments: list[dict], gae_fn) -> dict[str, torch.Tensor]:
    """Whole env sequences of all segments, stacked on the batch axis (T, B = segments x N): obs
    (T frames, flat; images stay uint8), state0, keep, actions, logprobs, advantages, returns, valid;
    with ``off_policy: decoupled`` also prox_logprobs, the current policy's (no gradient)."""
    c = algo.config
    decoupled = c.off_policy == "decoupled"
    parts: dict[str, list] = {k: [] for k in ("obs", "state0", "keep", "actions", "logprobs", "advantages", "returns", "valid")}
    if decoupled:
        parts["prox_logprobs"] = []
    T = segments[0]["rewards"].shape[0]
    for seg in segments:
        if seg["rewards"].shape[0] != T:
            raise ValueError("recurrent PPO: all segments of a batch must have the same number of steps")
        seg = with_start_state(algo, seg)
        obs = algo.network_obs(seg["obs"])
        rewards = seg["rewards"] if algo.reward_scale is None else algo.reward_scale(seg["rewards"])
        with torch.no_grad():
            feats = segment_features(algo.net, obs, seg, algo.device)
            values = algo.net.value(feats).cpu().numpy()
            if decoupled:  # the proximal policy: this learner's as the update starts
                parts["prox_logprobs"].append(algo.net.evaluate(feats[:T], torch.as_tensor(seg["actions"]).to(algo.device))[0].cpu().numpy())
        adv, ret = gae_fn(rewards, values, seg["terminated"], seg["truncated"], seg["valid"], c.gamma, c.gae_lambda)
        parts["obs"].append(frames(obs[:T]))
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
    """PPO's clipped loss over a minibatch of whole sequences, means over their valid steps; with
    ``off_policy: decoupled`` AReaL's decoupled surrogate, as ``PPO.loss``."""
    c = algo.config
    decoupled = c.off_policy == "decoupled"
    feats = algo.net.unroll(mb["obs"], mb["state0"], mb["keep"])
    newlogprob, entropy = algo.net.evaluate(feats, mb["actions"])
    newvalue = algo.net.value(feats)
    valid = mb["valid"]
    n = valid.sum().clamp(min=1)

    def mean(x):
        return (x * valid).sum() / n

    # the ratio's denominator: the behaviour policy mu, or (decoupled) the proximal policy pi_prox
    logratio = torch.where(valid, newlogprob - (mb["prox_logprobs"] if decoupled else mb["logprobs"]), torch.zeros_like(newlogprob))
    ratio = logratio.exp()
    adv = mb["advantages"]
    if c.norm_adv and int(n) > 1:
        mu = mean(adv)
        std = torch.sqrt(((adv - mu) ** 2 * valid).sum() / (n - 1))
        adv = (adv - mu) / (std + 1e-8)
    pg_losses = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - c.clip_coef, 1 + c.clip_coef))
    if decoupled:  # each step weighted by w = pi_prox / mu (no gradient), truncated at is_cap
        behav_weight = torch.where(valid, mb["prox_logprobs"] - mb["logprobs"], torch.zeros_like(newlogprob)).exp()
        is_weight = behav_weight.clamp(max=c.is_cap)
        pg_losses = pg_losses * is_weight
    pg_loss = mean(pg_losses)
    v_loss = 0.5 * mean((newvalue - mb["returns"]) ** 2)
    entropy_loss = mean(entropy)
    loss = pg_loss - c.ent_coef * entropy_loss + v_loss * c.vf_coef
    if not with_stats:
        return loss, {}
    with torch.no_grad():
        stats = {"pg_loss": pg_loss.detach(), "v_loss": v_loss.detach(), "entropy": entropy_loss.detach(),
                 "approx_kl": mean((ratio - 1) - logratio), "clipfrac": mean(((ratio - 1.0).abs() > c.clip_coef).float())}
        if decoupled:  # approx_kl and clipfrac are then against pi_prox: what this update moved
            stats.update(is_weight=mean(is_weight), is_truncated=mean((behav_weight > c.is_cap).float()))
    return loss, stats


def sequence_update(algo, batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int]:
    """All epochs x minibatches of whole sequences (shuffled each epoch); (summed last-epoch
    statistics, minibatches per epoch)."""
    c = algo.config
    B = batch["state0"].shape[0]
    n_mb = min(c.num_minibatches, B)
    totals: dict[str, torch.Tensor] = {}
    for epoch in range(c.update_epochs):
        perm = torch.from_numpy(algo.rng.permutation(B)).to(algo.device)
        last = epoch == c.update_epochs - 1
        for sl in minibatch_slices(B, n_mb):
            idx = perm[sl]
            mb = {k: (v[idx] if k == "state0" else v[:, idx]) for k, v in batch.items()}
            loss, stats = sequence_loss(algo, mb, with_stats=last)
            algo.optimizer.minimize(loss, c.max_grad_norm)
            for k, v in stats.items():
                totals[k] = totals[k] + v if k in totals else v
    return totals, n_mb
