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

Whatever happens, ``Undo`` (chaos_procs.py) ends every process (its whole process group, then any
descendant left), removes the namespaces and unmounts what was mounted, newest first. The ``slurm``
setup is chaos_slurm.py's; ``chaos_run.make_setup`` picks one by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

import netns
from chaos_procs import Proc, Undo, python_env, tianji

SCHEDULER_PORT = netns.PORT


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
