"""The algorithm interface. Algorithms are pure torch/numpy: nothing here or below imports Dask.

One object serves both sides:
- explorer side (CPU, inference only): ``act``, ``set_weights``;
- learner side: ``ingest``, ``ready``, ``learn``, ``get_weights``, ``state_dict``.

The same object runs unchanged in the single-process mode and on a Dask cluster: that is the
proof that the boundary between algorithm and dataflow is real.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict

from tianji_dask.acting import Acting


class AlgoConfig(BaseModel):
    """Base of every algorithm's hyperparameters: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid")


class Algorithm(Acting, ABC):
    """Base of every algorithm, bundled or your own: one object acts on the explorers (``act``,
    ``get_weights``/``set_weights``) and learns on the learner (``ingest``, ``ready``, ``learn``);
    name the hyperparameters' model on the class as ``Config`` (docs/extending.md)."""

    #: True for algorithms that train only on data from (nearly) the current policy
    on_policy: bool = False
    #: torch device types the learner side can train on (``learn`` moves its batches there)
    device_types: tuple[str, ...] = ("cpu",)
    #: checkpoints hold the replay buffer's contents (the run's ``checkpoint.replay_buffer`` sets it
    #: before each write); algorithms that do not replay ignore it
    include_replay: bool = False
    #: names of methods ``learner.compile`` may compile (core/compile.py): pure functions of their
    #: tensor arguments and the modules' parameters, with the same shapes every update, drawing no
    #: random numbers of their own; the first output is the loss the update differentiates. ``learn``
    #: calls each through ``self.compiled(name)``
    compilable: tuple[str, ...] = ()

    def __init__(self, obs_space, action_space, config: AlgoConfig, seed: int = 0):
        self.obs_space = obs_space
        self.action_space = action_space
        self.config = config
        self.seed = seed
        self.device = torch.device("cpu")

    def compiled(self, name: str):
        """What ``learn`` calls for its compilable loss ``name``: the method itself, or what
        ``learner.compile`` put in its place (``use_loss``), so a compiled loss reaches ``learn``
        without the method being replaced."""
        hook = self.__dict__.get("_losses", {}).get(name)
        return hook if hook is not None else getattr(self, name)

    def use_loss(self, name: str, fn=None) -> None:
        """Have ``compiled(name)`` give ``fn`` (a callable taking the method's arguments); None:
        the method again."""
        losses = self.__dict__.setdefault("_losses", {})
        if fn is None:
            losses.pop(name, None)
        else:
            losses[name] = fn

    def to_device(self, device) -> None:
        """Move the learner side's networks to ``device``, once, before the first ``learn``.
        Explorers never call it: they act on CPU, and ``get_weights`` always returns CPU arrays."""
        device = torch.device(device)
        if device.type not in self.device_types:
            raise ValueError(f"learner.device: {type(self).__name__} trains on {' or '.join(self.device_types)} only (got {device})")
        for value in vars(self).values():
            if isinstance(value, torch.nn.Module):
                value.to(device)
        self.device = device

    # ---- explorer side -------------------------------------------------------------------
    @abstractmethod
    def act(self, obs: np.ndarray, explore: dict) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions for a batch of observations, plus per-step extras the learner needs later
        (e.g. log-probabilities and values). ``explore`` holds exploration parameters from
        ``exploration()`` (e.g. epsilon)."""

    def initial_state(self, num_envs: int) -> np.ndarray | None:
        """The recurrent state (num_envs, S) float32 each env's episode starts from; None (the
        default) for a feed-forward policy, which acts through ``act`` alone."""
        return None

    def act_recurrent(self, obs: np.ndarray, state: np.ndarray, explore: dict) -> tuple[np.ndarray, dict, np.ndarray]:
        """``act`` for a recurrent policy: from ``state`` (N, S), the state each env acts from;
        returns (actions, extras, state after the step). Callers carry the state per env and
        replace it with ``initial_state`` where an episode restarts."""
        raise NotImplementedError(f"{type(self).__name__} is feed-forward: it acts through act()")

    def seed_acting(self, seed) -> None:
        """Seed the explorer side's action sampling (``seed``: anything ``default_rng`` takes), so
        that a chunk's actions depend on its seed and weights alone, not on what this object
        acted on before (what makes an asynchronous run replayable)."""
        if hasattr(self, "rng"):
            self.rng = np.random.default_rng(seed)

    def env_action(self, actions: np.ndarray) -> np.ndarray:
        """What ``env.step`` receives for the ``actions`` that ``act`` returned (e.g. clipped or
        rescaled to a Box's bounds). Chunks keep ``actions`` themselves: what the policy sampled."""
        return actions

    def policy_module(self) -> torch.nn.Module:
        """The deterministic policy as a plain CPU torch module, for export: a float32 batch of
        observations ``(B, *obs_space.shape)`` as the env gives them -> the env's actions, int64 (B,)
        for Discrete, float32 (B, A) for Box, as ``env_action`` of ``act`` with exploration off
        makes them (normalization folded in). A recurrent algorithm's takes the state too:
        ``forward(obs, state) -> (actions, new_state)``, one step as ``act_recurrent`` with
        exploration off makes it. A copy: later training does not change it."""
        raise NotImplementedError(f"{type(self).__name__} has no exportable policy network; load_policy still acts through act()")

    def exploration(self, env_steps: int, updates: int) -> dict:
        """Exploration parameters for explorers, given the learner's progress so far."""
        return {}

    @abstractmethod
    def get_weights(self) -> dict[str, np.ndarray]:
        """Policy weights as a plain dict of CPU float32 numpy arrays (what explorers need)."""

    @abstractmethod
    def set_weights(self, weights: dict[str, np.ndarray]) -> None: ...

    # ---- learner side --------------------------------------------------------------------
    @abstractmethod
    def ingest(self, chunk: dict, staleness: int) -> int:
        """Take a SampleChunk consumed at ``staleness`` versions; return the env steps kept
        (0 when the algorithm drops it, e.g. on-policy data that is too old)."""

    def accepts(self, staleness: int) -> bool:
        """Would ``ingest`` keep a chunk this many versions stale? (On-policy algorithms refuse
        data older than they can correct for; the learner then frees its credit at once.)"""
        return True

    @abstractmethod
    def ready(self) -> bool:
        """True when ``learn()`` may run now (warm-up reached, replay ratio not exceeded, a full
        on-policy batch collected, ...)."""

    def takes_more(self) -> bool:
        """Would the next update train on one more chunk? An on-policy learner consumes waiting
        chunks while this holds, and trains once it does not."""
        return not self.ready()

    @abstractmethod
    def learn(self) -> dict[str, float]:
        """One update. The learner's version goes +1 per call. Returns float metrics, including
        ``samples`` (samples trained on by this call) and, for algorithms that replay,
        ``batch_policy_version``: the mean policy version of the samples trained on, from which
        the learner reports replay staleness (its version at the update minus this)."""

    def chunks_per_update(self) -> int:
        """The fewest chunks one update needs: the window's lower bound in relaxed mode, as
        on-policy chunks hold their credit until trained on and a smaller window deadlocks.
        1 by default: any chunk can feed an update (e.g. through a replay)."""
        return 1

    def replay_progress(self) -> dict | None:
        """For algorithms that replay: ``{"env_steps": env steps ingested past the warm-up,
        "samples_trained": samples trained on since, "warm": warm-up reached, "ratio": the
        algorithm's own samples trained per env step}``, which a replay-ratio controller paces
        explorers by, and optionally ``"fill"``, the fraction of the buffer's capacity it holds
        (the replay-staleness law then steers by what a full buffer will give; without it the
        buffer counts as full). None for algorithms that do not replay."""
        return None

    def set_replay_ratio_max(self, rho_max: float | None) -> None:
        """Cap samples trained per env step ingested (replaying algorithms); None restores the
        algorithm's own ratio. A no-op for algorithms that do not replay."""

    def counters(self) -> dict[str, int]:
        """Counts worth reporting with the results (e.g. segments dropped as too stale)."""
        return {}

    # ---- group mode ------------------------------------------------------------------------
    def model_state(self) -> dict[str, np.ndarray]:
        """Every floating-point parameter and buffer of the learner's networks (target networks
        and critics included), as CPU arrays: what group mode averages across learners. Optimizer
        states are not part of it (TianJi does not merge them either)."""
        out = {}
        for name, module in self.networks():
            for key, tensor in module.state_dict().items():
                if tensor.is_floating_point():
                    out[f"{name}.{key}"] = tensor.detach().cpu().numpy().copy()
        return out

    def load_model_state(self, state: dict[str, np.ndarray]) -> None:
        """Overwrite the networks' floating-point tensors from ``model_state``-shaped arrays."""
        with torch.no_grad():
            for name, module in self.networks():
                for key, tensor in module.state_dict().items():
                    if tensor.is_floating_point():
                        tensor.copy_(torch.as_tensor(state[f"{name}.{key}"]).to(tensor.device))

    def networks(self) -> list[tuple[str, torch.nn.Module]]:
        return sorted((name, value) for name, value in vars(self).items() if isinstance(value, torch.nn.Module))

    @abstractmethod
    def state_dict(self) -> dict: ...

    @abstractmethod
    def load_state_dict(self, state: dict) -> None: ...
