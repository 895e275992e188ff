"""Hosts as Linux network namespaces: a simulated cluster of N hosts on one machine (needs root).

    python benchmarks/netns.py --hosts 4 [--learners 1] [--rate 1gbit] [--explorer-threads 8] -- \\
        python -m tianji_dask train cartpole_ppo --out runs/netns      # the scheduler's address is added

It builds N network namespaces, each with its own address on a bridge in a namespace of its
own (so no traffic reaches this machine's own interfaces), optionally caps every host's link with
``tc ... tbf``, starts the Dask scheduler on host 0 (with the tianji preload), a learner worker
on each of hosts 1 .. L (``--learners L``: one, or one per learner replica) and explorer workers
on the other hosts (host 1 as well when there are only two), and
runs the command on host 0 with ``--scheduler tcp://HOST0:8786`` appended. Chunks, weights and
the direct path then travel over real TCP between hosts. On exit, whatever happened (an error,
Ctrl-C, SIGTERM), every process it started is stopped and every namespace removed.
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

PORT = 8786


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class Hosts:
    """N namespaces ``{prefix}-h{i}`` at 10.{a}.{b}.{i + 2}/24 on a bridge in ``{prefix}-net``."""

    def __init__(self, n: int, rate: str | None = None, prefix: str | None = None):
        self.n, self.rate = n, rate
        self.prefix = prefix or f"tj{os.getpid() % 100_000}"
        octets = os.getpid() % 250 + 1
        self.subnet = f"10.{77 + octets // 250}.{octets}"
        self.net = f"{self.prefix}-net"
        self.names = [f"{self.prefix}-h{i}" for i in range(n)]
        self.procs: list[subprocess.Popen] = []
        self._made: list[str] = []

    def address(self, i: int) -> str:
        return f"{self.subnet}.{i + 2}"

    def up(self) -> "Hosts":
        _ip("netns", "add", self.net)
        self._made.append(self.net)
        _ip("-n", self.net, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.net, "link", "set", "br0", "up")
        for i, name in enumerate(self.names):
            _ip("netns", "add", name)
            self._made.append(name)
            _ip("-n", self.net, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", name)
            _ip("-n", self.net, "link", "set", f"v{i}", "master", "br0")
            _ip("-n", self.net, "link", "set", f"v{i}", "up")
            _ip("-n", name, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "link", "set", "lo", "up")
            if self.rate:  # every host's outgoing link capped (this kernel has tbf, not netem)
                subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
                                "rate", self.rate, "burst", "256kb", "latency", "50ms"], check=True, capture_output=True)
        return self

    def start(self, i: int, cmd: list[str], **kwargs) -> subprocess.Popen:
        """Run ``cmd`` on host ``i`` in a process group of its own (stopped at ``down``)."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.names[i], *cmd], start_new_session=True, **kwargs)
        self.procs.append(proc)
        return proc

    def down(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 10
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()
        for name in reversed(self._made):  # removing a namespace removes its ends of the veth pairs
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self._made.clear()


@contextmanager
def dask_on_hosts(n: int, rate: str | None = None, explorer_threads: int = 1, python: str = sys.executable,
                  learners: int = 1):
    """A Dask cluster over ``n`` namespace hosts (n >= 2), ``learners`` of them with a learner
    worker: yields (hosts, scheduler address)."""
    if n < 2 or (learners > 1 and n < learners + 2):
        raise ValueError(f"hosts: need at least 2 (the scheduler's and the learner's), and {learners + 2} for "
                         f"{learners} learners (one for explorers)")
    hosts = Hosts(n, rate)

    def stop(*_):
        hosts.down()
        raise SystemExit(130)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    atexit.register(hosts.down)
    try:
        hosts.up()
        scheduler = f"tcp://{hosts.address(0)}:{PORT}"
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        hosts.start(0, [python, "-m", "distributed.cli.dask_scheduler", "--host", hosts.address(0), "--port", str(PORT),
                        "--no-dashboard", "--preload", "tianji_dask.preload"], **quiet)
        worker = [python, "-m", "distributed.cli.dask_worker", scheduler, "--no-dashboard", "--no-nanny",
                  "--preload", "tianji_dask.launch.worker_preload"]
        for i in range(1, learners + 1):
            hosts.start(i, [*worker, "--host", hosts.address(i), "--nthreads", "1", "--resources", "LEARNER=1",
                            "--memory-limit", "0"], **quiet)
        for i in range(learners + 1, n) if n > learners + 1 else [1]:
            hosts.start(i, [*worker, "--host", hosts.address(i), "--nthreads", str(explorer_threads), "--resources",
                            f"EXPLORER={explorer_threads}"], **quiet)
        yield hosts, scheduler
    finally:
        hosts.down()
        atexit.unregister(hosts.down)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, cmd = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--learners", type=int, default=1, help="hosts with a learner worker (one per learner replica)")
    parser.add_argument("--rate", help="cap every host's link, e.g. 1gbit or 100mbit (tc tbf)")
    parser.add_argument("--explorer-threads", type=int, default=1, help="explorer tasks each explorer worker runs at once")
    args = parser.parse_args(own)
    if not cmd:
        print("netns: give the command to run on host 0 after --", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("netns: needs root (it creates network namespaces)", file=sys.stderr)
        return 2
    with dask_on_hosts(args.hosts, args.rate, args.explorer_threads, learners=args.learners) as (hosts, scheduler):
        return hosts.start(0, [*cmd, "--scheduler", scheduler]).wait()


if __name__ == "__main__":
    sys.exit(main())
