"""An env's pre-flight, in whichever process runs it (no Dask): make the env as the explorers will,
reset it and step it with a random action, and run gymnasium's env checker on the single env
(what a SyncVectorEnv holds: ``gym.make`` of its spec, then the pipeline's wrappers).

What raises is the env's fault, reported as the stage that raised it (``EnvCheckError``); the
checker's warnings are collected, not raised. ``run/preflight.py`` runs it in the driver and on
an explorer worker."""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

from tianji_dask.envs.marl import is_parallel_env_id
from tianji_dask.envs.vector import env_spec, make_single_env, make_vec_env, vectorization_mode
from tianji_dask.errors import TianjiError, first_line

#: spaces whose observations are arrays of the space's shape
SHAPED = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
#: what check_env says of every env gym.make wraps (order enforcing, the passive checker): not the env's
NOT_THE_ENVS = ("is different from the unwrapped version",)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class EnvCheckError(TianjiError):
    """The env failed its pre-flight; ``str()`` is one line: the stage and what it raised."""

    def __init__(self, stage: str, what: str):
        super().__init__(f"{stage} {what}")
        self.stage, self.what = stage, what

    def __reduce__(self):
        return type(self), (self.stage, self.what), dict(self.__dict__)


@dataclass
class Probe:
    """What a pre-flight saw: the spaces the explorers' vector envs have, and the env checker's warnings."""

    observation_space: gym.Space
    action_space: gym.Space
    warnings: list[str] = field(default_factory=list)

    @property
    def spaces(self) -> tuple[gym.Space, gym.Space]:
        return self.observation_space, self.action_space


def _stage(stage: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - whatever the env raises is its fault, said in one line
        hint = " (gymnasium's env checker; env.check: false skips it)" if stage == "check_env" else ""
        raise EnvCheckError(stage, f"raised {first_line(err)}{hint}") from err


def _shape(stage: str, obs, space: gym.Space) -> None:
    if isinstance(space, SHAPED) and np.shape(obs) != space.shape:
        raise EnvCheckError(stage, f"returned an observation of shape {np.shape(obs)}, but observation_space is {space}")


def _first(obs):
    """The first env's observation of a vector env's batch (a Dict's or Tuple's leaf by leaf)."""
    if isinstance(obs, dict):
        return {k: _first(v) for k, v in obs.items()}
    return tuple(_first(v) for v in obs) if isinstance(obs, tuple) else obs[0]


def _close(env) -> None:
    try:
        env.close()
    except Exception:  # noqa: BLE001 - a pre-flight that passed is not failed by a close
        pass


def _single(env_id, env_kwargs: dict, check: bool, seed: int) -> None:
    """The single env: reset, a random step (observations of the declared shape), check_env."""
    env = _stage("make", make_single_env, env_id, **env_kwargs)
    try:
        if not isinstance(env, gym.Env):
            raise EnvCheckError("make", f"returned {type(env).__name__}, not a gymnasium.Env")
        obs, _ = _stage("reset", env.reset, seed=seed)
        _shape("reset", obs, env.observation_space)
        env.action_space.seed(seed)
        result = _stage("step", env.step, env.action_space.sample())
        if not isinstance(result, tuple) or len(result) != 5:
            raise EnvCheckError("step", "must return (observation, reward, terminated, truncated, info)")
        _shape("step", result[0], env.observation_space)
        if check:
            from gymnasium.utils.env_checker import check_env

            _stage("check_env", check_env, env, skip_render_check=True, skip_close_check=True)
    finally:
        _close(env)


def _sync(env_id) -> bool:
    """The explorers' vector env is a SyncVectorEnv of single envs (the ones to check): not a
    multi-agent env, not an env vectorised by its own vector entry point (Atari's preprocesses) or by EnvPool."""
    if is_parallel_env_id(env_id) or getattr(env_id, "backend", "gymnasium") == "envpool":
        return False
    spec = _stage("make", env_spec, env_id)
    return vectorization_mode(spec, getattr(env_id, "wrappers", ())) == "sync"


def probe_env(env_id, env_kwargs: dict | None = None, *, check: bool = True, seed: int = 0) -> Probe:
    """Make, reset and step ``env_id`` as the explorers will; with ``check``, gymnasium's
    ``check_env`` on its single env (when the explorers' vector env is made of single envs).
    EnvCheckError (one line naming the stage) when the env fails."""
    env_kwargs = dict(env_kwargs or {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if _sync(env_id):
            _single(env_id, env_kwargs, check, seed)
        env = _stage("make_vec", make_vec_env, env_id, 1, seed=seed, **env_kwargs)
        try:
            obs, _ = _stage("vector reset", env.reset, seed=seed)
            _shape("vector reset", _first(obs), env.single_observation_space)
            env.action_space.seed(seed)
            obs = _stage("vector step", env.step, env.action_space.sample())[0]
            _shape("vector step", _first(obs), env.single_observation_space)
            probe = Probe(env.single_observation_space, env.single_action_space)
        finally:
            _close(env)
    for w in caught:
        text = _ANSI.sub("", str(w.message)).strip()
        if text.startswith("WARN: ") and not any(s in text for s in NOT_THE_ENVS):
            text = text[len("WARN: "):]
            if text not in probe.warnings:
                probe.warnings.append(text)
    return probe


def probe_pickled(blob: bytes, env_kwargs: dict, check: bool, seed: int) -> dict:
    """``probe_env`` of a cloudpickled env id, for a worker: never raises (a task that raised would
    be logged by Dask). ``{"error": one line or None, "spaces": (obs, act), "warnings": [...]}``;
    an env that cannot be unpickled here (a module this process cannot import) is an error too."""
    import cloudpickle

    try:
        env_id = cloudpickle.loads(blob)
    except Exception as err:  # noqa: BLE001 - what unpickling raises says why this process cannot have the env
        return {"error": f"cannot unpickle the env here ({first_line(err)})", "spaces": None, "warnings": []}
    try:
        probe = probe_env(env_id, env_kwargs, check=check, seed=seed)
    except EnvCheckError as err:
        return {"error": str(err), "stage": err.stage, "spaces": None, "warnings": []}
    except Exception as err:  # noqa: BLE001 - a fault of the probe itself, still one line
        return {"error": first_line(err), "spaces": None, "warnings": []}
    return {"error": None, "spaces": probe.spaces, "warnings": probe.warnings}
