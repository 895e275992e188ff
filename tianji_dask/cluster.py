"""Clusters: an embedded LocalCluster with role resources, or an existing scheduler."""

from __future__ import annotations

import copy
import logging
import os

import dask
from distributed import Client, LocalCluster

LEARNER, EXPLORER = "LEARNER", "EXPLORER"


def default_explorer_workers(explorers: int) -> int:
    return max(1, min(explorers, os.cpu_count() or 1))


def local_cluster(explorer_workers: int, dashboard_address: str | None = ":8787") -> LocalCluster:
    """One LEARNER worker process plus ``explorer_workers`` EXPLORER worker processes, one thread
    each, with the active memory manager off (it deletes the weight replicas explorers read)."""
    with dask.config.set({"distributed.scheduler.active-memory-manager.start": False}):
        cluster = LocalCluster(
            n_workers=0, threads_per_worker=1, processes=True, dashboard_address=dashboard_address,
            silence_logs=logging.ERROR,
        )
    template = cluster.new_spec
    learner = copy.deepcopy(template)
    learner["options"].update(resources={LEARNER: 1}, memory_limit=0)
    cluster.worker_spec["tianji-learner"] = learner
    for i in range(explorer_workers):
        explorer = copy.deepcopy(template)
        explorer["options"].update(resources={EXPLORER: 1})
        cluster.worker_spec[f"tianji-explorer-{i}"] = explorer
    cluster.sync(cluster._correct_state)
    return cluster


def stop_active_memory_manager(client: Client) -> None:
    """Turn the AMM off on a scheduler we did not start (weights live in one place on purpose)."""

    def _stop(dask_scheduler=None):
        amm = dask_scheduler.extensions.get("amm")
        if amm is not None and amm.running:
            amm.stop()

    client.run_on_scheduler(_stop)


def check_roles(client: Client, explorer_workers: int | None = None, timeout: float = 60) -> dict:
    """Wait until the cluster offers a LEARNER and an EXPLORER worker; return their counts."""
    import time

    deadline = time.time() + timeout
    while True:
        info = client.scheduler_info(n_workers=-1)
        counts = {LEARNER: 0, EXPLORER: 0}
        for w in info["workers"].values():
            for role in counts:
                if w.get("resources", {}).get(role, 0) > 0:
                    counts[role] += 1
        if counts[LEARNER] >= 1 and counts[EXPLORER] >= (explorer_workers or 1):
            return counts
        if time.time() > deadline:
            missing = "LEARNER" if counts[LEARNER] < 1 else "EXPLORER"
            raise RuntimeError(
                f"cluster: no worker offers the {missing} resource after {timeout:.0f}s; start workers with "
                f"`dask worker ADDRESS --resources {missing}=1`"
            )
        time.sleep(0.1)
