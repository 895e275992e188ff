"""A researcher's own algorithm: named as 'module:Class' or given as a class (one defined only in a
``__main__`` reaches the workers by value), its Config validated like the bundled ones, its
contract checked by ``tianji_dask.testing.check_algorithm``, and what its code raises in the learner
or an explorer reported in one line naming it, with the traceback in the run's error.txt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tianji_dask import Run
from tianji_dask.config import PipelineError, parse_pipeline
from tianji_dask.testing import AlgorithmCheckError, check_algorithm

BYO = Path(__file__).resolve().parent / "byo"
sys.path.insert(0, str(BYO))  # labalgos: importable here and, through PYTHONPATH, in the programs run below
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BYO), os.environ.get("PYTHONPATH", "")])}
OWN = "labalgos.clipped_pg:ClippedPG"


def _pipeline(name, config=None, **more) -> dict:
    return {"env": {"id": "CartPole-v1", "num_envs": 8}, "algo": {"name": name, "config": config or {}},
            "stop": {"max_env_steps": 4000}, **more}


@pytest.mark.parametrize("name,env_id,config", [
    ("dqn", "CartPole-v1", {"learning_starts": 200}),
    ("ppo", "CartPole-v1", {}),
    ("impala", "CartPole-v1", {}),
    ("sac", "Pendulum-v1", {"learning_starts": 200}),
    ("maddpg", "mpe2:simple_spread_v3", {"learning_starts": 200, "batch_size": 64}),
    (OWN, "CartPole-v1", {}),
])
def test_the_bundled_algorithms_and_ours_keep_the_contract(name, env_id, config):
    assert check_algorithm(name, env_id, config=config) == []


@pytest.mark.parametrize("cls,line", [
    pytest.param("ForgetsWeights", "ForgetsWeights.set_weights: get_weights() afterwards differs", marks=pytest.mark.slow),
    pytest.param("NoSamples", "NoSamples.learn: metrics lack 'samples'", marks=pytest.mark.slow),
    ("IngestReturnsNothing", "IngestReturnsNothing.ingest: returned None; must return the env steps kept"),
    pytest.param("UnseededActing", "UnseededActing.seed_acting: the same seed", marks=pytest.mark.slow),
    ("StateLoses", "StateLoses.load_state_dict: an instance given state_dict() differs from the learner in 'value.0.weight'"),
    pytest.param("KeepsWhatItRefuses", "KeepsWhatItRefuses.ingest: kept", marks=pytest.mark.slow),
    pytest.param("WantsMoreThanItSays", "WantsMoreThanItSays.ready: False after chunks_per_update() = 1", marks=pytest.mark.slow),
    ("RaisesInLearn", "RaisesInLearn.learn: raised ZeroDivisionError: bug in my loss"),
])
def test_a_broken_algorithm_is_named_in_one_line_per_violation(cls, line):
    with pytest.raises(AlgorithmCheckError) as err:
        check_algorithm(f"labalgos.broken:{cls}", "CartPole-v1")
    assert len(err.value.violations) == 1 and err.value.violations[0].startswith(line), err.value.violations
    assert str(err.value).count("\n") == 0


@pytest.mark.slow  # the fast tier checks a broken class by name
def test_check_algorithm_takes_an_instance_and_returns_violations_when_asked():
    from labalgos.broken import NoSamples

    from tianji_dask.envs.vector import env_spaces

    algo = NoSamples(*env_spaces("CartPole-v1"), NoSamples.Config(), seed=3)
    found = check_algorithm(algo, "CartPole-v1", raise_on_violation=False)
    assert found == ["NoSamples.learn: metrics lack 'samples' (the samples this update trained on)"]


@pytest.mark.parametrize("name,config,message", [
    ("no_such_module_xyz:Algo", {}, "algo.name: cannot import module 'no_such_module_xyz'"),
    ("labalgos.clipped_pg:NoSuchClass", {}, "algo.name: module 'labalgos.clipped_pg' has no attribute 'NoSuchClass'"),
    ("labalgos.clipped_pg:mlp", {}, "algo.name: labalgos.clipped_pg:mlp is not a subclass of tianji_dask.Algorithm"),
    ("labalgos.broken:NoConfig", {}, "algo.name: NoConfig names no hyperparameter model: set Config = YourConfig"),
    ("labalgos.broken:Unfinished", {}, "algo.name: labalgos.broken:Unfinished does not implement act, get_weights"),
    (OWN, {"hiden": 32}, "algo.config.hiden: unknown key"),
    (OWN, {"lr": "fast"}, "algo.config.lr: Input should be a valid number"),
    ("labalgos.broken:PlainConfigPG", {"lr": 1e-3, "epochs": 3}, "algo.config.epochs: unknown key"),
    ("a2c", {}, "algo.name: must be one of dqn, impala, maddpg, ppo, sac, or 'module:Class'"),
])
def test_a_bad_algorithm_is_one_line(name, config, message):
    with pytest.raises(PipelineError) as err:
        parse_pipeline(_pipeline(name, config))
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)


def test_a_class_is_taken_as_algo_name_and_written_as_its_spec(tmp_path):
    from labalgos.clipped_pg import ClippedPG

    from tianji_dask.config import pipeline_yaml

    p = parse_pipeline(_pipeline(ClippedPG, {"epochs": 3}))
    assert p.algo.cls is ClippedPG and p.algo_config.epochs == 3 and p.algo.label == "ClippedPG"
    assert "name: labalgos.clipped_pg:ClippedPG" in pipeline_yaml(p)
    assert parse_pipeline(_pipeline(OWN)).algo.cls is ClippedPG


def test_what_the_learner_raises_is_one_line_naming_the_class_and_the_traceback_is_kept(tmp_path, capsys):
    from tianji_dask.cli import main

    pipeline = tmp_path / "broken.yaml"
    pipeline.write_text(json.dumps(_pipeline("labalgos.broken:RaisesInLearn", mode="single")))
    out = tmp_path / "run"
    code = main(["train", str(pipeline), "--out", str(out)])
    err = capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    assert code == 1 and results["error"] == "learner: RaisesInLearn.learn raised ZeroDivisionError: bug in my loss"
    failed = [line for line in err.splitlines() if "failed" in line]
    assert failed == [f"tianji-dask: the run failed: {results['error']} (traceback: {out / 'error.txt'})"], err
    assert "Traceback" not in err
    saved = (out / "error.txt").read_text()
    assert saved.startswith(results["error"]) and 'broken.py", line' in saved and "Traceback" in saved
    assert "error_traceback" not in results and results["error_file"] == "error.txt"


@pytest.mark.slow  # a real cluster
def test_what_an_explorer_raises_is_one_line_naming_the_class(tianji_client, tmp_path):
    run = Run(_pipeline("labalgos.broken:RaisesInAct", stop={"max_seconds": 60, "max_explorer_failures": 3}),
              tianji_client, out=tmp_path / "run")
    results = run.start().wait()
    assert results["stop_reason"] == "explorer_failures"
    assert results["error"].endswith("RaisesInAct.act raised KeyError: 'missing_extra'"), results["error"]
    assert "raise KeyError" in (tmp_path / "run" / "error.txt").read_text()


@pytest.mark.slow  # trains on its own LocalCluster
def test_a_class_defined_only_in_main_trains_cartpole_on_a_cluster(tmp_path):
    proc = subprocess.run([sys.executable, str(BYO / "train_in_main.py"), str(tmp_path / "run")], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results == {**results, "solved": True, "mode": "relaxed", "algo": "ClippedPG", "error": None}
    assert results["final_mean_return"] >= 475


@pytest.mark.slow  # trains on its own LocalCluster
def test_the_same_class_by_module_and_name_trains_from_the_cli(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tianji_dask", "train", "cartpole_ppo", "--set", f"algo.name={OWN}",
                           "--set", "algo.config={}", "--out", str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"(CartPole-v1, {OWN}, relaxed, 2 explorers)" in proc.stdout and "tianji-dask: solved CartPole-v1" in proc.stdout
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["solved"] and results["algo"] == OWN and results["pipeline_config"]["algo"]["name"] == OWN


def test_a_module_the_workers_cannot_import_is_one_line_before_anything_runs(tianji_client, tmp_path, monkeypatch):
    (tmp_path / "only_here.py").write_text("from labalgos.clipped_pg import ClippedPG as Mine\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # this process imports it; the cluster's workers cannot
    run = Run(_pipeline("only_here:Mine"), tianji_client, out=tmp_path / "run")
    with pytest.raises(PipelineError) as err:
        run.start()
    assert str(err.value).startswith("algo.name: worker tcp://") and "cannot import module 'only_here'" in str(err.value)
    assert "\n" not in str(err.value) and not (tmp_path / "run").exists()


def test_the_cli_refuses_an_algorithm_it_cannot_use_in_one_line_and_writes_nothing(tmp_path, capsys):
    from tianji_dask.cli import main

    out = tmp_path / "run"
    code = main(["train", "cartpole_ppo", "--set", "algo.name=labalgos.broken:Unfinished", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "algo.name: labalgos.broken:Unfinished does not implement" in err, err
    assert "Traceback" not in err and not out.exists()


def test_train_raises_run_failed_with_the_runs_one_line(tmp_path):
    import tianji_dask
    from labalgos.broken import RaisesInLearn

    out = tmp_path / "run"
    with pytest.raises(tianji_dask.RunFailed) as failed:  # the class given as train() gives it to Run
        tianji_dask.train(_pipeline("ppo", mode="single"), out=out, algorithm=RaisesInLearn)
    line = "learner: RaisesInLearn.learn raised ZeroDivisionError: bug in my loss"
    assert str(failed.value) == line and failed.value.results["error"] == line
    assert failed.value.results["stop_reason"] == "error"
    assert json.loads((out / "results.json").read_text())["error"] == line  # written as for any other end
    assert (out / "error.txt").read_text().startswith(line)
