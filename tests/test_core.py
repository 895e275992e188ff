"""The learner core without Dask: one set of stop rules, the numeric guard, checkpoints and resume,
and the same books whether single mode or the learner actor runs it."""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest

from tianji_dask.algos import make_algorithm
from tianji_dask.core.guard import NumericFault, check_weights
from tianji_dask.core.learner_core import LearnerCore
from tianji_dask.core.spec import CheckpointSettings, CoreSpec
from tianji_dask.core.stop import StopRules
from tianji_dask.envs.rollout import Rollout
from tianji_dask.envs.vector import env_spaces

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SPACES = env_spaces("CartPole-v1")


def core_of(stop: StopRules, tmp_path=None, algo="ppo", config=None, **changes) -> LearnerCore:
    ckpt = CheckpointSettings(dir=str(tmp_path / "ckpt"), every_versions=2) if tmp_path is not None else None
    return LearnerCore(CoreSpec(make_algo=functools.partial(make_algorithm, algo, *SPACES, config or {"segments_per_batch": 1}, 0),
                                stop=stop, t_process_start=time.time(), checkpoint=ckpt, **changes))


def feed(core: LearnerCore, rollout: Rollout, updates: int) -> None:
    while core.ledger.updates < updates:
        core.consume(rollout.run(core.algo, 32, {}, policy_version=core.version, explorer_id=0))
        while core.ready() and core.ledger.updates < updates:
            core.learn_once()


@pytest.mark.parametrize("figures,reason", [
    ({"solved": True, "env_steps": 0, "updates": 0, "elapsed_s": 0.0}, "solved"),
    ({"solved": False, "env_steps": 500, "updates": 0, "elapsed_s": 0.0}, "max_env_steps"),
    ({"solved": False, "env_steps": 0, "updates": 7, "elapsed_s": 0.0}, "max_updates"),
    ({"solved": False, "env_steps": 0, "updates": 0, "elapsed_s": 9.0}, "max_seconds"),
    ({"solved": False, "env_steps": 499, "updates": 6, "elapsed_s": 8.9}, None),
])
def test_stop_rules_name_the_first_reason(figures, reason):
    rules = StopRules(target_return=1.0, max_env_steps=500, max_updates=7, max_seconds=9.0)
    assert rules.reason(**figures) == reason


def test_a_group_learner_stops_on_its_time_only_the_run_judges_the_rest():
    rules = StopRules(target_return=1.0, max_env_steps=500, max_updates=7, max_seconds=9.0).for_group()
    assert rules.reason(solved=True, env_steps=10**6, updates=10**6, elapsed_s=1.0) is None
    assert rules.reason(solved=True, env_steps=0, updates=0, elapsed_s=9.0) == "max_seconds"
    assert rules.target_return == 1.0  # its episodes still tell whether it solved


def test_solved_at_is_the_end_of_the_episode_that_brings_the_running_mean_to_the_target():
    rules = StopRules(target_return=10.0, mean_episodes=3)
    episodes = np.array([[1.0, 5.0], [2.0, 10.0], [3.0, 10.0], [4.0, 10.0], [5.0, 0.0]])
    assert rules.solved_at(episodes) == 4.0
    assert rules.running_mean_solves([10.0, 10.0, 10.0]) and not rules.running_mean_solves([10.0, 10.0])
    assert StopRules(target_return=None, max_seconds=1).solved_at(episodes) is None


def test_the_core_counts_versions_and_stops_by_its_rules():
    core = core_of(StopRules(max_updates=3))
    feed(core, Rollout("CartPole-v1", 4, seed=0), 3)
    assert core.version == 3 and core.stop_reason() == "max_updates"
    final = core.finish()
    r = final.results
    assert r["updates"] == 3 and r["final_version"] == 3 and r["stop_reason"] == "max_updates"
    assert r["env_steps"] == int(final.chunks[:, 7].sum()) and r["error"] is None
    assert set(r["learner_time"]["seconds"]) >= {"learn", "ingest", "other"}


def test_the_core_reports_replay_staleness_for_replaying_algorithms_only():
    dqn = {"hidden": [8], "learning_starts": 64, "batch_size": 16, "updates_per_env_step": 0.5}
    core = core_of(StopRules(max_updates=40), algo="dqn", config=dqn)
    feed(core, Rollout("CartPole-v1", 4, seed=0), 40)
    per_update = core.ledger.replay_staleness.all()[:, 0]
    # the version at the update (before it) minus the mean policy version of the batch it trained on
    assert len(per_update) == 40 and per_update[-1] == 39 - core.ledger.last_metrics["batch_policy_version"]
    assert (per_update >= 0).all() and per_update[-1] > 0
    assert core.status()["replay_staleness_recent_mean"] == pytest.approx(per_update[-40:].mean())
    summary = core.finish().results["replay_staleness_versions"]
    assert summary["mean"] == pytest.approx(per_update.mean()) and set(summary) == {"mean", "mean_second_half", "p95"}
    ppo = core_of(StopRules(max_updates=1))
    feed(ppo, Rollout("CartPole-v1", 4, seed=0), 1)
    assert ppo.status()["replay_staleness_recent_mean"] is None and ppo.finish().results["replay_staleness_versions"] is None


def test_a_dropped_chunk_is_counted_and_its_episodes_still_count():
    core = core_of(StopRules(max_updates=1))
    chunk = Rollout("CartPole-v1", 4, seed=0).run(core.algo, 64, {}, policy_version=0, explorer_id=0)
    done = core.consume(chunk, dropped="max_staleness")
    assert done.dropped == "max_staleness" and done.kept_steps == 0
    assert core.ledger.dropped == {"max_staleness": 1} and len(core.ledger.episodes) == len(chunk["episodes"])
    assert not core.ready()  # the algorithm never saw it


def test_numeric_faults_stop_the_run_and_nothing_non_finite_is_published(tmp_path):
    core = core_of(StopRules(max_updates=100), tmp_path)
    with pytest.raises(NumericFault, match="non-finite weights at version 0; not published"):
        check_weights({"w": np.array([np.nan])}, 0, published=True)

    def diverge():
        for p in core.algo.net.parameters():
            p.data.fill_(float("nan"))
        core.weights()

    core.run(diverge)
    assert core.stop_reason() == "numeric_fault" and core.error.startswith("numeric: non-finite weights")
    assert core.checkpointer.last_path is None  # no checkpoint of the broken weights


def test_an_error_in_the_loop_is_kept_for_the_results():
    core = core_of(StopRules(max_updates=1))
    core.run(lambda: 1 / 0)
    assert core.stop_reason() == "error" and "ZeroDivisionError" in core.finish().results["error"]


def test_a_resumed_core_goes_on_with_the_version_the_books_and_the_clock(tmp_path):
    first = core_of(StopRules(max_updates=4), tmp_path)
    feed(first, Rollout("CartPole-v1", 4, seed=0), 4)
    first.write_checkpoint()
    path = first.checkpointer.last_path
    episodes = len(first.ledger.episodes)
    time.sleep(0.2)  # a pause between the runs does not count: the run's start moves by at least it
    second = core_of(StopRules(max_updates=8), tmp_path, resume_from=str(path))
    assert second.version == 4 and second.ledger.updates == 4 and len(second.ledger.episodes) == episodes
    assert second.t_run_start >= first.t_run_start + 0.2
    feed(second, Rollout("CartPole-v1", 4, seed=1), 8)
    assert second.version == 8 and second.stop_reason() == "max_updates"


def test_a_rebuilt_core_keeps_the_runs_start(tmp_path):
    first = core_of(StopRules(max_updates=2), tmp_path)
    feed(first, Rollout("CartPole-v1", 4, seed=0), 2)
    first.write_checkpoint()
    start = first.t_run_start - 100.0  # the run started long before this learner was lost
    rebuilt = core_of(StopRules(max_updates=4), tmp_path, resume_from=str(first.checkpointer.last_path),
                      keep_t_run_start=start)
    assert rebuilt.t_run_start == start and rebuilt.version == 2
