"""Where a run's time and CPU went, read off the cluster at the start and the end of the run:
the dataflow's overhead per role (Dask's fine performance metrics for the explorer tasks, the
learner's own time split), each process's CPU, and the controller's credits (granted, consumed,
returned)."""

from __future__ import annotations

import time

from tianji_dask import dask_internals
from tianji_dask.dataflow.keys import EXPLORE_TASK_PREFIX
from tianji_dask.run.groups import learner_results


def cpu_seconds(client) -> dict | None:
    """CPU seconds so far of the scheduler's process and of each explorer worker's process
    (workers without the LEARNER resource; the learner measures its own)."""
    try:
        scheduler = client.run_on_scheduler(lambda: time.process_time())
        workers = client.scheduler_info(n_workers=-1)["workers"]
        explorers = [a for a, w in workers.items() if not w.get("resources", {}).get("LEARNER")]
        per = client.run(lambda: time.process_time(), workers=explorers) if explorers else {}
    except Exception:  # noqa: BLE001 - a cluster that cannot tell costs only this figure
        return None
    return {"scheduler": scheduler, "explorers": per}


def explorer_rss(client) -> dict | None:
    """Resident memory (bytes) of each explorer worker's process."""
    def rss():
        import psutil

        return psutil.Process().memory_info().rss

    try:
        workers = client.scheduler_info(n_workers=-1)["workers"]
        explorers = [a for a, w in workers.items() if w.get("resources", {}).get("EXPLORER")]
        return client.run(rss, workers=explorers) if explorers else {}
    except Exception:  # noqa: BLE001 - a cluster that cannot tell costs only this figure
        return None


def explorer_memory(rss0: dict | None, rss1: dict | None, streams: int) -> dict | None:
    """What the explorer workers' processes grew by over the run (their envs, policy copies and
    buffers, made as streams start), in all and per explorer stream."""
    if not rss0 or not rss1:
        return None
    grown = sum(rss1[a] - rss0[a] for a in rss1 if a in rss0)
    return {"rss_bytes_start": sum(rss0.values()), "rss_bytes_end": sum(rss1.values()), "streams": streams,
            "workers": len(rss1), "bytes_per_stream": grown / streams if streams else None}


def task_metrics(client) -> dict:
    """The scheduler's cumulative per-task-prefix metrics (Dask's fine performance metrics)."""
    def read(dask_scheduler=None):
        return dask_internals.task_prefix_metrics(dask_scheduler)

    return client.run_on_scheduler(read)


def dataflow_overhead(client, results: dict, metrics_at_start: dict) -> dict | None:
    """Where the roles' busy time went: the learner's own split (updates, ingesting data, the
    dataflow's work) and the explorer tasks' split as Dask meters it (env stepping with
    inference vs. everything else the task did: loading weights, deserializing, threads).
    "fraction": dataflow seconds / busy seconds, summed over roles (waiting is not busy)."""
    try:
        now = task_metrics(client)
    except Exception:  # noqa: BLE001 - a cluster that cannot tell costs only this figure
        return None
    explorer = {}
    for key, value in now.items():
        if key[0] == "execute" and key[1] == EXPLORE_TASK_PREFIX and key[-1] == "seconds":
            explorer[key[2]] = value - metrics_at_start.get(key, 0.0)
    times = [r["learner_time"] for r in learner_results(results) if r.get("learner_time")]
    learner_busy = sum(sum(t["seconds"].values()) - t["seconds"].get("wait", 0.0) for t in times)
    learner_useful = sum(t["seconds"]["learn"] + t["seconds"].get("ingest", 0.0) for t in times)
    explorer_busy = sum(explorer.values())
    explorer_useful = explorer.get("env-step", 0.0)
    busy = learner_busy + explorer_busy
    return {
        "fraction": (busy - learner_useful - explorer_useful) / busy if busy > 0 else None,
        "learner_fraction": (learner_busy - learner_useful) / learner_busy if learner_busy > 0 else None,
        "explorer_fraction": (explorer_busy - explorer_useful) / explorer_busy if explorer_busy > 0 else None,
        "explorer_task_seconds": {k: round(v, 4) for k, v in sorted(explorer.items())},
    }


def cpu_budget(results: dict, cpu0: dict | None, cpu1: dict | None) -> dict | None:
    """Where the processes' CPU went over the run, as cores (CPU seconds / the learner's wall
    seconds): the learner thread; the rest of the learner's process (its event loop, comms, the
    chunk sink); the explorer workers' processes, and the part of them the explorer tasks
    spent stepping envs; the scheduler's process (on a local cluster also the client and the
    nannies). A wall-time overhead (``dataflow_overhead``) misses work done beside the roles'
    main threads; this shows it. A learner rebuilt after its worker was lost counts from its
    rebuild."""
    if cpu1 is None or cpu0 is None:
        return None
    per = [r["learner_cpu_s"] for r in learner_results(results) if r.get("learner_cpu_s")]
    wall = results.get("wall_s") or 0.0
    if not per or wall <= 0:
        return None
    thread = sum(c["thread_s"] for c in per)
    seconds = {
        "learner_thread": thread,
        "learner_process_other": sum(c["process_s"] for c in per) - thread,
        # per worker process: one that joined during the run counts from its start
        "explorer_processes": sum(t - cpu0["explorers"].get(a, 0.0) for a, t in cpu1["explorers"].items()),
        "scheduler_process": cpu1["scheduler"] - cpu0["scheduler"],
    }
    stepping = ((results.get("dataflow_overhead") or {}).get("explorer_task_seconds") or {}).get("env-step")
    out = {"wall_s": round(wall, 4), "seconds": {k: round(v, 4) for k, v in seconds.items()},
           "cores": {k: round(v / wall, 4) for k, v in seconds.items()},
           "cores_total": round(sum(seconds.values()) / wall, 4)}
    if stepping is not None:
        out["explorer_env_step_cores"] = round(stepping / wall, 4)  # wall seconds in tasks, an upper bound
    return out


def chunk_accounting(state: dict, learner_chunks: int | None = None) -> dict:
    """Every credit the controller granted, group by group summed: consumed (once each), or
    returned unconsumed (lost, cancelled, never submitted), or still out; ``balanced`` when none
    is out and each consumed chunk was one credited key. ``learner_chunks``: the chunks in the
    learners' books (the results' chunk log); what the controller saw consumed beyond them was
    consumed by a learner lost before its next checkpoint (``consumed_lost_with_learners``); what
    the learners consumed beyond what the controller saw, their bookings cut off with their
    connection, the controller counted as forgotten: they count as consumed
    (``consumed_not_heard``)."""
    books = state.get("groups", [state])
    granted = sum(b["credits_granted"] for b in books)
    returned = {k: sum(b["credits_returned"][k] for b in books) for k in books[0]["credits_returned"]}
    consumed, in_flight = sum(b["chunks_consumed"] for b in books), sum(b["chunks_in_flight"] for b in books)
    unheard = 0 if learner_chunks is None else learner_chunks - consumed
    if 0 < unheard <= returned.get("forgotten", 0):
        returned["forgotten"] -= unheard
        returned["consumed"] += unheard
        consumed += unheard
    else:
        unheard = 0  # none, or more than the controller returned: left for ``balanced`` to show
    out = {"granted": granted, "consumed": consumed, "returned": returned, "in_flight": in_flight,
           "balanced": in_flight == 0 and granted == sum(returned.values()) and consumed == returned["consumed"]}
    if learner_chunks is not None:
        out["consumed_lost_with_learners"] = consumed - learner_chunks
        out["consumed_not_heard"] = unheard
    return out
