"""The processes a chaos run starts, and undoing all of it: ``Undo`` (steps run newest first,
whatever happens), ``Proc`` (a process in a session of its own, its output kept line by line and
time-stamped; killed with its whole process group and every descendant it had), the environment and
command every process of a run gets, and the tmpfs the full-disk class mounts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


class Undo:
    """Steps that undo what a run made, run newest first on ``close`` (each at most once, a
    failing one not stopping the others)."""

    def __init__(self):
        self.steps: list[tuple[str, object]] = []

    def add(self, what: str, fn) -> None:
        self.steps.append((what, fn))

    def close(self) -> list[str]:
        failed = []
        while self.steps:
            what, fn = self.steps.pop()
            try:
                fn()
            except Exception as err:  # noqa: BLE001 - the rest must still be undone
                failed.append(f"{what}: {type(err).__name__}: {err}")
        return failed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Proc:
    """A process in a session of its own; its output (stderr into stdout) kept line by line, each
    line stamped with the time it was read; or sent to ``log``."""

    def __init__(self, cmd: list[str], undo: Undo, *, log: Path | None = None, env: dict | None = None,
                 cwd: Path | None = None, name: str = ""):
        self.cmd, self.name = cmd, name or Path(cmd[0]).name
        self.lines: list[tuple[float, str]] = []
        self.t_start = time.time()
        self.t_end: float | None = None
        out = open(log, "ab") if log is not None else subprocess.PIPE  # noqa: SIM115 - closed by the reader or below
        self.popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True, env=env, cwd=cwd)
        self.descendants: dict[int, float] = {}
        threading.Thread(target=self._stamp_end, daemon=True).start()
        undo.add(f"stop {self.name} ({self.pid})", self.kill)
        if log is not None:
            out.close()
            self._reader = None
        else:
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _stamp_end(self) -> None:
        self.popen.wait()
        self.t_end = time.time()

    def _read(self) -> None:
        for raw in self.popen.stdout:
            self.lines.append((time.time(), raw.decode("utf-8", "replace").rstrip("\n")))

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float) -> int | None:
        """The exit status, or None when it has not ended within ``timeout`` seconds."""
        try:
            self.popen.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return None
        if self._reader is not None:
            self._reader.join(timeout=10)
        return self.poll()

    def remember_descendants(self) -> None:
        """Note the descendants now, each with its start time (an orphan of a killed parent is
        still ended by ``kill``; a pid the system gave to another process since is left alone)."""
        import psutil

        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    self.descendants[child.pid] = child.create_time()

    def _group(self) -> list:
        """The processes still in its process group (the group's id stays taken while one is)."""
        import psutil

        found = []
        for proc in psutil.process_iter(["create_time"]):
            with contextlib.suppress(OSError, psutil.Error):
                if os.getpgid(proc.pid) == self.pid and proc.pid != self.pid and proc.info["create_time"] >= self.t_start - 1:
                    found.append(proc)
        return found

    def kill(self) -> None:
        """SIGKILL to its process group and to every descendant noted or still there."""
        import psutil

        if self.popen.returncode is None:  # not reaped: its pid (the group's id) cannot have been reused
            self.remember_descendants()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        for proc in self._group():
            with contextlib.suppress(psutil.Error):
                proc.kill()
        for pid, started in self.descendants.items():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if abs(proc.create_time() - started) < 0.01:
                    proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        if self._reader is not None:
            self._reader.join(timeout=5)
        self.poll()

    def left_behind(self) -> list[int]:
        """Descendants noted (or group members) still running after it ended."""
        import psutil

        alive = {p.pid for p in self._group()}
        for pid, started in self.descendants.items():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if abs(proc.create_time() - started) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.add(pid)
        return sorted(alive)

    def text(self, since: float = 0.0) -> list[str]:
        return [line for t, line in self.lines if t >= since]


def package_root() -> str | None:
    """The folder holding the tianji_dask this Python imports (a checkout, or where an editable
    install points); every process of a run imports that one, whatever its working folder."""
    import importlib.util

    spec = importlib.util.find_spec("tianji_dask")
    return None if spec is None or spec.origin is None else str(Path(spec.origin).resolve().parent.parent)


def python_env() -> dict:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    root = package_root()
    if root:
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def tianji(*args: str) -> list[str]:
    return [sys.executable, "-m", "tianji_dask", *args]


def tmpfs(path: Path, size: str, undo: Undo) -> None:
    """A tmpfs of ``size`` at ``path`` (unmounted by ``undo``)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True, capture_output=True)
    undo.add(f"unmount {path}", lambda: subprocess.run(["umount", "-l", str(path)], check=True, capture_output=True))
