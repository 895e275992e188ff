"""Where a run came from: ``results.json``'s ``provenance`` (versions, git, machine, command line,
each explorer stream's env seeds) and a ``pipeline.yaml`` that holds the algorithm's whole config,
so that a resumed run reads back the same hyperparameters."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import yaml

from tianji_dask.run.provenance import git_state, stream_seeds, versions

ROOT = Path(__file__).resolve().parent.parent


def _head(folder: Path) -> str | None:
    if shutil.which("git") is None:
        return None
    done = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def test_a_cli_run_records_its_provenance_and_the_whole_algorithm_config(cli_training_run):
    # `tianji-dask train cartpole_ppo --explorers 3 --set explorers=1 ... --out OUT` (conftest)
    import torch

    from tianji_dask.algos.ppo import PPOConfig

    assert cli_training_run.proc.returncode == 0, cli_training_run.proc.stderr
    results = json.loads((cli_training_run.out / "results.json").read_text())
    prov = results["provenance"]
    assert prov["versions"]["torch"] == torch.__version__ and prov["versions"]["python"]
    assert {"tianji_dask", "gymnasium", "numpy", "dask", "distributed"} <= set(prov["versions"])
    assert prov["machine"]["cores"] == os.cpu_count() and prov["machine"]["memory_bytes"] > 0
    assert "gpu" in prov["machine"] and prov["machine"]["os"]
    assert prov["argv"][1:3] == ["train", "cartpole_ppo"]
    sha = _head(ROOT)
    if sha is not None:  # a source checkout (CI's), not an installed copy
        assert prov["git"]["sha"] == sha and isinstance(prov["git"]["dirty"], bool)
    assert prov["pipeline_source"]["path"].endswith("cartpole_ppo.yaml")
    # one explorer stream, its env seeds as its chunks recorded them
    assert prov["seeds"]["run"] == 0 and prov["seeds"]["from"] == "chunks" and list(prov["seeds"]["streams"]) == ["0"]
    written = yaml.safe_load((cli_training_run.out / "pipeline.yaml").read_text())
    assert written["algo"]["config"] == PPOConfig(segments_per_batch=1, max_policy_lag=1).model_dump(mode="json")
    assert written["algo"]["config"]["lr"] == 5e-3
    assert results["pipeline_config"]["algo"]["config"] == written["algo"]["config"]


def test_the_whole_algorithm_config_loads_back_the_same(tmp_path):
    from tianji_dask.config import load_pipeline, pipeline_yaml

    p = load_pipeline("lunarlander_dqn", overrides={"algo.config.lr": 3e-4})
    (tmp_path / "pipeline.yaml").write_text(pipeline_yaml(p))
    again = load_pipeline(tmp_path / "pipeline.yaml")
    assert again == p and again.algo_config == p.algo_config
    assert set(again.algo.config) == set(type(p.algo_config).model_fields)  # every hyperparameter, written out
    assert again.algo.config["lr"] == 3e-4


def test_git_state_is_none_outside_a_checkout_and_without_git(tmp_path, monkeypatch):
    assert git_state(tmp_path) is None and git_state(None) is None
    if _head(ROOT) is not None:
        assert git_state(ROOT, top=True)["sha"] == _head(ROOT)
        assert git_state(ROOT / "tianji_dask", top=True) is None  # inside a checkout, not its top
    monkeypatch.setenv("PATH", str(tmp_path))  # no git binary to be found
    assert git_state(ROOT) is None


def test_versions_name_the_envs_own_package():
    from importlib import metadata

    found = versions({"id": "ale_py:ALE/Pong-v5"})
    assert found["ale-py"] == metadata.version("ale-py")
    assert "mujoco" in versions({"id": "Hopper-v5"}) and "ale-py" not in versions({"id": "CartPole-v1"})


def test_stream_seeds_from_the_chunks_or_the_rule():
    from tianji_dask.config import load_pipeline
    from tianji_dask.core.exact_replay_log import REPLAY_FIELDS
    from tianji_dask.envs.rollout import stream_seed

    p = load_pipeline("cartpole_ppo", overrides={"seed": 4})
    rows = np.zeros((4, len(REPLAY_FIELDS)))
    rows[:, REPLAY_FIELDS.index("stream")] = [1, 0, 1, 1]
    rows[:, REPLAY_FIELDS.index("env_seed")] = [11, 7, 11, 12]  # stream 1's envs rebuilt once
    record = stream_seeds(p, 0, [{"replay_log": rows}])
    assert record == {"run": 4, "env_base": 4, "streams": {"0": [7], "1": [11, 12]}, "from": "chunks"}
    single = stream_seeds(load_pipeline("cartpole_ppo", overrides={"seed": 4, "mode": "single"}), 7919, [{"replay_log": None}])
    assert single["streams"] == {"0": [stream_seed(4 + 7919, 0)], "1": [stream_seed(4 + 7919, 1)]}
    grouped = stream_seeds(load_pipeline("cartpole_ppo", overrides={"groups": 2}), 0, [{}, {}])
    assert grouped["streams"] is None and grouped["run"] == 0


def test_a_python_run_records_the_same_sections(tmp_path):
    import tianji_dask

    results = tianji_dask.train("cartpole_ppo", out=tmp_path / "run", overrides={
        "mode": "single", "chunk_steps": 8, "stop.target_return": None, "stop.max_env_steps": 256})
    prov = results["provenance"]
    assert set(prov) == {"versions", "git", "pipeline_source", "machine", "argv", "seeds"}
    assert prov["seeds"]["from"] == "stream_seed" and set(prov["seeds"]["streams"]) == {"0", "1"}
    assert json.loads((tmp_path / "run" / "results.json").read_text())["provenance"] == prov
