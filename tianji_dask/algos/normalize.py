"""Running observation normalization and reward scaling, owned by the learner side.

The semantics are gymnasium's ``NormalizeObservation`` and ``NormalizeReward`` (CleanRL's
MuJoCo PPO wraps its envs in both), moved out of the envs: chunks keep raw observations and
rewards, and the statistics live in the algorithm. They change only between updates: data
ingested is folded in by ``fold()``, which an algorithm calls at the end of ``learn()``, so
the statistics one update trains with are those the explorers of that version act with.
"""

from __future__ import annotations

import numpy as np

#: what a normalized observation and a scaled reward are clipped to (as CleanRL does)
CLIP = 10.0
#: added to the variance before its square root
EPS = 1e-8


#: called at each ``fold`` with what this process collected, ``(mean, var, count)``, returning
#: what every learner replica collected together (core/replicas.py), so that all fold the same
#: statistics; None: nothing. A process holds one learner, so one hook serves every statistic.
_pending_hook = None


def set_pending_hook(hook) -> None:
    """Have every ``RunningMeanStd.fold`` in this process combine its collected summary through ``hook``."""
    global _pending_hook
    _pending_hook = hook


class RunningMeanStd:
    """Mean and variance of everything observed so far, in float64 (gymnasium's, with its prior
    count of 1e-4 at mean 0 and variance 1). ``observe`` only collects; ``fold`` merges what was
    collected into the statistics in use."""

    def __init__(self, shape: tuple[int, ...] = ()):
        self.shape = tuple(shape)
        self.mean = np.zeros(self.shape, np.float64)
        self.var = np.ones(self.shape, np.float64)
        self.count = 1e-4
        self._clear_pending()

    def _clear_pending(self) -> None:
        self.pending_mean = np.zeros(self.shape, np.float64)
        self.pending_var = np.zeros(self.shape, np.float64)
        self.pending_count = 0.0

    @staticmethod
    def merge(mean, var, count, b_mean, b_var, b_count):
        """Chan et al.'s parallel combination of two (mean, variance, count) summaries."""
        total = count + b_count
        delta = b_mean - mean
        new_mean = mean + delta * (b_count / total)
        m2 = var * count + b_var * b_count + delta**2 * (count * b_count / total)
        return new_mean, m2 / total, total

    def observe(self, x: np.ndarray) -> None:
        """Collect a batch [B, *shape] for the next ``fold``."""
        x = np.asarray(x, np.float64).reshape(-1, *self.shape)
        if len(x) == 0:
            return
        self.pending_mean, self.pending_var, self.pending_count = self.merge(
            self.pending_mean, self.pending_var, self.pending_count, x.mean(0), x.var(0), float(len(x)))

    def fold(self) -> bool:
        """Merge what was collected into the statistics in use; True if they changed."""
        if _pending_hook is not None:  # before the test below: every replica folds, or none
            self.pending_mean, self.pending_var, self.pending_count = _pending_hook(
                self.pending_mean, self.pending_var, self.pending_count)
        if self.pending_count == 0:
            return False
        self.mean, self.var, self.count = self.merge(
            self.mean, self.var, self.count, self.pending_mean, self.pending_var, self.pending_count)
        self._clear_pending()
        return True

    def state_dict(self) -> dict:
        return {k: np.array(getattr(self, k)) for k in
                ("mean", "var", "count", "pending_mean", "pending_var", "pending_count")}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var = np.array(state["mean"], np.float64), np.array(state["var"], np.float64)
        self.pending_mean = np.array(state["pending_mean"], np.float64)
        self.pending_var = np.array(state["pending_var"], np.float64)
        # .item(): a checkpoint written before 0-d arrays kept their shape holds them as [x]
        self.count, self.pending_count = np.asarray(state["count"]).item(), np.asarray(state["pending_count"]).item()


class ObsNormalizer(RunningMeanStd):
    """``(obs - mean) / sqrt(var + EPS)`` clipped to [-CLIP, CLIP], computed from float32 copies of
    the statistics: exactly what an explorer holding ``weights()`` computes."""

    PREFIX = "obs_norm."

    def __init__(self, shape: tuple[int, ...]):
        super().__init__(shape)
        self._refresh()

    def _refresh(self) -> None:
        self.mean32 = self.mean.astype(np.float32)
        self.std32 = np.sqrt(self.var.astype(np.float32) + np.float32(EPS))

    def observe_chunk(self, chunk: dict) -> None:
        """Collect the observations of a chunk's valid steps."""
        T = chunk["valid"].shape[0]
        self.observe(chunk["obs"][:T][chunk["valid"]])

    def fold(self) -> bool:
        changed = super().fold()
        if changed:
            self._refresh()
        return changed

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Normalized float32 observations [..., *shape] (a new array)."""
        out = np.subtract(obs, self.mean32, dtype=np.float32)
        out /= self.std32
        return np.clip(out, -CLIP, CLIP, out=out)

    def weights(self) -> dict[str, np.ndarray]:
        """The statistics in use, as the float32 arrays explorers receive with the policy."""
        return {self.PREFIX + "mean": self.mean32.copy(), self.PREFIX + "var": self.var.astype(np.float32)}

    def load_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Install ``weights()``'s statistics (explorer side)."""
        self.mean = np.array(weights[self.PREFIX + "mean"], np.float64)
        self.var = np.array(weights[self.PREFIX + "var"], np.float64)
        self._refresh()

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._refresh()


def split_weights(weights: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """(network weights, normalizer statistics) of a ``get_weights`` dict."""
    stats = {k: v for k, v in weights.items() if k.startswith(ObsNormalizer.PREFIX)}
    return {k: v for k, v in weights.items() if k not in stats}, stats


def load_policy_weights(weights: dict[str, np.ndarray], module, obs_norm: ObsNormalizer | None, keys=None) -> None:
    """A ``get_weights`` dict into the acting network ``module`` (its ``keys``; all by default)
    and, with normalization on, the statistics it acts with; ValueError when they disagree."""
    from tianji_dask.algos.weights import load_weights

    net_weights, stats = split_weights(weights)
    load_weights(module, net_weights, keys)
    if bool(stats) != (obs_norm is not None):
        raise ValueError(f"weights do not match normalize_obs={obs_norm is not None}: statistics {sorted(stats)}")
    if obs_norm is not None:
        obs_norm.load_weights(stats)


class RewardScaler:
    """Rewards divided by the running std of a discounted return, clipped to [-CLIP, CLIP]
    (gymnasium's NormalizeReward, then CleanRL's clip). The return is kept per explorer stream
    and env, so that an episode continues across a stream's chunks; it restarts after a
    terminated or truncated step. Autoreset steps are no steps of any episode: they are skipped."""

    def __init__(self, gamma: float):
        self.gamma = float(gamma)
        self.stats = RunningMeanStd(())
        self.returns: dict[int, np.ndarray] = {}  # explorer stream -> discounted return of each env

    def observe_chunk(self, chunk: dict) -> None:
        rewards, valid = chunk["rewards"], chunk["valid"]
        done = chunk["terminated"] | chunk["truncated"]
        T, N = rewards.shape
        ret = self.returns.get(chunk["explorer_id"])
        ret = np.zeros(N, np.float64) if ret is None or ret.shape != (N,) else ret.copy()
        seen = []
        for t in range(T):
            ret = np.where(valid[t], ret * self.gamma + rewards[t], ret)
            seen.append(ret[valid[t]])
            ret[done[t]] = 0.0
        self.stats.observe(np.concatenate(seen))
        self.returns[chunk["explorer_id"]] = ret

    def fold(self) -> bool:
        return self.stats.fold()

    def __call__(self, rewards: np.ndarray) -> np.ndarray:
        scale = np.float32(np.sqrt(self.stats.var + EPS))
        return np.clip(rewards / scale, -CLIP, CLIP).astype(np.float32)

    def state_dict(self) -> dict:
        return {"stats": self.stats.state_dict(), "gamma": self.gamma,
                "returns": {k: v.copy() for k, v in self.returns.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.stats.load_state_dict(state["stats"])
        self.returns = {int(k): np.array(v, np.float64) for k, v in state["returns"].items()}
