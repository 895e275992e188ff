"""The process an embedded cluster's worker processes fork from.

Spawned, every worker process imports distributed, torch and gymnasium on its own, all of them
at once, while the driver imports the same: on a small machine most of a run's start is those
imports. Workers forked from a forkserver that has imported them once (``worker_imports``)
start with everything loaded. The CLI starts the forkserver first thing, so it imports on
another core while the CLI process imports and checks the pipeline.

This module imports nothing heavy: the CLI calls ``start`` before it has imported anything else.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading

PRELOAD = ["tianji_dask.launch.worker_imports"]
MARK = "TIANJI_DASK_FORKSERVER"  # in the forkserver's environment only (see worker_imports)
#: ``TIANJI_FORK_WORKERS=0`` spawns a run's workers instead
SWITCH = "TIANJI_FORK_WORKERS"
#: what distributed's Nanny would put in a worker's environment and a run's own workers go
#: without (a variable the user sets in the environment still reaches them). MALLOC_TRIM_THRESHOLD_,
#: set to any value, stops glibc from adapting its mmap threshold: every large tensor torch
#: allocates is then mapped and unmapped afresh, and a MinAtar PPO update took 1.5x as long in a
#: worker as in a plain process (benchmarks/worker_environ.py).
LEFT_OUT = {"MALLOC_TRIM_THRESHOLD_"}
#: the warning multiprocessing's resource tracker prints when the process that started it dies
#: with semaphores of its cluster's processes still registered (a SIGKILLed driver): Python's
#: cleanup of them, not the run's news
RESOURCE_TRACKER_WARNING = "ignore:resource_tracker:UserWarning"


def _set_by_user(name: str) -> bool:
    """In this process's environment, and not as a Nanny left it: distributed's Nanny writes its
    variables into the environment of the process it runs in (a plain LocalCluster made in the
    same notebook, say), so a value equal to the Nanny's own does not count as the user's."""
    from tianji_dask import dask_internals

    value = os.environ.get(name)
    return value is not None and value != str(dask_internals.nanny_environ_config().get(name))


def worker_environ() -> dict[str, str]:
    """The variables a run's worker processes start with: the Nanny's, less ``LEFT_OUT``."""
    from tianji_dask import dask_internals

    return {k: v for k, v in dask_internals.worker_spawn_environ().items() if k not in LEFT_OUT or _set_by_user(k)}


def left_out_config() -> dict:
    """The dask config that keeps ``LEFT_OUT`` from spawned workers (None unsets a Nanny's variable)."""
    return {f"distributed.nanny.pre-spawn-environ.{k}": None for k in LEFT_OUT if not _set_by_user(k)}


def quiet_resource_tracker(verbose: bool) -> None:
    """Keep the resource tracker's leaked-semaphore warning off the terminal: the tracker, a
    process of its own started with the interpreter's ``-W`` options (``sys.warnoptions``),
    outlives a driver killed outright and writes to the same terminal. Call before the first
    process of a cluster starts (the tracker starts with it, or with this forkserver)."""
    if not verbose and RESOURCE_TRACKER_WARNING not in sys.warnoptions:
        sys.warnoptions.append(RESOURCE_TRACKER_WARNING)


def available() -> bool:
    return "forkserver" in multiprocessing.get_all_start_methods() and os.environ.get(SWITCH, "1") != "0"


def start() -> bool:
    """Start the forkserver with ``PRELOAD`` unless one runs already, and return at once: it
    imports in the background, and the first worker to fork waits for it. False with
    ``TIANJI_FORK_WORKERS=0`` and where there is no forkserver (Windows): workers are spawned.
    The resource tracker starts with it: ``quiet_resource_tracker`` first, where it should be quiet."""
    if not available():
        return False
    from multiprocessing import forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    # what a Nanny sets before it starts a worker (OMP_NUM_THREADS=1, ...): read at the server's start
    env = {**worker_environ(), MARK: "1"}
    env.update({k: None for k in LEFT_OUT if k not in env})  # nor left here by another Nanny
    with _environ(env), ignoring(signal.SIGINT), ignoring(signal.SIGTERM):
        forkserver.ensure_running()
    return True


@contextlib.contextmanager
def _environ(values: dict[str, str | None]):
    """``values`` in the environment of processes started inside (None: not there), not of this
    one (whose torch would read OMP_NUM_THREADS when imported)."""
    before = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def ignoring(signum: int):
    """Start processes with ``signum`` ignored from birth. SIGINT: a Ctrl-C while they import
    would kill them before they could ignore it themselves (worker_preload), and the cluster's
    start would end in tracebacks; a Ctrl-C while they start is lost, the next one stops the run.
    SIGTERM (the forkserver): a batch system signals every process of the job, and a server that
    died would read as dead workers to their nannies; it ends with this process."""
    if threading.current_thread() is not threading.main_thread():  # only there may handlers be set
        yield
        return
    previous = signal.signal(signum, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signum, previous)


@contextlib.contextmanager
def interrupts_held(method: str):
    """While worker processes start: a Ctrl-C (which a terminal sends to the workers too) would
    kill them half-started, and the start would end in tracebacks. Forked from the forkserver,
    they ignore it from birth, so this process holds it: one line says so at once, and the
    KeyboardInterrupt comes as the block ends. Spawned, a child takes this process's disposition
    only if it is to ignore: then Ctrl-C is ignored while they start."""
    if method != "forkserver" or threading.current_thread() is not threading.main_thread():
        with ignoring(signal.SIGINT):
            yield
        return
    held = []

    def hold(signum, frame):
        if not held:
            from tianji_dask.run.quiet import say

            say("Ctrl-C: the run stops as soon as its worker processes have started (a few seconds)")
        held.append(signum)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        raise KeyboardInterrupt
