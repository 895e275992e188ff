"""Several runs on one cluster at once, and the sweeps built on them: Optuna studies and
population-based training (tianji_dask.sweeps)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import optuna
import pytest
import yaml

from tianji_dask.config import PipelineError, load_pipeline
from tianji_dask.sweeps.space import check_space, parse_param
from tianji_dask.sweeps.study import Active, live_value, objective_value


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "tianji_dask", *args], capture_output=True, text=True, timeout=timeout)


# ---- several runs on one cluster --------------------------------------------------------------

def test_two_runs_train_at_once_on_one_cluster_each_with_its_own_books_learner_and_explorers(tmp_path):
    from distributed import Client

    from tianji_dask.dataflow.keys import is_pool_name
    from tianji_dask.launch.cluster import local_cluster
    from tianji_dask.run.handle import Run
    from tianji_dask.launch.cluster import learner_workers

    cluster = local_cluster(explorer_workers=2, dashboard_address=None, learner_workers=2, explorer_threads=2)
    client = Client(cluster)
    try:
        learners = learner_workers(client)
        explorers = sorted(a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()
                           if w["resources"].get("EXPLORER"))
        assert len(learners) == 2 and len(explorers) == 2
        runs = [Run("cartpole_dqn", client, out=tmp_path / f"run{i}", learner_worker=learners[i],
                    explorer_workers=[explorers[i]],
                    overrides={"explorers": 2, "seed": i, "stop.target_return": None, "stop.max_seconds": 2})
                for i in range(2)]
        for run in runs:
            run.start()
        seen: dict[int, list] = {0: [], 1: []}
        results: list = [None, None]

        def wait(i):
            results[i] = runs[i].wait(on_status=lambda s: seen[i].append(s))

        threads = [threading.Thread(target=wait, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        both = client.sync(client.scheduler.tianji_runs)
        plugins = client.run(lambda dask_worker: sorted(n for n in dask_worker.plugins if is_pool_name(n)))
    finally:
        client.close()
        cluster.close()
    assert sorted(both) == sorted(r.run_id for r in runs)  # the controller held both runs' books at once
    for i, (run, r) in enumerate(zip(runs, results)):
        assert r["run_id"] == run.run_id and r["stop_reason"] == "max_seconds"
        ctl = r["controller"]
        assert ctl["run_id"] == run.run_id
        # the run's own books: every chunk its learner consumed and no other run's
        assert ctl["chunks_consumed"] == r["chunks"] > 0
        assert sorted(ctl["per_explorer_env_steps"]) == ["0", "1"]
        assert sum(ctl["per_explorer_env_steps"].values()) == r["env_steps"]
        homes = {h for s in seen[i] for h in (s.get("explorer_homes") or {}).values()}
        assert homes == {explorers[i]}  # its streams stayed on its own explorer worker
        assert r["cluster_shared"] is True and "cpu" not in r  # cluster-wide figures would count the other run
        episodes = (tmp_path / f"run{i}" / "episodes.csv").read_text().splitlines()
        assert len(episodes) - 1 == r["episodes"]
    # both runs are over: their env pools have left the workers
    assert all(names == [] for names in plugins.values())


# ---- the search space ---------------------------------------------------------------------

def test_param_specs_parse_and_bad_ones_say_what_is_allowed():
    assert parse_param("algo.config.lr=loguniform:1e-4:1e-2").low == 1e-4
    assert parse_param("explorers=int:1:4").high == 4
    assert parse_param("algo.config.num_minibatches=choice:4,8").choices == (4, 8)
    assert parse_param("algo.config.lr=choice:1e-6,3e-3,0.01").choices == (1e-6, 3e-3, 0.01)
    assert parse_param("algo.config.activation=choice:relu,tanh").choices == ("relu", "tanh")
    for text, msg in [("lr", "KEY=SPEC expected"), ("a=normal:0:1", "allowed: loguniform:LO:HI"),
                      ("a=uniform:2:1", "need LO < HI"), ("a=loguniform:0:1", "LO > 0"),
                      ("a=int:1.5:3", "whole numbers"), ("a=choice:", "does not parse"),
                      ("a=uniform:1", "two bounds"), ("a=choice:1,1", "distinct")]:
        with pytest.raises(PipelineError, match=msg):
            parse_param(text)


def test_the_space_is_checked_against_the_pipeline_before_any_trial():
    p = load_pipeline("cartpole_ppo")
    assert check_space(p, [parse_param("algo.config.lr=loguniform:1e-4:1e-2")]) is p
    with pytest.raises(PipelineError, match=r"^--param algo\.config\.nope: unknown key; allowed: activation"):
        check_space(p, [parse_param("algo.config.nope=uniform:0:1")])
    with pytest.raises(PipelineError, match=r"^--param explorers=int:0:4: the value 0 is not allowed: explorers"):
        check_space(p, [parse_param("explorers=int:0:4")])
    with pytest.raises(PipelineError, match="given twice"):
        check_space(p, [parse_param("seed=int:0:4"), parse_param("seed=int:1:2")])


def test_objective_values_count_an_unsolved_trial_with_its_budget():
    assert objective_value("time_to_solve", {"solved": True, "time_to_solve_s": 3.5}, 40) == 3.5
    assert objective_value("time_to_solve", {"solved": False, "time_to_solve_s": None}, 40) == 40
    assert objective_value("final_return", {"final_mean_return": 120.0}, 40) == 120
    assert objective_value("eval_return", {"eval": [{"mean_return": 1}, {"mean_return": 7}]}, 40) == 7
    assert objective_value("eval_return", {"eval": []}, 40) is None
    # the pruner sees the running return, in the study's direction
    assert live_value("time_to_solve", {"mean_return": 80.0}) == -80 and live_value("final_return", {"mean_return": 80.0}) == 80
    assert live_value("final_return", {"mean_return": float("nan")}) is None


def test_a_trial_behind_the_median_at_the_same_point_is_stopped():
    from tianji_dask.sweeps.driver import _maybe_prune
    from tianji_dask.sweeps.study import REPORTS, make_pruner

    class StoppableRun:  # the one call the pruner makes on a run
        stopped = False

        def stop(self):
            self.stopped = True

    study = optuna.create_study(direction="maximize", pruner=make_pruner("median"))
    for final in (100.0, 200.0, 300.0):  # three finished trials that reported a rising return
        t = study.ask()
        for step in range(REPORTS):
            t.report(final * step / REPORTS, step)
        study.tell(t, final)
    events = []
    good, bad = (Active(study.ask(), None, StoppableRun(), {}) for _ in range(2))
    for step in range(REPORTS // 4, REPORTS // 2):
        elapsed = (step + 0.5) * 40 / REPORTS
        good.status, bad.status = {"elapsed_s": elapsed, "mean_return": 400.0}, {"elapsed_s": elapsed, "mean_return": 1.0}
        for a in (good, bad):
            if not a.pruned:
                _maybe_prune(a, "final_return", 40, lambda kind, info: events.append((kind, info["number"])))
    assert bad.pruned and bad.run.stopped and not good.pruned and not good.run.stopped
    assert events == [("prune", bad.trial.number)]


# ---- the command ------------------------------------------------------------------------------

@pytest.mark.parametrize("args, msg", [
    (["--param", "algo.config.nope=uniform:0:1"], "--param algo.config.nope: unknown key"),
    (["--param", "algo.config.lr=gauss:1:2"], "does not parse; allowed: loguniform:LO:HI"),
    (["--param", "algo.config.lr=uniform:-1:1"], "the value -1.0 is not allowed"),
    (["--param", "algo.config.lr=uniform:0.1:1", "--concurrent", "64"], "--concurrent: 64 trials at once need a core each"),
    ([], "--param: give at least one KEY=SPEC"),
    (["--param", "seed=int:0:3", "--objective", "eval_return"], "--objective eval_return: the pipeline has no eval"),
    (["--param", "seed=int:0:3", "--pbt", "--concurrent", "1"], "a population needs at least 2 members"),
])
def test_bad_sweeps_are_refused_in_one_line_before_any_trial(tmp_path, capsys, args, msg):
    from tianji_dask.cli import main

    out = tmp_path / "sweep"
    assert main(["sweep", "cartpole_ppo", "--max-seconds", "5", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert msg in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert not out.exists()  # nothing written: refused before the study or any trial


@pytest.mark.slow
def test_sweep_writes_every_trial_and_a_best_pipeline_that_trains_and_resumes(tmp_path):
    out = tmp_path / "sweep"
    args = ["sweep", "cartpole_ppo", "--concurrent", "2", "--param", "algo.config.lr=loguniform:1e-4:1e-2",
            "--max-seconds", "40", "--out", str(out), "--quiet"]
    proc = _cli(*args, "--trials", "4")
    assert proc.returncode == 0, proc.stderr
    data = json.loads((out / "sweep.json").read_text())
    assert len(data["trials"]) == 4 and data["best"] is not None
    assert all(t["state"] in ("COMPLETE", "PRUNED") for t in data["trials"])
    done = [t for t in data["trials"] if t["state"] == "COMPLETE"]
    assert data["best"]["value"] == min(t["value"] for t in done)
    for t in done:  # each trial's value is its own run's time to solve (or its budget)
        r = json.loads((out / "trials" / f"{t['number']:04d}" / "results.json").read_text())
        assert t["value"] == (r["time_to_solve_s"] if r["solved"] else 40)
        assert r["pipeline_config"]["algo"]["config"]["lr"] == t["params"]["algo.config.lr"]
    assert "best time_to_solve" in proc.stdout and (out / "sweep.png").stat().st_size > 0
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["algo"]["config"]["lr"] == data["best"]["params"]["algo.config.lr"]
    # the pipeline's own stop rules, not the trials' budget
    assert best["stop"]["max_seconds"] == load_pipeline("cartpole_ppo").stop.max_seconds != 40
    trained = _cli("train", str(out / "best.yaml"), "--quiet", "--max-seconds", "30", "--out", str(tmp_path / "best"))
    assert trained.returncode == 0, trained.stderr
    assert json.loads((tmp_path / "best" / "results.json").read_text())["updates"] > 0
    # the same command with more trials goes on from the four done
    proc = _cli(*args, "--trials", "5")
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads((out / "sweep.json").read_text())["trials"]) == 5


@pytest.mark.slow
def test_population_based_training_copies_the_better_member_and_records_it(tmp_path):
    out = tmp_path / "pbt"
    # a learning rate of 1e-6 barely learns in 5 s, one of 3e-3 solves: the first exploit (at 5 s)
    # copies the latter; a 10 s budget leaves a second look (at 10 s) and the copy seconds to train
    proc = _cli("sweep", "cartpole_ppo", "--pbt", "--concurrent", "2", "--param", "algo.config.lr=choice:1e-6,3e-3",
                "--max-seconds", "10", "--pbt-interval", "5", "--set", "stop.target_return=null", "--seed", "4",
                "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    data = json.loads((out / "sweep.json").read_text())
    starts = {t["member"]: t["params"]["algo.config.lr"] for t in data["trials"] if t["generation"] == 0}
    assert sorted(starts.values()) == [1e-6, 3e-3]  # seed 4 draws one of each
    first = data["lineage"][0]
    slow = next(m for m, lr in starts.items() if lr == 1e-6)
    assert first["member"] == slow and first["from_member"] != slow and first["score"] < first["from_score"]
    assert first["params_before"] == {"algo.config.lr": 1e-6}
    assert (out / "members" / f"m{slow}-g1" / "results.json").exists()
    r = json.loads((out / "members" / f"m{slow}-g1" / "results.json").read_text())
    assert r["final_version"] > 0 and r["pipeline_config"]["checkpoint"]["enabled"]
    assert data["best"] is not None and (out / "best.yaml").exists()


@pytest.mark.slow
def test_a_sweep_stopped_by_sigterm_leaves_each_trials_results_and_resumes_them_first(tmp_path):
    import signal
    import time

    out = tmp_path / "sweep"
    args = [sys.executable, "-m", "tianji_dask", "sweep", "cartpole_ppo", "--concurrent", "2", "--trials", "2",
            "--param", "algo.config.lr=loguniform:1e-4:1e-2", "--objective", "final_return",
            "--set", "stop.target_return=null", "--set", "checkpoint.every_versions=2", "--pruner", "none", "--out", str(out)]
    proc = subprocess.Popen([*args, "--max-seconds", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = []
    deadline = time.time() + 120
    while len(started) < 2 and time.time() < deadline:
        line = proc.stdout.readline()
        if " started on slot " in line:
            started.append(line)
    # both trials training: each has written a checkpoint, two versions in
    deadline = time.time() + 300
    while not all(any((out / "trials" / f"{n:04d}" / "checkpoints").glob("*.pt")) for n in (0, 1)):
        assert time.time() < deadline and proc.poll() is None, "the trials made no update"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "Traceback" not in err, err
    for number in (0, 1):  # each stopped trial wrote its results
        r = json.loads((out / "trials" / f"{number:04d}" / "results.json").read_text())
        assert r["stop_reason"] == "stopped" and r["updates"] > 0
    # the same command goes on: the two interrupted trials' parameters run again, first
    before = {t.number: t.params for t in optuna.load_study(study_name="tianji-sweep",
                                                             storage=f"sqlite:///{out / 'study.db'}").trials}
    done = subprocess.run([*args, "--max-seconds", "4", "--quiet"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    data = json.loads((out / "sweep.json").read_text())
    states = {t["number"]: t["state"] for t in data["trials"]}
    assert states[0] == states[1] == "FAIL" and states[2] == states[3] == "COMPLETE"
    retried = {t["retry_of"]: t["params"] for t in data["trials"] if t["retry_of"] is not None}
    assert retried == {0: before[0], 1: before[1]}


def test_a_cluster_too_small_for_the_trials_at_once_is_refused_before_any_trial(tianji_client, tmp_path, capsys):
    from tianji_dask.cli import main

    address = tianji_client.scheduler.address  # one LEARNER worker, two EXPLORER workers
    out = tmp_path / "sweep"
    assert main(["sweep", "cartpole_ppo", "--scheduler", address, "--concurrent", "2", "--max-seconds", "5",
                 "--param", "algo.config.lr=loguniform:1e-4:1e-2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--concurrent: 2 trials at once need 2 LEARNER and 2 EXPLORER workers; the cluster at {address} has 1 and 2" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    assert len(tianji_client.scheduler_info(n_workers=-1)["workers"]) == 3  # the cluster is left as it was
