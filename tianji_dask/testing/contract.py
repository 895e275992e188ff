"""``check_algorithm``: an algorithm run in this process on a real env, for a few chunks, against
the contract the dataflow relies on (in the spirit of gymnasium's ``check_env``). Each violation
is one line naming the method; the first exception a method raises ends that method's checks.
A recurrent algorithm (``initial_state`` gives a state) is checked through ``act_recurrent``, and
its ``policy_module``, when it has one, against ``act_recurrent`` with exploration off."""

from __future__ import annotations

import math
import pickle
import tempfile

import cloudpickle
import numpy as np
import torch
from pydantic import ValidationError

from tianji_dask.algos import Algorithm, resolve_algorithm, validate_config
from tianji_dask.chunk import obs_leaves
from tianji_dask.core import checkpoint
from tianji_dask.envs.play import DETERMINISTIC
from tianji_dask.envs.rollout import Rollout
from tianji_dask.envs.vector import env_spaces, make_vec_env, register
from tianji_dask.errors import TianjiError, raised_in

STALE = 10**6  # a staleness no algorithm should keep data at without saying so through accepts
MODULE_STEPS = 16  # env steps a recurrent policy_module is compared with act_recurrent over


class AlgorithmCheckError(TianjiError, AssertionError):
    """The violations ``check_algorithm`` found; ``str()`` holds one line each."""

    def __init__(self, violations: list[str]):
        super().__init__("\n".join(violations))
        self.violations = violations

    def __reduce__(self):
        return type(self), (self.violations,), dict(self.__dict__)


class _Failed(Exception):
    """A method raised; its line is recorded already."""


def check_algorithm(algorithm, env_id: str, *, config: dict | None = None, env_kwargs: dict | None = None,
                    env_register: str | None = None, num_envs: int = 4, chunk_steps: int = 32, updates: int = 2,
                    max_chunks: int = 64, seed: int = 0, raise_on_violation: bool = True) -> list[str]:
    """Check ``algorithm`` (a subclass of ``tianji_dask.Algorithm``, its ``"module:Class"``, a
    bundled name, or an instance) on ``env_id``: chunks stepped with its own ``act`` (a recurrent
    algorithm's ``act_recurrent``, from its ``initial_state``), ``ingest`` and
    ``learn`` until ``updates`` updates ran (at most ``max_chunks`` chunks of ``num_envs`` x
    ``chunk_steps`` steps), then weights, ``seed_acting``, pickling and checkpoint round trips.

    Returns the violations (one line each, naming the method); with ``raise_on_violation`` raises
    ``AlgorithmCheckError`` holding them instead, when there are any. ``env_id`` takes what a
    pipeline's ``env.id`` takes: a gymnasium id, ``"module:Class"``, or an env class or factory."""
    if not isinstance(env_id, str) or ":" in env_id:
        from tianji_dask.envs.source import resolve_env

        env_id = resolve_env(env_id, env_register)
    checker = _Checker(algorithm, env_id, config or {}, env_kwargs or {}, env_register, num_envs, chunk_steps, seed)
    checker.run(updates, max_chunks)
    if checker.found and raise_on_violation:
        raise AlgorithmCheckError(checker.found)
    return checker.found


class _Checker:
    def __init__(self, algorithm, env_id, config, env_kwargs, env_register, num_envs, chunk_steps, seed):
        self.found: list[str] = []
        self.env_id, self.env_kwargs, self.num_envs, self.chunk_steps, self.seed = env_id, env_kwargs, num_envs, chunk_steps, seed
        self.algorithm, self.config, self.env_register = algorithm, config, env_register
        self.initial = None  # a recurrent algorithm's initial_state(num_envs); None: feed-forward
        self.acting = "act"  # the method that acts: act, or act_recurrent

    def fail(self, method: str, text: str) -> None:
        line = f"{self.label}.{method}: {text}"
        if line not in self.found:  # once, however many updates repeat it
            self.found.append(line)

    def call(self, method: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, or one line and ``_Failed`` when it raises."""
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - whatever the algorithm raises is the finding
            where, _, text = raised_in(err, self.cls).rpartition(" raised ")
            inner = f" (in {where})" if where and where != f"{self.label}.{method}" else ""
            self.fail(method, f"raised {text}{inner}")
            raise _Failed from None

    def run(self, updates: int, max_chunks: int) -> None:
        self.label = getattr(self.algorithm, "__qualname__", str(self.algorithm))
        try:
            register(self.env_register)
            self.obs_space, self.act_space = env_spaces(self.env_id, **self.env_kwargs)
            if isinstance(self.algorithm, Algorithm):
                self.cls, self.label = type(self.algorithm), type(self.algorithm).__qualname__
                learner = self.algorithm
            else:
                self.cls = resolve_algorithm(self.algorithm)
                self.label = self.cls.__qualname__
                self.config = validate_config(self.cls, self.config)
                learner = self.call("__init__", self.build, self.seed)
        except (ValueError, ValidationError) as err:
            self.found.append(f"{self.label}: {' '.join(str(err).split())}")
            return
        except _Failed:
            return
        self.config = learner.config
        try:
            obs, weights = self.train(learner, updates, max_chunks)
        except _Failed:
            return
        self.seeded = True  # until seed_acting is found wanting: then acting is compared no further
        for check in (self.check_seed_acting, self.check_weights, self.check_pickle, self.check_state, self.check_policy_module):
            try:
                check(learner, obs, weights)
            except _Failed:
                pass

    def build(self, seed: int) -> Algorithm:
        return self.cls(self.obs_space, self.act_space, self.config, seed=seed)

    # ---- acting, ingesting, learning ---------------------------------------------------------
    def train(self, learner: Algorithm, updates: int, max_chunks: int):
        explorer = self.call("__init__", self.build, self.seed + 1)
        rollout = Rollout(self.env_id, self.num_envs, self.seed, self.env_kwargs)
        weights = self.call("get_weights", learner.get_weights)
        self.check_weights_dict(weights)
        self.initial = self.check_initial_state(explorer)
        if self.initial is None:
            self.check_act(explorer, rollout.obs, learner.exploration(0, 0))
        else:
            self.acting = "act_recurrent"
            self.check_act_recurrent(explorer, rollout.obs, learner.exploration(0, 0))
        done = env_steps = 0
        per_update = self.call("chunks_per_update", learner.chunks_per_update)
        for i in range(max_chunks):
            self.call("set_weights", explorer.set_weights, weights)
            self.call("seed_acting", explorer.seed_acting, [self.seed, i])
            explore = learner.exploration(env_steps, done)
            chunk = self.call(self.acting, rollout.run, explorer, self.chunk_steps, explore, policy_version=done, explorer_id=0)
            kept = self.call("ingest", learner.ingest, chunk, 0)
            if not isinstance(kept, (int, np.integer)) or not 0 <= kept <= chunk["env_steps"]:
                self.fail("ingest", f"returned {kept!r}; must return the env steps kept, an int in 0..{chunk['env_steps']}")
                raise _Failed
            env_steps += int(chunk["env_steps"])
            ready = self.call("ready", learner.ready)
            if learner.on_policy and i + 1 == per_update and not ready:
                self.fail("ready", f"False after chunks_per_update() = {per_update} fresh chunks: relaxed mode "
                          "holds no more chunks for an update, so it would wait forever")
            while ready and done < updates:
                self.check_metrics(self.call("learn", learner.learn))
                done += 1
                weights = self.call("get_weights", learner.get_weights)
                ready = self.call("ready", learner.ready)
            if done >= updates:
                break
        else:
            self.fail("ready", f"never True after {max_chunks} chunks ({env_steps} env steps): learn() never ran "
                      "(lower a warm-up in config, or raise max_chunks)")
            raise _Failed
        self.check_accepts(chunk)
        return rollout.obs, weights

    def check_act(self, algo: Algorithm, obs, explore: dict) -> None:
        out = self.call("act", algo.act, obs, explore)
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
            self.fail("act", f"must return (actions, extras dict), got {type(out).__name__}")
            raise _Failed
        self.check_actions("act", algo, obs, *out)

    def check_initial_state(self, algo: Algorithm) -> np.ndarray | None:
        """``initial_state(num_envs)``: None (feed-forward) or a float32 array (num_envs, S)."""
        state = self.call("initial_state", algo.initial_state, self.num_envs)
        if state is None:
            return None
        if not (isinstance(state, np.ndarray) and state.dtype == np.float32 and state.ndim == 2 and len(state) == self.num_envs):
            self.fail("initial_state", f"must return None or a float32 array (num_envs, S) = ({self.num_envs}, S), "
                      f"got {_typed(state)}")
            raise _Failed
        return state

    def check_act_recurrent(self, algo: Algorithm, obs, explore: dict) -> None:
        out = self.call("act_recurrent", algo.act_recurrent, obs, self.initial.copy(), explore)
        if not (isinstance(out, tuple) and len(out) == 3 and isinstance(out[1], dict)):
            self.fail("act_recurrent", f"must return (actions, extras dict, new state), got {type(out).__name__}")
            raise _Failed
        actions, extras, state = out
        if not (isinstance(state, np.ndarray) and state.dtype == np.float32 and state.shape == self.initial.shape):
            self.fail("act_recurrent", "the new state must be a float32 array shaped as initial_state()'s "
                      f"{self.initial.shape}, got {_typed(state)}")
            raise _Failed
        self.check_actions("act_recurrent", algo, obs, actions, extras)

    def check_actions(self, method: str, algo: Algorithm, obs, actions, extras: dict) -> None:
        """What ``act`` (or ``act_recurrent``) returned for ``obs``: one row each, in the action space
        (a Dict or Tuple observation's rows: those of its leaves)."""
        n = len(next(iter(obs_leaves(obs).values()))) if isinstance(obs, (dict, tuple)) else len(obs)
        if not isinstance(actions, np.ndarray) or len(actions) != n:
            self.fail(method, f"actions must be an array with one row per observation ({n}), got {_shape(actions)}")
            raise _Failed
        for name, value in extras.items():
            if not isinstance(value, np.ndarray) or len(value) != n:
                self.fail(method, f"extra {name!r} must be an array with one row per observation ({n}), got {_shape(value)}")
        env_actions = self.call("env_action", algo.env_action, actions)
        outside = [i for i in range(n) if not _contains(self.act_space, env_actions[i])]
        if outside:
            self.fail("env_action", f"action {env_actions[outside[0]]!r} is not in the action space {self.act_space}")

    def check_metrics(self, metrics) -> None:
        if not isinstance(metrics, dict):
            self.fail("learn", f"must return a dict of float metrics, got {type(metrics).__name__}")
            raise _Failed
        if "samples" not in metrics:
            self.fail("learn", "metrics lack 'samples' (the samples this update trained on)")
        bad = [k for k, v in metrics.items() if not isinstance(v, (int, float, np.number)) or not math.isfinite(float(v))]
        if bad:
            self.fail("learn", f"metric {bad[0]!r} is {metrics[bad[0]]!r}; metrics must be finite numbers")

    def check_accepts(self, chunk: dict) -> None:
        fresh = self.call("__init__", self.build, self.seed + 5)
        if not self.call("accepts", fresh.accepts, STALE):
            kept = self.call("ingest", fresh.ingest, chunk, STALE)
            if kept:
                self.fail("ingest", f"kept {kept} env steps of a chunk {STALE} versions stale, which accepts() refuses")

    # ---- round trips -------------------------------------------------------------------------
    def check_weights_dict(self, weights) -> None:
        if not isinstance(weights, dict) or not weights:
            self.fail("get_weights", f"must return a non-empty dict of numpy arrays, got {type(weights).__name__}")
            raise _Failed
        bad = [k for k, v in weights.items() if not isinstance(v, np.ndarray) or v.dtype.kind not in "fiub"]
        if bad:
            self.fail("get_weights", f"{bad[0]!r} is {_shape(weights[bad[0]])}; values must be numpy arrays on the CPU")
            raise _Failed

    def same_acting(self, a: Algorithm, b: Algorithm, obs, explore: dict, method: str, what: str) -> None:
        if not self.seeded:
            return
        self.call("seed_acting", a.seed_acting, [self.seed, 99])
        self.call("seed_acting", b.seed_acting, [self.seed, 99])
        (mine, my_state), (theirs, their_state) = self.acted(a, obs, explore, 1), self.acted(b, obs, explore, 1)
        if not np.array_equal(mine, theirs) or (my_state is not None and not np.array_equal(my_state, their_state)):
            self.fail(method, f"{what} acts differently on the same observations after the same seed_acting")

    def acted(self, algo: Algorithm, obs, explore: dict, steps: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The actions of ``steps`` steps on ``obs``, concatenated, and the state after them: a
        recurrent algorithm's from its initial state, carried from step to step (None: feed-forward)."""
        if self.initial is None:
            return np.concatenate([self.call("act", algo.act, obs, explore)[0] for _ in range(steps)]), None
        state, actions = self.initial.copy(), []
        for _ in range(steps):
            action, _, state = self.call("act_recurrent", algo.act_recurrent, obs, state, explore)
            actions.append(action)
        return np.concatenate(actions), np.asarray(state)

    def check_weights(self, learner: Algorithm, obs, weights) -> None:
        twin = self.call("__init__", self.build, self.seed + 2)
        self.call("set_weights", twin.set_weights, weights)
        back = self.call("get_weights", twin.get_weights)
        differ = _first_difference(weights, back)
        if differ:  # one violation, one line: acting on weights it did not keep would differ by chance
            self.fail("set_weights", f"get_weights() afterwards differs from what was set in {differ}")
        else:
            self.same_acting(learner, twin, obs, learner.exploration(0, 0), "set_weights", "an instance given the learner's weights")

    def check_seed_acting(self, learner: Algorithm, obs, weights) -> None:
        explore = learner.exploration(0, 0)
        first = self.acted_after_seed(learner, obs, explore, warmup=0)
        again = self.acted_after_seed(learner, obs, explore, warmup=3)
        if not np.array_equal(first, again):
            self.seeded = False
            self.fail("seed_acting", "the same seed and weights gave other actions after other acting: a chunk's "
                      "actions must depend on its seed and weights alone (exact replay and resume need it)")

    def acted_after_seed(self, algo: Algorithm, obs, explore: dict, warmup: int):
        for _ in range(warmup):
            self.acted(algo, obs, explore, 1)
        self.call("seed_acting", algo.seed_acting, [self.seed, 7])
        return self.acted(algo, obs, explore, 3)[0]

    def check_pickle(self, learner: Algorithm, obs, weights) -> None:
        try:
            copy = pickle.loads(cloudpickle.dumps(learner))
        except Exception as err:  # noqa: BLE001
            self.fail("__reduce__", f"does not pickle ({type(err).__name__}: {err}); explorers receive it pickled")
            return
        self.same_acting(learner, copy, obs, learner.exploration(0, 0), "__reduce__", "a pickled copy")

    def check_state(self, learner: Algorithm, obs, weights) -> None:
        state = self.call("state_dict", learner.state_dict)
        with tempfile.TemporaryDirectory() as d:
            try:
                loaded = checkpoint.load(checkpoint.save(d, {"version": 0, "algo": state}))["algo"]
            except Exception as err:  # noqa: BLE001
                self.fail("state_dict", f"does not survive a checkpoint (torch.save, torch.load(weights_only=True)): "
                          f"{type(err).__name__}: {' '.join(str(err).split())[:200]}")
                return
        twin = self.call("__init__", self.build, self.seed + 4)
        self.call("load_state_dict", twin.load_state_dict, loaded)
        differ = _first_difference(learner.get_weights(), twin.get_weights()) or \
            _first_difference(learner.model_state(), twin.model_state())
        if differ:
            self.fail("load_state_dict", f"an instance given state_dict() differs from the learner in {differ}")

    def check_policy_module(self, learner: Algorithm, obs, weights) -> None:
        """A recurrent algorithm's ``policy_module`` (when it has one): ``forward(obs, state)`` gives
        ``env_action`` of ``act_recurrent``'s greedy actions and its new state, step by step on an env."""
        if self.initial is None or not hasattr(learner, "policy_module"):
            return
        module = self.call("policy_module", _exportable, learner.policy_module)
        if module is None:
            return
        env = make_vec_env(self.env_id, self.num_envs, seed=self.seed + 6, **self.env_kwargs)
        try:
            obs, _ = env.reset(seed=self.seed + 6)
            state, module_state = self.initial.copy(), torch.from_numpy(self.initial.copy())
            for t in range(MODULE_STEPS):
                actions, _, state = self.call("act_recurrent", learner.act_recurrent, obs, state, DETERMINISTIC)
                actions = np.asarray(self.call("env_action", learner.env_action, actions))
                with torch.no_grad():
                    out = self.call("policy_module", module, torch.as_tensor(np.asarray(obs, np.float32)), module_state)
                if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(x, torch.Tensor) for x in out)):
                    self.fail("policy_module", "a recurrent algorithm's module must return (actions, new_state) tensors, "
                              f"got {type(out).__name__}")
                    return
                module_actions, module_state = out[0].numpy(), out[1]
                if not _same(module_actions, actions):
                    self.fail("policy_module", f"its actions differ at step {t} from env_action of act_recurrent's "
                              "with exploration off")
                    return
                if not np.allclose(module_state.numpy(), state, rtol=0, atol=1e-5):
                    self.fail("policy_module", f"its new_state differs from act_recurrent's at step {t}")
                    return
                obs, *_ = env.step(actions)
        finally:
            env.close()


def _exportable(policy_module):
    """``policy_module()``, or None for an algorithm without one (NotImplementedError)."""
    try:
        return policy_module()
    except NotImplementedError:
        return None


def _same(got: np.ndarray, expected: np.ndarray) -> bool:
    if got.shape != expected.shape:
        return False
    if got.dtype.kind in "iub" and expected.dtype.kind in "iub":
        return np.array_equal(got, expected)
    return np.allclose(got, expected, rtol=0, atol=1e-5)


def _first_difference(a: dict, b: dict) -> str | None:
    if set(a) != set(b):
        return f"its keys ({sorted(set(a) ^ set(b))[:3]})"
    return next((repr(k) for k in a if not np.array_equal(np.asarray(a[k]), np.asarray(b[k]))), None)


def _contains(space, action) -> bool:
    try:
        return bool(space.contains(np.asarray(action, dtype=space.dtype) if space.dtype is not None else action))
    except (TypeError, ValueError):
        return False


def _shape(value) -> str:
    return f"an array of shape {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__


def _typed(value) -> str:
    return f"{_shape(value)} of {value.dtype}" if isinstance(value, np.ndarray) else _shape(value)
