"""The fault classes of benchmarks/chaos.py, what each run of one draws from its seed, and how
each is injected.

A class is ``TARGET-ACTION``:

- targets: ``scheduler`` (the ``dask scheduler`` process; external setup only: the embedded
  scheduler lives in the driver), ``nanny`` (a ``dask worker`` process, the learner's or an
  explorer's as the seed says; external only, for the same reason), ``learner`` and ``explorer``
  (a worker process: the one the scheduler lists with the LEARNER resource, or one of those with
  EXPLORER, as the seed says), ``driver`` (``tianji-dask train``);
- actions: ``kill`` (SIGKILL), ``term`` (SIGTERM), ``stop`` (SIGSTOP, then SIGCONT after a hold
  of 3 to 60 s drawn from the seed: a stalled process, a long GC pause), ``cancel`` (on the slurm
  setup: ``scancel`` of the worker's batch job, as a preemption or an admin would);

and four more: ``learner-partition`` / ``explorer-partition`` (the worker's host, a namespace of its
own, loses its link to the bridge for 3 to 60 s, then gets it back), ``disk-full`` (the run folder
is on a 64 MiB tmpfs; a filler file grows until the file system is full, stays 5 to 30 s, and is
removed), ``learner-clock`` / ``explorer-clock`` (that worker's host's wall clock is stepped by 30
to 300 s, forward or back, and stays stepped; see chaos_clock.c).

The moment: once the learner has written a checkpoint at or past a version drawn from the seed
(checkpoints name their version), so a seed replays the same moment of the run on any machine.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import signal
import struct
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
DISK_SIZE = "64m"


@dataclass(frozen=True)
class FaultClass:
    name: str
    setups: tuple[str, ...]  # where it can be injected; the first is the default
    about: str

    @property
    def target(self) -> str:
        return self.name.split("-")[0] if self.name != "disk-full" else "run folder"

    @property
    def action(self) -> str:
        return self.name.split("-")[1]


_WHO = {
    "scheduler": ("the scheduler process", ("external",)),
    "nanny": ("the nanny (`dask worker` process) of the learner or an explorer", ("external",)),
    "learner": ("the learner's worker process", ("embedded", "external", "slurm")),
    "explorer": ("an explorer's worker process", ("embedded", "external", "slurm")),
    "driver": ("the driver (`tianji-dask train`)", ("embedded", "external", "slurm")),
}
_HOW = {"kill": "SIGKILL to {}", "term": "SIGTERM to {}", "stop": "SIGSTOP to {}, SIGCONT 3-60 s later"}


def _classes() -> dict[str, FaultClass]:
    found = {}
    for who, (what, setups) in _WHO.items():
        for action, how in _HOW.items():
            found[f"{who}-{action}"] = FaultClass(f"{who}-{action}", setups, how.format(what))
    for who in ("learner", "explorer"):
        found[f"{who}-cancel"] = FaultClass(f"{who}-cancel", ("slurm",),
                                            f"`scancel` of {_WHO[who][0].replace('worker process', 'batch job')} "
                                            "(SIGTERM to its processes, SIGKILL after Slurm's KillWait)")
    found["learner-partition"] = FaultClass("learner-partition", ("external",),
                                            "the learner's host cut off the network for 3-60 s (its link down, then up)")
    found["explorer-partition"] = FaultClass("explorer-partition", ("external",),
                                             "an explorer's host cut off the network for 3-60 s (its link down, then up)")
    found["disk-full"] = FaultClass("disk-full", ("embedded", "external"),
                                    f"the run folder's file system ({DISK_SIZE} tmpfs) filled for 5-30 s, then freed")
    found["learner-clock"] = FaultClass("learner-clock", ("external",),
                                        "the learner's host's wall clock stepped 30-300 s forward or back")
    found["explorer-clock"] = FaultClass("explorer-clock", ("external",),
                                         "an explorer's host's wall clock stepped 30-300 s forward or back")
    return found


CLASSES = _classes()


@dataclass
class Plan:
    """What a seed decides about one run of a class."""

    fault: str
    setup: str
    seed: int
    at_version: int  # inject once a checkpoint at or past this version exists
    hold_s: float | None = None  # stop, partition, disk-full: how long before it is undone
    step_s: float | None = None  # clock: the step, signed
    pick: int = 0  # which one of several candidate processes (index, modulo their count)
    nanny_of: str | None = None  # nanny: "learner" or "explorer"

    def as_dict(self) -> dict:
        return asdict(self)


def plan(fault: str, setup: str, seed: int, at_versions: tuple[int, int]) -> Plan:
    rng = random.Random(f"{fault}/{seed}")  # a str seeds the same on every Python
    p = Plan(fault, setup, seed, at_version=rng.randint(*at_versions), pick=rng.randrange(1 << 16))
    action = CLASSES[fault].action
    if action in ("stop", "partition"):
        p.hold_s = round(rng.uniform(3, 60), 1)
    elif fault == "disk-full":
        p.hold_s = round(rng.uniform(5, 30), 1)
    elif action == "clock":
        p.step_s = round(rng.choice((-1, 1)) * rng.uniform(30, 300), 1)
    if CLASSES[fault].target == "nanny":
        p.nanny_of = rng.choice(("learner", "explorer"))
    return p


# ---- the clock shim ------------------------------------------------------------------------------
def build_clock(scratch: Path) -> dict:
    """Compile chaos_clock.c into ``scratch``; the offset file starts at 0. Returns the
    environment a process needs to have its wall clock stepped, and the offset file."""
    lib, offset = scratch / "chaos_clock.so", scratch / "clock.offset"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(lib), str(ROOT / "chaos_clock.c"), "-ldl"],
                   check=True, capture_output=True)
    offset.write_bytes(struct.pack("<q", 0))
    return {"env": {"LD_PRELOAD": str(lib), "CHAOS_CLOCK_FILE": str(offset)}, "offset": offset}


def clock_env(p: Plan, clock: dict | None) -> dict:
    """The ``worker_env`` of the external setup: the shim in the stepped worker's processes."""
    if clock is None:
        return {}
    return {"learner" if p.fault == "learner-clock" else "explorer-0": clock["env"]}


# ---- injection -----------------------------------------------------------------------------------
def _signal(pid: int, sig) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _fill(path: Path) -> int:
    """Write ``path`` until its file system is full; returns the bytes written."""
    written, block = 0, 1 << 20
    with open(path, "wb", buffering=0) as fh:
        while block >= 512:
            try:
                written += fh.write(b"\0" * block)
            except OSError as err:
                if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                block //= 2
    return written


def inject(p: Plan, setup, run_dir: Path, clock: dict | None, undo) -> dict:
    """Inject the planned fault now; returns what was done: ``t_fault`` (when), ``t_undone`` (when
    a stop, partition or full disk was undone), ``target`` (role, name, pid), ``did`` (in words);
    ``error`` when there was nothing to inject it into."""
    cls = CLASSES[p.fault]
    rec = {"t_fault": time.time(), "t_undone": None, "target": None, "did": None, "error": None}

    def pick(found):
        return found[p.pick % len(found)]

    if p.fault == "disk-full":
        filler = run_dir.parent / "filler"
        undo.add("remove the filler", lambda: filler.unlink(missing_ok=True))
        rec["target"] = {"role": "run folder", "name": str(run_dir.parent)}
        written = _fill(filler)
        rec["did"] = f"filled the run folder's file system ({written / 2**20:.1f} MiB more)"
        time.sleep(p.hold_s)
        filler.unlink(missing_ok=True)
        rec["t_undone"] = time.time()
        return rec
    if cls.action == "clock":
        role = "learner" if p.fault == "learner-clock" else "explorer"
        rec["target"] = {"role": role, "name": "learner" if role == "learner" else "explorer-0"}
        clock["offset"].write_bytes(struct.pack("<q", int(p.step_s * 1e9)))
        rec["did"] = f"stepped the wall clock of {rec['target']['name']}'s host by {p.step_s:+.1f} s"
        return rec
    role = cls.target if cls.target != "nanny" else f"{p.nanny_of}-nanny"
    if cls.action == "partition":
        proc = setup.process(role, pick)
        if proc is None:
            rec["error"] = f"no {role} worker to cut off"
            return rec
        rec["target"] = proc
        undo.add("link up", lambda: setup.link(proc["host"], True))
        setup.link(proc["host"], False)
        rec["did"] = f"cut {proc['name']}'s host off the network for {p.hold_s:.1f} s"
        time.sleep(p.hold_s)
        setup.link(proc["host"], True)
        rec["t_undone"] = time.time()
        return rec
    proc = setup.process(role, pick)
    if proc is None:
        rec["error"] = f"no {role} process to signal"
        return rec
    rec["target"] = proc
    if cls.action == "cancel":
        if not proc.get("job"):
            rec["error"] = f"{proc['name']} (pid {proc['pid']}) runs in no Slurm job"
            return rec
        rec["t_fault"] = time.time()
        setup.cancel(proc["job"])
        rec["did"] = f"scancel {proc['job']}, the job of {proc['name']} (pid {proc['pid']})"
        return rec
    if role == "driver":
        setup.driver.remember_descendants()  # its cluster's processes are ended at the end even if orphaned
    rec["t_fault"] = time.time()
    if cls.action in ("kill", "term"):
        sig = signal.SIGKILL if cls.action == "kill" else signal.SIGTERM
        _signal(proc["pid"], sig)
        rec["did"] = f"{sig.name} to {proc['name']} (pid {proc['pid']})"
        return rec
    undo.add("SIGCONT", lambda: _signal(proc["pid"], signal.SIGCONT))
    _signal(proc["pid"], signal.SIGSTOP)
    time.sleep(p.hold_s)
    _signal(proc["pid"], signal.SIGCONT)
    rec["t_undone"] = time.time()
    rec["did"] = f"SIGSTOP to {proc['name']} (pid {proc['pid']}), SIGCONT {p.hold_s:.1f} s later"
    return rec
