"""Stepping a vector env with a policy into SampleChunks (no Dask).

Used by explorer tasks on Dask workers and by the single-process mode alike, so both produce
exactly the same data. What the env raises while it is made, reset or stepped comes out as an
``EnvError`` (its cause: the env's exception), so the caller tells a broken env from a broken policy.
"""

from __future__ import annotations

import time

import numpy as np

from tianji_dask.acting import Acting
from tianji_dask.chunk import leaf_dtype, make_chunk, obs_leaves
from tianji_dask.envs.burn_in import BurnInHistory
from tianji_dask.envs.vector import make_vec_env
from tianji_dask.errors import EnvError

#: per-step arrays an env reports in its step info that the chunk keeps as extras, zero on reset
#: steps like the reward (a multi-agent env's per-agent rewards: the team reward is their sum)
INFO_EXTRAS = ("agent_rewards",)


def keep_extra(extra_bufs: dict[str, np.ndarray], name: str, t: int, value: np.ndarray, n_steps: int) -> None:
    """Write step ``t``'s ``value`` (N, ...) into ``extra_bufs[name]``, made on first sight."""
    if name not in extra_bufs:
        extra_bufs[name] = np.empty((n_steps, *value.shape), dtype=value.dtype)
    extra_bufs[name][t] = value


def env_call(fn, *args, **kwargs):
    """``fn(...)``, what it raises as an ``EnvError`` (the env's fault, not the policy's)."""
    try:
        return fn(*args, **kwargs)
    except Exception as err:
        raise EnvError(f"{type(err).__name__}: {err}") from err


def stream_seed(run_seed: int, explorer_id: int, rebuild: int = 0) -> int:
    """The env seed of an explorer stream's envs: each stream its own, and each rebuild of a
    stream (its worker lost, its envs broken) a new one, not a replay of the old episodes."""
    return run_seed * 100_003 + explorer_id * 1009 + rebuild


class Rollout:
    """A live vector env whose episodes continue across chunks."""

    def __init__(self, env_id: str, num_envs: int, seed: int, env_kwargs: dict | None = None, step_cost=None,
                 generation: int = 0):
        """``step_cost``: a ``simulate.StepCostClock``, whose cost every vector step also spends.
        ``generation``: how many times its stream has moved to another worker (its seed's part)."""
        self.generation = generation
        self.env_id = env_id
        self.num_envs = num_envs
        self.step_cost = step_cost
        self.seed = int(seed)
        self.serial = 0  # chunks run so far: with the seed, which chunk of which env instance this is
        self.env = env_call(make_vec_env, env_id, num_envs, seed=seed, **(env_kwargs or {}))
        self.obs, _ = env_call(self.env.reset, seed=seed)
        self.env.action_space.seed(seed)
        # True where the env finished on the previous step: its next step is a reset, not a transition
        self.resetting = np.zeros(num_envs, dtype=bool)
        self.episode_return = np.zeros(num_envs, dtype=np.float64)
        self.episode_length = np.zeros(num_envs, dtype=np.int64)
        self.env_steps = 0
        self.state = None  # a recurrent policy's state per env (see Algorithm.initial_state), made on first run
        self.history = None  # with the policy's burn_in K > 0: its envs' last K steps (see burn_in.py)

    def run(self, policy: Acting, n_steps: int, explore: dict, *, policy_version: int, explorer_id: int) -> dict:
        """Step all envs ``n_steps`` times with ``policy.act`` and return one chunk. The env
        receives ``policy.env_action`` of each action; the chunk keeps the action itself. A
        recurrent policy (``initial_state`` not None) acts through ``act_recurrent`` and its chunk
        carries ``state0``; with ``policy.burn_in`` K > 0 also the K steps before (burn_in.py)."""
        t_start = time.time()
        n = self.num_envs
        leaves = None if isinstance(self.obs, np.ndarray) else obs_leaves(self.obs)  # a Dict or Tuple observation's
        if leaves is None:
            obs_buf = np.empty((n_steps + 1, n, *self.obs.shape[1:]), dtype=self.obs.dtype if self.obs.dtype == np.uint8 else np.float32)
        else:  # one buffer per leaf (see chunk.py)
            obs_buf = {k: np.empty((n_steps + 1, n, *np.shape(v)[1:]), dtype=leaf_dtype(np.asarray(v).dtype))
                       for k, v in leaves.items()}
        actions = None
        rewards = np.empty((n_steps, n), dtype=np.float32)
        terminated = np.empty((n_steps, n), dtype=bool)
        truncated = np.empty((n_steps, n), dtype=bool)
        valid = np.empty((n_steps, n), dtype=bool)
        extra_bufs: dict[str, np.ndarray] = {}
        episodes: list[tuple[float, float, int]] = []
        obs = self.obs
        env_action = policy.env_action
        initial = policy.initial_state(n)
        if initial is not None and self.state is None:
            self.state = initial.copy()
        state0 = None if initial is None else self.state.copy()
        burn_in = int(policy.burn_in) if initial is not None else 0
        if burn_in and leaves is not None:
            raise ValueError(f"burn_in: {type(policy).__name__}'s burn-in is for Box observations; allowed with Dict "
                             "observations: burn_in 0")
        if burn_in and (self.history is None or self.history.k != burn_in):
            self.history = BurnInHistory(burn_in, obs_buf[0], initial)
        tail = self.history.tail_steps(n_steps) if burn_in else n_steps
        tail_states = np.empty((n_steps - tail, *initial.shape), dtype=np.float32) if burn_in else None
        if self.step_cost is not None:
            self.step_cost.chunk()
        for t in range(n_steps):
            if leaves is None:
                obs_buf[t] = obs
            else:
                _put_leaves(obs_buf, t, obs)
            if initial is None:
                action, extra = policy.act(obs, explore)
            else:  # the step after a reset step starts the new episode from the initial state
                if t >= tail:
                    tail_states[t - tail] = self.state
                action, extra, self.state = policy.act_recurrent(obs, self.state, explore)
                self.state[self.resetting] = initial[self.resetting]
            if actions is None:
                actions = np.empty((n_steps, n, *action.shape[1:]), dtype=action.dtype)
            actions[t] = action
            for k, v in extra.items():
                keep_extra(extra_bufs, k, t, v, n_steps)
            try:
                obs, reward, term, trunc, step_info = self.env.step(env_action(action))
            except Exception as err:
                raise EnvError(f"{type(err).__name__}: {err}") from err
            if self.step_cost is not None:
                self.step_cost.step()
            valid[t] = ~self.resetting
            rewards[t] = np.where(valid[t], reward, 0.0)
            for k in INFO_EXTRAS:
                if k in step_info:
                    v = np.asarray(step_info[k])
                    keep_extra(extra_bufs, k, t, np.where(valid[t].reshape(n, *[1] * (v.ndim - 1)), v, 0), n_steps)
            terminated[t] = term & valid[t]
            truncated[t] = trunc & valid[t]
            self.episode_return += rewards[t]
            self.episode_length += valid[t]
            done = terminated[t] | truncated[t]
            if done.any():
                now = time.time()
                for i in np.flatnonzero(done):
                    episodes.append((now, float(self.episode_return[i]), int(self.episode_length[i])))
                self.episode_return[done] = 0.0
                self.episode_length[done] = 0
            self.resetting = done
        if leaves is None:
            obs_buf[n_steps] = obs
        else:
            _put_leaves(obs_buf, n_steps, obs)
        self.obs = obs
        recurrent = None
        if state0 is not None:
            recurrent = {"state0": state0}  # the state step 0 acted from, (N, S)
            if burn_in:
                recurrent.update(self.history.fields())
                self.history.advance(obs_buf[:n_steps], valid, tail_states)
        chunk = make_chunk(
            obs=obs_buf, actions=actions, rewards=rewards, terminated=terminated, truncated=truncated,
            valid=valid, extras=extra_bufs, explorer_id=explorer_id, policy_version=policy_version,
            t_start=t_start, t_end=time.time(), episodes=episodes, env_seed=self.seed, stream_serial=self.serial,
            recurrent=recurrent,
        )
        self.serial += 1
        self.env_steps += chunk["env_steps"]
        return chunk

    def close(self) -> None:
        self.env.close()


def _put_leaves(bufs: dict[str, np.ndarray], t: int, obs) -> None:
    """Frame ``t`` of a Dict or Tuple observation into its leaves' buffers."""
    for k, v in obs_leaves(obs).items():
        bufs[k][t] = v
