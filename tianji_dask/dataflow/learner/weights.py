"""The weights publisher: makes a version of the policy the one new explorer tasks get.

Small weights travel inside each explorer task (inline): no scatter, no fetch by explorers
from the learner's worker, nothing to wait for. Larger ones are scattered once per version under
a versioned key, without blocking the learner's thread: explorer tasks take the newest version
whose scatter has completed, so an off-policy chunk's policy may lag its submission by the
updates made during one scatter.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from tianji_dask import dask_internals
from tianji_dask.dataflow.keys import weights_key

PUBLISHED_AT_KEPT = 64  # versions whose publish times drop_on_refresh may look back on


@dataclass(frozen=True)
class Published:
    """A published version: the weights dict itself (inline) or the future of its scatter."""

    version: int
    weights: object


@dataclass(frozen=True)
class Scatter:
    """A scatter under way: the version, its key and the concurrent future of the scatter call."""

    version: int
    key: str
    future: object


class WeightsPublisher:
    def __init__(self, client, worker_address: str, tag: str, inline: bool):
        self._client = client
        self._worker = worker_address
        self._tag = tag
        self.inline = inline
        self._newest: deque[Published] = deque(maxlen=2)  # the previous version stays alive while tasks fetch it
        self._scatter: Scatter | None = None
        self._times: deque[tuple[int, float]] = deque(maxlen=PUBLISHED_AT_KEPT)
        self.version = -1  # the newest version handed to publish
        self.counts = {"inline": 0, "scattered": 0}

    @staticmethod
    def fits_inline(weights: dict, max_bytes: int | None) -> bool:
        return max_bytes is not None and sum(w.nbytes for w in weights.values()) <= max_bytes

    @property
    def scattering(self) -> bool:
        return self._scatter is not None

    def publish(self, version: int, weights: dict, wait: bool = False) -> None:
        """Publish ``weights`` as ``version``; with ``wait``, return once explorer tasks can get
        it. One scatter at a time: while one is under way this does nothing (the next
        submission publishes the newer version)."""
        if self._scatter is not None:
            return
        self.version = version
        if self.inline:
            self.counts["inline"] += 1
            self._install(version, weights)
            return
        self.counts["scattered"] += 1
        key = weights_key(self._tag, version)
        self._scatter = Scatter(version, key, dask_internals.scatter_nowait(self._client, {key: weights}, self._worker))
        if wait:
            self._scatter.future.result()
        self._collect()

    def newest(self) -> Published:
        """The newest version explorer tasks can get now."""
        self._collect()
        return self._newest[-1]

    def _collect(self) -> None:
        """Install the scatter under way once it has completed."""
        scatter = self._scatter
        if scatter is not None and scatter.future.done():
            self._scatter = None
            self._install(scatter.version, scatter.future.result()[scatter.key])

    def _install(self, version: int, weights) -> None:
        self._newest.append(Published(version, weights))
        self._times.append((version, time.time()))

    def superseded_before(self, version: int, t: float) -> bool:
        """Was a version newer than ``version`` available to explorers before time ``t``? (TianJi's
        explorer takes new weights between sends and drops what it had not sent.)"""
        for published, t_published in reversed(self._times):
            if published <= version:
                return False
            if t_published < t:
                return True
        return False

    def close(self) -> None:
        self._newest.clear()
        if self._scatter is not None:
            self._scatter.future.cancel()
            self._scatter = None
