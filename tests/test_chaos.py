"""The fault-injection harness (benchmarks/chaos.py) on its cheapest class: a real run on the
embedded cluster, one explorer worker process SIGKILLed once the learner has checkpointed a
version drawn from the seed, then every invariant checked and the run resumed. Nothing is mocked;
the moment is an event (a checkpoint's version) and the run's length is counted in env steps, so
the test does not depend on the machine's speed: the time limits only guard against a hang."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: invariants that fail today for a reason already on record, and that reason; one that holds
#: again should leave this list
KNOWN: dict[str, str] = {}  # invariants a class is known to break today, with why


def _harness(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("chaos_faults"), importlib.import_module("chaos_run")


def test_the_harness_lists_its_classes_and_refuses_bad_input_in_one_line():
    script = str(ROOT / "benchmarks" / "chaos.py")
    listed = subprocess.run([sys.executable, script, "--list"], capture_output=True, text=True, timeout=60, check=False)
    assert listed.returncode == 0 and "explorer-kill" in listed.stdout and "disk-full" in listed.stdout
    for bad in (["--fault", "no-such-class"], ["--fault", "scheduler-kill", "--setup", "embedded"], ["--runs", "0"]):
        proc = subprocess.run([sys.executable, script, *bad], capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, (bad, proc.stderr)
        assert proc.stderr.startswith("chaos: error: ")


def test_a_seed_draws_the_same_fault_every_time(monkeypatch):
    faults, _ = _harness(monkeypatch)
    for name in faults.CLASSES:
        setup = faults.CLASSES[name].setups[0]
        assert faults.plan(name, setup, 7, (10, 300)) == faults.plan(name, setup, 7, (10, 300))
    assert len({faults.plan("learner-stop", "embedded", seed, (10, 300)).at_version for seed in range(8)}) > 1


def test_a_run_file_names_this_machine_s_folders_instead_of_spelling_them_out(monkeypatch):
    import json
    import tempfile

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    chaos = importlib.import_module("chaos")
    scratch = f"{tempfile.gettempdir()}/tianji-chaos-ab_12x"
    monkeypatch.setattr(sys, "prefix", "/opt/lab-venv")  # run from a virtual environment
    rec = {"last": f"tianji-dask: resume {scratch}/run` exit 1",
           "tb": f'File "{ROOT}/tianji_dask/cli.py", line 3; File "{sys.base_prefix}/lib/x.py"; '
                 'File "/opt/lab-venv/lib/python3.11/site-packages/distributed/worker.py"',
           "other": f"{ROOT}-sibling/x"}
    made = json.loads(chaos.portable(json.dumps(rec)))
    assert made["last"] == "tianji-dask: resume $SCRATCH/run` exit 1"
    assert made["tb"] == ('File "./tianji_dask/cli.py", line 3; File "$PYTHON/lib/x.py"; '
                          'File "$VENV/lib/python3.11/site-packages/distributed/worker.py"')
    assert made["other"].endswith("-sibling/x") and not made["other"].startswith(".")  # another folder


@pytest.mark.slow  # a run of 500,000 env steps, its fault, its checks and a resume: about two minutes
def test_an_explorer_worker_killed_on_the_embedded_cluster_holds_every_invariant(monkeypatch):
    faults, chaos_run = _harness(monkeypatch)
    settings = chaos_run.Settings(env_steps=500_000, budget_s=600, at_versions=(20, 60), resume_steps=50_000)
    rec = chaos_run.run_one(faults.plan("explorer-kill", "embedded", 0, settings.at_versions), settings)
    said = "\n".join(f"{k}: {v['ok']}: {v['evidence']}" for k, v in rec.get("invariants", {}).items())
    assert rec.get("not_injected") is None, rec.get("not_injected")
    assert rec["injected"]["target"]["role"] == "explorer" and rec["injected"]["error"] is None
    assert rec["version_at_fault"] >= rec["plan"]["at_version"]
    assert set(rec["invariants"]) == set(importlib.import_module("chaos_checks").NAMES)
    failed = set(rec["failed"])
    assert failed <= set(KNOWN), said
    assert rec["left_behind"] == [] and not rec.get("undo_failed"), rec
    if failed:
        pytest.xfail("; ".join(KNOWN[name] for name in sorted(failed)))
