"""The benchmark harnesses end to end on our system only (no peers venv needed), so they cannot
rot; timing is never asserted."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run_peer = _load("run_peer", ROOT / "benchmarks" / "peers" / "run_peer.py")


@pytest.fixture
def bench(monkeypatch):
    """A module of benchmarks/ by name, imported as its scripts import it (their folder on the path)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module


@pytest.mark.slow
@pytest.mark.timeout(300)  # about 30 s on a quiet 2-core machine; much more on a loaded one
def test_solve_writes_every_run_and_the_tables(tmp_path, bench):
    out = tmp_path / "vs"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "suite.py"), "solve", "--tasks", "cartpole_ppo",
           "--systems", "tianji", "rllib", "--seeds", "1", "--max-seconds", "2", "--out", str(out),
           "--peers-python", str(tmp_path / "no-such-venv" / "python")]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]

    doc = json.loads(out.with_suffix(".json").read_text())
    runs = doc["runs"]
    assert [(r["system"], r["task"], r["seed"]) for r in runs] == [("tianji", "cartpole_ppo", 0), ("rllib", "cartpole_ppo", 0)]
    for r in runs:
        assert set(bench("_one_run").RUN_FIELDS) <= set(r)
        assert r["max_seconds"] == 2
    ours, peer = runs
    assert ours["error"] is None
    assert ours["env_steps"] > 0 and ours["wall_s"] > 0 and ours["process_wall_s"] >= ours["wall_s"]
    assert ours["learner_busy_fraction"] is not None and ours["env_steps_per_s"] > 0
    # a 2 s budget seldom solves CartPole: either way the run's fields agree with each other
    if ours["solved"]:
        assert ours["stop_reason"] == "solved"
        assert 0 < ours["time_to_solve_s"] <= ours["time_to_solve_from_launch_s"]
    else:
        assert ours["stop_reason"] == "max_seconds"
        assert ours["time_to_solve_s"] is None and ours["time_to_solve_from_launch_s"] is None
    # a peer that cannot run is kept as an unsolved run with its error, never dropped
    assert peer["solved"] is False and "benchmarks/peers/setup" in peer["error"]
    assert doc["meta"]["command"].startswith("python benchmarks/suite.py solve")

    md = out.with_suffix(".md").read_text()
    header = ("| task | system | solved | time-to-solve by seed | median | median from launch | ratio (system ÷ tianji) "
              "| median per-seed ratio | whole process by seed | whole process, median | ratio, whole process "
              "| learner busy | env steps/s |")
    assert header in md
    rows = [line for line in md.splitlines() if line.startswith("| cartpole_ppo |")]
    assert [line.split("|")[2].strip() for line in rows] == ["tianji", "rllib"]
    assert all(line.count("|") == header.count("|") for line in rows)
    assert "## Errors" in md

    # the report subcommand rebuilds the same markdown from the JSON
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "suite.py"), "report", str(out.with_suffix(".json"))],
                   check=True, capture_output=True, cwd=ROOT, timeout=60)
    assert out.with_suffix(".md").read_text() == md


def _run(system, seed, t, solved=True, budget=100.0):
    return {"system": system, "task": "cartpole_ppo", "seed": seed, "solved": solved, "max_seconds": budget,
            "time_to_solve_s": t if solved else None, "time_to_solve_from_launch_s": t + 10 if solved else None,
            "learner_busy_fraction": None, "env_steps_per_s": None}


def test_medians_count_unsolved_runs_as_lower_bounds(bench):
    runs = [_run("tianji", 0, 10), _run("tianji", 1, 20), _run("tianji", 2, 30),
            _run("sb3", 0, 40), _run("sb3", 1, 0, solved=False), _run("sb3", 2, 0, solved=False),
            _run("rllib", 0, 50), _run("rllib", 1, 60), _run("rllib", 2, 0, solved=False)]
    rows = {r["system"]: r for r in bench("_solve").summarise(runs)}
    assert rows["tianji"]["median_time_to_solve_s"] == 20 and rows["tianji"]["ratio_vs_tianji"] is None
    assert rows["rllib"]["median_time_to_solve_s"] == 60 and rows["rllib"]["ratio_vs_tianji"] == "3.00"
    assert rows["rllib"]["pair_ratios"] == [5.0, 3.0] and rows["rllib"]["median_pair_ratio"] == 4.0
    # two of three unsolved: the median is the budget, a lower bound, and so is the ratio
    assert rows["sb3"]["median_is_lower_bound"] and rows["sb3"]["median_time_to_solve_s"] == 100
    assert rows["sb3"]["ratio_vs_tianji"] == "≥ 5.00"
    assert rows["sb3"]["solved"] == 1 and rows["sb3"]["runs"] == 3


def test_peer_runner_time_to_solve_matches_the_projects_rule():
    import numpy as np

    from tianji_dask.core.metrics import time_to_solve

    rng = np.random.default_rng(0)
    t_end = np.sort(rng.uniform(0, 100, 400))
    returns = np.clip(np.linspace(0, 600, 400) + rng.normal(0, 50, 400), 0, 500)
    episodes = list(zip(t_end.tolist(), returns.tolist()))
    rng.shuffle(episodes)  # pooled from several processes: not in end-time order
    ours = time_to_solve(np.array([[t, r] for t, r in episodes]), 475.0, 100)
    assert ours is not None
    assert run_peer.time_to_solve(episodes, 475.0) == pytest.approx(ours)
    assert run_peer.time_to_solve(episodes[:99], 0.0) is None


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_transfer_measures_dask_its_comm_the_direct_path_and_raw_tcp_side_by_side(tmp_path):
    out = tmp_path / "transfer"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "transfer.py"), "--sizes-mib", "0.25",
           "--repeats", "2", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(out.with_suffix(".json").read_text())["sizes"]
    assert row["chunk_bytes"] >= 0.2 * 2**20
    names = ["dask_transfer", "dask_end_to_end", "dask_comm", "direct", "direct_tcp", "raw_tcp"]
    for name in names + (["raw_unix"] if sys.platform.startswith("linux") else []):
        assert len(row[f"{name}_Bps_all"]) == 2 and all(v > 0 for v in row[f"{name}_Bps_all"]), name
    assert row["ratio_comm_vs_raw"] == row["dask_comm_Bps"] / row["raw_tcp_Bps"]
    assert row["ratio_direct_vs_raw"] == row["direct_Bps"] / row["raw_tcp_Bps"]
    for name in ("direct", "direct_tcp", "transfer"):
        assert 0 < row[f"ratio_{name}_vs_raw_paired"], name
    assert "| direct path | direct over TCP | raw TCP | raw Unix |" in out.with_suffix(".md").read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_scaling_runs_each_explorer_count_and_reports_the_machines_cpu(tmp_path):
    out = tmp_path / "scaling"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "explorer_scaling.py"), "--pipeline", "cartpole_dqn",
           "--explorers", "1", "2", "--seconds", "4", "--set", "controller.replay_ratio=null", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.with_suffix(".json").read_text())
    assert [r["explorers"] for r in doc["runs"]] == [1, 2]
    for r in doc["runs"]:
        assert r["error"] is None and r["env_steps"] > 0 and r["env_steps_per_s"] > 0
        assert 0 < r["machine_cpu_busy"] <= 1  # a sample a second over the run's second half (2 s)
    assert set(doc["median_env_steps_per_s"]) == {"1", "2"}
    one, two = (r["env_steps_per_s"] for r in doc["runs"])
    assert doc["scaling_per_repeat"] == {"1": 1.0, "2": pytest.approx(two / one)}
    table = out.with_suffix(".md").read_text()
    assert "| explorers | median env steps/s produced | scaling vs first (medians) | scaling per repeat |" in table
    assert "\n| 2 | " in table and "\n| 1 | " in table and "| 1.00× |" in table


def test_overhead_variants_parse_and_bad_ones_exit_2(capsys):
    overhead = _load("overhead", ROOT / "benchmarks" / "overhead.py")
    assert overhead.parse_variants(["upp4:learner.updates_per_pass=4,chunk_steps=64"]) == {
        "upp4": {"learner.updates_per_pass": 4, "chunk_steps": 64}}
    for bad in ("upp4", "upp4:", ":chunk_steps=4", "upp4:chunk_steps"):
        with pytest.raises(SystemExit) as exc:
            overhead.parse_variants([bad])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("--variant") and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
def test_the_cleanrl_style_peer_trains_and_records_its_episodes(tmp_path):
    # it needs only torch and gymnasium, so it runs in the project's own environment here
    out = tmp_path / "cleanrl.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "peers" / "run_peer.py"), "--system", "cleanrl",
           "--task", "cartpole_ppo", "--seed", "0", "--max-seconds", "3", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["error"] is None and record["stop_reason"] == "max_seconds"
    assert record["num_episodes"] > 20 and record["env_steps"] > 1000
    ends = [t for t, _, _ in record["episodes"]]
    assert ends == sorted(ends)
    # the lengths (CartPole: a reward of 1 a step) add up to at most the env steps taken
    assert all(length == ret for _, ret, length in record["episodes"])
    assert sum(length for _, _, length in record["episodes"]) <= record["env_steps"]


def test_ppo_lag_study_sets_each_variant_and_tables_unsolved_runs_apart(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # for its shared _report
    study = _load("ppo_lag_study", ROOT / "benchmarks" / "ppo_lag_study.py")
    assert study.variant_overrides("lag0", 3, 60) == {"seed": 3, "stop.max_seconds": 60, "mode": "relaxed",
                                               "algo.config.max_policy_lag": 0}
    assert study.variant_overrides("lockstep", 1, 60)["mode"] == "lockstep"
    row = dict(seed=0, wall_s=10.0, env_steps=4096, updates=2, env_steps_per_update=2048.0, updates_per_s=0.2,
               learner_busy=0.9, staleness_mean=0.5, error=None)
    rows = [dict(row, variant="lag1", solved=True, time_to_solve_s=8.0),
            dict(row, variant="lag1", seed=1, solved=False, time_to_solve_s=None, updates=50),
            dict(row, variant="lag0", solved=True, time_to_solve_s=4.0, updates=7)]
    medians = study.table(rows, ["lag1", "lag0"]).split("Medians over seeds")[1]
    assert "| lag1 | 1/2 | 8.0 | 2 |" in medians and "| lag0 | 1/1 | 4.0 | 7 |" in medians


def test_ppo_lag_study_refuses_a_variant_it_does_not_know():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ppo_lag_study.py"), "--variants", "lag1", "fresh"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "'fresh' is not lagN" in proc.stderr and "Traceback" not in proc.stderr


def test_the_staleness_grid_keeps_a_file_per_run_and_resumes_from_them(monkeypatch, tmp_path, capsys, bench):
    """The grid's bookkeeping only (a fake run stands in for training): a second sitting reads
    the runs already there, other settings are refused, ``--rerun`` replaces them."""
    scale = _load("scale", ROOT / "benchmarks" / "scale.py")
    ran = []

    def fake_run(pipeline, overrides, seed, mode, seconds, extra=()):
        ran.append((overrides["controller.staleness_target"], seed))
        return {"chunks": 10, "explorers": overrides["explorers"], "seed": seed, "mode": mode, "env_steps_per_s": 100.0,
                "chunks_per_s": 1.0, "learner_busy_fraction": 0.5, "updates": 10, "chunks_lost": 0, "bytes_per_s": 10.0,
                "staleness_versions": {"mean": 2.0, "mean_second_half": 2.1}, "solved": False, "wall_s": seconds,
                "controller": {"target_verdict": {"state": "held", "reason": None}}}

    monkeypatch.setattr(bench("_scale_staleness"), "train_cell", fake_run)
    grid = ["staleness", "--targets", "2", "4", "--explorers", "8", "--pipelines", "cartpole_impala", "--seeds", "0",
            "--max-seconds", "5", "--cells", str(tmp_path / "cells")]
    assert scale.main(grid) == 0 and ran == [(2, 0), (4, 0)]
    assert len(list((tmp_path / "cells").glob("*.json"))) == 2
    assert scale.main(grid + ["--seeds", "0", "1"]) == 0 and ran[2:] == [(2, 1), (4, 1)]  # seed 0 read, not rerun
    table = capsys.readouterr().out
    assert "| cartpole_impala | 0 | 8 | 2 | 2.1 (2.1, 2.1) |" in table
    assert "| 0 | 4 | 2 | 0.53 | 0.50 |" in table  # second half and whole run, each ÷ the target, over the runs
    assert scale.main(grid[:-4] + ["--max-seconds", "9", "--cells", str(tmp_path / "cells")]) == 2
    assert "run with other settings" in capsys.readouterr().err and len(ran) == 4
    assert scale.main(grid + ["--rerun"]) == 0 and ran[4:] == [(2, 0), (4, 0)]


def test_the_staleness_grid_tells_a_miss_from_too_few_chunks_to_say(bench):
    grid = bench("_scale_staleness")

    def seeds(*pairs):
        return [{"staleness_second_half": s, "staleness_second_half_se": se} for s, se in pairs]

    assert grid.within_target(2.4, 2, seeds((2.4, 0.1))) == "yes"  # inside ±25%
    # 2.8 is 0.3 past the band's 2.5: two seeds' second halves too noisy to call it, then one precise enough
    assert grid.within_target(2.8, 2, seeds((2.8, 0.4), (2.8, 0.3))) == "no, within noise"
    assert grid.within_target(2.8, 2, seeds((2.8, 0.1), (2.8, 0.1))) == "**no**"
    assert grid.within_target(2.8, 2, seeds((2.8, None))) == "**no**"  # no error to weigh it by: a miss


def test_the_variant_study_turns_the_order_resumes_and_counts_an_unsolved_run_slower(monkeypatch, tmp_path, capsys):
    """The study's bookkeeping only (a fake run stands in for training)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    study = _load("variant_study", ROOT / "benchmarks" / "variant_study.py")
    ran = []

    def fake_run(path, seed, mode, max_seconds, extra, returns=False):
        anneal = "anneal_lr_steps" in Path(path).read_text()
        ran.append(("anneal" if anneal else "base", seed))
        solved = anneal or seed != 1  # base's seed 1 stays below the target
        return {"solved": solved, "time_to_solve_s": 5.0 + seed if solved else None, "wall_s": max_seconds,
                "env_steps": 1000, "final_mean_return": 400.0, "last_update_metrics": {"entropy": 0.5, "loss": 1.0},
                "returns": [float(i) for i in range(150)]}

    monkeypatch.setattr(study, "run_once", fake_run)
    args = ["--pipeline", "cartpole_ppo", "--max-seconds", "9", "--variant", "base",
            "--variant", "anneal", "algo.config.anneal_lr_steps=1000", "--out", str(tmp_path / "s")]
    assert study.main(args + ["--seeds", "0-1"]) == 0
    assert ran == [("base", 0), ("anneal", 0), ("anneal", 1), ("base", 1)]
    assert study.main(args + ["--seeds", "0-2"]) == 0 and ran[4:] == [("base", 2), ("anneal", 2)]  # 0 and 1 read
    runs = json.loads((tmp_path / "s.json").read_text())["runs"]
    assert len(runs) == 6 and runs[0]["best_mean_return"] == 99.5 and runs[0]["last_update"] == {"entropy": 0.5}
    table = capsys.readouterr().out
    assert "| base | as bundled | 2/3 | 6.0 | 5.0–7.0 | 100 | reference |" in table
    # anneal's 5, 6, 7 s against base's 5, 7 s and its unsolved run: (2.5 + 2 + 1.5) of 9 pairs
    assert "| anneal | `algo.config.anneal_lr_steps=1000` | 3/3 | 6.0 | 5.0–7.0 | – | 0.67 |" in table
    assert study.main(args[:-1] + [str(tmp_path / "s"), "--max-seconds", "60", "--seeds", "3"]) == 2
    assert "holds a study with other arguments" in capsys.readouterr().err and len(ran) == 6


def test_no_import_cycle_among_the_benchmark_scripts():
    """Each folder's scripts import their siblings by name (``from _report import ...``): that
    graph has no cycle."""
    import ast

    from helpers import cycles

    found = []
    for folder in (ROOT / "benchmarks", ROOT / "benchmarks" / "peers"):
        names = {p.stem: p for p in folder.glob("*.py")}
        graph = {}
        for stem, path in names.items():
            imported = set()
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Import):
                    imported |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    imported.add(node.module.split(".")[0])
            graph[stem] = sorted(imported & set(names) - {stem})
        found += cycles(graph)
    assert not found, f"import cycles in benchmarks/: {found}"
