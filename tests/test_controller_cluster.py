"""The staleness controller on a real cluster: targets held and said, filters, pacing and credits
coming back; and TianJi's levers."""

import time

import numpy as np
import pytest
from conftest import settle

from tianji_dask.config import PipelineError, load_pipeline
from tianji_dask.dataflow.controller.view import HistoryRow
from tianji_dask.run import Run


# ---- on a real cluster -----------------------------------------------------------------------
#: explorer-heavy, learner-slow: 64-step chunks from two explorers, a 128x128 PPO learner that
#: makes 8 epochs over each; every chunk is used (no lag limit) so staleness shows the window
SLOW_LEARNER = {
    "env.num_envs": 4, "chunk_steps": 16, "algo.config.hidden": [128, 128], "algo.config.update_epochs": 8,
    "algo.config.num_minibatches": 4, "algo.config.max_policy_lag": 1000, "stop.target_return": None,
    "stop.max_seconds": 120,
}


def _staleness_of_chunks(results, first, last):
    """Mean staleness of consumed chunks number ``first`` to ``last`` (in consumption order)."""
    h = [HistoryRow(*row) for row in results["controller"]["history"]]
    assert len(h) >= last, f"only {len(h)} chunks consumed"
    return float(np.mean([row.staleness_versions for row in h[first:last]]))


def _wait_for_chunks(run, n, timeout=120):
    """Block until the controller has booked ``n`` consumed chunks (the timeout only guards a hang)."""
    deadline = time.time() + timeout
    while run.controller_state()["chunks_consumed"] < n:
        assert time.time() < deadline, f"fewer than {n} chunks consumed in {timeout} s"
        time.sleep(0.1)
    return run.controller_state()


@pytest.mark.slow
def test_staleness_target_is_held_and_followed(tianji_client, tmp_path):
    settle(tianji_client)
    # the controller off, a wide fixed window: staleness grows to about the window
    run = Run("cartpole_ppo", tianji_client, out=tmp_path / "off", overrides={**SLOW_LEARNER, "controller.window": 12})
    run.start()
    _wait_for_chunks(run, 80)
    run.stop()
    off = run.wait(timeout=60)
    assert off["controller"]["staleness_target"] is None and off["controller"]["window"] == 12
    assert _staleness_of_chunks(off, 30, 80) > 6

    # target 2: held after warm-up; then moved to 6 from outside, and followed
    run = Run("cartpole_ppo", tianji_client, out=tmp_path / "on", overrides={**SLOW_LEARNER, "controller.staleness_target": 2})
    run.start()
    _wait_for_chunks(run, 80)
    assert run.status()["staleness_target"]["state"] in ("held", "settling")  # reachable: the learner says so live
    state = run.configure(staleness_target=6)
    moved_at = state["chunks_consumed"]
    assert state["staleness_target"] == 6
    live = _wait_for_chunks(run, moved_at + 120)
    run.stop()
    on = run.wait(timeout=60)
    assert abs(_staleness_of_chunks(on, 30, moved_at) - 2) <= 1
    assert abs(_staleness_of_chunks(on, moved_at + 60, moved_at + 120) - 6) <= 1.5
    assert live["window"] > 3  # the window followed the new target
    log = np.array([row for row in on["controller"]["window_log"] if row[3] is not None], dtype=float)
    assert len(log) >= 5 and (log[:, 1] >= 1).all()
    assert on["controller"]["chunks_in_flight"] == 0
    assert on["controller"]["target_verdict"]["state"] in ("held", "settling")
    assert off["controller"]["target_verdict"] == {"state": "off", "reason": None}


@pytest.mark.slow
def test_a_target_out_of_reach_is_said_live_and_in_the_results_with_its_reason(tianji_client, tmp_path):
    # two chunks in flight at most cannot be 40 versions stale
    settle(tianji_client)
    run = Run("cartpole_ppo", tianji_client, out=tmp_path / "far", overrides={
        **SLOW_LEARNER, "controller.staleness_target": 40, "controller.window_max": 2})
    run.start()
    deadline = time.time() + 90
    while (live := run.status())["staleness_target"]["state"] != "unreachable":
        assert time.time() < deadline, f"never called out of reach: {live['staleness_target']}"
        time.sleep(0.2)
    assert "window_max 2" in live["staleness_target"]["reason"]
    run.stop()
    results = run.wait(timeout=60)
    verdict = results["controller"]["target_verdict"]
    assert verdict["state"] == "unreachable" and "raise window_max" in verdict["reason"]


@pytest.mark.slow
def test_slow_explorer_does_not_stall_relaxed_ppo(tianji_client, tmp_path):
    # explorer 0 sleeps 10 ms per env step (about 0.6 s per chunk), explorer 1 runs at full speed
    overrides = {
        "env.id": "sleepy_env:SleepyCartPole-v0", "env.num_envs": 4, "chunk_steps": 16,
        "env.explorer_kwargs": {0: {"sleep_s": 0.01}}, "stop.target_return": None, "stop.max_seconds": 6,
    }
    settle(tianji_client)  # a worker restarted by an earlier test would slow the fast explorer
    relaxed = Run("cartpole_ppo", tianji_client, out=tmp_path / "relaxed", overrides=overrides).start().wait()
    lockstep = Run("cartpole_ppo", tianji_client, out=tmp_path / "lockstep",
                   overrides={**overrides, "mode": "lockstep"}).start().wait()
    per_explorer = relaxed["controller"]["per_explorer_env_steps"]
    slow_chunks = per_explorer.get("0", 0) // 64
    # lockstep waits for the slow explorer every round; relaxed updates at the fast one's pace
    lock_slow = lockstep["controller"]["per_explorer_env_steps"]["0"] // 64
    assert lockstep["updates"] <= 2 * (lock_slow + 1)  # one chunk per explorer per round, one update each
    assert relaxed["updates"] >= 5 * max(slow_chunks, 1)
    assert relaxed["updates"] >= 3 * lockstep["updates"]
    # the slow explorer's late segments were dropped (max_policy_lag 1) and counted
    assert relaxed["chunks_dropped"].get("algorithm", 0) >= 1
    assert relaxed["algo_counters"]["dropped_segments"] >= relaxed["chunks_dropped"]["algorithm"]


@pytest.mark.slow
def test_max_staleness_filter_drops_and_counts(tianji_client, tmp_path):
    run = Run("cartpole_ppo", tianji_client, out=tmp_path / "filter",
              overrides={**SLOW_LEARNER, "controller.window": 12, "controller.max_staleness": 3, "stop.max_seconds": 6})
    results = run.start().wait()
    dropped = results["chunks_dropped"].get("max_staleness", 0)
    assert dropped >= 5
    assert results["controller"]["chunks_dropped"] == sum(results["chunks_dropped"].values())
    assert results["env_steps_trained"] < results["env_steps"]
    # nothing staler than the bound was trained on
    from tianji_dask.core.metrics import CHUNK_FIELDS
    chunks = np.loadtxt(run.out / "chunks.csv", delimiter=",", skiprows=1, ndmin=2)
    assert chunks[:, CHUNK_FIELDS.index("staleness_versions")].max() > 3  # some arrived too stale ...
    assert results["updates"] <= results["chunks"] - dropped  # ... and only the rest fed updates


@pytest.mark.slow
def test_replay_ratio_band_paces_explorers(tianji_client, tmp_path):
    run = Run("cartpole_dqn", tianji_client, out=tmp_path / "rho",
              overrides={"stop.target_return": None, "stop.max_seconds": 8})
    results = run.start().wait()
    ctrl = results["controller"]
    lo, hi = ctrl["replay_ratio"]
    assert (lo, hi) == (6.0, 24.0)  # the pipeline's band
    prog = results["replay_progress"]
    rho = prog["samples_trained"] / prog["env_steps"]
    # at most a chunk's worth of data (per explorer) beyond the floor; never above the ceiling
    chunk = run.pipeline.chunk_steps * run.pipeline.env.num_envs
    assert lo * (prog["env_steps"] - 2 * chunk) / prog["env_steps"] <= rho <= hi
    assert ctrl["refused_replay_ratio"] > 0  # explorers were held back, not the learner


@pytest.mark.slow
def test_a_replay_staleness_target_moves_the_replay_ratio_within_the_band(tianji_client, tmp_path):
    run = Run("cartpole_dqn", tianji_client, out=tmp_path / "replay-target", overrides={
        "stop.target_return": None, "stop.max_seconds": 10, "controller.replay_staleness_target": 500})
    run.start()
    deadline = time.time() + 60
    while (live := run.status()).get("replay_staleness_target", {}).get("state") in (None, "off"):
        assert time.time() < deadline and not live.get("done"), f"never judged live: {live.get('replay_staleness_target')}"
        time.sleep(0.2)
    assert live["replay_staleness_target"]["state"] in ("settling", "held", "unreachable")
    assert live["staleness_target"] == {"state": "off", "reason": None}  # no window target here
    results = run.wait()
    summary = results["replay_staleness_versions"]
    assert set(summary) == {"mean", "mean_second_half", "p95"} and 0 < summary["mean"] <= summary["p95"]
    ctrl = results["controller"]
    assert ctrl["replay_staleness_target"] == 500 and ctrl["replay_staleness_last_period"] is not None
    assert ctrl["replay_target_verdict"]["state"] in ("settling", "held", "unreachable")  # judged, not off
    lo, hi = ctrl["replay_ratio"]
    assert lo <= ctrl["replay_ratio_effective"] <= hi


def test_explorer_errors_return_their_credits(tianji_client, tmp_path):
    # explorer 0's envs break after 1.25 chunks' steps: every other chunk fails and its envs are rebuilt
    steps = load_pipeline("cartpole_dqn").chunk_steps
    run = Run("cartpole_dqn", tianji_client, out=tmp_path / "fail", overrides={
        "env.id": "sleepy_env:FailingCartPole-v0", "env.explorer_kwargs": {0: {"fail_after": steps + steps // 4}},
        "stop.target_return": None, "stop.max_seconds": 2,
    })
    results = run.start().wait()
    ctrl = results["controller"]
    erred = [lost for lost in results["lost"] if "FailingCartPole: broke" in lost["reason"]]
    assert erred and all(lost["explorer_id"] == 0 for lost in erred)
    assert erred[0]["reason"].startswith("explorer 0, env sleepy_env:FailingCartPole-v0: RuntimeError")
    assert ctrl["credits_returned"]["erred"] >= len(erred)
    assert ctrl["chunks_in_flight"] == 0 and ctrl["credits_granted"] == sum(ctrl["credits_returned"].values())
    assert results["stop_reason"] == "max_seconds" and results["updates"] > 0
    assert ctrl["per_explorer_env_steps"]["0"] > 0  # the rebuilt envs produced chunks again


def test_an_explorer_that_always_fails_stops_the_run(tianji_client, tmp_path):
    run = Run("cartpole_dqn", tianji_client, out=tmp_path / "broken", overrides={
        "env.id": "sleepy_env:FailingCartPole-v0", "env.explorer_kwargs": {1: {"fail_after": 0}},
        "stop.target_return": None, "stop.max_seconds": 60, "stop.max_explorer_failures": 3,
    })
    results = run.start().wait()
    assert results["stop_reason"] == "explorer_failures"
    assert results["error"].startswith("explorer 1 failed 3 chunks in a row; last: explorer 1")
    assert (tmp_path / "broken" / "error.txt").read_text().count("Traceback") == 1  # the explorer's, in the run folder
    failed = [lost for lost in results["lost"] if lost["explorer_id"] == 1 and "FailingCartPole" in lost["reason"]]
    assert len(failed) >= 3  # it stopped on the failures, not on its time budget
    assert results["controller"]["chunks_in_flight"] == 0
    assert (run.out / "results.json").exists()


# ---- TianJi's levers ---------------------------------------------------------------------------
def test_balance_helper_and_updates_per_pass():
    import yaml

    from tianji_dask.config import bundled_pipelines_dir, parse_pipeline

    data = yaml.safe_load((bundled_pipelines_dir() / "tianji_cartpole_dqn.yaml").read_text())
    del data["chunk_steps"], data["learner"]["publish_every"]
    data["balance"] = {"chunk_steps_total": 64, "publish_every_total": 512}
    for explorers, chunk, publish in ((1, 64, 512), (4, 16, 128), (8, 8, 64)):
        p = parse_pipeline({**data, "explorers": explorers})
        assert (p.chunk_steps, p.learner.publish_every) == (chunk, publish)
    data["learner"]["updates_per_pass"] = "ln_explorers"
    assert [parse_pipeline({**data, "explorers": a}).updates_per_pass for a in (1, 2, 4, 8, 16)] == [1, 1, 1, 2, 3]
    with pytest.raises(PipelineError, match="^balance: derives chunk_steps"):
        parse_pipeline({**data, "chunk_steps": 32})


def test_epsilon_can_follow_learner_updates():
    from tianji_dask.algos.dqn import DQN, DQNConfig
    from tianji_dask.envs.vector import env_spaces

    spaces = env_spaces("CartPole-v1")
    by_steps = DQN(*spaces, DQNConfig(eps_decay_steps=1000))
    by_updates = DQN(*spaces, DQNConfig(eps_decay_steps=1000, eps_decay_on="updates"))
    assert by_steps.exploration(env_steps=1000, updates=0)["epsilon"] == pytest.approx(0.04)
    assert by_updates.exploration(env_steps=1000, updates=0)["epsilon"] == pytest.approx(1.0)
    assert by_updates.exploration(env_steps=0, updates=500)["epsilon"] == pytest.approx(0.52)


@pytest.mark.slow
def test_tianji_pipeline_runs_and_drops_on_refresh(tianji_client, tmp_path):
    # TianJi's setting, publishing every update so refreshes happen during most chunks
    run = Run("tianji_cartpole_dqn", tianji_client, out=tmp_path / "tianji", overrides={
        "learner.publish_every": 1, "stop.target_return": None, "stop.max_seconds": 5, "stop.max_updates": None,
    })
    results = run.start().wait()
    assert results["error"] is None and results["explorers"] == 4 and results["updates"] > 0
    dropped = results["chunks_dropped"].get("refresh", 0)
    assert dropped > 0 and results["env_steps_trained"] < results["env_steps"]
    # the same run without the lever keeps everything
    run = Run("tianji_cartpole_dqn", tianji_client, out=tmp_path / "keep", overrides={
        "learner.publish_every": 1, "learner.drop_on_refresh": False, "stop.target_return": None,
        "stop.max_seconds": 3, "stop.max_updates": None,
    })
    results = run.start().wait()
    assert results["chunks_dropped"] == {} and results["env_steps_trained"] == results["env_steps"]
