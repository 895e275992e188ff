import numpy as np

from tianji_dask.metrics import staleness_summary, time_to_solve


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


def test_ledger_time_split_counts_nested_parts_once():
    import time

    from tianji_dask.config import StopConfig
    from tianji_dask.dataflow.ledger import Ledger

    ledger = Ledger(StopConfig(max_seconds=1), t_run_start=time.time(), t_process_start=time.time())
    t0 = time.perf_counter()
    with ledger.timed("wait"):
        time.sleep(0.02)
        with ledger.timed("submit"):
            time.sleep(0.03)
    ledger.record_update({"samples": 1}, 0.01)
    wall = time.perf_counter() - t0 + 0.01
    split = ledger.time_breakdown(wall)
    seconds = split["seconds"]
    assert 0.02 <= seconds["wait"] < 0.03 and seconds["submit"] >= 0.03
    assert abs(sum(seconds.values()) - wall) < 1e-3
    # busy = wall - wait; of it, updates and ingesting are the algorithm's, the rest dataflow
    busy = wall - seconds["wait"]
    assert abs(split["dataflow_fraction"] - (busy - 0.01) / busy) < 1e-3
