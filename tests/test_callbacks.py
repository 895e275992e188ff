"""Callbacks: the hooks a learner calls off its own thread, in single mode and on a real LocalCluster,
what a failing or blocking callback does to a run (nothing), a pipeline's bad entries, and the MLflow
and W&B loggers read back with their own libraries."""

import collections
import json
import logging
import struct
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml

from tianji_dask import Callback, PipelineError, Run
from tianji_dask.callbacks.runner import MAX_ERRORS, CallbackPlan, CallbackRunner, pooled
from tianji_dask.config import load_pipeline, parse_pipeline, pipeline_yaml
from tianji_dask.core.metrics import read_episodes

SINGLE = {"mode": "single", "stop.max_env_steps": 8_000, "checkpoint.every_versions": 2}


class Recorder(Callback):
    """Every call, in order; with ``path`` also one JSON line each (what a copy in another process leaves)."""

    def __init__(self, path=None):
        self.path, self.calls = path, []

    def _add(self, *call):
        self.calls.append(call)
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps(call) + "\n")

    def on_start(self, info):
        self._add("on_start", {k: info[k] for k in ("run_id", "out", "group", "version", "resumed")}, info["pipeline"]["name"])

    def on_episodes(self, rows):
        self._add("on_episodes", rows)

    def on_update(self, version, metrics):
        self._add("on_update", version, sorted(metrics))

    def on_evaluation(self, result):
        self._add("on_evaluation", result["version"], result["mean"], result["episodes"])

    def on_checkpoint(self, path, version):
        self._add("on_checkpoint", path, version)

    def on_end(self, results):
        self._add("on_end", results["updates"], results["episodes"])


class Failing(Callback):
    def __init__(self):
        self.ended = 0

    def on_update(self, version, metrics):
        raise ValueError(f"no update {version} wanted\nsecond line")

    def on_end(self, results):
        self.ended += 1


class Blocking(Callback):
    """Its first ``on_update`` waits until the test lets it go."""

    def __init__(self):
        self.entered, self.release, self.versions = threading.Event(), threading.Event(), []

    def on_update(self, version, metrics):
        self.entered.set()
        self.release.wait(120)
        self.versions.append(version)


class NeedsMissing(Callback):
    def __init__(self):
        from tianji_dask.callbacks.base import require

        require("tianji_no_such_package", "nothing")


def _wandb_processes():
    """This process's children that are wandb's service."""
    return [p.pid for p in psutil.Process().children(recursive=True) if "wandb" in " ".join(p.cmdline())]


def _by_hook(calls):
    hooks = collections.defaultdict(list)
    for call in calls:
        hooks[call[0]].append(call[1:])
    return hooks


def _check_against_results(calls, run, results):
    """The calls match what the run wrote: one start first, one end last, every update, episode and checkpoint."""
    assert calls[0][0] == "on_start" and calls[-1][0] == "on_end"
    hooks = _by_hook(calls)
    assert len(hooks["on_start"]) == len(hooks["on_end"]) == 1
    (info, name), = hooks["on_start"]
    assert info == {"run_id": run.run_id, "out": str(run.out.resolve()), "group": 0, "version": 0, "resumed": False}
    assert name == run.pipeline.name
    assert [v for v, _ in hooks["on_update"]] == list(range(1, results["updates"] + 1))
    assert all(keys == sorted(results["last_update_metrics"]) for _, keys in hooks["on_update"])
    rows = [row for (batch,) in hooks["on_episodes"] for row in batch]
    episodes = read_episodes(run.out)
    assert len(rows) == results["episodes"] == len(episodes)
    assert [r["return"] for r in rows] == episodes[:, 1].tolist()
    assert [r["length"] for r in rows] == episodes[:, 2].astype(int).tolist()
    steps = [r["env_steps"] for r in rows]
    assert steps == sorted(steps) and 0 < steps[-1] <= results["env_steps"]
    every = run.pipeline.checkpoint.every_versions
    versions = [v for _, v in hooks["on_checkpoint"]]
    assert versions == [*range(every, results["updates"] + 1, every), results["final_version"]]
    assert hooks["on_checkpoint"][-1][0] == results["checkpoint"]
    assert hooks["on_end"] == [(results["updates"], results["episodes"])]
    assert results["callbacks"]["dropped"] == 0
    return hooks


# ---- the runner on its own ---------------------------------------------------------------------------

def test_a_full_queue_drops_and_counts_and_never_blocks():
    blocking, recorder = Blocking(), Recorder()
    runner = CallbackRunner(CallbackPlan(entries=(blocking, recorder), queue_size=4))
    runner.emit("on_update", 1, {})
    assert blocking.entered.wait(30)  # the thread holds event 1: four more fit in the queue
    for version in range(2, 11):
        runner.emit("on_update", version, {})
    blocking.release.set()
    summary = runner.end({"updates": 10, "episodes": 0})
    assert summary == {"events": 10, "dropped": 5, "errors": {}, "disabled": []}
    assert blocking.versions == [1, 2, 3, 4, 5]
    assert recorder.calls == [("on_update", v, []) for v in range(1, 6)] + [("on_end", 10, 0)]


def test_the_end_is_bounded_when_a_hook_never_returns():
    blocking = Blocking()
    runner = CallbackRunner(CallbackPlan(entries=(blocking,), drain_s=0.2, end_s=0.2))
    for version in range(1, 4):
        runner.emit("on_update", version, {})
    assert blocking.entered.wait(30)
    summary = runner.end({})
    blocking.release.set()
    assert summary["events"] == 3 and summary["dropped"] == 2  # the stuck one was delivered, the rest never
    assert list(summary["errors"]) == ["Blocking.on_update"]
    assert summary["errors"]["Blocking.on_update"]["error"].startswith("TimeoutError: still running after 0.2s")


def test_group_summaries_pool_into_one():
    one = {"events": 3, "dropped": 1, "errors": {"Failing.on_update": {"count": 3, "error": "ValueError: x"}},
           "disabled": ["Failing"]}
    two = {"events": 5, "dropped": 0, "errors": {}, "disabled": []}
    assert pooled([None, None]) is None
    assert pooled([one, two]) == {"events": 8, "dropped": 1, "disabled": ["g0.Failing"],
                                  "errors": {"g0.Failing.on_update": one["errors"]["Failing.on_update"]}}


def test_hooks_nobody_overrides_are_not_queued():
    runner = CallbackRunner(CallbackPlan(entries=(Failing(),)))
    assert runner.wants("on_update") and not runner.wants("on_episodes")
    runner.emit("on_episodes", [])
    assert runner.end({})["events"] == 0


# ---- in a run ----------------------------------------------------------------------------------------

def test_single_mode_calls_every_hook_in_order(tmp_path):
    recorder = Recorder()
    run = Run("cartpole_ppo", out=tmp_path / "run", overrides=SINGLE, callbacks=[recorder])
    results = run.start().wait()
    assert results["error"] is None and results["updates"] >= 3
    _check_against_results(recorder.calls, run, results)
    assert results["callbacks"]["errors"] == {} and results["callbacks"]["disabled"] == []
    assert json.loads((run.out / "results.json").read_text())["callbacks"] == results["callbacks"]


def test_a_failing_and_a_blocked_callback_leave_training_alone(tmp_path, caplog):
    failing, blocking, recorder = Failing(), Blocking(), Recorder()
    run = Run("cartpole_ppo", out=tmp_path / "run", callbacks=[failing, blocking, recorder],
              overrides={**SINGLE, "stop.max_env_steps": None, "stop.max_updates": 12, "stop.target_return": None})
    with caplog.at_level(logging.WARNING, logger="tianji_dask.callbacks"):
        run.start()
        assert blocking.entered.wait(60)
        # the callbacks' thread is held in update 1's call; the learner trains on regardless
        while run.status().get("updates", 0) < 12 and not run.status().get("done"):
            time.sleep(0.05)
        assert run.status()["updates"] == 12 and blocking.versions == []
        blocking.release.set()
        results = run.wait()
    assert results["error"] is None and results["stop_reason"] == "max_updates" and results["updates"] == 12
    assert blocking.versions == list(range(1, 13))
    summary = results["callbacks"]
    assert summary["errors"] == {"Failing.on_update": {"count": MAX_ERRORS, "error": "ValueError: no update 1 wanted"}}
    assert summary["disabled"] == ["Failing"] and summary["dropped"] == 0 and failing.ended == 1
    lines = [r.getMessage() for r in caplog.records if "Failing" in r.getMessage()]
    assert lines == ["tianji: callback Failing.on_update raised ValueError: no update 1 wanted",
                     f"tianji: callback Failing gets no more events after {MAX_ERRORS} errors (on_end still runs)"]
    _check_against_results(recorder.calls, run, results)


@pytest.mark.slow  # a real cluster with both loggers: the full suite runs it; single mode is the fast tier's
def test_relaxed_mode_calls_them_in_the_learners_process(tianji_client, tmp_path, monkeypatch):
    log = tmp_path / "calls.jsonl"
    run = Run("cartpole_ppo", tianji_client, out=tmp_path / "run", callbacks=[Recorder(str(log))], overrides={
        "stop.max_env_steps": 12_000, "stop.target_return": None, "checkpoint.every_versions": 2,
        "eval": {"every_versions": 2, "episodes": 2},
        "callbacks": ["tianji_dask.callbacks.mlflow:MLflowLogger", "tianji_dask.callbacks.wandb:WandbLogger"]})
    results = run.start().wait()
    assert results["error"] is None
    calls = [tuple(json.loads(line)) for line in log.read_text().splitlines()]
    hooks = _check_against_results(calls, run, results)
    assert results["callbacks"]["errors"] == {}
    assert [(v, mean, n) for v, mean, n in hooks["on_evaluation"]] == [(e["version"], e["mean"], 2) for e in results["eval"]]
    assert results["eval"]
    # the pipeline's loggers were built on the learner's worker and wrote to the run's folder; no
    # wandb service outlives the run in the worker's process
    assert not any(tianji_client.run(_wandb_processes).values())
    (wandb_log,) = (run.out / "wandb").glob("offline-run-*/run-*.wandb")
    assert sum(r.WhichOneof("record_type") == "exit" for r in _wandb_records(wandb_log)) == 1
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client, mlflow_run = _mlflow_run(run)
    assert len(client.get_metric_history(mlflow_run.info.run_id, "episode/return")) == results["episodes"]
    evals = client.get_metric_history(mlflow_run.info.run_id, "eval/mean")
    assert [m.step for m in evals] == [e["version"] for e in results["eval"]]


# ---- bad input -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("entry,message", [
    ("no_such_module_x:Thing", "callbacks[1]: cannot import module 'no_such_module_x' (ModuleNotFoundError"),
    ("json", "callbacks[1]: must be 'module:Class' or {class: 'module:Class', kwargs: {...}}"),
    ("json:JSONDecoder", "callbacks[1]: json:JSONDecoder is not a subclass of tianji_dask.Callback; allowed: 'module:Class'"),
    ("tianji_dask.callbacks.base:flatten", "callbacks[1]: tianji_dask.callbacks.base:flatten is not a subclass"),
    ({"class": "tianji_dask.callbacks.wandb:WandbLogger", "kwargs": {"mode": "loud"}},
     "callbacks[1]: tianji_dask.callbacks.wandb:WandbLogger(**{'mode': 'loud'}) raised ValueError: mode: must be offline"),
    ({"class": "tianji_dask.callbacks.mlflow:MLflowLogger", "kwargs": {"bogus": 1}},
     "callbacks[1]: tianji_dask.callbacks.mlflow:MLflowLogger(**{'bogus': 1}) raised TypeError:"),
    ({"klass": "x:Y"}, "callbacks[1]: unknown key 'klass'; allowed: 'module:Class' or"),
    ({"class": "x:Y", "kwargs": [1]}, "callbacks[1]: class must be a string and kwargs a mapping of names"),
    (7, ("callbacks[1]: must be 'module:Class' or {class: 'module:Class', kwargs: {...}} naming a subclass of "
         "tianji_dask.Callback (got int)")),
    ("test_callbacks:NeedsMissing", "callbacks[1]: needs tianji_no_such_package (pip install 'tianji-dask[nothing]')"),
])
def test_a_bad_pipeline_entry_is_one_line(entry, message):
    data = parse_pipeline_data()
    data["callbacks"] = ["tianji_dask.callbacks.mlflow:MLflowLogger", entry]
    with pytest.raises(PipelineError) as err:
        parse_pipeline(data)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_bad_callback_objects_are_one_line(tmp_path):
    with pytest.raises(PipelineError, match=r"^callbacks\[1\]: must be a tianji_dask.Callback object, got object$"):
        Run("cartpole_ppo", out=tmp_path / "a", overrides={"mode": "single"}, callbacks=[Recorder(), object()])
    unpicklable = Recorder()
    unpicklable.lock = threading.Lock()
    with pytest.raises(PipelineError, match=r"^callbacks\[0\]: Recorder cannot be pickled to reach the learner's process "):
        Run("cartpole_ppo", out=tmp_path / "b", callbacks=[unpicklable])
    Run("cartpole_ppo", out=tmp_path / "c", overrides={"mode": "single"}, callbacks=[unpicklable])  # it stays here
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def parse_pipeline_data():
    return yaml.safe_load(pipeline_yaml(load_pipeline("cartpole_ppo")))


# ---- the loggers, read back with their own libraries -------------------------------------------------

def _mlflow_run(run):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"file:{run.out.resolve() / 'mlruns'}")
    experiment = client.get_experiment_by_name("tianji-dask")
    (mlflow_run,) = client.search_runs([experiment.experiment_id])
    return client, mlflow_run


def test_mlflow_logger_holds_the_runs_episodes_and_updates(tmp_path, monkeypatch):
    run = Run("cartpole_ppo", out=tmp_path / "run", overrides={**SINGLE, "callbacks": [
        {"class": "tianji_dask.callbacks.mlflow:MLflowLogger", "kwargs": {"run_name": "cartpole"}}]})
    results = run.start().wait()
    assert results["error"] is None and results["callbacks"]["errors"] == {}
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client, mlflow_run = _mlflow_run(run)
    rid = mlflow_run.info.run_id
    assert mlflow_run.info.run_name == "cartpole" and mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.params["algo.name"] == "ppo" and mlflow_run.data.params["mode"] == "single"
    assert mlflow_run.data.tags["tianji.run_id"] == run.run_id
    episodes = read_episodes(run.out)
    returns = client.get_metric_history(rid, "episode/return")
    assert sorted(m.value for m in returns) == sorted(episodes[:, 1].tolist())
    assert [m.step for m in returns] == sorted(m.step for m in returns) and returns[-1].step <= results["env_steps"]
    lengths = client.get_metric_history(rid, "episode/length")
    assert sum(m.value for m in lengths) == episodes[:, 2].sum()
    for key in results["last_update_metrics"]:
        history = client.get_metric_history(rid, f"update/{key}")
        assert [m.step for m in history] == list(range(1, results["updates"] + 1))
        assert history[-1].value == pytest.approx(results["last_update_metrics"][key])
    (artifact,) = client.list_artifacts(rid)
    assert artifact.path == "results.json"
    logged = json.loads(Path(client.download_artifacts(rid, "results.json", str(tmp_path))).read_text())
    assert logged["updates"] == results["updates"] and logged["episodes"] == results["episodes"]


def _wandb_records(path):
    """The records of a W&B transaction log (``run-*.wandb``): W&B's LevelDB-style log of protobuf
    ``Record`` messages. wandb 0.31 ships no Python reader for it, so the framing is read here."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32 * 1024
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 1) or (ident, magic) == (b":W&B", 0xBEE1)
    pos, parts = 7, []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos: pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        parts.append(data[pos + 7: pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):  # FULL, or LAST of FIRST/MIDDLE/LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            parts = []
            yield record


def test_wandb_logger_offline_holds_the_runs_episodes_and_updates(tmp_path):
    run = Run("cartpole_ppo", out=tmp_path / "run",
              overrides={**SINGLE, "callbacks": ["tianji_dask.callbacks.wandb:WandbLogger"]})
    results = run.start().wait()
    assert results["error"] is None and results["callbacks"]["errors"] == {}
    assert not _wandb_processes()  # wandb's service process ended with the run
    (log,) = (run.out / "wandb").glob("offline-run-*/run-*.wandb")
    kinds, history = collections.Counter(), []
    for record in _wandb_records(log):
        kind = record.WhichOneof("record_type")
        kinds[kind] += 1
        if kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item})
        if kind == "run":
            config = {item.key: json.loads(item.value_json) for item in record.run.config.update}
    assert kinds["exit"] == 1
    assert config["algo"]["name"] == "ppo" and config["mode"] == "single"
    episodes = [row for row in history if "episode/return" in row]
    assert [row["episode/return"] for row in episodes] == read_episodes(run.out)[:, 1].tolist()
    assert [row["env_steps"] for row in episodes] == sorted(row["env_steps"] for row in episodes)
    updates = [row for row in history if "version" in row]
    assert [row["version"] for row in updates] == list(range(1, results["updates"] + 1))
    assert all(f"update/{key}" in row for row in updates for key in results["last_update_metrics"])
    assert np.isclose(updates[-1]["update/" + next(iter(results["last_update_metrics"]))],
                      next(iter(results["last_update_metrics"].values())))
