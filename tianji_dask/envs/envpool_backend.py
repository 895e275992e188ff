"""EnvPool as the explorers' vector env (``env.backend: envpool``, no Dask): what a pipeline may
ask of it, checked when the pipeline loads, and the adapter that makes it step as the rollout
expects a gymnasium vector env to.

EnvPool (1.2.5) is already a gymnasium ``VectorEnv`` with next-step autoreset: the step after an
episode's end is a reset step (reward 0, neither flag, the reset observation), and the step that
ends an episode, truncated or not, returns that episode's true final observation, so the chunk's
``valid`` mask and its truncation bootstrap come out as with gymnasium and the rollout needs no
change. The adapter covers the rest:

- **spaces**: EnvPool's ``observation_space`` and ``action_space`` are a single env's; here they
  are batched as gymnasium's vector envs have them, beside ``single_*``.
- **seeding**: EnvPool seeds only when it is made (``reset(seed=...)`` is ignored, with a warning),
  and only with int32 seeds. ``reset(seed=s)`` here makes the pool again with ``s`` (unless it was
  just made with ``s``), so a seeded reset is reproducible as gymnasium's is; each env's seed
  comes from ``numpy.random.SeedSequence(s)``, any int giving int32 seeds that do not overlap
  between streams.
- **threads**: ``num_threads`` 1 by default, one core per explorer stream as gymnasium's vector
  env has (``env.kwargs`` may ask for more)."""

from __future__ import annotations

import contextlib
import difflib
import warnings

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space

from tianji_dask.envs.simulate import KEYS as SIMULATED
from tianji_dask.errors import first_line

INSTALL = "pip install 'tianji-dask[envpool]'"
#: EnvPool config keys the rollout sets itself, or that would change how the pool steps
RESERVED = frozenset({"num_envs", "batch_size", "seed", "env_seed", "gym_reset_return_info", "base_path", "max_num_players"})
OTHERWISE = "(or env.backend: gymnasium)"
_INT32 = 2**31 - 1


@contextlib.contextmanager
def _quiet():
    """EnvPool builds its Box spaces from float64 bounds, which gymnasium warns of: not the env's fault."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*precision lowered by casting", UserWarning)
        yield


def _envpool():
    try:
        import envpool
    except ImportError:
        raise ValueError(f"env.backend: envpool is not installed; allowed: {INSTALL}") from None
    return envpool


def allowed_kwargs(task_id: str) -> list[str]:
    """The ``env.kwargs`` an EnvPool id takes: its config keys but those the rollout sets."""
    return [k for k in _envpool().make_spec(task_id).config._fields if k not in RESERVED]


def resolve(value, register_spec, wrappers, kwargs_sets) -> str:
    """``value`` (``env.id``) as an EnvPool id, after checking what cannot combine with EnvPool:
    ``register``, ``wrappers``, a class or factory, an id it lacks, a multi-player game, a Dict
    or Tuple space, ``kwargs`` (each dict of ``kwargs_sets``) it does not take. ValueError, one
    line starting with the field at fault."""
    if wrappers:
        raise ValueError(f"env.wrappers: EnvPool steps its own vector env, which has no single envs to wrap; "
                         f"allowed with env.backend envpool: no wrappers {OTHERWISE}")
    if register_spec:
        raise ValueError(f"env.register: EnvPool's ids need no registering; allowed with env.backend envpool: "
                         f"no env.register {OTHERWISE}")
    envpool = _envpool()
    ids = envpool.list_all_envs()
    if not isinstance(value, str) or getattr(value, "source", None) is not None:  # an EnvId of a class, validated again
        raise ValueError(f"env.backend: envpool makes only its own ids, not a class or factory ({value!r}); "
                         f"allowed: one of its {len(ids)} ids (envpool.list_all_envs()) {OTHERWISE}")
    task_id = str(value)
    if task_id not in ids:
        close = difflib.get_close_matches(task_id, ids, n=5)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ValueError(f"env.backend: envpool has no env {task_id!r}{hint}; allowed: one of its {len(ids)} ids "
                         f"(envpool.list_all_envs()) {OTHERWISE}")
    spec = envpool.make_spec(task_id)
    if spec.config.max_num_players > 1:
        raise ValueError(f"env.backend: envpool's {task_id} is a game of {spec.config.max_num_players} players; "
                         f"allowed with env.backend envpool: single-agent envs {OTHERWISE}")
    allowed = allowed_kwargs(task_id)
    for kwargs in kwargs_sets:
        kwargs = {k: v for k, v in kwargs.items() if k not in SIMULATED}  # an explorer's simulated step cost
        bad = sorted(k for k in kwargs if k not in allowed)
        if bad:
            raise ValueError(f"env.kwargs: envpool's {task_id} takes no {', '.join(map(repr, bad))}; "
                             f"allowed: {', '.join(allowed)}")
        defaults = spec.config._asdict()
        for k, v in kwargs.items():
            if not _same_kind(v, defaults[k]):
                raise ValueError(f"env.kwargs.{k}: must be of type {type(defaults[k]).__name__} for envpool's {task_id} "
                                 f"(default {defaults[k]!r}); got {v!r}")
        try:
            spec = envpool.make_spec(task_id, **kwargs)
        except Exception as err:  # noqa: BLE001 - whatever EnvPool's spec refuses, in one line
            raise ValueError(f"env.kwargs: envpool's {task_id} refused {kwargs} ({first_line(err, 200)})") from None
        with _quiet():
            spaces = (("observation", spec.gymnasium_observation_space), ("action", spec.gymnasium_action_space))
        for name, space in spaces:
            if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple, dict)):
                raise ValueError(f"env.backend: envpool's {task_id} has a {type(space).__name__} {name} space; allowed "
                                 f"with env.backend envpool: Box, Discrete, MultiDiscrete and MultiBinary spaces {OTHERWISE}")
    return task_id


def _same_kind(value, default) -> bool:
    """Whether ``value`` can stand where EnvPool's config has ``default`` (a float takes an int)."""
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def env_seeds(seed: int | None, num_envs: int) -> list[int]:
    """One int32 seed per env from any int ``seed`` (None: fresh entropy)."""
    seq = np.random.SeedSequence(None if seed is None else int(seed) & (2**64 - 1))
    return [int(s) % _INT32 for s in seq.generate_state(num_envs, dtype=np.uint32)]


class EnvPoolVectorEnv(gym.vector.VectorEnv):
    """An EnvPool pool of ``num_envs`` envs of ``task_id`` behind gymnasium's vector env API, as
    the rollout steps it (see the module docstring)."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP, "render_modes": ["rgb_array"]}

    def __init__(self, task_id: str, num_envs: int, seed: int | None = None, **kwargs):
        self.task_id, self.num_envs = str(task_id), int(num_envs)
        self.render_mode = kwargs.get("render_mode")
        self._kwargs = {"num_threads": 1, **kwargs}
        self._pool = None
        self._make(seed)
        with _quiet():
            self.single_observation_space = self._pool.single_observation_space
            self.single_action_space = self._pool.single_action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

    def _make(self, seed: int | None) -> None:
        if self._pool is not None:
            self._pool.close()
        with _quiet():
            self._pool = _envpool().make(self.task_id, env_type="gymnasium", num_envs=self.num_envs,
                                         seed=env_seeds(seed, self.num_envs), **self._kwargs)
            _ = self._pool.observation_space  # built (and warned of) here, not at the first reset
        self._seed, self._fresh = seed, True

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if options:
            raise ValueError(f"EnvPoolVectorEnv.reset takes no options (got {sorted(options)})")
        if seed is not None and not (self._fresh and seed == self._seed):
            self._make(seed)
        self._fresh = False
        return self._pool.reset()

    def step(self, actions):
        self._fresh = False
        return self._pool.step(np.asarray(actions))

    def render(self):
        return self._pool.render()

    def close_extras(self, **kwargs) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def make_vec(task_id: str, num_envs: int, seed: int | None = None, **kwargs) -> EnvPoolVectorEnv:
    """The explorers' vector env of an EnvPool id (``vector.make_vec_env`` of an ``env.backend:
    envpool`` id), reset with ``seed``."""
    env = EnvPoolVectorEnv(task_id, num_envs, seed, **kwargs)
    env.reset(seed=seed)
    return env
