"""The ``slurm`` setup of a chaos run: ``tianji-dask train ... --set cluster.kind=slurm`` on a
running Slurm (``.ci/slurm-up`` starts a one-node one), as a user launches on HPC: the scheduler
lives in the driver, the learner is a batch job of its own (``tianji-learner``) and each explorer
worker one of the adaptive pool's jobs (``tianji-explorer``), started by dask-jobqueue.

A job's processes are not the driver's descendants: a worker process is the one listening on the
port the run's scheduler gives as its address, and its job is the ``SLURM_JOB_ID`` in its
environment. The harness takes the Slurm as its own while a run lasts: the jobs it cancels at the
end are every ``tianji-learner`` and ``tianji-explorer`` job in the queue.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path

from chaos_procs import Proc, Undo, python_env, tianji
from chaos_setup import Embedded

JOB_NAMES = ("tianji-learner", "tianji-explorer")
#: seconds the run's jobs may take to leave the queue once the driver has ended (jobqueue cancels
#: them as it closes; after a driver killed outright, the workers end once they give up on it)
JOBS_GONE_S = 90


def slurm_answers() -> bool:
    """Does a Slurm controller answer here?"""
    if shutil.which("sinfo") is None or shutil.which("scancel") is None:
        return False
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10, check=False).returncode == 0
    return False


def run_jobs() -> list[dict]:
    """The queue's ``tianji-*`` jobs: ``{id, name, state}``."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True, timeout=30,
                         check=False).stdout
    jobs = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in JOB_NAMES:
            jobs.append({"id": parts[0], "name": parts[1], "state": parts[2]})
    return jobs


def _all_listening() -> dict[int, int]:
    """Every listening TCP port on this machine and the pid holding it."""
    import psutil

    return {c.laddr.port: c.pid for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.pid is not None}


def job_of(pid: int) -> str | None:
    """The Slurm job a process runs in (its ``SLURM_JOB_ID``), None for none."""
    with contextlib.suppress(OSError):
        for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if item.startswith(b"SLURM_JOB_ID="):
                return item.split(b"=", 1)[1].decode()
    return None


class Slurm(Embedded):
    """``tianji-dask train`` with ``cluster.kind: slurm``: one learner job, ``explorers`` explorer
    jobs (the pool held at that size), the driver on this machine."""

    name = "slurm"

    def __init__(self, scratch: Path, undo: Undo, explorers: int = 2):
        super().__init__(scratch, undo)
        self.explorers = explorers

    def start(self) -> None:
        self.undo.add("cancel the run's jobs", self.stop_cluster)

    def train(self, args: list[str]) -> Proc:
        jobqueue = (f"{{minimum_jobs: {self.explorers}, maximum_jobs: {self.explorers}, memory: 2GiB, "
                    "walltime: '00:20:00', start_timeout: 180, learner: {memory: 2GiB}}")
        cmd = tianji("train", *args, "--set", "cluster.kind=slurm", "--set", f"cluster.jobqueue={jobqueue}")
        self.driver = Proc(cmd, self.undo, env=python_env(), cwd=self.scratch, name="driver")
        return self.driver

    def _worker_ports(self) -> dict[int, int]:
        """Every listening port on this machine and its pid: a job's processes are not the driver's."""
        return _all_listening()

    def workers(self) -> list[dict]:
        """The run's workers now, each with its Slurm job: ``{role, name, address, pid, job}``."""
        return [{**w, "job": job_of(w["pid"])} for w in super().workers()]

    def cancel(self, job: str) -> None:
        subprocess.run(["scancel", job], capture_output=True, timeout=30, check=True)

    def jobs_left(self, wait_s: float = JOBS_GONE_S) -> list[str]:
        """The run's jobs still in the queue after up to ``wait_s`` seconds: ``ID (NAME, STATE)``."""
        end = time.time() + wait_s
        while (jobs := run_jobs()) and time.time() < end:
            time.sleep(1)
        return [f"{j['id']} ({j['name']}, {j['state']})" for j in jobs]

    def stop_cluster(self) -> None:
        """Cancel whatever of the run's jobs is still queued or running."""
        ids = [j["id"] for j in run_jobs()]
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True, timeout=30, check=False)
