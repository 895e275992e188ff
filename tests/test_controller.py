"""The staleness controller's laws on their own, as arithmetic, and the settings a run resolves for
them. The plugin's handlers and the books behind them: test_controller_plugin.py; on a real
cluster: test_controller_cluster.py."""

import heapq

import numpy as np
import pytest

from tianji_dask.config import PipelineError
from tianji_dask.dataflow.controller.pacing import (
    REPLAY_CEILING_MARGIN,
    REPLAY_MAX_STEP,
    REPLAY_PERIOD_S,
    ReplayRatioLaw,
    replay_gate,
)
from tianji_dask.dataflow.controller.window_law import WindowLaw
from tianji_dask.run import Run


# ---- the law, as arithmetic ----------------------------------------------------------------
def _plant(law: WindowLaw, u: float, periods: int, t0: float = 0.0, k: float = 0.0) -> float:
    """Feed the law the staleness its own window would produce (s = W u + k) for some periods."""
    t, version = t0, 0
    for _ in range(periods):
        for _ in range(law.window):
            t += 0.1
            version += u
            law.observe(t, int(version), [int(round(law.window * u + k))])
    return t


def test_law_without_target_keeps_the_window():
    law = WindowLaw(5, staleness_target=None, window_min=1, window_max=16, gain=0.5)
    _plant(law, u=1.0, periods=20)
    assert law.window == 5
    assert law.last["staleness"] == 5  # it still measures


@pytest.mark.parametrize("start,target,u", [(12, 2, 1.0), (1, 8, 1.0), (16, 4, 2.0), (2, 6, 0.5)])
def test_law_settles_at_the_target(start, target, u):
    law = WindowLaw(start, staleness_target=target, window_min=1, window_max=32, gain=0.5)
    _plant(law, u=u, periods=40)
    assert abs(law.window * u - target) <= max(u, 1.0)


def test_law_steps_are_bounded_and_clamped():
    law = WindowLaw(8, staleness_target=0, window_min=3, window_max=10, gain=0.5)
    windows = [law.w]
    t = 0.0
    for _ in range(60):
        t += 0.1
        if law.observe(t, 0, [100]):  # far above target
            windows.append(law.w)
    steps = np.diff(windows)
    assert (steps >= -np.maximum(1, np.array(windows[:-1]) / 2) - 1e-9).all()  # at most max(1, W/2) per period
    assert min(windows) == 3 and law.window == 3  # never below w_min
    law.configure(staleness_target=1000)
    for _ in range(30):
        for _ in range(law.window):
            t += 0.1
            law.observe(t, 0, [0])
    assert law.window == 10  # nor above w_max


def test_law_leaves_out_the_chunks_admitted_before_its_move():
    # a plant with a whole window of dead time: each chunk measures the window in force when it
    # was admitted, W chunks earlier (chunks queued behind 8 explorers at a window of 64)
    law, t, version, queue = WindowLaw(64, staleness_target=32, window_min=1, window_max=128, gain=0.5), 0.0, 0, []
    moves = []
    for _ in range(2000):
        queue.append(law.window)  # admitted now, consumed a window later
        if len(queue) <= law.window:
            continue
        t, version = t + 0.05, version + 1
        admitted_under = queue.pop(0)
        if law.observe(t, version, [admitted_under]):
            moves.append(law.window)
    assert abs(law.window - 32) <= 4, moves[-10:]  # settled at the target, not swinging around it
    assert max(abs(w - 32) for w in moves[-5:]) <= 4, moves[-10:]


def test_law_settles_on_a_small_target_though_stragglers_make_single_chunks_noisy():
    # measured with stragglers (jitter 1.0, 8 explorers): window 1 gives staleness ~0.2, 2 gives
    # ~1.0, 3 ~1.35, 4 ~3.6 with a long tail (a straggler sees 7 or more updates); target 1 is held
    # at window 2. A law acting on one chunk at a time chased the zeros and the sevens.
    rng = np.random.default_rng(0)
    means = {1: 0.2, 2: 1.0, 3: 1.35, 4: 3.6}
    law, t, version, seen = WindowLaw(2, staleness_target=1, window_min=1, window_max=32, gain=0.5), 0.0, 0, []
    for _ in range(600):
        w = min(law.window, 5)
        m = means.get(w, 3.6 + 2 * (w - 4))
        tail = rng.random() < 0.1  # a straggler: seven times the mean, else a third of it (mean ~m)
        staleness = int(rng.poisson(7 * m if tail else 0.3 * m))
        t, version = t + 0.3, version + 1
        law.observe(t, version, [staleness])
        seen.append(staleness)
    second_half = float(np.mean(seen[300:]))
    assert abs(second_half - 1) <= 0.25, second_half
    assert law.verdict["state"] == "held", law.verdict


def _straggler_plant(target: int, seed: int, seconds: float = 120.0) -> float:
    """An event simulation of the pipe with stragglers: each credit starts a chunk at once (more
    explorers than the window) on the newest policy, its duration 2 s times a mean-1 lognormal of
    sigma 1 (``env.step_cost_jitter: 1.0``); the learner makes one update per chunk as it arrives.
    Returns the mean staleness of the chunks consumed in the second half."""
    rng = np.random.default_rng(seed)
    law = WindowLaw(target + 1, staleness_target=target, window_min=1, window_max=4 * target + 8, gain=0.5)
    t, version, flight, seen = 0.0, 0, [], []
    while t < seconds:
        while len(flight) < law.window:
            heapq.heappush(flight, (t + 2.0 * rng.lognormal(-0.5, 1.0), version))
        t, policy = heapq.heappop(flight)
        seen.append((t, version - policy))
        version += 1
        law.observe(t, version, [seen[-1][1]])
    return float(np.mean([s for when, s in seen if when >= seconds / 2]))


@pytest.mark.parametrize("target", [1, 2, 4, 16, 64])
def test_law_holds_its_target_where_stragglers_return_chunks_out_of_order(target):
    # a straggler holds a credit unseen while the chunks behind it come back fresh; the law must
    # neither chase the fresh ones (and land the stragglers stale) nor the stragglers
    medians = np.median([_straggler_plant(target, seed) for seed in range(9)])
    assert abs(medians - target) <= 0.25 * target, medians


def test_law_says_when_its_target_is_held_and_why_one_is_out_of_reach():
    law = WindowLaw(4, staleness_target=4, window_min=1, window_max=32, gain=0.5)
    assert law.verdict == {"state": "settling", "reason": None}
    _plant(law, u=1.0, periods=10)
    assert law.verdict == {"state": "held", "reason": None}
    # ten updates per chunk: even one chunk in flight is ten versions stale
    law = WindowLaw(4, staleness_target=4, window_min=1, window_max=32, gain=0.5)
    _plant(law, u=10.0, periods=2)
    assert law.verdict["state"] == "settling"  # not yet at its floor long enough to say
    _plant(law, u=10.0, periods=60)  # at window 1, a law period is 8 chunks: 3 of them at the floor
    assert law.window == 1 and law.verdict["state"] == "unreachable"
    assert "window_min 1" in law.verdict["reason"] and "10.00 updates per chunk" in law.verdict["reason"]
    # a window at its ceiling that is still too fresh
    law = WindowLaw(4, staleness_target=60, window_min=1, window_max=8, gain=0.5)
    _plant(law, u=1.0, periods=12)
    assert law.window == 8 and law.verdict["state"] == "unreachable" and "window_max 8" in law.verdict["reason"]
    # growth held because the learner drops what a wider window makes
    law, t = WindowLaw(4, staleness_target=40, window_min=1, window_max=64, gain=0.5), 0.0
    for version in range(1, 40):
        t += 0.3
        law.observe(t, version, [4, 4, 4, 4], dropped=2)
    assert law.window == 4 and law.verdict["state"] == "unreachable" and "lag limit" in law.verdict["reason"]
    law.configure(staleness_target=None)
    assert law.verdict == {"state": "off", "reason": None}


def test_the_verdict_counts_the_chunks_the_law_leaves_out_and_says_why_it_is_still_settling():
    # the chunks in flight at a move are left out of the law's next period, not of what the
    # learner trained on: a period at the target after four very stale chunks is not "held"; the
    # run's first window (the pipe filling, all at version 0) is left out of both
    law = WindowLaw(4, staleness_target=2, window_min=1, window_max=32, gain=0.5)
    law.observe(1.0, 0, [0, 0, 0, 0])
    assert law.observe(9.0, 8, [8] * 8) and law.window == 2  # a period at 8: the window narrows
    assert law.last["judged_chunks"] == 8 and law.verdict["reason"] == (
        "staleness 8.0 against 2, window 4 still narrowing; a control period took 8.0 s"), law.verdict
    law.observe(10.0, 12, [20] * 4)  # admitted under the window before the move: left out of the period
    assert law.observe(18.0, 20, [2] * 8)  # the period: 8 chunks at the target
    assert law.last["staleness"] == 2.0 and law.verdict["state"] == "settling"
    assert (law.last["judged_staleness"], law.last["judged_chunks"]) == (8.0, 20)
    # a window of one fed fresh chunks a second apart: the law widens it, one period per 8 s
    law = WindowLaw(1, staleness_target=1, window_min=1, window_max=32, gain=0.5)
    for i in range(1, 10):
        law.observe(float(i), i, [0])
    assert law.verdict["state"] == "settling" and "window 1 still widening; a control period took 8.0 s" in law.verdict["reason"]


def test_law_does_not_widen_a_window_whose_chunks_are_dropped():
    law = WindowLaw(2, staleness_target=8, window_min=1, window_max=32, gain=0.5)
    t = 0.0
    for i in range(40):  # staleness stuck near 1: staler chunks are thrown away at consumption
        t += 0.3
        law.observe(t, i, [1, 1, 3], dropped=1)
    assert law.window == 2 and law.last["dropped_fraction"] > 0.2
    for i in range(40):  # the same staleness without drops: the window opens toward the target
        t += 0.3
        law.observe(t, 40 + i, [1, 1, 1], dropped=0)
    assert law.window > 8


def test_a_target_starts_the_window_near_it():
    from tianji_dask.run import Run

    over = {"explorers": 32, "controller.window_max": 128}
    assert [Run("cartpole_impala", overrides={**over, "controller.staleness_target": t}).law()["window"]
            for t in (1, 4, 64)] == [2, 5, 65]
    assert Run("cartpole_impala", overrides=over).law()["window"] == 32  # no target: one per explorer
    assert Run("cartpole_impala", overrides={**over, "controller.staleness_target": 4, "controller.window": 9}).law()["window"] == 9
    ppo = Run("cartpole_ppo", overrides={**over, "controller.staleness_target": 2})
    assert ppo.law()["window"] == 2 * ppo.plan.prepared.chunks_per_update + 1


def test_replay_gate():
    # warm-up and an empty pipe always admit; afterwards the ratio counting in-flight data decides
    assert replay_gate(16.0, 0, 0, 3, 256, warm=False)
    assert replay_gate(16.0, 0, 10_000, 0, 256, warm=True, starving=True)
    assert not replay_gate(16.0, 0, 10_000, 0, 256, warm=True, starving=False)  # it has work: wait
    assert not replay_gate(16.0, 16 * 10_000, 10_000, 1, 256, warm=True)
    assert replay_gate(16.0, 16 * (10_000 + 256), 10_000, 1, 256, warm=True)
    assert replay_gate(None, 0, 10_000, 5, 256, warm=True)


def _replay_plant(law: ReplayRatioLaw, k: float, periods: int, t0: float = 0.0) -> float:
    """Report to the law, twice a second, the replay staleness its ratio makes (s = k rho: a
    full buffer's C/2 env steps of age at rho / B versions per env step)."""
    t = t0
    for _ in range(int(periods * REPLAY_PERIOD_S / 0.5)):
        t += 0.5
        law.observe(t, k * law.rho)
    return t


@pytest.mark.parametrize("target,k", [(500.0, 50.0), (150.0, 10.0), (300.0, 40.0)])
def test_replay_law_settles_at_its_target(target, k):
    law = ReplayRatioLaw([6.0, 24.0], replay_staleness_target=target, gain=0.5)
    assert law.rho == 12.0 and law.verdict == {"state": "settling", "reason": None}  # the band's geometric middle
    factors, t = [], 0.0
    for _ in range(30):
        before = law.rho
        t = _replay_plant(law, k, periods=1, t0=t)
        factors.append(law.rho / before)
    assert law.rho == pytest.approx(target / k, rel=0.02) and law.verdict == {"state": "held", "reason": None}
    assert max(factors) <= REPLAY_MAX_STEP + 1e-9 and min(factors) >= 1 / REPLAY_MAX_STEP - 1e-9  # bounded steps
    floor, ceiling = law.bounds()  # the gate's floor at rho, the learner's ceiling a margin above it
    assert floor == pytest.approx(law.rho) and ceiling == pytest.approx(law.rho * REPLAY_CEILING_MARGIN)


@pytest.mark.parametrize("fill_reported", [True, False], ids=["fill reported", "fill unknown"])
def test_replay_law_does_not_overshoot_while_the_buffer_fills(fill_reported):
    """A filling buffer holds younger samples: s = k rho f with f the fraction filled (here from 5%
    to full over 40 periods). Steering by s / f, rho goes straight to target / k and staleness
    rises to the target from below; steering by s alone raises rho to the band's top while the
    buffer fills, and staleness overshoots once it is full."""
    law, k, target, t, seen = ReplayRatioLaw([6.0, 24.0], replay_staleness_target=500.0, gain=0.5), 50.0, 500.0, 0.0, []
    for step in range(int(60 * REPLAY_PERIOD_S / 0.5)):
        t += 0.5
        fill = min(1.0, 0.05 + step * 0.5 / (40 * REPLAY_PERIOD_S))
        seen.append(k * law.rho * fill)
        law.observe(t, seen[-1], fill if fill_reported else None)
    assert law.verdict["state"] == "held" and law.rho == pytest.approx(target / k, rel=0.05)
    if fill_reported:
        assert max(seen) <= target * 1.02
    else:  # what the law did before the learner reported its fill
        assert max(seen) > target * 1.1


def test_replay_law_says_why_a_target_is_out_of_reach_at_either_edge_of_the_band():
    law = ReplayRatioLaw([6.0, 24.0], replay_staleness_target=10_000.0, gain=0.5)  # 50 versions per unit of ratio: even 24 is too fresh
    _replay_plant(law, 50.0, periods=2)
    assert law.verdict["state"] == "settling"  # not at its ceiling long enough to say
    _replay_plant(law, 50.0, periods=10, t0=100.0)
    assert law.rho == 24.0 and law.verdict["state"] == "unreachable"
    assert "replay_ratio's max 24" in law.verdict["reason"] and "raise that max" in law.verdict["reason"]
    assert law.bounds() == (24.0 / REPLAY_CEILING_MARGIN, 24.0)  # the floor gives way, the ceiling stays in the band
    law.configure(replay_staleness_target=10.0)  # now even the fewest samples trained per env step are too stale
    _replay_plant(law, 50.0, periods=12, t0=200.0)
    assert law.rho == 6.0 and law.verdict["state"] == "unreachable" and "replay_ratio's min 6" in law.verdict["reason"]
    law.configure(replay_staleness_target=None)
    assert law.verdict == {"state": "off", "reason": None}


def test_replay_law_without_target_applies_the_band_as_it_is():
    law = ReplayRatioLaw([6.0, 24.0], replay_staleness_target=None, gain=0.5)
    _replay_plant(law, 50.0, periods=5)
    assert law.bounds() == (6.0, 24.0) and law.rho == 12.0 and law.verdict == {"state": "off", "reason": None}
    assert law.last == pytest.approx(600.0)  # it still measures
    assert ReplayRatioLaw(None, replay_staleness_target=5.0, gain=0.5).bounds() == (None, None)  # no band: no pacing


def test_auto_replay_ratio_is_half_to_double_the_algorithms_own():
    run = Run("cartpole_dqn", overrides={"controller.replay_ratio": "auto"})
    assert run.law()["replay_ratio"] == [8.0, 32.0]  # r = 0.125 updates/env step x 128 samples
    assert Run("cartpole_dqn", overrides={"controller.replay_ratio": None}).law()["replay_ratio"] is None  # null: no pacing
    assert Run("cartpole_ppo").law()["replay_ratio"] is None  # PPO does not replay


@pytest.mark.parametrize("overrides,message", [
    ({"controller.window_min": 1, "algo.config.segments_per_batch": 2},
     "controller.window_min: must be >= 2, the chunks one ppo update needs"),
    ({"controller.window": 1, "algo.config.segments_per_batch": 3},
     "controller.window: must be >= 3, the chunks one ppo update needs"),
    ({"controller.replay_ratio": [1, 2]}, "controller.replay_ratio: ppo does not replay"),
    ({"controller.replay_staleness_target": 50}, "controller.replay_staleness_target: ppo does not replay"),
])
def test_window_below_one_update_is_refused(overrides, message):
    with pytest.raises(PipelineError, match=message):
        Run("cartpole_ppo", overrides=overrides)
