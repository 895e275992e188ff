import shutil
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _cluster_client():
    """A real LocalCluster with one LEARNER and two EXPLORER worker processes, and its client."""
    from tianji_dask.launch.cluster import local_client

    return local_client(explorer_workers=2)


@pytest.fixture(scope="session")
def tianji_client():
    """The cluster most tests share."""
    with _cluster_client() as client:
        yield client


@pytest.fixture
def own_client():
    """A cluster of its own, for tests that kill worker processes (the shared one stays whole)."""
    with _cluster_client() as client:
        yield client

def settle(client, timeout: float = 120) -> None:
    """Wait until the shared cluster has its learner and both explorers back and answering (a test
    that kills worker processes leaves their nannies restarting them)."""
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        workers = client.scheduler_info(n_workers=-1)["workers"].values()
        roles = sorted(next(iter(w["resources"]), "") for w in workers)
        if roles == ["EXPLORER", "EXPLORER", "LEARNER"]:
            client.run(lambda: None)  # every worker answers
            return
        time.sleep(0.2)
    seen = {a: (w["name"], w["resources"]) for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}
    raise TimeoutError(f"the test cluster did not settle in {timeout:.0f}s: {seen}")


@pytest.fixture(scope="module")
def one_torch_thread():
    """As in the roles that host the algorithms: tiny ops run fastest on one thread."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---- processes started before the tests that read them ----------------------------------------
# A test that is about a real process (the program's exit status, its output) waits seconds for it
# to import torch and the rest. Once collection ends, a thread starts such processes one after the
# other, each once the one before has finished (or is ready), in the order the tests read them:
# they use the core the tests leave idle while the tests before them run. A fixture registered
# with ``starts_early`` gets its process with ``started``.

class EarlyProcess:
    """A process started before the test that reads it, with a temporary folder of its own
    (``dir``, removed at the end of the session); ``held`` is kept open until it ends. A
    process that goes on (a scheduler) is ``ready`` once it can be used."""

    def __init__(self, argv_in, *, log: bool = False, held=(), ready=None, **info):
        import subprocess
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix="tianji-early-"))
        self.held = list(held)
        self.ready = ready
        self.__dict__.update(info)
        self.log = self.dir / "process.log" if log else None
        out = open(self.log, "w") if log else subprocess.PIPE
        self.proc = subprocess.Popen(argv_in(self.dir), stdout=out, stderr=subprocess.STDOUT if log else subprocess.PIPE,
                                     text=True, cwd=ROOT)
        self.result = None

    def settled(self) -> bool:
        return self.proc.poll() is not None or (self.ready is not None and self.ready(self))

    def wait(self, timeout: float = 600):
        """The finished process (returncode, stdout, stderr); the time out only guards a hang."""
        import subprocess

        if self.result is None:
            stdout, stderr = self.proc.communicate(timeout=timeout)
            self.result = subprocess.CompletedProcess(self.proc.args, self.proc.returncode, stdout, stderr)
            self._release()
        return self.result

    def _release(self) -> None:
        for thing in self.held:
            thing.close()
        self.held = []

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except Exception:  # noqa: BLE001 - it will not go: it goes now
                self.proc.kill()
                self.proc.wait()
        self._release()
        shutil.rmtree(self.dir, ignore_errors=True)


_EARLY: dict = {}  # fixture name: the function that starts its EarlyProcess
_STARTED: dict = {}
_LOCK = threading.Lock()
_DONE = threading.Event()  # the session is over: the starting thread starts no more


def starts_early(name: str):
    """Register the function that starts the process the fixture ``name`` reads."""
    def register(start):
        _EARLY[name] = start
        return start
    return register


def started(name: str) -> EarlyProcess:
    """The process registered for the fixture ``name``: started already, or now."""
    with _LOCK:
        if name not in _STARTED:
            if _DONE.is_set():
                raise RuntimeError(f"{name}: the test session is over")
            _STARTED[name] = _EARLY[name]()
        return _STARTED[name]


def _start_in_turn(names: list[str]) -> None:
    for name in names:
        try:
            process = started(name)
        except RuntimeError:  # the session ended first
            return
        deadline = time.monotonic() + 60
        while not process.settled() and time.monotonic() < deadline and not _DONE.wait(0.1):
            pass


#: started as collection starts, in a session that collects whole folders (the fast tier, the full
#: suite): collection imports on one core for seconds, and this process and the forkserver the
#: session's clusters fork from import on the other. A narrower session starts them as it needs them.
AT_COLLECTION = ("cli_training_run",)


def _collects_whole_folders(config) -> bool:
    return not config.option.keyword and all(Path(str(arg).split("::")[0]).is_dir() for arg in config.args)


def pytest_collection(session):
    if _collects_whole_folders(session.config):
        from tianji_dask.launch import forkserver

        forkserver.start()  # returns at once: it imports torch and gymnasium in the background
        for name in AT_COLLECTION:
            started(name)


def pytest_collection_finish(session):
    order = []  # the registered fixtures the selected tests use, in the order the tests use them
    for item in session.items:
        order += [name for name in getattr(item, "fixturenames", ()) if name in _EARLY and name not in order]
    with _LOCK:  # started as collection started, for tests that -m then left out
        for name in [name for name in _STARTED if name not in order]:
            _STARTED.pop(name).close()
    if order:
        threading.Thread(target=_start_in_turn, args=(order,), name="tianji-tests-early", daemon=True).start()


def pytest_sessionfinish(session):
    _DONE.set()
    with _LOCK:
        for process in _STARTED.values():
            process.close()
        _STARTED.clear()


@starts_early("cli_training_run")
def _cli_training_run() -> EarlyProcess:
    import socket

    taken = socket.socket()  # a dashboard port that is taken while the run starts its cluster
    taken.bind(("", 0))
    taken.listen()
    port = taken.getsockname()[1]
    return EarlyProcess(lambda d: [sys.executable, "-m", "tianji_dask", "train", "cartpole_ppo", "--explorers", "3",
                                   "--set", "explorers=1", "--set", "stop.max_env_steps=6144",
                                   "--set", f"cluster.dashboard_address=:{port}", "--verbose", "--out", str(d / "run")],
                        held=[taken], port=port)


@pytest.fixture(scope="session")
def cli_training_run():
    """One ``tianji-dask train`` as a user starts it, output into pipes, which two modules read:
    test_cli how its flags reached the run (``--explorers 3`` then ``--set explorers=1``: the
    later wins; a dashboard port that is taken), test_startup each step of its start (``--verbose``):
    ``train cartpole_ppo --explorers 3 --set explorers=1 --set stop.max_env_steps=6144 --set
    cluster.dashboard_address=:PORT --verbose --out OUT``: it stops on env steps, three chunks,
    so a slow start on a busy machine cannot end it before its first chunk. Gives the finished process (its
    returncode, stdout and stderr), OUT and PORT."""
    early = started("cli_training_run")
    return SimpleNamespace(proc=early.wait(), out=early.dir / "run", port=early.port)
