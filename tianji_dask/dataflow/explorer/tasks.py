"""Explorer side: the tasks that run on a worker's env pool (``pool.py``): ``explore_chunk``
steps one stream's live envs into a chunk, ``evaluate_policy`` plays an evaluation. Each task is
short and idempotent: if its worker dies, Dask reruns it elsewhere and that stream's episode
restarts there.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass

from distributed import get_worker
from distributed.metrics import context_meter

from tianji_dask.dataflow.direct.send import Unencodable, send_chunk
from tianji_dask.dataflow.explorer.pool import worker_pool
from tianji_dask.dataflow.keycache import bound_key_cache
from tianji_dask.errors import EnvError, ExplorerError, raised_in


@dataclass(frozen=True)
class DirectRoute:
    """Where an explorer task sends a chunk of at least ``min_bytes`` straight to the learner
    (direct.py): the sink's address and secret. A task argument: module-level, so it pickles."""

    address: tuple
    secret: bytes
    min_bytes: int



def _explorer_error(pool, explorer_id: int, err: Exception, policy) -> ExplorerError:
    """One line naming the stream, the env and what raised; the traceback (an env's own, without
    the rollout's re-raise) as its detail, which the learner writes to the run's folder."""
    line = f"explorer {explorer_id}, env {pool.env_id}: "
    if isinstance(err, EnvError):
        return ExplorerError(line + str(err), err.traceback_text(), env=True)
    return ExplorerError(line + raised_in(err, type(policy)), traceback.format_exc())


def explore_chunk(run_id: str, weights: dict, policy_version: int, explorer_id: int, n_steps: int, explore: dict,
                  group: int = 0, direct: DirectRoute | None = None, generation: int = 0) -> dict:
    """Step explorer ``explorer_id``'s envs ``n_steps`` times with group ``group``'s policy
    ``policy_version``. With ``direct``, a chunk of at least ``direct.min_bytes`` goes straight
    to the learner's sink and the task returns its stub (see direct.py). ``generation``: how
    many times the learner has moved the stream to another worker (its envs' seeds follow it)."""
    worker = get_worker()
    pool = worker_pool(worker, run_id)
    with context_meter.meter("policy-load"):
        policy = pool.policy_for(weights, policy_version, group)
    with pool.stream_lock(explorer_id):
        try:
            rollout = pool.rollout(explorer_id, generation)
        except EnvError as err:  # the env cannot be made (or reset): said as an env error, like one in step
            raise _explorer_error(pool, explorer_id, err, policy) from err
        policy.seed_acting([rollout.seed, rollout.serial])  # its actions: a function of its seed and weights alone
        with context_meter.meter("env-step"):
            try:
                chunk = rollout.run(policy, n_steps, explore, policy_version=policy_version, explorer_id=explorer_id)
            except Exception as err:
                pool.drop(explorer_id)  # the stream's envs may be broken: the next chunk rebuilds them (fresh episodes)
                raise _explorer_error(pool, explorer_id, err, policy) from err
    pool.count(chunk["env_steps"])
    context_meter.digest_metric("env-steps", chunk["env_steps"], "count")
    bound_key_cache()  # every chunk's key passes through this worker's key-name cache
    if direct is not None and chunk["nbytes"] >= direct.min_bytes:
        with context_meter.meter("direct-send"):
            try:
                return send_chunk(direct.address, worker.get_current_task(), chunk, secret=direct.secret)
            except Unencodable:
                pass  # a value the direct format cannot carry: the chunk goes through Dask
    return chunk


def evaluate_policy(run_id: str, weights: dict, policy_version: int, episodes: int, seed: int,
                    deterministic: bool = True) -> dict:
    """Play ``episodes`` whole episodes on an env of its own with policy ``policy_version``: an
    evaluation, never trained on. Deterministic: the most likely action, no exploration."""
    from tianji_dask.envs.vector import make_vec_env
    from tianji_dask.envs.play import DETERMINISTIC, play_episodes

    pool = worker_pool(get_worker(), run_id)
    policy = pool.make_policy()  # its own: the explorer threads' policies stay at their versions
    policy.set_weights(weights)
    env = make_vec_env(pool.env_id, 1, seed=seed, **pool.env_kwargs)
    t_start = time.time()
    try:
        returns, lengths = play_episodes(policy, env, episodes, seed, DETERMINISTIC if deterministic else {})
    finally:
        env.close()
    return {"version": policy_version, "returns": returns, "lengths": lengths, "t_start": t_start, "t_end": time.time()}
