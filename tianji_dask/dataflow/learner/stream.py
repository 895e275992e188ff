"""The stream of explorer futures: submission, completion order, placement, lost chunks.

The learner thread hands it granted keys and takes back arrivals in the order explorer tasks
finish (``as_completed``). Each explorer stream runs on one explorer worker, its home, where its
envs live; a chunk restricted to a worker that has left is cancelled and reported lost, and the
stream moves to another worker. Chunks sent over the direct socket are taken from the sink here,
so an arrival always carries the chunk itself.
"""

from __future__ import annotations

import contextlib
import heapq
import time
from dataclasses import dataclass

from tianji_dask import dask_internals
from tianji_dask.dataflow.direct.sink import ChunkSink, DirectChunk, sink_host
from tianji_dask.dataflow.explorer.tasks import DirectRoute, explore_chunk
from tianji_dask.dataflow.keycache import bound_key_cache
from tianji_dask.dataflow.keys import explore_key
from tianji_dask.errors import ExplorerError

# a direct chunk's task returns only once the sink holds its bytes, so they are here when its
# result is; this bounds a wait that should not happen (the chunk is then reported lost)
DIRECT_TAKE_S = 5.0


@dataclass(frozen=True)
class InFlight:
    future: object
    stream: int
    submit_version: int
    home: str | None
    explore: dict | None = None


@dataclass
class Arrival:
    """A finished explorer task. ``chunk`` is None when the chunk was lost (``lost`` says why);
    ``failed`` when its task erred (``failures``: that stream's failures in a row; ``env_error``:
    the env raised, not the policy). The future
    is held until the controller has the chunk's consumption on record, or its credit would
    come back as forgotten."""

    key: str
    stream: int
    submit_version: int
    future: object
    chunk: dict | None = None
    lost: str | None = None
    failed: bool = False
    failures: int = 0
    explore: dict | None = None  # the exploration settings its task acted with
    detail: str | None = None  # a failed task's traceback, when its explorer sent one
    env_error: bool = False  # failed because its env raised (made, reset or stepped), not its policy


def describe_error(error) -> str:
    """One line for a failed explorer task (``as_completed`` hands over ``(type, value, tb)``)."""
    error = _exception(error)
    return str(error) if isinstance(error, ExplorerError) else f"{type(error).__name__}: {error}"


def _exception(error):
    return error[1] if isinstance(error, tuple) and len(error) == 3 else error


class ExplorerStream:
    def __init__(self, client, *, run_id: str, tag: str, group: int, streams, chunk_steps: int,
                 worker_address: str, direct_min_bytes: int | None, timed=None, hosts=None):
        """``timed(part)``: a context manager that books a block's time (the ledger's). ``hosts``:
        the explorer workers this run may use (None: every EXPLORER worker)."""
        self._client = client
        self._timed = timed or (lambda part: contextlib.nullcontext())
        self._run_id, self._tag, self._group = run_id, tag, group
        self.streams = list(streams)
        self._chunk_steps = chunk_steps
        self._ac = dask_internals.arrivals_in_completion_order()
        self._in_flight: dict[str, InFlight] = {}
        self._per_stream = {s: 0 for s in self.streams}  # chunks in flight per stream
        self._failures = {s: 0 for s in self.streams}  # consecutive failed chunks per stream
        self._served: dict[int, int] = {}  # stream -> serial number of its last submission
        self._serial = 0
        self._homes: list[str] = []
        #: per stream, how many times it moved to another worker: its envs' seeds there are new ones
        self._generation = {s: 0 for s in self.streams}
        self._hosts = None if hosts is None else set(hosts)
        self._homes_looked_up_at = 0.0
        self._workers_epoch: int | None = None  # the controller's count of workers joined or left, when last looked
        # large chunks come straight from the explorers (direct.py) when the comms are plain TCP
        self.sink, self._direct = None, None
        host = sink_host(worker_address) if direct_min_bytes is not None else None
        if host is not None:
            self.sink = ChunkSink(host)
            # each task carries the sink's secret, inside Dask's comms like the rest of its arguments
            self._direct = DirectRoute(self.sink.address, self.sink.secret, int(direct_min_bytes))

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    # ---- submitting -------------------------------------------------------------------------
    def choose(self, n: int) -> list[tuple[str, int]]:
        """Keys for ``n`` chunks, each for the least-loaded stream, among equals the one served
        longest ago: the controller grants the head of the list, and were ties broken by order
        a learner granted one chunk at a time would give the first stream every one."""
        if n <= 0:
            return []
        heap = [(self._per_stream[s], self._served.get(s, 0), s) for s in self.streams]
        heapq.heapify(heap)
        chosen: list[tuple[str, int]] = []
        for _ in range(n):
            load, served, stream = heapq.heappop(heap)
            chosen.append((explore_key(self._tag), stream))
            heapq.heappush(heap, (load + 1, served, stream))
        return chosen

    def submit(self, granted: list[tuple[str, int]], weights_version: int, weights, explore: dict, version: int) -> None:
        """Submit an explorer task per granted (key, stream), acting with ``weights``."""
        bound_key_cache()  # the chunks' and weights' keys pass through this process's key-name cache
        for key, stream in granted:
            home = self._home(stream)
            future = self._client.submit(
                explore_chunk, self._run_id, weights, weights_version, stream, self._chunk_steps, explore, self._group,
                self._direct, self._generation[stream], key=key, resources={"EXPLORER": 1}, pure=False, workers=home,
            )
            self._per_stream[stream] += 1
            self._serial += 1
            self._served[stream] = self._serial
            self._in_flight[key] = InFlight(future, stream, version, home[0] if home else None, explore)
            self._ac.add(future)

    # ---- receiving --------------------------------------------------------------------------
    def arrivals(self, wait_s: float = 0.0) -> list[Arrival]:
        """The tasks finished since the last call; with ``wait_s``, block up to that long for
        one when none has (and look for explorer workers that left if none came)."""
        if wait_s and self._in_flight and not self._ac.has_ready():
            dask_internals.wait_any_completed(self._ac, wait_s)
            if not self._ac.has_ready():
                self.refresh_homes()  # nothing came for a while: are the explorers still there?
        # taken out of flight only once all are read: a read that raises (the scheduler lost under
        # it) leaves the batch in flight, where the learner's books count it lost
        arrived = [self._arrival(future, result) for future, result in self._ac.next_batch(block=False)]
        for arrival in arrived:
            del self._in_flight[arrival.key]
            self._per_stream[arrival.stream] -= 1
        return arrived

    def _arrival(self, future, result) -> Arrival:
        entry = self._in_flight[future.key]
        stream = entry.stream
        arrival = Arrival(future.key, stream, entry.submit_version, future, explore=entry.explore)
        if future.status == "cancelled":
            arrival.lost = "cancelled: its explorer worker left"
        elif isinstance(result, dask_internals.FetchFailed):
            arrival.lost = f"finished, but its result could not be fetched ({result})"
        elif future.status != "finished":
            self._failures[stream] += 1
            arrival.lost, arrival.failed, arrival.failures = describe_error(result), True, self._failures[stream]
            arrival.detail = getattr(_exception(result), "detail", None)
            arrival.env_error = bool(getattr(_exception(result), "env", False))
        else:
            if isinstance(result, DirectChunk):
                with self._timed("receive"):
                    result = self.sink.take(future.key, DIRECT_TAKE_S)
                if result is None:
                    arrival.lost = (f"its bytes did not reach the learner within {DIRECT_TAKE_S:g} s "
                                    f"(direct send; sink errors: {self.sink.stats()['errors']})")
            if result is not None:
                self._failures[stream] = 0
                arrival.chunk = result
        if arrival.lost is not None and self.sink is not None:
            self.sink.discard(future.key)  # its bytes may have come (or still come) directly
        return arrival

    @property
    def submitted(self) -> int:
        """Explorer tasks this learner has submitted."""
        return self._serial

    def forget_all(self) -> list[tuple[str, int]]:
        """Drop every task still out without a word to the scheduler (it is gone); returns their
        (key, stream)."""
        out = [(key, entry.stream) for key, entry in self._in_flight.items()]
        self._in_flight.clear()
        self._ac.clear()
        return out

    def cancel_all(self) -> list[tuple[str, int]]:
        """Cancel every task still out; returns their (key, stream). Their credits come back
        when the scheduler forgets them."""
        out = [(key, entry.stream) for key, entry in self._in_flight.items()]
        futures = [entry.future for entry in self._in_flight.values()]
        for key, _ in out:
            if self.sink is not None:
                self.sink.discard(key)
        if futures:
            self._client.cancel(futures)
        self._in_flight.clear()
        self._ac.clear()
        return out

    # ---- placement ----------------------------------------------------------------------------
    def _home(self, stream: int) -> list[str] | None:
        """The explorer worker a stream runs on: a slow stream does not queue a fast one behind
        it. The restriction is strict (dask cannot combine loose worker restrictions with
        resources, distributed#4792), hence the cancellation of orphans in ``refresh_homes``.
        Workers come and go (adaptive clusters, restarts): ``workers_moved`` looks again."""
        if not self._homes:
            self.refresh_homes()
        return [self._homes[stream % len(self._homes)]] if self._homes else None

    def workers_moved(self, epoch: int) -> None:
        """The controller's count of workers joined or left: when it moved, look at the explorer
        workers again, so that from this submission on a worker that left gets no chunk (and
        those waiting for it are cancelled) and one that joined gets its share."""
        if epoch != self._workers_epoch:
            self._workers_epoch = epoch
            self.refresh_homes()

    def refresh_homes(self) -> None:
        """Look up the explorer workers; cancel the chunks waiting for one that has left (a
        restarted worker comes back at a new address)."""
        workers = self._client.sync(self._client.scheduler.identity, n_workers=-1).get("workers", {})
        homes = sorted(a for a, w in workers.items() if w.get("resources", {}).get("EXPLORER")
                       and (self._hosts is None or a in self._hosts))
        gone = set(self._homes) - set(homes)
        before = self.homes_by_stream()
        self._homes, self._homes_looked_up_at = homes, time.time()
        for stream, home in self.homes_by_stream().items():
            if stream in before and before[stream] != home:  # its envs are built anew there: with new seeds
                self._generation[stream] += 1
        orphans = [entry.future for entry in self._in_flight.values() if entry.home in gone]
        if orphans:
            self._client.cancel(orphans)  # they come out of as_completed as cancelled

    @property
    def homes_looked_up_at(self) -> float:
        """When the explorer workers were last looked up (unix s; 0 before the first look)."""
        return self._homes_looked_up_at

    def homes_by_stream(self) -> dict[int, str]:
        return {s: self._homes[s % len(self._homes)] for s in self.streams} if self._homes else {}

    def direct_stats(self) -> dict | None:
        return None if self.sink is None else {**self.sink.stats(), "min_bytes": self._direct.min_bytes}

    def direct_refused(self) -> dict | None:
        """Connections the sink refused, by reason; None when there is no sink."""
        return None if self.sink is None else self.sink.refusals()

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()  # chunks still held were never trained on: they are on record as lost
