"""The rliable-protocol report and the suite runner, on raw files written here: no training.
benchmarks/report.py must regenerate only its section of a page, with the IQM computed as an
independent trimmed mean gives it, the same bytes every time, from plain and compressed raw files
alike; benchmarks/suite.py must refuse an unknown suite in one line and skip a cell whose raw file
exists."""

from __future__ import annotations

import gzip
import importlib
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from scipy.stats import trim_mean

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
BEGIN, END = "<!-- suite-report:begin -->", "<!-- suite-report:end -->"
HEAD = "# A page\n\nText before the report, kept as it is.\n\n"
TAIL = "\n\n## After the report\n\nText after it, kept too.\n"
BUDGET = 300.0
#: system -> (time-to-solve by seed, None: unsolved within the budget)
TIMES = {"tianji": [52.5, 61.0, 78.25], "sb3": [104.0, 139.5, None]}


@pytest.fixture
def suite(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # suite.py imports its modules from beside it
    spec = importlib.util.spec_from_file_location("suite", BENCH / "suite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def run_file(monkeypatch):
    """benchmarks/_run_file.py: a suite cell's raw file, written and read."""
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("_run_file")


def _episodes(solve_s: float | None, with_steps: bool) -> list[list[float]]:
    """150 episodes over the run, returns rising to 500 (the last 100 reach CartPole's 475 at the solve
    time), or to 300 for a run that does not solve."""
    end = solve_s or BUDGET
    rows, steps = [], 0
    for i in range(150):
        ret = min(500.0, 20 + i * 10.0) if solve_s else min(300.0, 20 + i * 2.0)
        steps += int(ret)
        rows.append([round(end * (i + 1) / 150, 3), ret, *([steps] if with_steps else [])])
    return rows


def _raw(system: str, seed: int, solve_s: float | None) -> dict:
    """One raw file's content as suite.py writes it."""
    ours = system == "tianji"
    episodes = _episodes(solve_s, with_steps=ours)
    run = {"system": system, "task": "cartpole_ppo", "seed": seed, "solved": solve_s is not None,
           "time_to_solve_s": solve_s, "max_seconds": BUDGET, "wall_s": solve_s or BUDGET, "env_steps": 60_000,
           "episodes": len(episodes), "env_steps_per_s": 60_000 / (solve_s or BUDGET), "error": None,
           "stop_reason": "solved" if solve_s else "max_seconds"}
    return {"suite": "cartpole", "task": "cartpole_ppo", "system": system, "seed": seed, "settings": "tuned",
            "max_seconds": BUDGET, "utc": "2026-12-01T10:00:00Z",
            "commit": {"sha": "0123456789abcdef0123456789abcdef01234567", "dirty": False},
            "machine": {"cpu_model": "test CPU", "cores": 2, "memory_gib": 8.0, "platform": "Linux"},
            "versions": {"python": "3.11", "torch": "2.13.0"}, "run": run,
            "episode_fields": ["seconds_since_built", "return", *(["env_steps"] if ours else [])],
            "episodes": episodes, "throughput_per_s": [200] * int(solve_s or BUDGET) if ours else None}


@pytest.fixture
def page(tmp_path, run_file):
    results = tmp_path / "results"
    for system, times in TIMES.items():
        for seed, t in enumerate(times):
            run_file.write_run(run_file.cell_path(results, "cartpole_ppo", system, seed), _raw(system, seed, t))
    doc = tmp_path / "docs" / "page.md"
    doc.parent.mkdir()
    doc.write_text(f"{HEAD}{BEGIN}\nhand-written, to be replaced\n{END}{TAIL}")
    return results, doc, tmp_path / "docs" / "images"


def _report(results: Path, doc: Path, images: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / "report.py"), "--results", str(results), "--doc", str(doc),
                           "--images", str(images), "--reps", "500", *extra],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def _row(section: str, system: str) -> list[str]:
    line = next(line for line in section.splitlines() if line.startswith(f"| {system} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


@pytest.mark.slow  # it renders the whole report twice
def test_report_writes_its_section_once_and_the_same_every_time(page):
    results, doc, images = page
    proc = _report(results, doc, images)
    assert proc.returncode == 0, proc.stderr
    text = doc.read_text()
    assert text.startswith(HEAD + BEGIN + "\n") and text.endswith("\n" + END + TAIL)
    section = text[len(HEAD + BEGIN):-len(END + TAIL)]
    assert "hand-written" not in section and "### cartpole_ppo" in section
    assert "Unsolved runs count at their budget (censored)" in section

    header = _row(section, "system")
    for system, times in TIMES.items():
        cells = dict(zip(header, _row(section, system)))
        solved = sum(t is not None for t in times)
        assert cells["seeds"] == "3" and cells["solved"] == f"{solved}/3"
        censored = [BUDGET if t is None else t for t in times]
        iqm, low, high = map(float, re.fullmatch(r"(?:≥ )?([\d.]+) s \[([\d.]+), ([\d.]+)\]",
                                                  cells["time-to-solve IQM [95% CI]"]).groups())
        assert iqm == pytest.approx(trim_mean(censored, 0.25), abs=0.05)
        assert low <= iqm <= high
        # an unsolved run among the three the IQM keeps makes it a lower bound
        assert cells["time-to-solve IQM [95% CI]"].startswith("≥") == (None in times)
        assert cells["measured at"] == "0123456"
    assert _row(section, "tianji")[header.index("P(tianji faster) [95% CI]")] == "reference"
    assert _row(section, "sb3")[header.index("P(tianji faster) [95% CI]")].startswith("1.00 [")
    assert "Env steps panel: tianji only" in section

    figure = images / "suite-cartpole_ppo.png"
    assert figure.read_bytes().startswith(b"\x89PNG")
    assert "(images/suite-cartpole_ppo.png)" in section
    before = (text, figure.read_bytes())
    assert _report(results, doc, images).returncode == 0
    assert (doc.read_text(), figure.read_bytes()) == before  # byte for byte

    assert _report(results, doc, images, "--check").returncode == 0
    doc.write_text(text.replace("3/3", "2/3"))
    edited = doc.read_text()
    check = _report(results, doc, images, "--check")
    assert check.returncode == 1 and "out of date" in check.stderr
    assert doc.read_text() == edited  # --check writes nothing


def test_runs_prints_each_run_at_its_end_and_writes_nothing(page):
    results, doc, images = page
    before = doc.read_text()
    proc = _report(results, doc, images, "--runs", "cartpole_ppo")
    assert proc.returncode == 0, proc.stderr
    header, _, *lines = [[c.strip() for c in line.strip("|").split("|")] for line in proc.stdout.strip().splitlines()]
    rows = [dict(zip(header, line)) for line in lines]
    assert [(r["system"], r["seed"]) for r in rows] == [(s, str(k)) for s in TIMES for k in range(3)]  # tianji first
    for cells in rows:
        solve = TIMES[cells["system"]][int(cells["seed"])]
        returns = [r[1] for r in _episodes(solve, with_steps=True)]
        windows = [sum(returns[i - 100:i]) / 100 for i in range(100, len(returns) + 1)]
        assert cells["solved"] == ("no" if solve is None else f"{solve:.1f} s")
        assert cells["final 100-episode mean"] == f"{windows[-1]:,.0f}" and cells["best"] == f"{max(windows):,.0f}"
        if cells["system"] == "tianji":  # its rows carry env steps: each episode's length is its return here
            assert cells["last 100 episodes: mean length"] == f"{sum(returns[-100:]) / 100:,.0f}"
            assert cells["return per step"] == "1.00"
        else:
            assert cells["last 100 episodes: mean length"] == cells["return per step"] == "–"
    assert doc.read_text() == before and not images.exists()  # --runs writes nothing
    missing = _report(results, doc, images, "--runs", "hopper_ppo")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no raw runs of 'hopper_ppo'" in missing.stderr


def test_an_empty_results_folder_says_so_in_one_line(tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text(f"{HEAD}{BEGIN}\n{END}{TAIL}")
    assert _report(tmp_path / "nothing-here", doc, tmp_path / "images").returncode == 0
    section = doc.read_text()[len(HEAD + BEGIN) + 1:-len(END + TAIL) - 1]
    assert len(section.splitlines()) == 1 and "No suite runs" in section
    assert not (tmp_path / "images").exists()


def test_a_large_raw_file_is_stored_compressed_and_read_back_as_written(run_file, tmp_path):
    path = run_file.cell_path(tmp_path, "cartpole_ppo", "tianji", 0)
    big = _raw("tianji", 0, 52.5)
    big["episodes"] = big["episodes"] * 40  # past GZIP_FROM
    written = run_file.write_run(path, big)
    assert written == path.with_name("seed0.json.gz") and not path.exists()
    assert run_file.write_run(path, big).read_bytes() == written.read_bytes()  # the same bytes every time
    assert run_file.load_runs(tmp_path) == [json.loads(json.dumps(big))]
    small = _raw("tianji", 0, 52.5)
    assert run_file.write_run(path, small) == path and not written.exists()  # a rerun leaves one form
    assert run_file.load_runs(tmp_path) == [json.loads(json.dumps(small))]


def test_suite_refuses_an_unknown_suite_in_one_line():
    proc = subprocess.run([sys.executable, str(BENCH / "suite.py"), "list", "no-such-suite"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "no-such-suite" in proc.stderr and "cartpole" in proc.stderr and "Traceback" not in proc.stderr


def test_suite_skips_a_cell_whose_file_exists(suite, run_file, tmp_path):
    done = run_file.cell_path(tmp_path, "cartpole_ppo", "sb3", 0)
    done.parent.mkdir(parents=True)
    done.write_text("{}\n")
    zipped = run_file.cell_path(tmp_path, "cartpole_dqn", "tianji", 1)
    zipped.parent.mkdir(parents=True)
    zipped.with_name(zipped.name + ".gz").write_bytes(gzip.compress(b"{}\n"))
    cells = suite.plan("cartpole", results=tmp_path)
    assert len(cells) == 2 * 2 * 5
    # seed-major, the system order rotating from one seed to the next
    assert [(c["task"], c["system"], c["seed"]) for c in cells[:6]] == [
        ("cartpole_ppo", "tianji", 0), ("cartpole_ppo", "sb3", 0), ("cartpole_dqn", "tianji", 0),
        ("cartpole_dqn", "sb3", 0), ("cartpole_ppo", "sb3", 1), ("cartpole_ppo", "tianji", 1)]
    assert [c["path"] for c in cells if c["done"]] == [done, zipped]  # a compressed file counts as done
    todo = suite.pending(cells)
    assert len(todo) == len(cells) - 2 and all(c["path"] not in (done, zipped) for c in todo)
    assert len(suite.pending(cells, rerun=True)) == len(cells)
    some = suite.plan("cartpole", tasks=["cartpole_dqn"], seeds=[2], results=tmp_path)
    assert [(c["system"], c["seed"]) for c in some] == [("tianji", 2), ("sb3", 2)]
    with pytest.raises(suite.BadInput, match="system rllib not in suite 'cartpole'"):
        suite.plan("cartpole", systems=["rllib"], results=tmp_path)


def test_a_peer_on_an_older_env_id_is_named_so_and_compared_with_tianji_on_that_env(run_file, tmp_path):
    """Sample Factory and PufferLib run Hopper-v4 (their gymnasium has no v5): their rows carry the env
    id, tianji-v4 (tianji_dask on Hopper-v4) is their reference, and each row of a peer with its own
    venv says its settings (PufferLib's patched build named); every row has the time from launch."""
    results = tmp_path / "results"
    runs = {("tianji", "Hopper-v5"): [50.0, 60.0, 70.0], ("tianji-v4", "Hopper-v4"): [55.0, 65.0, 75.0],
            ("sf", "Hopper-v4"): [100.0, None, 120.0], ("pufferlib", "Hopper-v4"): [30.0, 40.0, 45.0]}
    for (system, env_id), times in runs.items():
        for seed, t in enumerate(times):
            doc = _raw(system, seed, t)
            doc.update(task="hopper_ppo", env_id=env_id, max_seconds=BUDGET)
            doc["run"].update(task="hopper_ppo", time_to_solve_from_launch_s=None if t is None else t + 10.0,
                              build_s_from_launch=10.0, config={"source": f"{system}'s own Hopper settings"})
            run_file.write_run(run_file.cell_path(results, "hopper_ppo", system, seed), doc)
    doc_path = tmp_path / "page.md"
    doc_path.write_text(f"{HEAD}{BEGIN}\n{END}{TAIL}")
    # 50 resamples, not 500: the figures checked here (who is the reference, a peer always faster
    # at 0.00, the medians) are the same for any number of them
    proc = _report(results, doc_path, tmp_path / "images", "--reps", "50")
    assert proc.returncode == 0, proc.stderr
    section = doc_path.read_text()
    header = _row(section, "system")
    rows = {name: dict(zip(header, _row(section, name)))
            for name in ("tianji", "tianji-v4 (Hopper-v4)", "sf (Hopper-v4)", "pufferlib (Hopper-v4)")}
    assert rows["tianji"]["P(tianji faster) [95% CI]"] == "reference"
    assert rows["tianji-v4 (Hopper-v4)"]["P(tianji faster) [95% CI]"] == "reference"
    assert rows["sf (Hopper-v4)"]["P(tianji faster) [95% CI]"].endswith("vs tianji-v4 (Hopper-v4)")
    assert rows["pufferlib (Hopper-v4)"]["P(tianji faster) [95% CI]"].startswith("0.00 [")  # always faster than ours
    # the median from launch: solved runs at their time from launch, an unsolved one at budget + build
    assert rows["tianji"]["median from launch"] == "70.0 s"
    assert rows["sf (Hopper-v4)"]["median from launch"] == "130.0 s"
    assert rows["sf (Hopper-v4)"]["solved"] == "2/3"
    lines = section.splitlines()
    # the v4 rows after the task's env's, tianji-v4 first among them
    order = [line.split("|")[1].strip() for line in lines if line.startswith("| ") and "|---" not in line][1:]
    assert order == ["tianji", "tianji-v4 (Hopper-v4)", "sf (Hopper-v4)", "pufferlib (Hopper-v4)"]
    notes = [line for line in lines if line.startswith("- ")]
    assert any(n.startswith("- sf (Hopper-v4) (tuned): sf's own Hopper settings.") for n in notes)
    assert any(n.startswith("- pufferlib (Hopper-v4) (tuned):") for n in notes)
    assert sum("PufferLib 3.0.0 is a patched build" in n for n in notes) == 1
    assert not any(n.startswith("- tianji (") for n in notes)
