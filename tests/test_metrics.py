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
