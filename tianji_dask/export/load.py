"""A trained policy out of a run: ``load_policy`` finds a checkpoint (a run's newest, as ``tianji-dask
eval`` does, or one named), rebuilds the algorithm for the env's spaces and gives a ``Policy``
that acts as explorers act, in this process (no Dask)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tianji_dask.envs.play import DETERMINISTIC
from tianji_dask.errors import PipelineError

if TYPE_CHECKING:
    import gymnasium as gym
    import torch

    from tianji_dask.algos import Algorithm

def leaf_shapes(space) -> dict[str, tuple[int, ...]] | None:
    """Each leaf's shape of a Dict or Tuple observation space, by path (``chunk.obs_leaves``' paths);
    None for any other space."""
    if not hasattr(space, "spaces"):
        return None
    from tianji_dask.algos.encoders import space_leaves

    return {path: tuple(int(d) for d in sub.shape) for path, sub in space_leaves(space).items()}


ALLOWED = "a run directory (with pipeline.yaml), a checkpoint file in one, or a folder of checkpoints in one"


@dataclass
class Policy:
    """A checkpoint's policy: ``act`` through the algorithm itself, ``module()`` as a torch module.

    A recurrent policy (``recurrent``: the algorithm's ``initial_state`` gives a state) carries a
    float32 state from step to step, SB3's ``predict(obs, state, episode_start)`` in this project's
    terms: ``action, state = policy.act(obs, state=state, episode_start=start)``, where ``state``
    is what the previous call returned (None: the initial state, ``initial_state``) and
    ``episode_start`` marks the observations that begin an episode (after a reset), which act from
    the initial state instead. Feed-forward policies take neither and return the actions alone."""

    algorithm: Algorithm
    observation_space: gym.spaces.Space
    action_space: gym.spaces.Space
    version: int
    checkpoint: str

    @property
    def recurrent(self) -> bool:
        """True when the policy acts from a state it carries (``act`` then returns (actions, state))."""
        return self._initial(1) is not None

    def initial_state(self, batch: int | None = None) -> np.ndarray | None:
        """The state an episode starts from: float32 (S,) for one observation (``batch`` None),
        (batch, S) for a batch; None for a feed-forward policy."""
        state = self._initial(1 if batch is None else batch)
        if state is None:
            return None
        state = np.array(state, np.float32)
        return state[0] if batch is None else state

    def _initial(self, n: int) -> np.ndarray | None:
        return self.algorithm.initial_state(n)

    def act(self, obs, deterministic: bool = True, state: np.ndarray | None = None, episode_start=None):
        """The env actions for one observation (shaped as ``observation_space``) or a batch of them:
        the algorithm's ``act`` (exploration off with ``deterministic``, else its own sampling with
        ``{}``), then its ``env_action`` (continuous actions clipped or rescaled into the Box).

        A recurrent policy acts through ``act_recurrent`` and returns ``(actions, new_state)``:
        from ``state`` (float32 (S,) for one observation, (B, S) for a batch; None: the initial
        state), except where ``episode_start`` (a bool, or (B,) bools) is True, which act from the
        initial state. ``new_state`` is what the next call takes. ValueError (one line) for a
        wrong shape, or for a state given to a feed-forward policy."""
        batch, single = self._batch(obs)
        explore = DETERMINISTIC if deterministic else {}
        n = len(next(iter(batch.values()))) if isinstance(batch, dict) else len(batch)
        initial = self._initial(n)
        if initial is None:
            if state is not None or episode_start is not None:
                name = type(self.algorithm).__name__
                raise ValueError(f"state: {name}'s policy is feed-forward (no state); allowed: state=None, episode_start=None")
            actions, _ = self.algorithm.act(batch, explore)
            actions = np.asarray(self.algorithm.env_action(actions))
            return actions[0] if single else actions
        state = self._state(state, episode_start, initial, single, n)
        actions, _, new_state = self.algorithm.act_recurrent(batch, state, explore)
        actions = np.asarray(self.algorithm.env_action(actions))
        new_state = np.array(new_state, np.float32)
        return (actions[0], new_state[0]) if single else (actions, new_state)

    def _batch(self, obs) -> tuple:
        """(a batch of observations, whether ``obs`` was one); a Dict or Tuple's as ``{path: leaf}``."""
        shapes = leaf_shapes(self.observation_space)
        if shapes is None:
            obs = np.asarray(obs)
            shape = tuple(self.observation_space.shape)
            single = obs.shape == shape
            if not single and obs.shape[1:] != shape:
                raise ValueError(f"obs: shape {obs.shape}; allowed: {shape} (one observation) or (B, *{shape}) (a batch)")
            return (obs[None] if single else obs), single
        from tianji_dask.chunk import obs_leaves

        leaves = {k: np.asarray(v) for k, v in obs_leaves(obs).items()}
        if set(leaves) != set(shapes):
            raise ValueError(f"obs: leaves {sorted(leaves)}; allowed: {sorted(shapes)} (the observation space's)")
        single = all(leaves[k].shape == s for k, s in shapes.items())
        if not single and not all(leaves[k].shape[1:] == s and len(leaves[k]) == len(leaves[next(iter(shapes))])
                                  for k, s in shapes.items()):
            got = {k: v.shape for k, v in leaves.items()}
            raise ValueError(f"obs: leaf shapes {got}; allowed: {shapes} (one observation) or each with a batch axis first")
        return ({k: v[None] for k, v in leaves.items()} if single else leaves), single

    @staticmethod
    def _state(state, episode_start, initial: np.ndarray, single: bool, n: int) -> np.ndarray:
        """The (n, S) state the step acts from: ``state`` checked, ``initial`` where it is None or an episode starts."""
        initial = np.asarray(initial, np.float32)
        if state is None:
            return initial.copy()
        state = np.asarray(state)
        want = initial.shape[1:] if single else initial.shape
        if state.shape != want:
            allowed = f"{want} (the state of one observation)" if single else f"{want} (one row per observation)"
            raise ValueError(f"state: shape {state.shape}; allowed: {allowed}, as initial_state() or the previous act() gives it")
        state = np.array(state[None] if single else state, np.float32)
        if episode_start is not None:
            start = np.asarray(episode_start)
            if start.shape not in ((), (n,)):
                raise ValueError(f"episode_start: shape {start.shape}; allowed: () or ({n},) (one bool per observation)")
            start = np.broadcast_to(start.astype(bool), (n,))
            state[start] = initial[start]
        return state

    def module(self) -> torch.nn.Module:
        """The algorithm's ``policy_module()``: the deterministic policy as a CPU torch module;
        for a recurrent policy its ``forward(obs, state)`` returns ``(action, new_state)``."""
        return self.algorithm.policy_module()


def locate(path: str | os.PathLike, checkpoint_path: str | os.PathLike | None = None) -> tuple[Path, Path | None]:
    """(run directory, checkpoint file or None for the run's newest) for ``path``: a run directory
    (with ``checkpoint_path``, that file); a checkpoint file, or a folder's newest, in a run directory."""
    from tianji_dask.core import checkpoint

    path = Path(path)
    if (path / "pipeline.yaml").is_file():
        return path, None if checkpoint_path is None else Path(checkpoint_path)
    if checkpoint_path is not None:
        raise PipelineError(f"run_dir: {str(path)!r} is not a run directory (no pipeline.yaml); allowed with a checkpoint: a run directory")
    run_dir = next((d for d in path.resolve().parents if (d / "pipeline.yaml").is_file()), None) if path.exists() else None
    if run_dir is None:
        raise PipelineError(f"run_dir: {str(path)!r} is not a run directory (no pipeline.yaml in it or above it); allowed: {ALLOWED}")
    return run_dir, checkpoint.latest(path) if path.is_dir() else path


def load_policy(path: str | os.PathLike, *, checkpoint_path: str | os.PathLike | None = None) -> Policy:
    """The policy of a checkpoint: ``path`` is a run directory (its newest checkpoint, group 0, or
    ``checkpoint_path``), a checkpoint file or a folder of checkpoints inside a run directory.
    PipelineError (one line) for anything else, a damaged checkpoint or a multi-agent pipeline."""
    from tianji_dask.algos import make_algorithm
    from tianji_dask.config import load_pipeline
    from tianji_dask.core import checkpoint
    from tianji_dask.envs.marl import is_parallel_env_id
    from tianji_dask.envs.vector import make_vec_env
    from tianji_dask.run.specs import checkpoint_dirs

    run_dir, ckpt = locate(path, checkpoint_path)
    p = load_pipeline(run_dir / "pipeline.yaml")
    if is_parallel_env_id(p.env.id):
        raise PipelineError(f"load_policy: multi-agent pipelines ({p.env.id}) have no single policy to load; "
                            "allowed: single-agent envs")
    if ckpt is None:  # the newest that loads
        ckpt, state, _ = checkpoint.newest_loadable(checkpoint_dirs(run_dir, p.groups)[0])
    else:
        state = checkpoint.load(ckpt)
    env = make_vec_env(p.env.id, 1, seed=p.seed, **dict(p.env.kwargs))  # the spaces the algorithm was built for
    try:
        obs_space, action_space = env.single_observation_space, env.single_action_space
    finally:
        env.close()
    algo = make_algorithm(p.algo.name, obs_space, action_space, p.algo_config.model_dump(), p.seed)
    algo.load_state_dict(state["algo"])
    return Policy(algo, obs_space, action_space, int(state["version"]), str(ckpt))
