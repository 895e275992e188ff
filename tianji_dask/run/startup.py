"""The start-up figures of a run: when the user's process started, and the seconds from then to
each step of the start (imports, checks, cluster, learners built, first chunk)."""

from __future__ import annotations

import os
import time

import psutil


def process_start_time() -> float:
    """When this process started, as a Unix time. psutil's ``create_time`` counts from the boot
    time in whole seconds (/proc/stat), so on Linux it is up to a second early; the process's age
    on the boot clock is exact to a clock tick."""
    try:
        with open("/proc/self/stat") as f:
            ticks = float(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, AttributeError, ValueError, IndexError):  # not Linux
        return psutil.Process(os.getpid()).create_time()


def startup_results(marks: dict, t_process_start: float, finals: list[dict]) -> dict:
    """Seconds from process start to each step of the start (None: not reached): ``marks`` the
    driver's and the backend's times; in group mode, to every learner built and to every group's
    first chunk (``finals``: each learner's final report)."""

    def since(step):
        t = marks.get(step)
        return None if t is None else t - t_process_start

    learners = [final["results"].get("startup") or {} for final in finals]

    def every(key):
        values = [s.get(key) for s in learners]
        return None if not values or None in values else max(values)

    return {"import_s": since("import"), "checked_s": since("checked"), "cluster_s": since("cluster"),
            "learner_built_s": every("learner_built_s"), "first_chunk_s": every("first_chunk_s")}
