"""What the learner actor adds to the core's results: where its process's CPU went, how weights
and chunks travelled, and group mode's fusions."""

from __future__ import annotations

import time


class CpuClock:
    """CPU seconds of the learner's thread and of its whole worker process (its event loop,
    comms, the chunk sink) since ``start``, beside the wall time: what the dataflow costs off
    the learner's thread."""

    def __init__(self):
        self._t0 = (0.0, 0.0)

    def start(self) -> None:
        self._t0 = time.thread_time(), time.process_time()

    def seconds(self) -> dict:
        return {"thread_s": round(time.thread_time() - self._t0[0], 4),
                "process_s": round(time.process_time() - self._t0[1], 4)}


def learner_extras(*, cpu: CpuClock, publisher, stream, fusion, group: int) -> dict:
    extras = {
        "learner_cpu_s": cpu.seconds(),
        "weights_published": dict(publisher.counts),
        "direct_chunks": stream.direct_stats(),
        "direct_refused": stream.direct_refused(),
    }
    if fusion is not None:
        extras.update(group=group, fusions=fusion.installed)
    return extras
