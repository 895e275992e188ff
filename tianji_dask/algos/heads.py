"""The actor-critics' policies over non-continuous actions, and action masks: one categorical
(Discrete), one independent categorical per dimension (MultiDiscrete: the log-probability and the
entropy are the sums over dimensions), or a Bernoulli per bit (MultiBinary); numpy for acting,
torch for the losses and export. A mask sets the logits of masked actions to ``MASKED``, a large
negative but finite number, so log-probabilities and entropies stay finite. No Dask."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

#: the logit of a masked action: its probability underflows to 0, its log stays finite
MASKED = -1e8
_TINY = np.float32(np.finfo(np.float32).tiny)


def sample_categorical(logits: np.ndarray, rng: np.random.Generator, greedy: bool = False,
                       masked: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(actions, float32 log-probabilities of those actions) for a batch of categorical logits
    [B, A]: sampled by inverse CDF, or the most likely action with ``greedy``. Overwrites
    ``logits``. ``masked``: some logits are ``MASKED``, whose actions must never be drawn (not
    even by a draw of exactly 0, which would take a masked first action)."""
    logits -= logits.max(axis=1, keepdims=True)
    logp_all = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    if greedy:
        actions = logp_all.argmax(axis=1)
    else:
        cdf = np.cumsum(np.exp(logp_all), axis=1)
        u = rng.random((len(logits), 1), dtype=np.float32) * cdf[:, -1:]
        if masked:
            np.maximum(u, _TINY, out=u)
        actions = np.minimum((cdf < u).sum(axis=1), logits.shape[1] - 1)
    logp = logp_all[np.arange(len(logits)), actions]
    return actions, logp.astype(np.float32, copy=False)


def mask_numpy(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``logits`` with those where ``mask`` is 0 set to ``MASKED`` (a new float32 array)."""
    return np.where(np.asarray(mask).reshape(logits.shape) > 0, logits, np.float32(MASKED)).astype(np.float32, copy=False)


def mask_torch(logits: torch.Tensor, mask: torch.Tensor, fallback: bool = False) -> torch.Tensor:
    """``logits`` with those where ``mask`` is 0 set to ``MASKED``. ``fallback``: a row masked
    entirely counts as unmasked (a Q-network's bootstrap from an end state with no legal action)."""
    valid = mask.reshape(logits.shape) > 0
    if fallback:
        valid = valid | ~valid.any(dim=-1, keepdim=True)
    return logits.masked_fill(~valid, MASKED)


def random_valid(mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One action per row drawn uniformly among those ``mask`` allows (all, where it allows none)."""
    scores = rng.random(mask.shape, dtype=np.float32) + (np.asarray(mask) > 0)
    return scores.argmax(axis=1)


class ActionHeads:
    """The policy's distribution over Discrete (``kind`` discrete, ``nvec`` (n,)), MultiDiscrete
    (multi_discrete, one size per dimension, flattened; ``start`` its offsets; actions (B, k)) or
    MultiBinary actions (binary, ``nvec`` (n,); actions (B, n) of 0/1). ``width``: the logits the
    network outputs (a MultiDiscrete's categoricals side by side; one per bit)."""

    ALLOWED = "Discrete, MultiDiscrete or MultiBinary"

    def __init__(self, kind: str, nvec: tuple[int, ...], shape: tuple[int, ...] = (), start: tuple[int, ...] = ()):
        self.kind, self.nvec, self.shape = kind, tuple(nvec), tuple(shape)
        self.start = np.asarray(start or (0,) * len(nvec), dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.nvec)]).astype(np.int64)
        self.width = int(self.nvec[0]) if kind == "binary" else int(self.offsets[-1])

    @staticmethod
    def of(action_space, algo: str, allowed: str = ALLOWED) -> ActionHeads:
        """ValueError (one line) for a space that is none of those ``allowed`` names."""
        import gymnasium as gym

        kinds = {gym.spaces.Discrete: "Discrete", gym.spaces.MultiDiscrete: "MultiDiscrete", gym.spaces.MultiBinary: "MultiBinary"}
        name = kinds.get(type(action_space))
        if name is None or name not in allowed:
            raise ValueError(f"{algo}: action space {action_space} is not supported; allowed: {allowed}")
        if name == "Discrete":
            return ActionHeads("discrete", (int(action_space.n),))
        if name == "MultiDiscrete":
            return ActionHeads("multi_discrete", tuple(int(n) for n in action_space.nvec.reshape(-1)), action_space.shape,
                               tuple(int(s) for s in action_space.start.reshape(-1)))
        return ActionHeads("binary", (int(np.prod(action_space.shape)),), action_space.shape)

    def _slices(self):
        return [(int(a), int(b)) for a, b in zip(self.offsets[:-1], self.offsets[1:])]

    # ---- acting (numpy) ------------------------------------------------------------------
    def sample(self, logits: np.ndarray, rng: np.random.Generator, greedy: bool = False,
               masked: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(actions, float32 log-probabilities, summed over dimensions) for logits [B, width]."""
        if self.kind == "discrete":
            return sample_categorical(logits, rng, greedy, masked)
        if self.kind == "binary":
            p = 1.0 / (1.0 + np.exp(-logits))
            bits = logits > 0 if greedy else rng.random(logits.shape, dtype=np.float32) < p
            logp = (bits * logits - np.logaddexp(0.0, logits)).sum(axis=1)
            return bits.astype(np.int8), logp.astype(np.float32, copy=False)
        actions = np.empty((len(logits), len(self.nvec)), dtype=np.int64)
        logp = np.zeros(len(logits), dtype=np.float32)
        for i, (a, b) in enumerate(self._slices()):
            actions[:, i], lp = sample_categorical(logits[:, a:b], rng, greedy, masked)
            logp += lp
        return actions, logp

    def env_action(self, actions: np.ndarray) -> np.ndarray:
        """A MultiDiscrete's actions shaped as its space and offset by its ``start``; others unchanged."""
        if self.kind != "multi_discrete":
            return actions
        out = actions + self.start if self.start.any() else actions
        return out.reshape(len(actions), *self.shape)

    def masked_taken(self, actions: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Whether each action (shape (...,) Discrete, (..., k) MultiDiscrete) takes a masked choice in
        any dimension, for masks (..., width)."""
        mask = np.asarray(mask)
        if self.kind == "discrete":
            return np.take_along_axis(mask, actions[..., None].astype(np.int64), -1)[..., 0] <= 0
        cols = actions.astype(np.int64) + self.offsets[:-1]
        return (np.take_along_axis(mask, cols, -1) <= 0).any(-1)

    # ---- learning and export (torch) ---------------------------------------------------------
    def log_prob_entropy(self, logits: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probabilities of ``actions`` [B], entropies [B]), each the sum over dimensions."""
        if self.kind == "binary":
            bits = actions.float()
            softplus = F.softplus(logits)
            return (bits * logits - softplus).sum(1), (softplus - logits * torch.sigmoid(logits)).sum(1)
        actions = actions.long().reshape(len(logits), -1)
        logp = entropy = 0
        for i, (a, b) in enumerate(self._slices()):
            lp = torch.log_softmax(logits[:, a:b], dim=1)
            logp = logp + lp.gather(1, actions[:, i:i + 1]).squeeze(1)
            entropy = entropy - (lp.exp() * lp).sum(1)
        return logp, entropy

    def greedy(self, logits: torch.Tensor) -> torch.Tensor:
        """The most likely action, as the env takes it (a MultiDiscrete's shaped and offset)."""
        if self.kind == "discrete":
            return logits.argmax(dim=1)
        if self.kind == "binary":
            return (logits > 0).long().reshape(-1, *self.shape)  # -1, not len(): a traced batch size stays free
        best = torch.stack([logits[:, a:b].argmax(dim=1) + int(s) for (a, b), s in zip(self._slices(), self.start)], dim=1)
        return best.reshape(-1, *self.shape)
