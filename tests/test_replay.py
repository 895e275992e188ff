"""Prioritized replay: the sum tree, sampling in proportion to priorities, importance weights,
priority updates from DQN's TD errors, checkpoints, and a PER DQN learning CartPole; replay
staleness: each transition's policy version, and the batch's mean each update reports."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
from helpers import hand_chunk
from test_algos import ACT, OBS
from helpers import box_chunk
from test_continuous import BOX

from tianji_dask.algos.dqn import DQN, DQNConfig
from tianji_dask.algos.replay_buffer import VERSION, PrioritizedReplayBuffer, ReplayBuffer, SumTree
from tianji_dask.algos.sac import SAC, SACConfig
from tianji_dask.config import StopConfig
from tianji_dask.core import checkpoint
from tianji_dask.core.ledger import Ledger
from tianji_dask.core.stop import StopRules
from tianji_dask.run import Run
from tianji_dask.core import summary


def transitions(lo: int, hi: int) -> dict[str, np.ndarray]:
    """Transitions numbered lo..hi-1: ``actions`` holds the number, to find them in the buffer."""
    x = np.arange(lo, hi, dtype=np.float32)
    return {"obs": x[:, None], "actions": np.arange(lo, hi), "rewards": x, "next_obs": x[:, None] + 1,
            "discounts": np.ones(hi - lo, np.float32)}


def assert_tree_consistent(tree: SumTree, leaves: np.ndarray) -> None:
    """Leaves equal ``leaves`` (zero past them) and every inner node is the sum of its children."""
    np.testing.assert_array_equal(tree.nodes[tree.leaves:tree.leaves + len(leaves)], leaves)
    assert not tree.nodes[tree.leaves + len(leaves):].any()
    inner = np.arange(1, tree.leaves)
    np.testing.assert_array_equal(tree.nodes[inner], tree.nodes[2 * inner] + tree.nodes[2 * inner + 1])
    np.testing.assert_allclose(tree.total(), leaves.sum(), rtol=1e-12)


# ---- the sum tree ------------------------------------------------------------------------------
def test_sum_tree_totals_and_prefix_search_after_batch_updates_and_ring_overwrite():
    alpha, eps, cap = 0.7, 1e-3, 37  # a capacity that is no power of two: padded leaves exist
    buf = PrioritizedReplayBuffer(cap, alpha=alpha, eps=eps, seed=0)
    assert buf.tree is None  # nothing allocated until data arrives
    rng = np.random.default_rng(0)
    expected = np.zeros(cap)  # leaf values p^alpha, kept by direct numpy
    max_p, pos, size, number = 1.0, 0, 0, 0
    for step in range(60):
        if step % 3 == 0:  # add: new transitions take the largest priority so far, oldest overwritten
            n = int(rng.integers(1, 50))  # sometimes more than the capacity
            buf.add(transitions(number, number + n))
            number += n
            kept = min(n, cap)
            expected[(pos + np.arange(kept)) % cap] = max_p**alpha
            pos, size = (pos + kept) % cap, min(size + kept, cap)
        else:  # update a batch with repeated indices: the last value for an index wins
            idx = rng.integers(0, size, size=16)
            td = rng.exponential(2.0, size=16)
            buf.update_priorities(idx, td)
            expected[idx] = (td + eps) ** alpha
            max_p = max(max_p, (td + eps).max())
        assert (len(buf), buf.pos) == (size, pos)
        assert buf.max_priority == pytest.approx(max_p, rel=1e-12)
        assert_tree_consistent(buf.tree, expected)
        # prefix search: the leaf whose cumulative range holds u, as searchsorted finds it
        u = rng.random(500) * buf.tree.total()
        np.testing.assert_array_equal(buf.tree.find(u), np.searchsorted(np.cumsum(expected), u, side="right"))
    assert number > 3 * cap and sorted(buf.storage["actions"].tolist()) == list(range(number - cap, number))


def test_sum_tree_rebuild_matches_incremental_updates():
    rng = np.random.default_rng(1)
    a, b = SumTree(100), SumTree(100)
    values = rng.random(100)
    a.update(np.arange(100), values)
    b.nodes[b.leaves:b.leaves + 100] = values
    b.rebuild()
    np.testing.assert_array_equal(a.nodes, b.nodes)


# ---- sampling, weights and priority updates ----------------------------------------------------
def test_sampling_frequencies_match_priorities_to_the_alpha():
    alpha, cap, size = 0.6, 100, 40  # part-full: the empty slots must never be drawn
    buf = PrioritizedReplayBuffer(cap, alpha=alpha, eps=1e-6, seed=0)
    buf.add(transitions(0, size))
    td = np.random.default_rng(2).exponential(1.0, size=size)
    td[:3] = [0.0, 10.0, 0.01]  # a near-zero, a dominant and a small priority
    buf.update_priorities(np.arange(size), td)
    draws = 4000 * 64
    idx = np.concatenate([buf.sample_indices(64) for _ in range(4000)])
    assert idx.min() >= 0 and idx.max() < size
    freq = np.bincount(idx, minlength=size) / draws
    p = (td + 1e-6) ** alpha
    expected = p / p.sum()
    # multinomial s.d. is at most sqrt(0.25 / 256000) = 0.001; stratified draws vary less
    assert np.abs(freq - expected).max() < 0.003
    assert np.abs(expected - 1 / size).max() > 0.05  # uniform draws would fail the line above
    # and the buffer's probabilities are the same numbers
    np.testing.assert_allclose(buf.probabilities(np.arange(size)), expected, rtol=1e-12)


def test_stratified_sampling_draws_one_per_segment_of_the_total():
    buf = PrioritizedReplayBuffer(8, alpha=1.0, eps=0.0, seed=3)
    buf.add(transitions(0, 8))
    buf.update_priorities(np.arange(8), np.ones(8))  # equal priorities: segment i is leaf i
    for _ in range(20):
        np.testing.assert_array_equal(buf.sample_indices(8), np.arange(8))


def test_importance_weights_and_priority_updates_against_numpy():
    alpha, eps, beta = 0.6, 1e-6, 0.5
    buf = PrioritizedReplayBuffer(50, alpha=alpha, eps=eps, seed=0)
    buf.add(transitions(0, 30))
    np.testing.assert_array_equal(buf.tree.values(np.arange(30)), np.ones(30))  # max priority 1 to start
    td = np.random.default_rng(4).exponential(1.0, size=30)
    buf.update_priorities(np.arange(30), td)
    p = (td + eps) ** alpha
    np.testing.assert_allclose(buf.tree.values(np.arange(30)), p, rtol=1e-12)
    assert buf.max_priority == pytest.approx(td.max() + eps)
    idx = buf.sample_indices(16)
    w = (30 * p[idx] / p.sum()) ** -beta
    np.testing.assert_allclose(buf.importance_weights(idx, beta), w / w.max(), rtol=1e-6)
    # new transitions get the largest priority seen so far, and explorer-given priorities are honoured
    buf.add(transitions(30, 32))
    np.testing.assert_allclose(buf.tree.values([30, 31]), (td.max() + eps) ** alpha, rtol=1e-12)
    buf.add(transitions(32, 34), priorities=np.array([0.5, 20.0]))
    np.testing.assert_allclose(buf.tree.values([32, 33]), (np.array([0.5, 20.0]) + eps) ** alpha, rtol=1e-12)
    assert buf.max_priority == pytest.approx(20.0 + eps)


def per_dqn(**cfg) -> DQN:
    algo = DQN(OBS, ACT, DQNConfig(**{"learning_starts": 10, "batch_size": 16, "prioritized": True,
                                      "updates_per_env_step": 1.0, **cfg}), seed=0)
    algo.ingest(hand_chunk(T=20, N=3, seed=1, done_p=0.2), staleness=0)  # 3-step returns by default
    return algo


@pytest.mark.parametrize("loss", ["huber", "mse"])
def test_dqn_per_learn_weights_the_loss_and_updates_priorities_from_td_errors(loss):
    algo = per_dqn(loss=loss, per_beta_start=0.4, per_beta_steps=10)
    for _ in range(4):  # priorities move away from the initial all-equal ones
        algo.learn()
    before = copy.deepcopy(algo)  # same networks and replay RNG: draws the minibatch learn() will draw
    idx = before.replay.sample_indices(16)
    beta = 0.4 + 0.6 * 4 / 10
    assert algo.per_beta() == pytest.approx(beta)
    p = before.replay.tree.values(np.arange(len(before.replay)))
    w = (len(p) * p[idx] / p.sum()) ** -beta
    w = w / w.max()
    sample = {k: torch.from_numpy(v) for k, v in before.replay.gather(idx).items()}
    _, q, target = before.loss(sample)
    d = (q - target).detach().numpy()
    per_item = np.where(np.abs(d) < 1, 0.5 * d**2, np.abs(d) - 0.5) if loss == "huber" else d**2
    assert not np.allclose(w, 1.0)  # the weights matter on this batch

    metrics = algo.learn()
    np.testing.assert_allclose(metrics["loss"], np.mean(w * per_item), rtol=1e-5)
    assert metrics["per_beta"] == pytest.approx(beta)
    np.testing.assert_allclose(algo.replay.tree.values(idx), (np.abs(d) + 1e-6) ** 0.6, rtol=1e-5)
    assert algo.replay.max_priority >= np.abs(d).max()
    for _ in range(10):
        algo.learn()
    assert algo.per_beta() == 1.0  # annealed to 1 and held there


def test_uniform_replay_stays_the_default():
    algo = DQN(OBS, ACT, DQNConfig(), seed=0)
    assert type(algo.replay) is ReplayBuffer and not DQNConfig().prioritized
    filled = DQN(OBS, ACT, DQNConfig(learning_starts=10, batch_size=8, updates_per_env_step=1.0), seed=0)
    filled.ingest(hand_chunk(T=20, N=2, seed=1), staleness=0)
    assert set(filled.learn()) == {"loss", "q_mean", "samples", "batch_policy_version"}


# ---- checkpoints ---------------------------------------------------------------------------------
def test_dqn_per_checkpoint_round_trip_resumes_identically(tmp_path):
    a = per_dqn(checkpoint_replay=True)
    for _ in range(5):
        a.learn()
    path = checkpoint.save(tmp_path, {"version": a.updates, "algo": a.state_dict()})
    b = DQN(OBS, ACT, a.config, seed=99)
    b.load_state_dict(checkpoint.load(path)["algo"])
    np.testing.assert_array_equal(b.replay.tree.nodes, a.replay.tree.nodes)
    assert (b.replay.max_priority, b.per_beta(), len(b.replay)) == (a.replay.max_priority, a.per_beta(), len(a.replay))
    assert a.learn() == b.learn()  # same draws, weights, step and priority updates
    np.testing.assert_array_equal(b.replay.tree.nodes, a.replay.tree.nodes)
    for p, q in zip(a.q.parameters(), b.q.parameters()):
        assert torch.equal(p, q)
    # without replay contents: the largest priority and beta's progress still carry over
    a.config = a.config.model_copy(update={"checkpoint_replay": False})
    state = pickle.loads(pickle.dumps(a.state_dict()))
    assert "priorities" not in state["replay"]
    c = DQN(OBS, ACT, a.config, seed=0)
    c.load_state_dict(state)
    assert len(c.replay) == 0 and c.replay.tree is None
    assert (c.replay.max_priority, c.per_beta()) == (a.replay.max_priority, a.per_beta()) and c.replay.max_priority > 1.0
    c.ingest(hand_chunk(T=20, N=3, seed=5), staleness=0)
    np.testing.assert_allclose(c.replay.tree.values(np.arange(len(c.replay))), a.replay.max_priority**0.6)


# ---- replay staleness ----------------------------------------------------------------------------
def replaying(name: str, **cfg):
    """A tiny DQN (uniform or prioritized) or SAC whose replay holds 20 transitions from each of
    three chunks, made by policy versions 0, 3 and 7."""
    if name == "sac":
        algo = SAC(OBS, BOX, SACConfig(**{"hidden": (8,), "learning_starts": 10, "batch_size": 16,
                                          "updates_per_env_step": 1.0, **cfg}), seed=0)
        chunks = [box_chunk(T=10, N=2, seed=i, done_p=0.0) for i in range(3)]
    else:
        algo = DQN(OBS, ACT, DQNConfig(**{"hidden": (8,), "learning_starts": 10, "batch_size": 16, "updates_per_env_step": 1.0,
                                          "prioritized": name == "dqn_per", **cfg}), seed=0)
        chunks = [hand_chunk(T=10, N=2, seed=i) for i in range(3)]
    for version, chunk in zip((0, 3, 7), chunks):
        algo.ingest({**chunk, "policy_version": version}, staleness=0)
    return algo


@pytest.mark.parametrize("name", ["dqn", "dqn_per", "sac"])
def test_replayed_transitions_keep_their_policy_version_and_an_update_reports_its_batchs_mean(name):
    algo = replaying(name)
    versions = algo.replay.storage[VERSION][:len(algo.replay)]
    np.testing.assert_array_equal(versions, np.repeat([0, 3, 7], 20))  # each row, its chunk's version
    seen = set()
    for _ in range(4):
        before = copy.deepcopy(algo)  # same replay RNG (and priorities): draws the indices learn() will draw
        idx = before.replay.sample_indices(16)
        metrics = algo.learn()
        assert metrics["batch_policy_version"] == pytest.approx(versions[idx].mean())
        seen.add(metrics["batch_policy_version"])
    assert len(seen) > 1  # each batch its own


def test_a_checkpoint_whose_replay_has_no_versions_loads_them_as_the_checkpoints_own(tmp_path):
    a = replaying("dqn", checkpoint_replay=True)
    for _ in range(5):
        a.learn()
    state = a.state_dict()
    del state["replay"]["storage"][VERSION]  # as written before transitions kept their versions
    path = checkpoint.save(tmp_path, {"version": a.updates, "algo": state})
    b = DQN(OBS, ACT, a.config, seed=0)
    b.load_state_dict(checkpoint.load(path)["algo"])
    # their age is unknown: counted as made by the checkpoint's policy (version 5), and read as such
    assert len(b.replay) == 60 and (b.replay.storage[VERSION][:60] == 5).all()
    assert b.learn()["batch_policy_version"] == 5.0
    b.ingest({**hand_chunk(T=10, N=2, seed=9), "policy_version": 6}, staleness=0)  # new rows keep their own
    np.testing.assert_array_equal(b.replay.storage[VERSION][60:80], 6)
    # nor did the learner's books then measure replay staleness: measured from the resume on
    ledger = Ledger(StopRules.of(StopConfig(max_seconds=1, target_return=None)), t_run_start=0.0, t_process_start=0.0)
    ledger.record_update({"samples": 16.0, "batch_policy_version": 1.5}, 0.01, version=4)
    old = ledger.state_dict()
    del old["replay_staleness"]
    ledger.load_state_dict(old)
    assert summary.results(ledger, 5)["replay_staleness_versions"] is None and ledger.status(5)["replay_staleness_recent_mean"] is None
    ledger.record_update({"samples": 16.0, "batch_policy_version": 4.0}, 0.01, version=5)
    assert summary.results(ledger, 6)["replay_staleness_versions"] == {"mean": 1.0, "mean_second_half": 1.0, "p95": 1.0}


# ---- learning ----------------------------------------------------------------------------------
@pytest.mark.slow  # a training run: the fast tier checks PER's every learn step and its annealing above
def test_dqn_per_learns_cartpole_in_single_mode(tmp_path):
    run = Run("cartpole_dqn_per", out=tmp_path / "per", overrides={
        "mode": "single", "stop.max_env_steps": 15_000, "stop.mean_episodes": 10, "stop.max_seconds": 60})
    results = run.start().wait()
    assert results["error"] is None
    assert results["last_update_metrics"]["per_beta"] > 0.4  # prioritized replay was on and annealing
    # random play averages ~22; the measured run reaches ~160 by 10k env steps
    assert results["final_mean_return"] > 100, results["final_mean_return"]
