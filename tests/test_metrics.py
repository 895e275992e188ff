import numpy as np
import pytest

from tianji_dask.core.metrics import staleness_summary, time_to_solve


def test_time_to_solve_pools_and_sorts_episodes_by_end_time():
    # two explorers' episodes arrive interleaved and out of order; the rule sorts by end time
    rng = np.random.default_rng(0)
    t_end = rng.permutation(np.arange(300, dtype=float))
    returns = np.where(t_end >= 150, 500.0, 10.0)
    episodes = np.stack([t_end, returns], axis=1)
    # the mean of the last 100 first reaches 475 when 95 of them are 500: 150 + 94 = t 244
    # (mean of 5 x 10 + 95 x 500 = 475.5; one fewer gives 470.6)
    assert time_to_solve(episodes, 475, 100) == 244.0


def test_time_to_solve_none_when_never_reached_or_too_few():
    episodes = np.stack([np.arange(50.0), np.full(50, 500.0)], axis=1)
    assert time_to_solve(episodes, 475, 100) is None
    episodes = np.stack([np.arange(200.0), np.full(200, 400.0)], axis=1)
    assert time_to_solve(episodes, 475, 100) is None


def test_staleness_summary():
    s = staleness_summary(np.array([0, 1, 1, 2, 10]))
    assert s["mean"] == 2.8 and s["max"] == 10 and s["hist"] == {"0": 1, "1": 2, "2": 1, "10": 1}
    assert staleness_summary(np.zeros(0))["mean"] is None
    assert s["se_second_half"] is None  # under two chunks a batch: no error to give


def test_the_second_halfs_standard_error_is_taken_over_batches_of_consecutive_chunks():
    # first half anything; second half five batches of 4 chunks with means 1, 2, 3, 4, 5
    second = np.repeat([1.0, 2.0, 3.0, 4.0, 5.0], 4)
    s = staleness_summary(np.concatenate([np.full(20, 100.0), second]))
    assert s["mean_second_half"] == 3.0
    assert s["se_second_half"] == pytest.approx(np.std([1, 2, 3, 4, 5], ddof=1) / np.sqrt(5))


def test_ledger_time_split_counts_nested_parts_once(monkeypatch):
    from tianji_dask.core import ledger as ledger_module
    from tianji_dask.core.ledger import Ledger
    from tianji_dask.core.stop import StopRules

    clock = [100.0]  # a clock the test moves: the split is arithmetic on its readings
    monkeypatch.setattr(ledger_module.time, "perf_counter", lambda: clock[0])
    ledger = Ledger(StopRules(max_seconds=1), t_run_start=0.0, t_process_start=0.0)
    with ledger.time.timed("wait"):
        clock[0] += 0.02
        with ledger.time.timed("submit"):
            clock[0] += 0.03
    ledger.record_update({"samples": 1}, 0.01)
    wall = 0.02 + 0.03 + 0.01 + 0.04  # 0.04 s that no part covers
    split = ledger.time.breakdown(wall, ledger.learn_s)
    seconds = split["seconds"]
    assert seconds["wait"] == pytest.approx(0.02) and seconds["submit"] == pytest.approx(0.03)  # the inner part once
    assert seconds["other"] == pytest.approx(0.04) and sum(seconds.values()) == pytest.approx(wall)
    # busy = wall - wait; of it, updates and ingesting are the algorithm's, the rest dataflow
    busy = wall - seconds["wait"]
    assert abs(split["dataflow_fraction"] - (busy - 0.01) / busy) < 1e-3


@pytest.mark.parametrize("where", ["memory", "spill", "unwritable"])
def test_ledger_books_thousands_of_chunks_compactly_and_round_trips(where, tmp_path):
    import time

    from tianji_dask.config import StopConfig
    from tianji_dask.core.ledger import Ledger
    from tianji_dask.core.metrics import CHUNK_FIELDS
    from tianji_dask.core.stop import StopRules

    t0 = time.time()
    spill = where == "spill"
    rows_dir = {"memory": None, "spill": tmp_path / "rows", "unwritable": tmp_path / "a-file" / "rows"}[where]
    (tmp_path / "a-file").write_text("")  # no folder can be made under it: the rows stay in memory
    ledger = Ledger(StopRules.of(StopConfig(max_seconds=1, target_return=None)), t_run_start=t0, t_process_start=t0, rows_dir=rows_dir)
    rng = np.random.default_rng(0)
    n = 20000 if rows_dir else 3000  # past the first buffer, so it grows (or spills, twice over)
    for i in range(n):
        eps = np.array([[t0 + i + 0.5, float(i), 10.0], [t0 + i + 0.2, float(-i), 5.0]])  # out of order
        chunk = {"policy_version": i, "explorer_id": i % 3, "env_steps": 16, "nbytes": 100,
                 "t_start": t0 + i, "t_end": t0 + i + 0.9, "episodes": eps}
        version = i + int(rng.integers(0, 5))
        ledger.consume(chunk, version, version - i, kept_steps=16, t_consumed=t0 + i + 1)
    episodes, chunks = ledger.arrays()
    assert episodes.shape == (2 * n, 4) and chunks.shape == (n, len(CHUNK_FIELDS))
    assert np.array_equal(episodes[:2, 1], [0.0, 0.0]) and np.array_equal(episodes[2:4, 1], [-1.0, 1.0])  # sorted by end
    assert np.array_equal(episodes[:, 3], np.repeat(np.arange(n) % 3, 2))
    assert np.array_equal(chunks[:, CHUNK_FIELDS.index("policy_version")], np.arange(n))  # every row, in order
    staleness = chunks[:, CHUNK_FIELDS.index("staleness_versions")]
    status = ledger.status(version=n)
    assert status["episodes"] == 2 * n and status["env_steps"] == 16 * n
    assert status["staleness_recent_mean"] == staleness[-50:].mean()  # staleness, not the learner's version
    np.testing.assert_array_equal(ledger.episodes.tail(3 * n), episodes)  # a tail longer than the buffer
    if spill:  # memory bounded by the buffer, the rest on disk
        assert ledger.chunk_rows.in_memory_bytes() == 8192 * len(CHUNK_FIELDS) * 8
        assert (rows_dir / "chunks.f64").stat().st_size > (n - 8192) * len(CHUNK_FIELDS) * 8
    else:
        assert ledger.chunk_rows.in_memory_bytes() < 2 * n * len(CHUNK_FIELDS) * 8 + 1
    # a checkpoint's books load back into the same rows, on a clock that goes on
    again = Ledger(StopRules.of(StopConfig(max_seconds=1, target_return=None)), t_run_start=0.0, t_process_start=0.0,
                   rows_dir=tmp_path / "again" if spill else None)
    again.load_state_dict(ledger.state_dict(now=t0 + n + 5), now=t0 + 100 + n + 5)
    e2, c2 = again.arrays()
    np.testing.assert_allclose(e2[:, 0] - 100, episodes[:, 0])
    np.testing.assert_array_equal(c2[:, 5], staleness)
    ledger.consume({**chunk, "episodes": np.zeros((0, 3))}, n, n - chunk["policy_version"], kept_steps=16)
    assert len(ledger.episodes) == 2 * n and len(ledger.chunk_rows) == n + 1 and len(again.chunk_rows) == n
    assert len(ledger.arrays()[1]) == n + 1
    ledger.discard_spill()
    assert rows_dir is None or not any(rows_dir.glob("*.f64"))
