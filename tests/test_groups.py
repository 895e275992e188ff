"""Group mode: G learners, each with its own explorers and controller books, fused by a reducer."""

import asyncio
import contextlib

import numpy as np
import pytest

from tianji_dask.algos import make_algorithm
from tianji_dask.config import PipelineError, load_pipeline
from tianji_dask.dataflow.controller.plugin import StalenessController
from tianji_dask.dataflow.messages import Consumption, consumptions_to_wire
from tianji_dask.dataflow.learner.reducer import Reducer, average
from tianji_dask.envs.vector import env_spaces
from tianji_dask.run import Run
from tianji_dask.run.checks import check_pipeline
from helpers import law_wire


def _model(value: float) -> dict:
    return {"w": np.full((2, 3), value, dtype=np.float32), "b": np.full(3, value, dtype=np.float32)}


def test_reducer_fuses_exactly_one_model_per_group_per_round():
    async def scenario():
        r = Reducer(2)
        assert await r.join(0) == 0 and await r.take(0, timeout=0.01) is None
        assert await r.offer(0, 0, 16, _model(1.0)) == 1
        with pytest.raises(ValueError, match="group 0 offered round 0, but its next round is 1"):
            await r.offer(0, 0, 20, _model(9.0))  # a fast group cannot put a second model into a round
        waiting = asyncio.ensure_future(r.take(0, timeout=5))  # waits on the loop without blocking it
        await asyncio.sleep(0.01)
        assert not waiting.done()
        assert await r.offer(1, 0, 12, _model(3.0)) == 2
        model, versions = await waiting
        assert versions == {0: 16, 1: 12}
        np.testing.assert_array_equal(model["w"], np.full((2, 3), 2.0, dtype=np.float32))
        assert model["w"].dtype == np.float32
        # round 1: group 1 is first this time; the models of round 0 do not leak into it
        await r.offer(1, 1, 30, _model(5.0))
        await r.offer(0, 1, 33, _model(7.0))
        model, versions = await r.take(1)
        assert versions == {0: 33, 1: 30} and float(model["b"][0]) == 6.0
        assert [row["round"] for row in await r.rounds()] == [0, 1]
        assert await r.join(1) == 2  # a rebuilt learner goes on from its next round
        with pytest.raises(ValueError, match="no group 2"):
            await r.offer(2, 0, 1, _model(0.0))

    asyncio.run(scenario())


def test_average_keeps_dtype_and_is_the_elementwise_mean():
    rng = np.random.default_rng(0)
    models = [{"a": rng.normal(size=(4, 5)).astype(np.float32)} for _ in range(3)]
    np.testing.assert_allclose(average(models)["a"], np.mean([m["a"] for m in models], axis=0), atol=1e-6)


@pytest.mark.parametrize("name", ["dqn", "ppo", "impala"])
def test_model_state_covers_every_network_and_loads_back(name):
    obs, act = env_spaces("CartPole-v1")
    a, b = make_algorithm(name, obs, act, {}, 0), make_algorithm(name, obs, act, {}, 1)
    state_a, state_b = a.model_state(), b.model_state()
    assert state_a.keys() == state_b.keys() and any(not np.array_equal(state_a[k], state_b[k]) for k in state_a)
    if name == "dqn":  # the target network is fused too, not only the acting network
        assert any(k.startswith("target.") for k in state_a), sorted(state_a)
    fused = average([state_a, state_b])
    a.load_model_state(fused)
    for k, v in a.model_state().items():
        np.testing.assert_array_equal(v, fused[k])
    # what explorers act with is part of it
    for k, v in a.get_weights().items():
        assert any(np.array_equal(v, fused[key]) for key in fused if key.endswith(k)), k


def test_controller_keeps_books_per_group():
    ctl = StalenessController()
    ctl.begin("r", law_wire(window=2), group=0)
    ctl.begin("r", law_wire(window=3), group=1)
    warm = {"env_steps": 0, "samples_trained": 0, "warm": False}
    keys0 = [f"tianji-explore-r-g0-{i}" for i in range(3)]
    keys1 = [f"tianji-explore-r-g1-{i}" for i in range(4)]
    assert ctl.cycle("r", group=0, want=keys0, progress=warm)["granted"] == keys0[:2]
    assert ctl.cycle("r", group=1, want=keys1, progress=warm)["granted"] == keys1[:3]
    ctl.cycle("r", group=1, consumed=consumptions_to_wire([Consumption(keys1[0], 2, 256, 10, 1, 0.1, None)]), learner_version=4)
    ctl.transition(keys0[1], "processing", "erred")  # a credit goes back to the group that holds it
    state = ctl.state("r")
    g0, g1 = state["groups"]
    assert (g0["chunks_in_flight"], g1["chunks_in_flight"]) == (1, 2)
    assert g0["credits_returned"]["erred"] == 1 and g1["credits_returned"]["consumed"] == 1
    assert g1["per_explorer_env_steps"] == {"2": 256} and g0["chunks_consumed"] == 0
    with pytest.raises(ValueError, match="^gain"):
        ctl.configure("r", gain=5)  # refused for every group, applied to none
    assert ctl.configure("r", staleness_target=3)["groups"][1]["staleness_target"] == 3
    ctl.begin("other", law_wire(window=1))  # a new run has books of its own; the first run's stay
    assert ctl.run_ids() == ["r", "other"] and list(ctl.run("other").groups) == [0] and list(ctl.run("r").groups) == [0, 1]


def test_group_pipeline_fields_are_checked():
    p = load_pipeline("cartpole_dqn", overrides={"groups": 3, "explorers": 2})
    assert [p.group_streams(g) for g in range(3)] == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(PipelineError, match="^groups: single mode runs one learner"):
        load_pipeline("cartpole_dqn", overrides={"groups": 2, "mode": "single"})
    with pytest.raises(PipelineError, match=r"^groups: Input should be greater than or equal to 1 \(got 0\)"):
        load_pipeline("cartpole_dqn", overrides={"groups": 0})
    with pytest.raises(PipelineError, match="^reduce.every: Input should be greater than or equal to 1"):
        load_pipeline("cartpole_dqn", overrides={"groups": 2, "reduce.every": 0})
    dqn, ppo = (check_pipeline(load_pipeline(name, overrides={"groups": 2}), has_client=False)
                for name in ("cartpole_dqn", "cartpole_ppo"))
    assert (dqn.reduce_every, dqn.reduce_barrier) == (16, False)  # off-policy: fuse every 16 updates, no barrier
    assert (ppo.reduce_every, ppo.reduce_barrier) == (1, True)


# ---- on a real cluster: one LEARNER worker per group ------------------------------------------
@pytest.fixture(scope="module")
def group_client():
    from distributed import Client

    from tianji_dask.launch.cluster import local_cluster

    cluster = local_cluster(explorer_workers=2, dashboard_address=None, learner_workers=2)
    client = Client(cluster)
    with contextlib.closing(cluster), contextlib.closing(client):
        yield client


def _check_rounds(results: dict, groups: int) -> list[dict]:
    """Every fusion averaged exactly one model from each group, rounds in order, and each
    group's own record of what it offered matches the reducer's."""
    rounds = results["fusion"]["rounds"]
    assert rounds and [r["round"] for r in rounds] == list(range(len(rounds)))
    for r in rounds:
        assert sorted(r["versions"]) == list(range(groups)), r
    for g, res in enumerate(results["group_results"]):
        mine = res["fusions"]
        assert [f["round"] for f in mine] == list(range(len(mine)))
        assert len(rounds) - 1 <= len(mine) <= len(rounds)  # the last round may be fused and not yet installed
        for f in mine:
            assert rounds[f["round"]]["versions"][g] == f["offered_version"]
        offered = [r["versions"][g] for r in rounds]
        assert all(b > a for a, b in zip(offered, offered[1:]))  # one new model per round
    return rounds


@pytest.mark.slow
def test_two_groups_of_dqn_solve_cartpole(group_client, tmp_path):
    run = Run("cartpole_dqn", group_client, out=tmp_path / "dqn", overrides={
        "groups": 2, "explorers": 1, "stop.max_seconds": 400})
    results = run.start().wait(timeout=450)
    assert results["error"] is None and results["solved"], (results["stop_reason"], results["final_mean_return"])
    rounds = _check_rounds(results, 2)
    every = results["fusion"]["every"]
    assert not results["fusion"]["barrier"] and every == 16
    for res in results["group_results"]:
        # asynchronous: a learner keeps training while its round completes, so it offers every
        # `every` updates of its own, not in lockstep with the other group
        assert res["updates"] >= every * len(res["fusions"])
    assert len(rounds) >= 20
    # both groups' explorers made the episodes the solve is measured on; each group's books
    # were its own: every credit granted is a chunk consumed or lost
    assert set(np.unique(np.loadtxt(run.out / "episodes.csv", delimiter=",", skiprows=1)[:, 3])) == {0.0, 1.0}
    for g, books in enumerate(results["controller"]["groups"]):
        res = results["group_results"][g]
        assert books["group"] == g and books["chunks_in_flight"] == 0
        assert books["credits_granted"] == res["chunks"] + res["chunks_lost"]
        assert set(books["per_explorer_env_steps"]) == {str(g)}


@pytest.mark.slow
def test_on_policy_groups_keep_the_barrier(group_client, tmp_path):
    run = Run("cartpole_ppo", group_client, out=tmp_path / "ppo", overrides={"groups": 2, "stop.max_seconds": 240})
    results = run.start().wait(timeout=300)
    assert results["error"] is None and results["solved"], (results["stop_reason"], results["final_mean_return"])
    rounds = _check_rounds(results, 2)
    assert results["fusion"] == {**results["fusion"], "every": 1, "barrier": True}
    for r in rounds:  # in lockstep: both groups offered the model of the same update count
        assert len(set(r["versions"].values())) == 1, r
    for res in results["group_results"]:
        # no update while a learner waited: the fused model is the only version in between
        assert all(f["installed_version"] == f["offered_version"] + 1 for f in res["fusions"])
        assert res["updates"] in (len(res["fusions"]), len(res["fusions"]) + 1)
