"""A run's records are never destroyed: a resume that a stop rule still in force would end trains
nothing and changes nothing; a resume that trains keeps the earlier leg's records apart, whole,
and that leg's exact replay."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tianji_dask.run import legs

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "gymnasium", "distributed")
#: ``tianji-dask resume`` in a process whose forkserver start fails loudly: what it printed, its
#: exit, and what it imported
RESUME_STARTING_NOTHING = """
import sys
from tianji_dask.launch import forkserver

def start():
    raise AssertionError("the workers' forkserver was started")

forkserver.start = start
from tianji_dask.cli import main
code = main({argv!r})
print("imported:", sorted(m for m in {heavy!r} if m in sys.modules), flush=True)
sys.exit(code)
"""


def digests(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def resume_starting_nothing(*argv: str) -> subprocess.CompletedProcess:
    code = RESUME_STARTING_NOTHING.format(argv=["resume", *argv], heavy=HEAVY)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.fixture
def budget_run(cli_training_run, tmp_path) -> Path:
    """A copy of the session's CLI run, which stopped on its env-step budget."""
    assert cli_training_run.proc.returncode == 0, cli_training_run.proc.stderr[-3000:]
    run = tmp_path / "run"
    shutil.copytree(cli_training_run.out, run)
    assert json.loads((run / "results.json").read_text())["stop_reason"] == "max_env_steps"
    return run


def solved(run: Path, mean_episodes: int = 100) -> None:
    """Make ``run`` read as a run that reached its target: results and pipeline say so."""
    results = json.loads((run / "results.json").read_text())
    results.update(solved=True, stop_reason="solved", time_to_solve_s=1.5, target_return=20.0)
    (run / "results.json").write_text(json.dumps(results))
    pipeline = yaml.safe_load((run / "pipeline.yaml").read_text())
    pipeline["stop"].update(target_return=20.0, mean_episodes=mean_episodes, max_env_steps=None)
    (run / "pipeline.yaml").write_text(yaml.safe_dump(pipeline))


def test_resume_of_a_run_whose_budget_is_spent_says_which_flag_and_changes_nothing(budget_run):
    before = digests(budget_run)
    proc = resume_starting_nothing(str(budget_run))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("tianji-dask: error: stop.max_env_steps:") and "--total-timesteps 12288" in line, line
    assert "imported: []" in proc.stdout  # no cluster could have started
    assert digests(budget_run) == before


def test_resume_of_a_solved_run_changes_no_file_and_starts_no_cluster(budget_run):
    solved(budget_run)
    before = digests(budget_run)
    proc = resume_starting_nothing(str(budget_run))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0].startswith("tianji-dask: resume: run ") and "solved" in proc.stdout
    assert "--set stop.target_return=" in proc.stdout and proc.stderr == ""
    assert "imported: []" in proc.stdout
    assert digests(budget_run) == before


def test_a_rule_no_longer_in_force_lets_the_resume_go_on(budget_run):
    solved(budget_run)
    legs.check(budget_run, {"stop.target_return": 30.0})  # a higher target: not reached yet
    legs.check(budget_run, {"stop.on_solve": False, "stop.max_env_steps": 20_000})
    with pytest.raises(legs.NothingToResume) as lower:
        legs.check(budget_run, {"stop.target_return": 10.0})  # a lower one is reached too
    assert lower.value.solved
    with pytest.raises(legs.NothingToResume):
        legs.check(budget_run, {"stop.max_seconds": 0.001})  # a budget spent, whatever the target


def test_a_run_folder_written_before_the_renames_still_resumes(budget_run):
    # pipeline.yaml as runs wrote it before stop.window and checkpoint.replay were renamed
    from tianji_dask.config import load_pipeline
    from tianji_dask.run import Run

    solved(budget_run)
    text = (budget_run / "pipeline.yaml").read_text()
    old = text.replace("  mean_episodes: 100\n", "  window: 100\n").replace("  replay_buffer: false\n", "  replay: false\n")
    assert "  window: 100\n" in old and "  replay: false\n" in old
    (budget_run / "pipeline.yaml").write_text(old)
    p = load_pipeline(budget_run / "pipeline.yaml")
    assert p.stop.mean_episodes == 100 and p.checkpoint.replay_buffer is False
    with pytest.raises(legs.NothingToResume) as err:  # the same judge, read by its old name
        legs.check(budget_run)
    assert err.value.solved and "100-episode mean" in str(err.value)
    for judge in ({"stop.mean_episodes": 50}, {"stop.window": 50}, {"stop": {"target_return": 20.0, "mean_episodes": 50}}):
        legs.check(budget_run, judge)  # another judge: not solved by it yet
    run = Run.resume(budget_run, overrides={"stop.target_return": 30.0})
    assert run.pipeline.stop.mean_episodes == 100 and run.pipeline.stop.target_return == 30.0 and all(run.resume_from)


def test_a_resume_that_trains_keeps_the_first_leg_whole_and_replayable(budget_run, capsys):
    from tianji_dask.cli import main

    before = digests(budget_run)
    first = json.loads((budget_run / "results.json").read_text())
    proc = subprocess.run([sys.executable, "-m", "tianji_dask", "resume", str(budget_run), "-n", "12288", "--quiet"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    leg = budget_run / "legs" / "0"
    kept = digests(leg)
    for name in ("results.json", "episodes.csv", "chunks.csv", "replay.csv", "pipeline.yaml"):
        assert kept[name] == before[name], name  # moved whole, byte for byte
    assert not list((budget_run / "legs").glob(".*"))  # no staging folder left
    results = json.loads((budget_run / "results.json").read_text())
    assert results["run_id"] == first["run_id"]  # one run, one id
    assert results["resumes"] == 1 and results["legs"] == ["legs/0"]
    assert results["env_steps"] >= 12288 > first["env_steps"]
    first_process_s = first["t_run_start"] + first["wall_s"] - first["t_process_start"]
    assert results["process_s"] > first_process_s and results["process_s"] >= results["wall_s"]  # both legs' in all
    # the replays in this process, as test_exact_replay runs them: the program's own main
    capsys.readouterr()
    assert main(["replay", str(budget_run)]) == 2
    err = capsys.readouterr().err
    assert f"tianji-dask replay {leg}" in err, err
    assert main(["replay", str(leg)]) == 0
    printed = capsys.readouterr()
    assert "the same as the run recorded" in printed.out, printed.out + printed.err


def test_a_resumed_solve_is_never_earlier_from_process_start_than_from_run_start():
    first = {"t_process_start": 100.0, "t_run_start": 103.0, "wall_s": 10.0}  # 3 s start-up, 10 s training
    earlier = {**legs.history(Path("/nonexistent"), first), "legs": ["legs/0"], "resumes": 1}
    assert earlier["process_s_before"] == 13.0 and earlier["trained_s_before"] == 10.0
    # the second leg: process start at 500, learner built at 502 (its clock set back by the 10 s trained)
    leg = {"t_process_start": 500.0, "t_run_start": 492.0, "wall_s": 14.0, "time_to_solve_s": 12.5,
           "startup": {"learner_built_s": 2.0}}
    legs.stamp(leg, earlier)
    assert leg["process_s"] == 13.0 + (492.0 + 14.0 - 500.0)
    # solved 2.5 s into the second leg's training: 13 s of the first leg, then 2 s start-up and 2.5 s
    assert leg["time_to_solve_from_process_start_s"] == pytest.approx(13.0 + 2.0 + 2.5)
    assert leg["time_to_solve_from_process_start_s"] >= leg["time_to_solve_s"]
    fresh = {"t_process_start": 100.0, "t_run_start": 103.0, "wall_s": 10.0, "time_to_solve_s": 4.0,
             "time_to_solve_from_process_start_s": 7.0}
    assert legs.stamp(fresh, None) == {**fresh, "process_s": 13.0, "resumes": 0, "legs": []}
