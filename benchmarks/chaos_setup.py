"""The clusters a chaos run trains on, the processes in them, and undoing all of it.

- ``embedded``: ``tianji-dask train PIPELINE --out DIR`` with the LocalCluster it starts itself.
  Its scheduler and nannies live in the driver's process; its worker processes fork from the
  driver's forkserver. They are found among the driver's descendants: the run's scheduler (the
  driver's listening port that answers Dask's ``identity`` as a Scheduler) names each worker's
  address, name and resources, and the descendant listening on that address's port is its process.
- ``external``: netns.py's hosts (Linux network namespaces on a bridge of their own). Host 0 runs
  the scheduler (``dask scheduler --preload tianji_dask.preload``) and the driver (``tianji-dask
  train ... --scheduler tcp://HOST0:8786``), host 1 the learner's ``dask worker ... --nthreads 1
  --resources LEARNER=1``, each further host one explorer's ``dask worker ... --nthreads 1
  --resources EXPLORER=1`` (docs/clusters.md). The harness started each, so it has their pids; a
  ``dask worker`` process is the nanny, and its worker process is the nanny's child that
  multiprocessing spawned.

Whatever happens, ``Undo`` ends every process (its whole process group, then any descendant left),
removes the namespaces and unmounts what was mounted, newest first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import netns

SCHEDULER_PORT = netns.PORT


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


# ---- processes as roles ---------------------------------------------------------------------------
async def _ask_identity(address: str, timeout: float) -> dict:
    from distributed.comm import connect

    async def ask():
        comm = await connect(address, timeout=timeout)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    return await asyncio.wait_for(ask(), timeout)


def _identity(address: str, timeout: float = 10) -> dict:
    return asyncio.run(_ask_identity(address, timeout))


def _scheduler_among(ports: list[int], timeout: float = 5) -> str | None:
    """The address of the Dask scheduler listening on one of ``ports`` (127.0.0.1), or None: every
    port asked at once (the driver's others, its dashboard's HTTP, answer nothing until the
    timeout), the first scheduler to answer taken."""
    async def scheduler(port: int) -> str | None:
        address = f"tcp://127.0.0.1:{port}"
        with contextlib.suppress(Exception):
            if (await _ask_identity(address, timeout)).get("type") == "Scheduler":
                return address
        return None

    async def first() -> str | None:
        for answer in asyncio.as_completed([scheduler(port) for port in ports]):
            if address := await answer:
                return address
        return None

    return asyncio.run(first())


def _listening(pid: int) -> list[int]:
    import psutil

    with contextlib.suppress(psutil.Error):
        return [c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN]
    return []


class Embedded:
    """``tianji-dask train`` with its own LocalCluster, the driver on this machine."""

    name = "embedded"

    def __init__(self, scratch: Path, undo: Undo, env: dict | None = None):
        self.scratch, self.undo, self.env = scratch, undo, env
        self.driver: Proc | None = None
        self.scheduler_address: str | None = None

    def start(self) -> None:
        pass

    def train(self, args: list[str]) -> Proc:
        self.driver = Proc(tianji("train", *args), self.undo, env=python_env(), cwd=self.scratch, name="driver")
        return self.driver

    def command(self, args: list[str], name: str) -> Proc:
        return Proc(tianji(*args), self.undo, env=python_env(), cwd=self.scratch, name=name)

    def _scheduler(self) -> str | None:
        if self.scheduler_address is None:
            self.scheduler_address = _scheduler_among(_listening(self.driver.pid))
        return self.scheduler_address

    def workers(self) -> list[dict]:
        """The run's workers now: ``{role, name, address, pid}`` (role ``learner`` or ``explorer``)."""
        address = self._scheduler()
        if address is None:
            return []
        ports = self._worker_ports()
        found = []
        for addr, info in _identity(address)["workers"].items():
            port = int(addr.rsplit(":", 1)[1])
            if port in ports:
                role = "learner" if info.get("resources", {}).get("LEARNER") else "explorer"
                found.append({"role": role, "name": str(info.get("name")), "address": addr, "pid": ports[port]})
        return sorted(found, key=lambda w: (w["role"], w["name"]))

    def _worker_ports(self) -> dict[int, int]:
        """Listening port -> pid, among the driver's descendants (its cluster's worker processes)."""
        import psutil

        self.driver.remember_descendants()
        ports = {}
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.driver.pid).children(recursive=True):
                for port in _listening(child.pid):
                    ports[port] = child.pid
        return ports

    def process(self, role: str, pick=None) -> dict | None:
        """One process of ``role`` (``driver``, ``learner``, ``explorer``): ``{role, name, pid}``;
        ``pick`` chooses among several (a function of the sorted list)."""
        if role == "driver":
            return {"role": "driver", "name": "driver", "pid": self.driver.pid}
        found = [w for w in self.workers() if w["role"] == role]
        if not found:
            return None
        return pick(found) if pick else found[0]

    def run_dir_host(self) -> None:
        return None

    def stop_cluster(self) -> None:
        pass


class External:
    """A scheduler and hand-started ``dask worker`` processes on netns.py's hosts; the driver on
    host 0. ``worker_env`` adds to one worker's environment (``{"learner" | "explorer-0": env}``)."""

    name = "external"

    def __init__(self, scratch: Path, undo: Undo, explorers: int = 2, worker_env: dict | None = None):
        self.scratch, self.undo, self.explorers = scratch, undo, explorers
        self.worker_env = worker_env or {}
        self.hosts = netns.Hosts(2 + explorers)
        self.nannies: dict[str, Proc] = {}
        self.scheduler: Proc | None = None
        self.driver: Proc | None = None
        self.logs = scratch / "logs"

    @property
    def address(self) -> str:
        return f"tcp://{self.hosts.address(0)}:{SCHEDULER_PORT}"

    def _in(self, host: int, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.hosts.names[host], *cmd]

    def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.undo.add("remove the namespaces", self.hosts.down)
        self.hosts.up()
        py = sys.executable
        self.scheduler = Proc(self._in(0, [py, "-m", "distributed.cli.dask_scheduler", "--host", self.hosts.address(0),
                                           "--port", str(SCHEDULER_PORT), "--no-dashboard",
                                           "--preload", "tianji_dask.preload"]),
                              self.undo, log=self.logs / "scheduler.log", env=python_env(), cwd=self.scratch, name="scheduler")
        roles = [("learner", 1, ["--resources", "LEARNER=1", "--memory-limit", "0"])]
        roles += [(f"explorer-{i}", 2 + i, ["--resources", "EXPLORER=1"]) for i in range(self.explorers)]
        for name, host, flags in roles:
            env = {**python_env(), **self.worker_env.get(name, {})}
            cmd = [py, "-m", "distributed.cli.dask_worker", self.address, "--host", self.hosts.address(host),
                   "--nthreads", "1", *flags, "--name", name, "--no-dashboard",
                   "--local-directory", str(self.scratch / f"dask-{name}")]
            self.nannies[name] = Proc(self._in(host, cmd), self.undo, log=self.logs / f"{name}.log", env=env,
                                     cwd=self.scratch, name=name)

    def host_of(self, name: str) -> int:
        return 1 if name == "learner" else 2 + int(name.rsplit("-", 1)[1])

    def train(self, args: list[str]) -> Proc:
        self.driver = self.command(["train", *args, "--scheduler", self.address], "driver")
        return self.driver

    def command(self, args: list[str], name: str) -> Proc:
        return Proc(self._in(0, tianji(*args)), self.undo, env=python_env(), cwd=self.scratch, name=name)

    def _worker_pid(self, nanny: Proc) -> int | None:
        import psutil

        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(nanny.pid).children():
                if "spawn_main" in " ".join(child.cmdline()):
                    return child.pid
        return None

    def process(self, role: str, pick=None) -> dict | None:
        """One process of ``role``: ``driver``, ``scheduler``, ``learner`` or ``explorer`` (the
        worker process), ``learner-nanny`` or ``explorer-nanny``; ``pick`` chooses among several."""
        if role in ("driver", "scheduler"):
            proc = self.driver if role == "driver" else self.scheduler
            return {"role": role, "name": role, "pid": proc.pid}
        kind, _, nanny = role.partition("-")
        found = []
        for name, proc in sorted(self.nannies.items()):
            if not name.startswith(kind) or proc.poll() is not None:
                continue
            pid = proc.pid if nanny else self._worker_pid(proc)
            if pid is not None:
                found.append({"role": role, "name": name, "pid": pid, "host": self.host_of(name)})
        if not found:
            return None
        return pick(found) if pick else found[0]

    def link(self, host: int, up: bool) -> None:
        """The host's link to the bridge up or down (down: its packets vanish both ways, as when a
        cable or a switch port fails; nothing tells either end)."""
        netns._ip("-n", self.hosts.net, "link", "set", f"v{host}", "up" if up else "down")

    def log_tails(self, lines: int = 15) -> dict:
        tails = {}
        for path in sorted(self.logs.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()
            tails[path.stem] = text[-lines:]
        return tails

    def stop_cluster(self) -> None:
        """End the scheduler and the workers (the run's results, if any, are written by now)."""
        for proc in [*self.nannies.values(), self.scheduler]:
            if proc is not None:
                proc.kill()
        self.hosts.down()


def make_setup(name: str, scratch: Path, undo: Undo, explorers: int, worker_env: dict | None = None):
    if name == "embedded":
        return Embedded(scratch, undo)
    if name == "slurm":
        from chaos_slurm import Slurm

        return Slurm(scratch, undo, explorers)
    return External(scratch, undo, explorers, worker_env)
