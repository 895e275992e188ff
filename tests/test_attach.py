"""A run on an external scheduler outlives its driver: the driver SIGKILLed, the run trains on
the cluster, and ``tianji-dask attach`` drives it to its end and writes its results once; and
the one-line refusals of ``attach`` (no run, a finished one, a scheduler gone, no such run on
it, a second driver)."""

from __future__ import annotations

import json
import signal
import socket
import time

import pytest

from tianji_dask.cli import main
from tianji_dask.dataflow import keys
from tianji_dask.run import attach
from helpers import external_cluster, spawn, wait_for


def _run_dir(tmp_path, address: str | None, run_id: str = "abcd1234"):
    """A run directory as ``train`` leaves it on an external scheduler (``address`` None: on an
    embedded cluster, with no run file)."""
    from tianji_dask.config import load_pipeline, pipeline_yaml

    d = tmp_path / "run"
    d.mkdir()
    settings = {} if address is None else {"cluster.kind": "address", "cluster.address": address}
    (d / "pipeline.yaml").write_text(pipeline_yaml(load_pipeline("cartpole_dqn", overrides=settings)))
    if address is not None:
        attach.write_run_file(d, {"run_id": run_id, "scheduler": address, "t_process_start": time.time(),
                                  "startup": {"import": time.time()}, "resume_from": [None], "env_seed": 7919})
    return d


def _refused(capsys, run_dir) -> str:
    rc = main(["attach", str(run_dir)])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tianji-dask: error: ") and "Traceback" not in err, err
    return lines[0]


def test_attach_refuses_what_is_not_a_run_directory(tmp_path, capsys):
    assert "is not a run directory" in _refused(capsys, tmp_path)


def test_attach_refuses_a_run_of_an_embedded_cluster(tmp_path, capsys):
    line = _refused(capsys, _run_dir(tmp_path, None))
    assert "did not train on a scheduler of its own" in line and "tianji-dask resume" in line


def test_attach_refuses_a_finished_run(tmp_path, capsys):
    d = _run_dir(tmp_path, "tcp://127.0.0.1:1")
    (d / "results.json").write_text(json.dumps({"run_id": "abcd1234"}))
    line = _refused(capsys, d)
    assert "has finished" in line and "tianji-dask resume" in line


def test_attach_refuses_a_scheduler_that_is_gone(tmp_path, capsys):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    line = _refused(capsys, _run_dir(tmp_path, f"tcp://127.0.0.1:{port}"))
    assert "nothing listens" in line and "unreachable" in line and "tianji-dask resume" in line


@pytest.fixture(scope="module")
def scheduler():
    """A scheduler with the controller and no workers (nothing trains), and a client of it."""
    from distributed import Client, LocalCluster

    from tianji_dask.dataflow.controller.plugin import StalenessController

    with LocalCluster(n_workers=0, processes=False, protocol="tcp://", host="127.0.0.1", dashboard_address=":0") as cluster:
        with Client(cluster) as client:
            client.register_plugin(StalenessController(), name="tianji")
            yield client


def test_attach_refuses_a_run_the_scheduler_does_not_hold(tmp_path, capsys, scheduler):
    line = _refused(capsys, _run_dir(tmp_path, scheduler.scheduler.address))
    assert "no live run abcd1234 on the scheduler" in line and "tianji-dask resume" in line


def test_attach_refuses_a_second_driver_and_leaves_the_run_alone(tmp_path, capsys, scheduler):
    d = _run_dir(tmp_path, scheduler.scheduler.address, run_id="feed0002")
    future = scheduler.submit(sum, [1, 2], key="tianji-test-learner")  # no workers: it waits, held
    attach.publish(scheduler, "feed0002", {"learners": [future]})
    assert attach.drive(scheduler, "feed0002") is None  # this client drives the run
    try:
        line = _refused(capsys, d)
        assert "has a driver attached already" in line and scheduler.id in line
        # the refused driver ended nothing: the run's state is still published, its task still held
        assert keys.run_dataset_name("feed0002") in scheduler.list_datasets()
        del future
        assert scheduler.run_on_scheduler(lambda dask_scheduler: "tianji-test-learner" in dask_scheduler.tasks)
    finally:
        attach.unpublish(scheduler, "feed0002")


# ---- a real run, its driver killed ------------------------------------------------------------
def _state(client, run_id: str) -> dict:
    return client.sync(client.scheduler.tianji_state, run_id=run_id)


def _driver_of(client, run_id: str) -> str | None:
    return client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["tianji"].drivers.get(run_id))


RUN_S = 15  # the run's time budget: the attach drives it some 3 s into its training


@pytest.mark.slow  # about 25 s: a 15 s run, its cluster's start, a kill and an attach
def test_a_killed_driver_leaves_the_run_training_and_attach_ends_it(tmp_path, capsys):
    from distributed import Client

    log_path = tmp_path / "processes.log"
    client = None
    with external_cluster(log_path) as (address, procs):
        try:
            log = open(log_path, "a")  # appended, as the cluster's processes write it
            out = tmp_path / "run"
            driver = spawn(["tianji_dask", "train", "cartpole_dqn", "--scheduler", address, "--set", "stop.on_solve=false",
                            "--set", f"stop.max_seconds={RUN_S}", "--out", str(out), "--quiet"], log)
            procs.append(driver)
            run_file = out / "run.json"
            run_id = wait_for("the run file", lambda: run_file.is_file() and json.loads(run_file.read_text())["run_id"],
                              120, log_path)
            client = Client(address)
            name = keys.run_dataset_name(run_id)
            wait_for("the run's state published", lambda: name in client.list_datasets(), 120, log_path)
            wait_for("a few seconds of training", lambda: (_state(client, run_id)["learner_version"] or 0) >= 200, 60, log_path)
            first_driver = _driver_of(client, run_id)
            assert first_driver is not None
            driver.send_signal(signal.SIGKILL)
            assert driver.wait(timeout=30) == -signal.SIGKILL
            at_kill = _state(client, run_id)["learner_version"]
            # no driver: the learner trains on, its actor held by the published state
            wait_for("training after the kill", lambda: _state(client, run_id)["learner_version"] > at_kill + 100, 30, log_path)
            assert name in client.list_datasets() and not (out / "results.json").exists()
            attached = spawn(["tianji_dask", "attach", str(out)], log)
            procs.append(attached)
            wait_for("the attached driver", lambda: _driver_of(client, run_id) not in (None, first_driver), 60, log_path)
            line = _refused(capsys, out)  # a second driver while one is attached
            assert "has a driver attached already" in line
            assert attached.wait(timeout=120) == 0, log_path.read_text()[-4000:]
            results = json.loads((out / "results.json").read_text())
            assert results["run_id"] == run_id and results["error"] is None
            assert results["stop_reason"] == "max_seconds" and results["wall_s"] >= RUN_S - 1
            assert results["final_version"] > at_kill and results["updates"] > 0 and results["episodes"] > 0
            assert (out / "episodes.csv").is_file() and (out / "chunks.csv").is_file()
            accounting = results["chunk_accounting"]
            assert accounting["balanced"] and accounting["granted"] == results["chunks"] + results["chunks_lost"], accounting
            assert name not in client.list_datasets()  # nothing left on the scheduler
            assert _driver_of(client, run_id) is None
            assert "has finished" in _refused(capsys, out)
            assert "tianji-dask: results" in log_path.read_text()
        finally:
            if client is not None:
                client.close()
