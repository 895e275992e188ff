"""Faults at the edges, as a user meets them on the command line: bad addresses and folders, a
scheduler that is not there or does not answer, a disk that fills. Each is one line naming what
went wrong and what is allowed, a non-zero exit (2 for what the user gave), no traceback."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading

import pytest
from conftest import EarlyProcess, started, starts_early


def _cli(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tianji_dask", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def _one_error_line(proc, starts: str) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("tianji-dask: error:")]
    assert len(errors) == 1 and errors[0].startswith(starts), proc.stderr
    return errors[0]


@pytest.mark.parametrize("args,starts", [
    (["--scheduler", "nonsense"], "tianji-dask: error: cluster.address: not a scheduler address"),
    (["--scheduler", "udp://10.0.0.1:8786"], "tianji-dask: error: cluster.address: not a scheduler address"),
    (["--scheduler", "tcp://10.0.0.1:0"], "tianji-dask: error: cluster.address: not a scheduler address"),
    (["--set", "cluster.dashboard_address=:70000"], "tianji-dask: error: cluster.dashboard_address: not a listening address"),
    (["--set", "cluster.dashboard_address=host:port"], "tianji-dask: error: cluster.dashboard_address: not a listening address"),
    (["--out", "/proc/no-such-place/run"], "tianji-dask: error: out: cannot write"),
])
def test_a_bad_address_or_folder_is_one_line_and_exit_2(tmp_path, capsys, args, starts):
    from tianji_dask.cli import main

    code = main(["train", "cartpole_ppo", "--quiet", *args])  # in this process: the exit code main returns
    err = capsys.readouterr().err
    assert code == 2, err
    line = _one_error_line(subprocess.CompletedProcess([], code, "", err), starts)
    assert "allowed" in line
    assert not list(tmp_path.iterdir())


@contextlib.contextmanager
def _silent_listener():
    """A port that accepts connections and never says a word."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    held, done = [], threading.Event()

    def accept():
        while not done.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    finally:
        done.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _names_the_unreachable_address(proc, address: str, says: str, out) -> None:
    assert proc.returncode == 2, proc.stderr
    line = _one_error_line(proc, "tianji-dask: error: cluster.address:")
    assert address in line and says in line
    assert not out.exists()  # a start that failed leaves no folder behind


@starts_early("nothing_listens_process")
def _nothing_listens_process():
    # the real program, started as soon as the tests are known (conftest)
    address = f"tcp://127.0.0.1:{_free_port()}"
    return EarlyProcess(lambda d: [sys.executable, "-m", "tianji_dask", "train", "cartpole_ppo", "--quiet",
                                   "--out", str(d / "run"), "--scheduler", address], address=address)


@pytest.fixture
def nothing_listens_process():
    return started("nothing_listens_process")


def test_a_scheduler_address_where_nothing_listens_is_one_line_and_exit_2(nothing_listens_process):
    # the real program: its exit status, and nothing else on its stderr (no traceback, no log line)
    early = nothing_listens_process
    proc = early.wait(timeout=90)  # the CLI's own bound is 10 s; this only keeps a broken build from hanging
    _names_the_unreachable_address(proc, early.address, "nothing listens", early.dir / "run")


@pytest.mark.parametrize("kind", ["does not resolve", pytest.param("never answers", marks=pytest.mark.slow)])
def test_an_unreachable_scheduler_is_one_line_naming_the_address(tmp_path, capsys, kind):
    from tianji_dask.cli import main

    out = tmp_path / "run"
    args = ["train", "cartpole_ppo", "--quiet", "--out", str(out)]
    with contextlib.ExitStack() as stack:
        if kind == "does not resolve":  # in this process: the exit status main returns, its one line
            address = "tcp://no-such-host.invalid:8786"
            code = main([*args, "--scheduler", address])
            proc = subprocess.CompletedProcess([], code, *capsys.readouterr())
        else:  # the real program, while a listener holds the connection and says nothing
            address = stack.enter_context(_silent_listener())
            # the CLI's own bound is 10 s; the timeout here only keeps a broken build from hanging the suite
            proc = _cli(*args, "--scheduler", address, timeout=90)
    _names_the_unreachable_address(proc, address, {"does not resolve": "does not resolve",
                                                   "never answers": "no Dask scheduler answered"}[kind], out)


def _tmpfs(path, size: str):
    path.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a full disk is simulated with a small tmpfs, which needs root")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=False).returncode:
        pytest.skip("cannot mount a tmpfs here")


@pytest.mark.slow
@pytest.mark.parametrize("size,starts", [
    # room for the pipeline and the results, none for a checkpoint: the run says so in its results
    ("120k", "tianji-dask: the run failed: checkpoint: cannot write to"),
    # room for the pipeline only: the results cannot be written, and the line says where they were to go
    ("24k", "tianji-dask: error: out: cannot write the results to"),
])
def test_a_disk_that_fills_during_a_run_is_one_line_and_leaves_no_partial_file(tmp_path, size, starts):
    disk = tmp_path / "disk"
    _tmpfs(disk, size)
    try:
        proc = _cli("train", "cartpole_dqn", "--quiet", "--out", str(disk / "run"), "--set", "stop.max_seconds=10")
        assert proc.returncode == 1, proc.stderr
        assert "Traceback" not in proc.stderr and starts in proc.stderr, proc.stderr
        left = sorted(p.name for p in (disk / "run").rglob("*") if p.is_file())
        assert not [name for name in left if name.startswith(".")], left  # no temporary file is left taking room
        assert "pipeline.yaml" in left
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def _kill_a_worker_when(proc, out, phase: str, rng) -> bool:
    """Kill one of the run's worker processes (chosen by ``rng``) while the cluster starts, while
    it trains, or as it shuts down (once its results are written); False if none was there."""
    import time

    import psutil

    def workers():
        try:  # they fork from a process of the CLI's own, not from the CLI
            return [p for p in psutil.Process(proc.pid).children(recursive=True) if p.ppid() != proc.pid]
        except psutil.Error:
            return []

    deadline = time.time() + 120
    if phase == "start":
        while not workers() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.4))
    elif phase == "train":
        while not (out / "checkpoints").is_dir() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 1.5))
    else:
        while not (out / "results.json").exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.002)
    found = workers()
    if not found:
        return False
    with contextlib.suppress(psutil.Error):
        rng.choice(found).kill()
    return True


@pytest.mark.slow
def test_a_worker_killed_at_any_moment_leaves_a_finished_run_or_one_line():
    # a seeded schedule of faults: a learner or explorer worker process killed while the cluster
    # starts, while the run trains, or as it shuts down; each run completes (results and a
    # checkpoint kept) or stops with one line and a non-zero exit, and never prints a traceback
    import random
    import tempfile
    from pathlib import Path

    rng = random.Random(20261202)
    killed = 0
    for trial in range(6):
        phase = ("start", "train", "end")[trial % 3]
        out = Path(tempfile.mkdtemp(prefix="tianji-fault-")) / "run"
        proc = subprocess.Popen(
            [sys.executable, "-m", "tianji_dask", "train", "cartpole_ppo", "--quiet", "--out", str(out),
             "--set", "stop.max_seconds=20", "--set", "checkpoint.every_versions=20",
             "--set", "cluster.dashboard_address=null"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            killed += _kill_a_worker_when(proc, out, phase, rng)
            stdout, stderr = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
        said = f"trial {trial} ({phase}): exit {proc.returncode}\n{stdout}\n{stderr}"
        assert "Traceback" not in stderr and "KeyError" not in stderr and " - ERROR - " not in stderr, said
        if proc.returncode == 0:
            assert (out / "results.json").exists() and list((out / "checkpoints").glob("ckpt-*.pt")), said
        else:
            assert proc.returncode == 1 and len([x for x in stderr.splitlines() if x.startswith("tianji-dask: error:")]) == 1, said
        shutil.rmtree(out.parent, ignore_errors=True)
    assert killed >= 5  # the schedule reached a worker almost every time
