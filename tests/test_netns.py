"""Training across hosts: Linux network namespaces joined by a bridge stand for machines, and the
scheduler, the learner and the explorers each run on one of them (needs root and iproute2; CI
requires it with TIANJI_REQUIRE_NETNS=1)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tianji_dask.config import resolve_pipeline_path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("netns", ROOT / "benchmarks" / "netns.py")
netns = importlib.util.module_from_spec(spec)
spec.loader.exec_module(netns)


def _can_make_namespaces() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = subprocess.run(["ip", "netns", "add", f"tjprobe{os.getpid()}"], capture_output=True)
    subprocess.run(["ip", "netns", "del", f"tjprobe{os.getpid()}"], capture_output=True)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _can_make_namespaces() and not os.environ.get("TIANJI_REQUIRE_NETNS"),
                                reason="needs root and iproute2's network namespaces")


@pytest.mark.slow
def test_cartpole_trains_across_four_namespace_hosts(tmp_path):
    # the direct path on for every chunk: their bytes go host to host over TCP, not a Unix socket
    data = yaml.safe_load(resolve_pipeline_path("cartpole_ppo").read_text())
    data["learner"] = {"direct_chunks_min_mib": 0}
    data["stop"]["max_seconds"] = 120
    pipeline = tmp_path / "cartpole_ppo.yaml"
    pipeline.write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    with netns.dask_on_hosts(4) as (hosts, scheduler):
        assert len(set(hosts.names)) == 4 and all(hosts.address(i).startswith(hosts.subnet) for i in range(4))
        proc = hosts.start(0, [sys.executable, "-m", "tianji_dask", "train", str(pipeline), "--out", str(out), "--quiet",
                               "--scheduler", scheduler], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        text, _ = proc.communicate(timeout=300)
        names = hosts.names
    assert proc.returncode == 0, text
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in names)  # nothing left behind
    results = json.loads((out / "results.json").read_text())
    assert results["solved"] and results["error"] is None
    ways = results["direct_chunks"]["connections"]
    assert ways["tcp"] >= 1 and ways["unix"] == 0  # explorers on other hosts: the abstract socket is out of reach
    assert results["direct_chunks"]["chunks"] >= results["chunks"]
    steps = results["controller"]["per_explorer_env_steps"]  # one stream on each explorer host
    assert len(steps) == 2 and min(steps.values()) > 0
