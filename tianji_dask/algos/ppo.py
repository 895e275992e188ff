"""PPO (clipped surrogate, GAE), following CleanRL's ppo.py step by step.

Data arrives as chunks ("segments") from explorers. ``ingest`` keeps segments whose behaviour
policy is at most ``max_policy_lag`` versions old (their stored log-probabilities make the
clipped ratio correct) and drops older ones, counting them in ``dropped_segments``. Once
``segments_per_batch`` are in, ``learn()`` runs one full PPO iteration (all epochs x
minibatches) over the first ``segments_per_batch`` of them (up to ``max_segments_per_batch`` when
more are waiting): one version. Any surplus waits for the next batch, and is dropped there too
if the update made it too old.

Values are not carried in chunks: ``learn()`` evaluates the current critic on every frame of a
segment, which gives V(obs[t]), the bootstrap value after a truncation (the true final
observation obs[t+1]) and after the segment's last step (obs[T]). For fresh segments this is
exactly CleanRL's stored value; for stale ones it is the better estimate.

With ``off_policy: decoupled`` the policy term is AReaL's decoupled PPO objective (Fu et al. 2025,
arXiv:2505.24298): the batch also carries the log-probabilities of the proximal policy
(the learner's policy as this update starts, computed once per batch without gradients), the
ratio is clipped around it instead of around the behaviour policy mu, and each step is weighted by
w = pi_prox / mu, truncated at ``is_cap``. At staleness 0, mu = pi_prox, w = 1 and the loss is
PPO's.

Box action spaces get CleanRL's ppo_continuous_action.py policy (a diagonal Gaussian with a
state-independent log-std; actions clipped to the bounds only in the env), and optionally its
observation normalization and reward scaling, kept by the learner (see ``normalize.py``).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import Field

from tianji_dask.algos.base import Algorithm
from tianji_dask.algos.normalize import RewardScaler
from tianji_dask.algos.recurrent import RecurrentSpec
from tianji_dask.algos.recurrent_ppo import sequence_batch, sequence_update
from tianji_dask.algos.segments import SegmentActorCritic, SegmentConfig, minibatch_slices
from tianji_dask.chunk import cat_obs, extras, map_obs


class PPOConfig(SegmentConfig):
    """Defaults are tuned for wall-clock time to solve CartPole-v1 on a small CPU, with batches of
    about 2048 env steps (e.g. 32 envs x 64 steps in one segment, or 2 segments of 16 x 64): a
    large learning rate and few, small-minibatch epochs. Harder tasks want a lower ``lr``, more
    epochs and larger batches."""

    gae_lambda: float = Field(0.95, ge=0.0, le=1.0)
    lr: float = Field(5e-3, gt=0.0)
    num_minibatches: int = Field(8, ge=1)
    clip_coef: float = Field(0.2, gt=0.0)
    #: CleanRL's clipped value loss; off: with unnormalised returns (tens to hundreds) it keeps
    #: the critic within clip_coef of its old values and slows learning
    clip_vloss: bool = False
    #: segments from a policy more than this many versions old are dropped
    max_policy_lag: int = Field(1, ge=0)
    #: the policy term's correction for segments made by an older policy mu. none: PPO's ratio
    #: pi/mu, clipped around mu. decoupled: AReaL's decoupled PPO (arXiv:2505.24298): the ratio
    #: pi/pi_prox to the proximal policy (this learner's as the update starts), clipped around it,
    #: each step weighted by pi_prox/mu truncated at is_cap; the same loss as none at staleness 0
    off_policy: Literal["none", "decoupled"] = "none"
    #: decoupled: the behaviour weight pi_prox/mu is truncated at this cap (as V-trace's rho_bar;
    #: AReaL's code drops the steps above its cap instead); at least 1, so fresh steps (w = 1) keep theirs
    is_cap: float = Field(2.0, ge=1.0)
    #: divide rewards by the running std of a discounted return (CleanRL's NormalizeReward; MuJoCo)
    normalize_reward: bool = False
    #: ``{kind: lstm|gru, hidden: N, burn_in: K}``: a recurrent core between trunk (after the image or
    #: own encoder) and heads, Discrete or Box actions; updates unroll whole env sequences from each
    #: chunk's state0 (truncated BPTT over the segment), recomputed from the K steps before it with
    #: burn_in, minibatches of whole sequences. null: feed-forward
    recurrent: RecurrentSpec | None = None


def gae(rewards: np.ndarray, values: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
        valid: np.ndarray, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimates and returns for one segment.

    ``values`` [T+1, N] holds V(obs[t]) for every frame. A terminated step does not bootstrap;
    a truncated step bootstraps from V(obs[t+1]), the true final observation; both stop the
    recursion. The last step bootstraps from V(obs[T]). Invalid (autoreset) steps get 0.
    """
    T = rewards.shape[0]
    adv = np.zeros_like(rewards, dtype=np.float32)
    next_adv = np.zeros(rewards.shape[1:], dtype=np.float32)
    not_term = 1.0 - terminated.astype(np.float32)
    cont = 1.0 - (terminated | truncated).astype(np.float32)
    for t in reversed(range(T)):
        delta = rewards[t] + gamma * values[t + 1] * not_term[t] - values[t]
        next_adv = np.where(valid[t], delta + gamma * lam * cont[t] * next_adv, 0.0).astype(np.float32)
        adv[t] = next_adv
    returns = adv + values[:T]
    return adv, returns


class PPO(SegmentActorCritic, Algorithm):
    Config = PPOConfig
    on_policy = True
    device_types = ("cpu", "cuda")

    def __init__(self, obs_space, action_space, config: PPOConfig, seed: int = 0):
        super().__init__(obs_space, action_space, config, seed)
        self._init_actor_critic(obs_space, action_space, seed)
        if config.normalize_reward:
            self.reward_scale = RewardScaler(config.gamma)

    # ---- learner side (acting and the segment queue: SegmentActorCritic) ----------------
    def build_batch(self, segments: list[dict]) -> dict[str, torch.Tensor]:
        """Valid steps of all segments, flattened, with advantages and returns from the current
        critic (observations normalized and rewards scaled with the statistics in use, if on);
        with ``off_policy: decoupled`` also ``prox_logprobs``, the current policy's log-probabilities
        of the actions taken."""
        c = self.config
        decoupled = c.off_policy == "decoupled"
        parts: dict[str, list] = {k: [] for k in ("obs", "actions", "logprobs", "advantages", "returns", "values")}
        if decoupled:
            parts["prox_logprobs"] = []
        for seg in segments:
            obs = self._segment_obs(seg)
            rewards = seg["rewards"] if self.reward_scale is None else self.reward_scale(seg["rewards"])
            T, N = seg["rewards"].shape
            with torch.no_grad():
                values = self.net.value(self._rows(obs, (T + 1) * N))
            values = values.cpu().numpy().reshape(T + 1, N)
            adv, ret = gae(rewards, values, seg["terminated"], seg["truncated"], seg["valid"], c.gamma, c.gae_lambda)
            valid = seg["valid"]
            parts["obs"].append(map_obs(lambda v: v[:T][valid], obs))
            parts["actions"].append(seg["actions"][valid])
            parts["logprobs"].append(extras(seg)["logprob"][valid])
            parts["advantages"].append(adv[valid])
            parts["returns"].append(ret[valid])
            parts["values"].append(values[:T][valid])
            if decoupled:  # the proximal policy: this learner's as the update starts
                parts["prox_logprobs"].append(self._logprobs(map_obs(lambda v: v[:T][valid], obs), seg["actions"][valid]))
        obs = cat_obs(parts.pop("obs"), np.concatenate)
        batch = {k: torch.from_numpy(np.concatenate(v)).to(self.device) for k, v in parts.items()}
        # uint8 frames stay uint8 until a minibatch is encoded
        batch["obs"] = map_obs(lambda v: torch.from_numpy(v).to(self.device).reshape(len(v), -1), obs)
        return batch

    def _logprobs(self, obs, actions: np.ndarray) -> np.ndarray:
        """log pi(actions | obs) under the current weights, without gradients (rows: valid steps)."""
        with torch.no_grad():
            logprob = self.net.evaluate(self._rows(obs, len(actions)), torch.as_tensor(actions).to(self.device))[0]
        return logprob.cpu().numpy()

    def loss(self, mb: dict[str, torch.Tensor], with_stats: bool = True) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """CleanRL's PPO loss on one minibatch: clipped surrogate + vf_coef x (clipped) value loss
        - ent_coef x entropy; with ``off_policy: decoupled`` the surrogate is AReaL's decoupled one
        (arXiv:2505.24298). Returns (loss, detached statistics, empty unless ``with_stats``)."""
        c = self.config
        decoupled = c.off_policy == "decoupled"
        newlogprob, entropy, newvalue = self.net.evaluate(mb["obs"], mb["actions"])
        # the ratio's denominator: the behaviour policy mu, or (decoupled) the proximal policy pi_prox
        logratio = newlogprob - (mb["prox_logprobs"] if decoupled else mb["logprobs"])
        ratio = logratio.exp()

        mb_advantages = mb["advantages"]
        if c.norm_adv and len(mb_advantages) > 1:
            mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

        # policy loss
        pg_loss1 = -mb_advantages * ratio
        pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - c.clip_coef, 1 + c.clip_coef)
        if decoupled:  # each step weighted by w = pi_prox / mu (no gradient), truncated at is_cap
            behav_weight = (mb["prox_logprobs"] - mb["logprobs"]).exp()
            is_weight = behav_weight.clamp(max=c.is_cap)
            pg_loss = (torch.max(pg_loss1, pg_loss2) * is_weight).mean()
        else:
            pg_loss = torch.max(pg_loss1, pg_loss2).mean()

        # value loss
        if c.clip_vloss:
            v_loss_unclipped = (newvalue - mb["returns"]) ** 2
            v_clipped = mb["values"] + torch.clamp(newvalue - mb["values"], -c.clip_coef, c.clip_coef)
            v_loss_clipped = (v_clipped - mb["returns"]) ** 2
            v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
        else:
            v_loss = 0.5 * ((newvalue - mb["returns"]) ** 2).mean()

        entropy_loss = entropy.mean()
        loss = pg_loss - c.ent_coef * entropy_loss + v_loss * c.vf_coef
        if not with_stats:
            return loss, {}
        with torch.no_grad():
            stats = {
                "pg_loss": pg_loss.detach(),
                "v_loss": v_loss.detach(),
                "entropy": entropy_loss.detach(),
                "approx_kl": ((ratio - 1) - logratio).mean(),
                "clipfrac": ((ratio - 1.0).abs() > c.clip_coef).float().mean(),
            }
            if decoupled:  # approx_kl and clipfrac are then against pi_prox: what this update moved
                stats["is_weight"] = is_weight.mean()
                stats["is_truncated"] = (behav_weight > c.is_cap).float().mean()
        return loss, stats

    def learn(self) -> dict[str, float]:
        c = self.config
        segments, _ = self._take_batch()
        if self.recurrent:
            return self._learn_sequences(segments)
        batch = self.build_batch(segments)
        B = len(batch["actions"])
        n_mb = min(c.num_minibatches, B)
        totals: dict[str, torch.Tensor] = {}
        for epoch in range(c.update_epochs):
            perm = torch.from_numpy(self.rng.permutation(B)).to(self.device)
            shuffled = {k: map_obs(lambda t: t[perm], v) for k, v in batch.items()}  # then minibatches are cheap views
            last_epoch = epoch == c.update_epochs - 1
            for mb_slice in minibatch_slices(B, n_mb):
                mb = {k: map_obs(lambda t: t[mb_slice], v) for k, v in shuffled.items()}
                loss, stats = self.loss(mb, with_stats=last_epoch)
                self.optimizer.minimize(loss, c.max_grad_norm)
                for k, v in stats.items():  # reported: means over the last epoch
                    totals[k] = totals[k] + v if k in totals else v
        return self._finish_update(totals, n_mb, B, len(segments))

    def _learn_sequences(self, segments: list[dict]) -> dict[str, float]:
        """``learn`` of a recurrent policy: minibatches of whole env sequences (recurrent.py)."""
        batch = sequence_batch(self, segments, gae)
        totals, n_mb = sequence_update(self, batch)
        B = int(batch["valid"].sum())
        return self._finish_update(totals, n_mb, B, len(segments))

    def _finish_update(self, totals: dict, n_mb: int, batch_env_steps: int, segments: int) -> dict[str, float]:
        """One version done: stale segments dropped, statistics folded, the metrics (means of the
        last epoch's minibatches)."""
        self.updates += 1
        self._drop_stale()
        self._fold_statistics()
        metrics = {k: float(v) / n_mb for k, v in totals.items()}
        metrics.update(samples=float(batch_env_steps * self.config.update_epochs), batch_env_steps=float(batch_env_steps),
                       segments=float(segments), dropped_segments=float(self.dropped_segments),
                       **self._schedule_metrics())
        return metrics

    def counters(self) -> dict[str, int]:
        return {"dropped_segments": self.dropped_segments, "late_segments_used": self.late_segments_used,
                **self._mask_counters()}
