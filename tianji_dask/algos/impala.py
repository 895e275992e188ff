"""IMPALA's actor-critic with V-trace off-policy correction (Espeholt et al. 2018, arXiv:1802.01561).

Learning is asynchronous: chunks ("segments") are trained on as they arrive, however many versions
old their behaviour policy is (unless ``max_policy_lag`` is set). Each chunk carries the behaviour
policy's log-probabilities of the taken actions (``act``'s extra ``logprob``, as for PPO); the
learner's current policy pi and those behaviour probabilities mu give the importance ratios that
V-trace clips (rho_bar, c_bar) to correct for the lag.

One ``learn()`` takes the first ``segments_per_batch`` segments (up to ``max_segments_per_batch``
when more are waiting) and makes ``update_epochs`` passes
over them: one version. By default each pass takes one gradient step per group of envs
(``num_minibatches``), recomputing V-trace with the current network before each step; with
``minibatch_size`` set, each pass computes V-trace once for the whole batch and takes one step per
random minibatch of that many single steps (PPO's shape: many small steps per segment).

Episode boundaries follow the chunk format (see ``tianji_dask/chunk.py``): a terminated step does not
bootstrap; a truncated step bootstraps from the value of the true final observation (frame t+1);
the segment's last step bootstraps from frame T; the autoreset step after an episode's end is
invalid: it gets no target and no loss.

Box action spaces get the diagonal Gaussian policy (``gaussian.py``, as for PPO): pi/mu is then a
ratio of densities, taken from the same ``evaluate`` as the losses' log-probabilities.

With ``recurrent`` (``recurrent.py``, as for PPO) the logits (or means) and values of a segment come
from unrolling each env's sequence from the chunk's ``state0`` (recomputed from the steps before
it with ``burn_in``); groups of envs keep their sequences whole.
"""

from __future__ import annotations


import numpy as np
import torch
from pydantic import Field

from tianji_dask.algos.base import Algorithm
from tianji_dask.algos.recurrent import RecurrentSpec, segment_terms, with_start_state
from tianji_dask.algos.segments import SegmentActorCritic, SegmentConfig
from tianji_dask.chunk import cat_obs, extras, map_obs, select_envs


class IMPALAConfig(SegmentConfig):
    """Defaults are plain IMPALA (the paper's lam 1, no clip) with small, careful steps: two
    gradient steps per batch at lr 5e-4, advantages normalised per batch. Without PPO's clip the
    return oscillates, and at lr 1e-3 and above some seeds collapse to a deterministic policy.
    What solves CartPole-v1 reliably, under policy lag too, is the APPO form that
    ``pipelines/cartpole_impala.yaml`` sets: clip_coef 0.2, lr 2.5e-3, lam 0.95, 2 epochs x 8
    minibatches over one segment of 16 envs x 128 steps per batch."""

    #: V-trace's lambda: trace cutting on top of c_bar (1: the paper's default)
    lam: float = Field(1.0, ge=0.0, le=1.0)
    #: rho_bar: clips the importance weight of the TD error and of the policy gradient
    rho_clip: float = Field(1.0, gt=0.0)
    #: c_bar: clips the trace coefficients (how far a correction propagates back in time)
    c_clip: float = Field(1.0, gt=0.0)
    lr: float = Field(5e-4, gt=0.0)
    #: groups of envs (whole time series: V-trace runs along time) per pass
    num_minibatches: int = Field(1, ge=1)
    #: instead of groups of envs: V-trace computed once per pass over the whole batch, then
    #: random minibatches of this many steps (PPO's shape; num_minibatches is then unused).
    #: Many small steps per segment without cutting V-trace's time series short.
    minibatch_size: int | None = Field(None, ge=2)
    #: APPO: the policy term becomes PPO's clipped surrogate on the ratio pi/mu to the behaviour
    #: policy, with V-trace's advantages; None: IMPALA's plain importance-weighted policy gradient
    clip_coef: float | None = Field(None, gt=0.0)
    #: segments from a policy more than this many versions old are dropped; None: V-trace
    #: corrects any lag, nothing is dropped
    max_policy_lag: int | None = Field(None, ge=0)
    #: ``{kind: lstm|gru, hidden: N, burn_in: K}``: a recurrent core between trunk (after the image or
    #: own encoder) and heads, Discrete or Box actions; V-trace runs over each segment with values and
    #: log-probabilities from unrolling every env sequence from the chunk's state0 (recomputed from the
    #: K steps before it with burn_in), minibatches of whole sequences (no minibatch_size). null: feed-forward
    recurrent: RecurrentSpec | None = None


def vtrace(behaviour_logp: np.ndarray, target_logp: np.ndarray, rewards: np.ndarray, values: np.ndarray,
           terminated: np.ndarray, truncated: np.ndarray, valid: np.ndarray, gamma: float,
           rho_clip: float = 1.0, c_clip: float = 1.0, lam: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """V-trace targets v_s and policy-gradient advantages for one segment of [T, N] steps.

    ``values`` [T+1, N] holds V(obs[t]) for every frame, so V(obs[t+1]) is the bootstrap value
    after a truncation (the true final observation) and after the segment's last step. With
    rho_t = min(rho_clip, pi/mu), c_t = lam min(c_clip, pi/mu) and
    delta_t = rho_t (r_t + gamma V(x_{t+1}) - V(x_t)), the paper's recursion is
    v_t = V(x_t) + delta_t + gamma c_t (v_{t+1} - V(x_{t+1})), cut at an episode's end and at
    the segment's end. The advantage is rho_t (r_t + gamma v_{t+1} - V(x_t)), with v_{t+1}
    replaced by V(x_{t+1}) where the recursion is cut. Terminated steps do not bootstrap.
    Invalid (autoreset) steps get v_t = V(x_t) and advantage 0.
    """
    T = rewards.shape[0]
    ratio = np.exp(target_logp - behaviour_logp)
    rho = np.minimum(rho_clip, ratio)
    c = lam * np.minimum(c_clip, ratio)
    discount = gamma * (1.0 - terminated.astype(np.float32))
    cont = 1.0 - (terminated | truncated).astype(np.float32)  # step t+1 belongs to the same episode
    vs = np.zeros_like(rewards, dtype=np.float32)
    advantages = np.zeros_like(rewards, dtype=np.float32)
    later = np.zeros(rewards.shape[1:], dtype=np.float32)  # v_{t+1} - V(x_{t+1})
    for t in reversed(range(T)):
        carry = cont[t] * later if t + 1 < T else 0.0  # 0 where the recursion is cut
        delta = rho[t] * (rewards[t] + discount[t] * values[t + 1] - values[t])
        advantages[t] = np.where(valid[t], rho[t] * (rewards[t] + discount[t] * (values[t + 1] + carry) - values[t]), 0.0)
        later = np.where(valid[t], delta + gamma * c[t] * carry, 0.0).astype(np.float32)
        vs[t] = values[t] + later
    return vs.astype(np.float32), advantages.astype(np.float32)


class IMPALA(SegmentActorCritic, Algorithm):
    Config = IMPALAConfig
    on_policy = True  # consumed as updates take them, so staleness is measured at training time
    device_types = ("cpu", "cuda")

    def __init__(self, obs_space, action_space, config: IMPALAConfig, seed: int = 0):
        super().__init__(obs_space, action_space, config, seed)
        if config.recurrent is not None and config.minibatch_size is not None:
            raise ValueError("IMPALA: recurrent trains on whole env sequences (num_minibatches groups of envs); "
                             "minibatch_size (single steps) does not apply")
        self._init_actor_critic(obs_space, action_space, seed)
        self.max_lag_used = 0  # the largest policy lag trained on

    # ---- learner side (acting and the segment queue: SegmentActorCritic) ----------------
    def loss(self, segments: list[dict]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The IMPALA loss over the valid steps of ``segments``: policy gradient with V-trace
        advantages + vf_coef x squared error to the V-trace targets - ent_coef x entropy.
        Returns (loss, detached statistics)."""
        return self._loss_of(self._terms(segments))

    def _terms(self, segments: list[dict], keep_inputs: bool = False) -> dict[str, torch.Tensor]:
        """Per valid step of ``segments``, under the current network: the target policy's
        log-probability, entropy and value (with gradients unless called under no_grad), and
        the behaviour log-probability, V-trace target, advantage and importance ratio.
        ``keep_inputs``: also the observation and action of each valid step."""
        c = self.config
        names = ("logp", "behaviour_logp", "entropy", "value", "vs", "adv", "rho") + (("obs", "actions") if keep_inputs else ())
        parts: dict[str, list] = {k: [] for k in names}
        for seg in segments:
            T, N = seg["rewards"].shape
            valid = seg["valid"]
            if self.recurrent:  # each env's sequence unrolled from the chunk's state0
                target_logp, entropy, values = segment_terms(self.net, self.network_obs(seg["obs"]), seg, self.device)
            else:
                obs = self._rows(self._segment_obs(seg), (T + 1) * N)
                actions = torch.as_tensor(seg["actions"]).to(self.device).flatten(0, 1)
                # frame T has no action: its row is padding, only its value (the bootstrap) is used
                logp, entropy, values = self.net.evaluate(obs, torch.cat([actions, actions[-N:]]))
                target_logp, entropy = logp[: T * N].reshape(T, N), entropy[: T * N].reshape(T, N)
                values = values.reshape(T + 1, N)
            behaviour_logp = extras(seg)["logprob"]
            target_logp_np = target_logp.detach().cpu().numpy()
            vs, adv = vtrace(behaviour_logp, target_logp_np, seg["rewards"],
                             values.detach().cpu().numpy(), seg["terminated"], seg["truncated"], valid,
                             c.gamma, c.rho_clip, c.c_clip, c.lam)
            ratio = np.exp(target_logp_np - behaviour_logp)
            if c.clip_coef is not None:  # the surrogate's ratio does the importance weighting
                adv = adv / np.minimum(c.rho_clip, ratio)
            mask = torch.from_numpy(valid).to(self.device)
            parts["logp"].append(target_logp[mask])
            parts["behaviour_logp"].append(torch.from_numpy(behaviour_logp[valid]).to(self.device))
            parts["entropy"].append(entropy[mask])
            parts["value"].append(values[:T][mask])
            parts["vs"].append(torch.from_numpy(vs[valid]).to(self.device))
            parts["adv"].append(torch.from_numpy(adv[valid]).to(self.device))
            parts["rho"].append(torch.from_numpy(ratio[valid]).to(self.device))
            if keep_inputs:
                parts["obs"].append(map_obs(lambda v: v.reshape(T + 1, N, -1)[:T][mask], obs))
                parts["actions"].append(actions.reshape(T, N, *actions.shape[1:])[mask])
        return {k: cat_obs(v, torch.cat) for k, v in parts.items()}

    def _loss_of(self, b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        c = self.config
        adv = b["adv"]
        if c.norm_adv and len(adv) > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        if c.clip_coef is None:
            pg_loss = -(adv * b["logp"]).mean()
        else:  # APPO: PPO's clipped surrogate against the behaviour policy
            ratio = (b["logp"] - b["behaviour_logp"]).exp()
            pg_loss = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - c.clip_coef, 1 + c.clip_coef)).mean()
        v_loss = 0.5 * ((b["value"] - b["vs"]) ** 2).mean()
        entropy_loss = b["entropy"].mean()
        loss = pg_loss - c.ent_coef * entropy_loss + c.vf_coef * v_loss
        stats = {
            "pg_loss": pg_loss.detach(), "v_loss": v_loss.detach(), "entropy": entropy_loss.detach(),
            # float32 round-off puts on-policy ratios a hair above 1: count only real clipping
            "rho_mean": b["rho"].mean(), "rho_clipfrac": (b["rho"] > c.rho_clip + 1e-3).float().mean(),
        }
        return loss, stats

    def learn(self) -> dict[str, float]:
        c = self.config
        segments, lags = self._take_batch()
        if self.recurrent:
            segments = [with_start_state(self, seg) for seg in segments]
        self.max_lag_used = max([self.max_lag_used, *lags])
        if c.minibatch_size is None:
            n_mb = min(c.num_minibatches, *(seg["rewards"].shape[1] for seg in segments))
            for _ in range(c.update_epochs):
                # minibatch i: the i-th group of every segment's shuffled envs
                groups = [np.array_split(self.rng.permutation(seg["rewards"].shape[1]), n_mb) for seg in segments]
                for i in range(n_mb):
                    stats = self._step(self.loss([select_envs(seg, g[i]) for seg, g in zip(segments, groups)]))
        else:
            for _ in range(c.update_epochs):
                # V-trace once per pass under the network of that moment, then PPO's shape:
                # random minibatches of single steps, each re-evaluated under the current network
                with torch.no_grad():
                    fixed = self._terms(segments, keep_inputs=True)
                order = torch.from_numpy(self.rng.permutation(len(fixed["adv"])))
                for idx in order.split(c.minibatch_size):
                    stats = self._step(self._loss_of(self._reevaluate({k: map_obs(lambda t: t[idx], v)
                                                                       for k, v in fixed.items()})))
        self.updates += 1
        self._drop_stale()
        self._fold_statistics()
        B = sum(int(s["env_steps"]) for s in segments)
        metrics = {k: float(v) for k, v in stats.items()}  # of the last gradient step
        metrics.update(samples=float(B * c.update_epochs), batch_env_steps=float(B), segments=float(len(segments)),
                       policy_lag_mean=float(np.mean(lags)), dropped_segments=float(self.dropped_segments),
                       **self._schedule_metrics())
        return metrics

    def _step(self, loss_and_stats: tuple[torch.Tensor, dict]) -> dict:
        loss, stats = loss_and_stats
        self.optimizer.minimize(loss, self.config.max_grad_norm)
        return stats

    def _reevaluate(self, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A minibatch of fixed terms with the target log-probability, entropy and value
        recomputed (with gradients) under the current network."""
        logp, entropy, values = self.net.evaluate(b["obs"], b["actions"])
        return {**b, "logp": logp, "entropy": entropy, "value": values.reshape(-1)}

    def counters(self) -> dict[str, int]:
        return {"dropped_segments": self.dropped_segments, "late_segments_used": self.late_segments_used,
                "max_lag_used": self.max_lag_used, **self._mask_counters()}
