"""A researcher's own environment: a gymnasium.Env subclass, a factory, an id registered in the
driver or 'module:Class' as env.id (a class of ``__main__`` reaches the workers by value), wrappers
around each single env, the pre-flight that makes, steps and checks the env in the driver and on
an explorer worker, and envs that raise while training (counted, rebuilt, never a Dask traceback)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import yaml

from tianji_dask import Run
from tianji_dask.config import PipelineError, load_pipeline, parse_pipeline, pipeline_yaml
from tianji_dask.core.env_errors import EnvErrors
from tianji_dask.envs.vector import env_spaces, make_vec_env

BYO = Path(__file__).resolve().parent / "byo"
sys.path.insert(0, str(BYO))  # labenvs: importable here and, through PYTHONPATH, in the programs run below
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BYO), os.environ.get("PYTHONPATH", "")])}

from labenvs.corridor import Corridor  # noqa: E402

CORRIDOR = "labenvs.corridor:Corridor"
FLAKY = "labenvs.broken:RaiseSometimes"


def _pipeline(env: dict, **more) -> dict:
    return {"env": {"num_envs": 4, **env}, "algo": {"name": "ppo", "config": {"segments_per_batch": 1}},
            "chunk_steps": 32, "stop": {"max_env_steps": 4000}, **more}


def _corridor_factory(**kwargs):
    return Corridor(**kwargs)


# ---- what env.id takes -------------------------------------------------------------------------
@pytest.mark.parametrize("given,label", [
    (Corridor, "labenvs.corridor:Corridor"),
    (_corridor_factory, "test_your_env:_corridor_factory"),
    (CORRIDOR, CORRIDOR),
])
def test_a_class_a_factory_or_module_colon_class_is_an_env(given, label):
    p = parse_pipeline(_pipeline({"id": given, "kwargs": {"length": 5}}))
    assert p.env.id == label and str(p.env.id) == label
    env = make_vec_env(p.env.id, 3, seed=1, **p.env.kwargs)
    try:  # vectorised as a gymnasium id without a vector entry point is: SyncVectorEnv, next-step autoreset
        assert isinstance(env, gym.vector.SyncVectorEnv) and env.metadata["autoreset_mode"].name == "NEXT_STEP"
        assert env.single_observation_space.shape == (5,) and env.single_action_space == gym.spaces.Discrete(2)
    finally:
        env.close()
    written = yaml.safe_load(pipeline_yaml(p))["env"]
    assert written["id"] == label and written["kwargs"] == {"length": 5}


def test_an_id_registered_here_carries_its_spec_so_no_other_process_needs_to_register_it():
    gym.register("lab/TestCorridor-v0", entry_point=Corridor, max_episode_steps=7)
    try:
        p = parse_pipeline(_pipeline({"id": "lab/TestCorridor-v0"}))
    finally:
        del gym.registry["lab/TestCorridor-v0"]  # as in a process that never registered it
    assert p.env.id == "lab/TestCorridor-v0" and p.env.id.spec.entry_point is Corridor
    import pickle

    env = make_vec_env(pickle.loads(pickle.dumps(p.env.id)), 1, seed=0)
    try:
        lengths = [env.step(np.array([0]))[3][0] for _ in range(7)]
    finally:
        env.close()
    assert lengths == [False] * 6 + [True]  # the spec's max_episode_steps came with it


def test_module_colon_name_is_a_registered_id_first_then_an_attribute():
    registered = parse_pipeline(_pipeline({"id": "tianji_dask.envs.masked:CartPoleNoVel-v1"})).env.id
    assert env_spaces(registered)[0].shape == (2,) and registered.spec.id == "CartPoleNoVel-v1"
    attribute = parse_pipeline(_pipeline({"id": "gymnasium.envs.classic_control.cartpole:CartPoleEnv"})).env.id
    assert attribute.spec.entry_point is gym.envs.classic_control.cartpole.CartPoleEnv


@pytest.mark.parametrize("env,message", [
    ({"id": "labenvs.corridor:Nope"},
     "env.id: module 'labenvs.corridor' registers no gymnasium id 'Nope' and has no attribute 'Nope'; allowed: a gymnasium id"),
    ({"id": "no_such_module_xyz:Corridor"}, "env.id: cannot import module 'no_such_module_xyz' (ModuleNotFoundError"),
    ({"id": "labenvs.corridor:np"}, "env.id: labenvs.corridor:np is neither a gymnasium.Env subclass nor callable"),
    ({"id": "gymnasium.wrappers:TimeLimit"}, "env.id: gymnasium.wrappers:TimeLimit is a gymnasium.Wrapper: name it in env.wrappers"),
    ({"id": 3}, "env.id: must be a gymnasium id (CartPole-v1; 'module:Name-v0' imports module first), 'module:Name' naming"),
    ({"id": "__main__:Corridor"}, "env.id: '__main__:Corridor' names a class or function of the notebook or script that "
                                  "started the run, which this process does not define; give it again from Python"),
    ({"id": "CartPole-v1", "wrappers": ["NoSuchWrapper"]}, "env.wrappers[0]: gymnasium.wrappers has no 'NoSuchWrapper'"),
    ({"id": "CartPole-v1", "wrappers": [{"name": "TimeLimit", "kwargs": {"max_steps": 3}}]},
     "env.wrappers[0]: TimeLimit(max_steps): missing a required argument: 'max_episode_steps' (it takes: env, max_episode_steps)"),
    ({"id": "CartPole-v1", "wrappers": ["gymnasium.wrappers.vector:NormalizeReward"]},
     "env.wrappers[0]: gymnasium.wrappers.vector:NormalizeReward wraps a vector env; allowed: single-env wrappers only"),
    ({"id": "CartPole-v1", "wrappers": [{"name": "TimeLimit", "max_episode_steps": 3}]},
     "env.wrappers[0]: a mapping takes name and kwargs"),
    ({"id": "CartPole-v1", "wrappers": ["labenvs.corridor:Corridor"]},
     "env.wrappers[0]: labenvs.corridor:Corridor is not a gymnasium.Wrapper subclass"),
    ({"id": "mpe2:simple_spread_v3", "wrappers": [{"name": "TimeLimit", "kwargs": {"max_episode_steps": 3}}]},
     "env.wrappers: mpe2:simple_spread_v3 is a multi-agent env, which takes no wrappers"),
])
def test_a_bad_env_or_wrapper_is_one_line_at_load(env, message):
    with pytest.raises(PipelineError) as err:
        parse_pipeline(_pipeline(env))
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)


def test_a_notebooks_class_is_written_as_main_and_resumes_only_when_given_again(tmp_path, capsys):
    from tianji_dask.cli import main

    mine = type("NotebookCorridor", (Corridor,), {"__module__": "__main__"})  # as a notebook cell defines it
    p = parse_pipeline(_pipeline({"id": mine}))
    assert p.env.id == "__main__:NotebookCorridor" and p.env.id.spec.entry_point is mine
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "pipeline.yaml").write_text(pipeline_yaml(p))
    assert main(["resume", str(run_dir)]) == 2  # this process's __main__ has no such class
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "env.id: '__main__:NotebookCorridor' names a class or function of the notebook" in err, err
    assert "Traceback" not in err
    again = load_pipeline(run_dir / "pipeline.yaml", overrides={"env.id": mine})  # what Run.resume(..., overrides=) reads
    assert again.env.id.spec.entry_point is mine and again.env.id == "__main__:NotebookCorridor"


# ---- wrappers --------------------------------------------------------------------------------------
def test_wrappers_wrap_each_single_env_in_order_even_one_with_a_vector_entry_point():
    p = load_pipeline("cartpole_ppo", overrides={"env.wrappers": [
        {"name": "gymnasium.wrappers:TimeLimit", "kwargs": {"max_episode_steps": 20}}, "FlattenObservation"]})
    env = make_vec_env(p.env.id, 2, seed=0)  # CartPole-v1's own vector env takes no wrappers: sync over wrapped envs
    try:
        assert isinstance(env, gym.vector.SyncVectorEnv)
        assert [type(w).__name__ for w in _wrappers(env.envs[0])][-2:] == ["TimeLimit", "FlattenObservation"]
        assert _wrappers(env.envs[0])[-2]._max_episode_steps == 20
        ended_at = next(t for t in range(1, 100) if np.logical_or(*env.step(np.full(2, t % 2))[2:4]).all())
    finally:
        env.close()
    assert ended_at <= 20  # every episode, ended by the pole or by the time limit


def _wrappers(env) -> list:
    found = []
    while isinstance(env, gym.Wrapper):
        found.insert(0, env)
        env = env.env
    return found


# ---- the pre-flight --------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id,message", [
    ("labenvs.broken:RaisesInInit",
     "env: cannot create labenvs.broken:RaisesInInit with kwargs {} in the driver: FileNotFoundError: corridor.map not found"),
    ("labenvs.broken:WrongShape", "env: labenvs.broken:WrongShape failed its pre-flight in the driver: reset returned an "
                                  "observation of shape (3,), but observation_space is Box("),
    ("labenvs.broken:Unseeded", "env: labenvs.broken:Unseeded failed its pre-flight in the driver: check_env raised "
                                "AssertionError: "),
])
def test_a_bad_env_fails_its_pre_flight_in_one_line_exit_2_and_writes_nothing(tmp_path, capsys, env_id, message):
    from tianji_dask.cli import main

    out = tmp_path / "run"
    code = main(["train", "cartpole_ppo", "--set", f"env.id={env_id}", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"tianji-dask: error: {message}" in err, err
    assert "Traceback" not in err and not out.exists()


def test_env_check_false_skips_the_checker_but_not_the_step(tmp_path):
    Run("cartpole_ppo", out=tmp_path / "a", overrides={"env.id": "labenvs.broken:Unseeded", "env.check": False,
                                                       "mode": "single"})
    with pytest.raises(PipelineError, match="reset returned an observation of shape"):
        Run("cartpole_ppo", out=tmp_path / "b", overrides={"env.id": "labenvs.broken:WrongShape", "env.check": False})


def test_the_checkers_warnings_are_one_line_and_not_an_error(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="tianji_dask.preflight"):
        Run("cartpole_ppo", out=tmp_path / "a", overrides={"env.id": "labenvs.broken:RaisesOnWorkers", "mode": "single"})
    lines = [r.getMessage() for r in caplog.records if r.name == "tianji_dask.preflight"]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert lines[0].startswith("tianji: env labenvs.broken:RaisesOnWorkers in the driver: gymnasium's env checker warns (2): "
                               "A Box observation space minimum value is -infinity")


def test_an_env_that_fails_only_on_a_worker_stops_the_start_in_one_line(tianji_client, tmp_path):
    run = Run("cartpole_ppo", tianji_client, out=tmp_path / "run", overrides={"env.id": "labenvs.broken:RaisesOnWorkers"})
    with pytest.raises(PipelineError) as err:
        run.start()
    line = str(err.value)
    assert line.startswith("env: cannot create labenvs.broken:RaisesOnWorkers with kwargs {} on worker tcp://"), line
    assert line.endswith(": ImportError: libsim.so: cannot open shared object file") and "\n" not in line
    assert not (tmp_path / "run").exists()


# ---- envs that raise while training --------------------------------------------------------------
def test_env_errors_are_counted_with_first_and_last_lines_and_judged_per_minute():
    errors = EnvErrors(max_errors=3)
    assert [errors.record(s, f"e{i}", f"tb{i}", now=100.0 + i) for i, s in enumerate([0, 1, 0])] == [None] * 3
    stop = errors.record(1, "e3", "tb3", now=103.0)
    assert stop == "env: 4 env errors within 60 s, more than env.max_errors (3); last: e3"
    assert errors.record(0, "e4", "tb4", now=170.0) is None  # the first four are more than 60 s ago
    summary = errors.summary()
    assert summary == {**summary, "count": 5, "first": "e0", "last": "e4", "per_stream": {"0": 3, "1": 2}}
    assert summary["tracebacks"].count("tb") == 5 and "explorer stream 1: e3" in summary["tracebacks"]
    many = EnvErrors()
    for i in range(30):
        many.record(0, f"e{i}", f"tb{i}", now=float(i))
    text = many.text()
    assert "... 10 errors not kept here ..." in text and "tb9\n" in text and "tb10\n" not in text and "tb29" in text


def test_group_mode_pools_the_groups_env_errors_and_keeps_one_text():
    from tianji_dask.core.env_errors import pooled

    a, b = EnvErrors(), EnvErrors()
    a.record(0, "x", "tb-x", now=1.0)
    b.record(3, "y", "tb-y", now=2.0)
    b.record(3, "z", "tb-z", now=3.0)
    per = [a.summary(), b.summary(), EnvErrors().summary()]
    run = pooled(per)
    assert run == {**run, "count": 3, "first": "x", "last": "z", "per_stream": {"0": 1, "3": 2}}
    assert run["tracebacks"].startswith("group 0:\n") and "group 1:\n" in run["tracebacks"] and "group 2" not in run["tracebacks"]
    assert all("tracebacks" not in group for group in per)


def test_check_algorithm_takes_an_env_as_env_id_takes_it():
    from tianji_dask.testing import check_algorithm

    assert check_algorithm("ppo", Corridor) == [] and check_algorithm("ppo", CORRIDOR, env_kwargs={"length": 5}) == []


def _flaky(every: int, grace: int = 10) -> list:
    return [{"name": FLAKY, "kwargs": {"every": every, "grace": grace}}]


def test_in_single_mode_an_env_that_raises_is_rebuilt_and_counted(tmp_path):
    results = Run("cartpole_ppo", out=tmp_path / "run", overrides={
        "mode": "single", "env.wrappers": _flaky(300), "env.check": False, "env.num_envs": 4, "chunk_steps": 32,
        "stop.max_env_steps": 6000}).start().wait()  # about one chunk in four fails
    errors = results["env_errors"]
    assert results["stop_reason"] == "max_env_steps" and results["error"] is None
    assert errors["count"] > 0 and errors["first"].startswith("explorer ") and ": RuntimeError: simulator lost its state" in errors["first"]
    assert errors["file"] == "env_errors.txt" and "tracebacks" not in errors
    assert (tmp_path / "run" / "env_errors.txt").read_text().count("Traceback") == min(errors["count"], 20)
    assert any("simulator lost its state" in lost["reason"] for lost in results["lost"])


def test_env_max_errors_stops_the_run_in_one_line(tmp_path):
    results = Run("cartpole_ppo", out=tmp_path / "run", overrides={
        "mode": "single", "env.wrappers": _flaky(5), "env.check": False, "env.num_envs": 4, "chunk_steps": 32,
        "env.max_errors": 3, "stop.max_explorer_failures": 100, "stop.max_env_steps": 100_000}).start().wait()
    assert results["stop_reason"] == "env_errors" and results["env_errors"]["count"] == 4
    assert results["error"].startswith("env: 4 env errors within 60 s, more than env.max_errors (3); last: explorer ")
    assert results["error_file"] == "error.txt"


# ---- on a cluster ----------------------------------------------------------------------------------
@pytest.mark.slow  # trains twice, each on its own LocalCluster
@pytest.mark.parametrize("how", ["class", "registered"])
def test_an_env_defined_only_in_main_trains_on_a_cluster(tmp_path, how):
    proc = subprocess.run([sys.executable, str(BYO / "env_in_main.py"), str(tmp_path / "run"), how], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)  # labenvs is not on its path: the class is __main__'s alone
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    label = "__main__:Corridor" if how == "class" else "lab/Corridor-v0"
    assert results == {**results, "solved": True, "env_id": label, "error": None, "stop_reason": "solved"}
    assert results["final_mean_return"] >= 0.6
    assert yaml.safe_load((tmp_path / "run" / "pipeline.yaml").read_text())["env"]["id"] == label


@pytest.mark.slow  # trains on the shared cluster
def test_a_time_limit_wrapper_bounds_every_episode_in_training_and_in_evaluation(tianji_client, tmp_path):
    from tianji_dask import evaluate
    from tianji_dask.core.metrics import read_episodes

    out = tmp_path / "run"
    results = Run("cartpole_ppo", tianji_client, out=out, overrides={
        "env.wrappers": [{"name": "gymnasium.wrappers:TimeLimit", "kwargs": {"max_episode_steps": 200}}],
        "stop.target_return": 195, "stop.max_seconds": 120}).start().wait()
    assert results["solved"] and results["error"] is None
    lengths = read_episodes(out)[:, 2]
    assert lengths.max() == 200 and (lengths <= 200).all()
    evaluation = evaluate(out, episodes=3)
    assert evaluation.lengths and max(evaluation.lengths) <= 200


@pytest.mark.slow  # trains in a subprocess on its own LocalCluster
def test_an_env_that_raises_about_once_in_2000_steps_still_solves_and_prints_no_traceback(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "tianji_dask", "train", "cartpole_ppo", "--set",
                           f"env.wrappers=[{{name: '{FLAKY}', kwargs: {{every: 2000}}}}]", "--quiet", "--out", str(out)],
                          capture_output=True, text=True, timeout=400, cwd=tmp_path, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tianji-dask: solved CartPole-v1" in proc.stdout, proc.stdout
    for noise in ("Traceback", "Compute Failed", "RuntimeError", "simulator lost"):
        assert noise not in proc.stderr, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    errors = results["env_errors"]
    assert results["solved"] and results["stop_reason"] == "solved" and errors["count"] > 0 and errors["file"] == "env_errors.txt"
    assert errors["last"].startswith("explorer ") and "RuntimeError: simulator lost its state after" in errors["last"]
    assert sum(errors["per_stream"].values()) == errors["count"]
    assert (out / "env_errors.txt").read_text().count("Traceback (most recent call last)") == min(errors["count"], 20)
    assert results["controller"]["chunks_in_flight"] == 0  # every failed chunk's credit came back
