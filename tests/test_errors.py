"""The exception family: every error the package raises to a caller is a ``TianjiError`` that
keeps its builtin base and pickles whole (they cross Dask); one ``except tianji_dask.RunFailed``
catches a run that did not succeed, a ``RunFault`` included: a real cluster whose worker
processes cannot start, through ``train`` and through the command line (exit 1, one line)."""

from __future__ import annotations

import importlib
import inspect
import pickle
import subprocess
import sys

import dask
import distributed  # noqa: F401 - its config defaults loaded before dask.config.set adds to them
import pytest

import tianji_dask
from tianji_dask import errors

#: every module that defines an error a caller can meet
MODULES = ("tianji_dask.errors", "tianji_dask.observe.plots", "tianji_dask.envs.check", "tianji_dask.callbacks.base",
           "tianji_dask.testing.contract", "tianji_dask.core.guard", "tianji_dask.core.checkpoint",
           "tianji_dask.playback.exact_replay")
#: the builtin base each kept, so that an ``except`` written for it still catches it
BUILTIN = {"PipelineError": ValueError, "RunFailed": RuntimeError, "RunFault": RuntimeError, "ClusterLost": RuntimeError,
           "SchedulerLost": RuntimeError, "LearnerWorkersGone": RuntimeError, "ExplorerError": RuntimeError,
           "EnvError": RuntimeError, "RunDirError": ValueError, "MissingDependency": ImportError,
           "AlgorithmCheckError": AssertionError, "NumericFault": RuntimeError, "CheckpointError": ValueError,
           "CheckpointWriteError": OSError}
#: how to make one of each whose constructor takes more than one line
MADE = {"RunFailed": lambda cls: cls("learner: ZeroDivisionError: division by zero", {"error": "learner: ...", "env_steps": 5}),
        "SchedulerLost": lambda cls: cls("tcp://10.0.0.1:8786"),
        "ExplorerError": lambda cls: cls("explorer 1, env CartPole-v1: ValueError: bad", "Traceback ...", True),
        "EnvCheckError": lambda cls: cls("reset", "raised ValueError: no"),
        "AlgorithmCheckError": lambda cls: cls(["act: raised ValueError: a", "learn: must return a dict"])}
#: a Nanny preload (dask's config) whose nanny's worker process is killed as it starts, as the
#: kernel's OOM killer would kill it: every start of the cluster's workers fails, again and again
KILLED_AT_START = ("def dask_setup(nanny):\n"
                   "    nanny.preload = [*nanny.preload, 'import os, signal\\nos.kill(os.getpid(), signal.SIGKILL)\\n']\n")


def _errors() -> list[type]:
    """The public exception classes the modules define."""
    found = []
    for name in MODULES:
        module = importlib.import_module(name)
        found += [obj for key, obj in vars(module).items() if inspect.isclass(obj) and issubclass(obj, BaseException)
                  and obj.__module__ == name and not key.startswith("_")]
    return found


def test_every_error_is_a_tianji_error_and_keeps_its_builtin_base():
    classes = _errors()
    assert {c.__name__ for c in classes} >= set(BUILTIN) | {"TianjiError", "EnvCheckError", "ReplayMismatch"}
    for cls in classes:
        assert issubclass(cls, tianji_dask.TianjiError), cls
        if cls.__name__ in BUILTIN:
            assert issubclass(cls, BUILTIN[cls.__name__]), cls
    assert issubclass(tianji_dask.PipelineError, ValueError) and not issubclass(tianji_dask.PipelineError, RuntimeError)


def test_a_run_fault_is_a_run_failed_made_with_one_line():
    assert issubclass(tianji_dask.RunFault, tianji_dask.RunFailed)
    assert issubclass(errors.ClusterLost, tianji_dask.RunFault)
    fault = tianji_dask.RunFault("out: cannot write the results")
    assert str(fault) == "out: cannot write the results" and fault.results == {}
    with pytest.raises(tianji_dask.RunFailed):
        raise fault


def test_every_error_pickles_whole():
    for cls in _errors():
        err = MADE.get(cls.__name__, lambda c: c("what: one line"))(cls)
        err.note = "an attribute set after it was made"
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is cls and str(back) == str(err), cls
        assert vars(back) == vars(err), cls
    lost = pickle.loads(pickle.dumps(errors.SchedulerLost("tcp://10.0.0.1:8786")))
    assert lost.address == "tcp://10.0.0.1:8786" and "tcp://10.0.0.1:8786 was lost" in str(lost)


def test_the_family_is_exported_at_the_top_and_costs_nothing_to_import():
    for name in ("TianjiError", "PipelineError", "RunFailed", "RunFault"):
        assert name in tianji_dask.__all__ and getattr(tianji_dask, name) is getattr(errors, name)
    code = ("import sys, tianji_dask; tianji_dask.TianjiError, tianji_dask.RunFault, tianji_dask.PipelineError; "
            "print(sorted(m for m in ('numpy', 'torch', 'distributed', 'tianji_dask.config') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_a_cluster_that_cannot_start_is_a_run_fault_that_except_run_failed_catches(tmp_path):
    # the worker processes die as they start: the run's cluster cannot start, no fault of the pipeline
    with dask.config.set({"distributed.nanny.preload": [KILLED_AT_START]}), pytest.raises(tianji_dask.RunFailed) as failed:
        tianji_dask.train("cartpole_ppo", out=tmp_path / "run", overrides={"stop.max_env_steps": 2048})
    err = failed.value
    assert type(err) is tianji_dask.RunFault and isinstance(err, tianji_dask.TianjiError), type(err)
    assert str(err).startswith("cluster: worker processes died while the cluster started") and "\n" not in str(err)
    assert err.results == {}


def test_the_command_line_says_a_cluster_that_cannot_start_in_one_line_exit_1(tmp_path, capsys):
    from tianji_dask.cli import main

    with dask.config.set({"distributed.nanny.preload": [KILLED_AT_START]}):
        code = main(["train", "cartpole_ppo", "--quiet", "--set", "stop.max_env_steps=2048", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.startswith("tianji-dask: error: cluster: worker processes died while the cluster started") and err.count("\n") == 1, err
