"""A run's start: each step on record in order, and the CLI's own imports light. Timing is never
asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "gymnasium", "distributed")
STEPS = ["import_s", "checked_s", "cluster_s", "learner_built_s", "first_chunk_s"]


def test_the_cli_imports_neither_torch_nor_distributed_before_it_starts_the_workers():
    # the forkserver imports them on another core while the CLI process does (cli/train.py, start_workers_early)
    code = f"import sys, tianji_dask.cli; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert proc.stdout.strip() == "[]"


#: a CLI command up to the moment it starts the forkserver, which it then ends: what the command's
#: own process had imported by then
AT_FORKSERVER_START = """
import sys
from tianji_dask.launch import forkserver

def start():
    print("at start:", sorted(m for m in {heavy!r} if m in sys.modules), flush=True)
    raise SystemExit(0)

forkserver.start = start
from tianji_dask.cli import main
sys.exit(main({argv!r}))
"""


@pytest.mark.parametrize("argv", [["train", "cartpole_ppo"], ["train", "--env", "CartPole-v1", "--algo", "ppo"],
                                  ["train", "cartpole_ppo", "--seeds", "0", "1"]], ids=["pipeline", "env-algo", "seeds"])
def test_the_cli_starts_the_forkserver_before_it_imports_torch_gymnasium_or_distributed(argv):
    # the mechanism start-up rests on: the forkserver imports them on another core while the CLI
    # process does; started after them, the two imports run one after the other (4b49fbb did,
    # through one import of tianji_dask.run, and start-up took 1.2 s more)
    code = AT_FORKSERVER_START.format(heavy=HEAVY, argv=argv)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "at start: []" in proc.stdout.splitlines(), proc.stdout[-3000:] + proc.stderr[-3000:]


def test_a_cli_run_records_each_step_of_its_start_in_order(cli_training_run):
    proc = cli_training_run.proc  # `tianji-dask train cartpole_ppo ... --verbose` (conftest)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((cli_training_run.out / "results.json").read_text())
    startup = results["startup"]
    assert set(startup) == set(STEPS)
    values = [startup[k] for k in STEPS]
    assert all(v is not None and v > 0 for v in values), startup
    assert values == sorted(values), startup
    # run start is the learner built: the two clocks of time-to-solve differ by exactly that
    assert startup["learner_built_s"] == pytest.approx(results["t_run_start"] - results["t_process_start"])
    lines = proc.stdout.splitlines()
    assert len([line for line in lines if line.startswith("tianji-dask: startup:")]) == len(STEPS)
    assert len([line for line in lines if line.startswith("tianji-dask: shutdown:")]) == 1


def test_a_single_mode_run_has_no_cluster_step(tmp_path):
    from tianji_dask import Run

    results = Run("cartpole_ppo", out=tmp_path / "single", overrides={"mode": "single", "stop.max_env_steps": 4096,
                                                                     "stop.target_return": None}).start().wait()
    startup = results["startup"]
    assert startup["cluster_s"] is None
    steps = [startup[k] for k in STEPS if k != "cluster_s"]
    assert None not in steps and steps == sorted(steps), startup


def test_a_local_cluster_s_workers_fork_from_one_process_that_imported_torch(monkeypatch):
    import dask
    from distributed import Client

    monkeypatch.delenv("TIANJI_FORK_WORKERS", raising=False)  # the default

    from tianji_dask.launch.cluster import local_cluster

    method = "distributed.worker.multiprocessing-method"
    with dask.config.set({method: dask.config.get(method)}):  # forking stays on in the process: not after this test
        cluster = local_cluster(explorer_workers=2, dashboard_address=None)
        try:
            with Client(cluster) as client:
                parents = set(client.run(os.getppid).values())
                loaded = set(client.run(lambda: "torch" in sys.modules).values())
                kept = dask.config.get(method)
        finally:
            cluster.close()
    assert len(parents) == 1 and os.getpid() not in parents  # the forkserver, not this process
    assert loaded == {True}  # before any task asked for it
    assert kept == "forkserver"  # a worker the nanny restarts forks too


@pytest.mark.slow
def test_the_startup_benchmark_writes_every_round_and_its_table(tmp_path):
    out = tmp_path / "startup"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "startup.py"), "--rounds", "1", "--max-seconds", "2",
                           "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = json.loads(out.with_suffix(".json").read_text())["runs"]
    assert {"import_s", "startup_s", "startup_ratio", "shutdown_s", *(f"startup.{k}" for k in STEPS)} <= set(row)
    table = out.with_suffix(".md").read_text()
    assert "| startup ÷ import to imports done, per round |" in table and "| shutdown:" in table
