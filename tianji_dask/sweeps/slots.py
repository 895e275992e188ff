"""The cluster a sweep's concurrent trials share, cut into slots: each slot a LEARNER worker of
its own and its share of the EXPLORER workers, so trials running side by side neither share a
learner's core nor queue behind each other's explorer tasks."""

from __future__ import annotations

import os
from dataclasses import dataclass

from tianji_dask.errors import PipelineError


@dataclass(frozen=True)
class Slot:
    index: int
    learner: str  # the LEARNER worker's address
    explorers: tuple[str, ...] | None  # the EXPLORER workers it may use (None: every one, an adaptive pool)


class SweepCluster:
    """Open (or join) the pipeline's cluster for ``concurrent`` trials at once; one line, before
    any trial starts, when it cannot host them."""

    def __init__(self, pipeline, concurrent: int):
        from tianji_dask.launch.cluster import (
            check_roles,
            default_explorer_workers,
            open_cluster,
            stop_active_memory_manager,
        )
        from tianji_dask.launch.cluster import learner_workers

        kind, k = pipeline.cluster.kind, concurrent
        per_slot = pipeline.cluster.explorer_workers or max(1, default_explorer_workers(pipeline.explorers) // k)
        check_concurrent(pipeline, k)
        threads = pipeline.cluster.explorer_threads or -(-pipeline.explorers // per_slot)
        self.opened = open_cluster(pipeline.cluster, k * pipeline.explorers, k * per_slot, learners=k,
                                   explorer_threads=threads)
        self.client = self.opened.client
        try:
            if kind == "address":
                counts = _role_counts(self.client)
                if counts["LEARNER"] < k or counts["EXPLORER"] < k:
                    raise PipelineError(
                        f"--concurrent: {k} trials at once need {k} LEARNER and {k} EXPLORER workers; the cluster at "
                        f"{pipeline.cluster.address} has {counts['LEARNER']} and {counts['EXPLORER']}; allowed: 1 to "
                        f"{max(1, min(counts['LEARNER'], counts['EXPLORER']))}")
            check_roles(self.client, timeout=self.opened.start_timeout, learners=k)
            stop_active_memory_manager(self.client)
            learners = learner_workers(self.client)[:k]
            explorers = sorted(a for a, w in self.client.scheduler_info(n_workers=-1)["workers"].items()
                               if w.get("resources", {}).get("EXPLORER"))
        except BaseException:
            self.close()
            raise
        shared = kind in ("slurm", "pbs")  # an adaptive explorer pool: workers come and go, the slots share it
        self.slots = [Slot(i, learners[i], None if shared else tuple(explorers[i::k])) for i in range(k)]
        self.dashboard_link = self.client.dashboard_link

    def close(self) -> None:
        if self.opened is not None:
            self.opened.close()
            self.opened = None


def check_concurrent(pipeline, concurrent: int, asked: int | None = None) -> None:
    """What can be told before a cluster starts: trials that are one learner each, and on this
    machine a core for every learner (a cluster's own counts are checked when it is joined)."""
    if pipeline.mode == "single":
        raise PipelineError("mode: a sweep runs its trials on a cluster; allowed: relaxed or lockstep")
    if pipeline.groups > 1:
        raise PipelineError("groups: a sweep's trials are one learner each; allowed: groups 1")
    cores = os.cpu_count() or 1
    if pipeline.cluster.kind == "local" and concurrent > cores:
        raise PipelineError(f"--concurrent: {asked or concurrent} trials at once need a core each for their learners "
                            f"and this machine has {cores}; allowed: 1 to {cores} (or a cluster: --scheduler)")


def _role_counts(client) -> dict:
    counts = {"LEARNER": 0, "EXPLORER": 0}
    for w in client.scheduler_info(n_workers=-1)["workers"].values():
        for role in counts:
            counts[role] += w.get("resources", {}).get(role, 0) > 0
    return counts
