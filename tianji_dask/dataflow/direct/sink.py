"""Large chunks go from explorer to learner over a direct TCP connection, not Dask's gather.

Dask moves a task result between workers at a fixed cost per transfer (the request, its msgpack
framing, serialization, tornado's reads on the event loop) and well below the speed of a plain
socket (``benchmarks/transfer.py`` measures both). For a chunk of pixels that is most of
its cost. So a chunk of at least ``min_bytes`` is sent by the explorer task itself to a
``ChunkSink`` in the learner's process, as one message: a small JSON description, then the
arrays' own memory (scatter-gather from the sender's arrays, one receive buffer on the other side
whose views become the chunk's arrays). The sink answers one byte once it holds
the chunk, and only then does the task return, with just a ``DirectChunk`` stub: the future still
says when and whether the chunk exists (``as_completed``, retries, lost chunks and the
controller's credits work as before), and when it says so the bytes are already in the learner's
process. A sink that dies or goes away fails the task, as a dead worker would; only the bytes
take the short way.

On Linux the sink also listens on an abstract Unix socket under a random name, and a sender tries
it first: it connects only on the sink's own host (and network namespace), where it is faster
than loopback TCP; anywhere else the connection fails at once and the chunk goes over TCP. Plain
TCP comms only: when the
cluster's comms are TLS (or anything but ``tcp://``), the direct path is off, so no byte leaves a
worker unencrypted. This module imports no algorithm code.

Anyone who can reach the sink's port (or, on its host, the Unix socket) can connect, so the sink
trusts nothing it reads until the sender has shown the run's secret, and parses nothing with a
format that can run code: the wire format is in ``wire.py``.

Lengths are checked against ``MAX_DESCRIPTION_BYTES`` and ``MAX_BODY_BYTES`` before anything is
allocated, and the body's length against the fields' before it is read. Each refused connection
is closed and counted by reason (``REFUSALS``); nothing it sent is kept.
"""

from __future__ import annotations

import hmac
import secrets
import socket
import sys
import threading
import time
import uuid
from collections import deque

import numpy as np
from distributed.comm.addressing import get_address_host, parse_address

from tianji_dask.dataflow.direct.wire import (  # noqa: F401 - the format's names, re-exported for senders and tests
    ARRAY_DTYPES,
    HEAD,
    MAGIC,
    MAX_BODY_BYTES,
    MAX_DESCRIPTION_BYTES,
    REFUSALS,
    SECRET_BYTES,
    Refused,
    Unencodable,
    assemble,
    decode,
    encode,
    plan,
)

ACK = b"\x01"  # the sink's answer once it holds a chunk
HELLO_TIMEOUT_S = 10.0  # a connection that has not shown the secret by then is closed
POOL_BYTES = 256 * 2**20  # receive buffers kept for reuse by one sink, at most
#: a Unix socket's send buffer (the kernel caps it at net.core.wmem_max): large enough that a
#: 1 MiB chunk goes in one write, not one wake-up of both processes per default-sized buffer
UNIX_SEND_BUFFER = 4 * 2**20


class DirectChunk(dict):
    """What an explorer task returns for a chunk sent directly: its key."""

    __slots__ = ()


def sink_host(worker_address: str) -> str | None:
    """The host a sink listens on, from its worker's address; None when the comms are not plain
    TCP (TLS or another protocol: the direct path would bypass their encryption or transport)."""
    scheme, _ = parse_address(worker_address)
    return get_address_host(worker_address) if scheme == "tcp" else None


class ChunkSink:
    """Receives directly sent chunks in a background thread (one per connection) and holds each
    under its task key until the learner takes it.

    A connection is served only once it has shown ``secret``; one that does not, or that sends
    anything but well-formed chunks, is closed and counted in ``refusals()``.
    Each chunk held (or dropped, if discarded) is acknowledged with one byte on its connection,
    and the sender's task returns only then, so ``take`` finds a chunk whose stub has arrived
    without waiting. ``discard`` forgets a chunk the learner will never take (its task was
    cancelled or lost); ``close`` forgets everything."""

    def __init__(self, host: str = "127.0.0.1", local: bool = sys.platform.startswith("linux"),
                 hello_timeout_s: float = HELLO_TIMEOUT_S):
        #: what a sender must show first on each connection; new for every sink, so for every run
        self.secret = secrets.token_bytes(SECRET_BYTES)
        self._hello_timeout_s = hello_timeout_s
        self._listeners = [socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET)]
        local_name = None
        if local:  # same-host senders' way in: an abstract Unix socket (no file to clean up)
            unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                name = f"tianji-sink-{uuid.uuid4().hex}"
                unix.bind("\0" + name)
                unix.listen()
                self._listeners.append(unix)
                local_name = name
            except OSError:  # not allowed here: senders use TCP, as from another host
                unix.close()
        #: what a sender needs besides the secret: (host, port, abstract Unix socket name or None)
        self.address = (*self._listeners[0].getsockname()[:2], local_name)
        self._chunks: dict[str, object] = {}
        self._discarded: set[str] = set()
        self._cond = threading.Condition()
        self._closed = False
        self._conns: list[socket.socket] = []
        #: chunks received, their bytes and the seconds from each send's start to its last byte here
        self.received = 0
        self.bytes = 0
        self.seconds = 0.0
        self.errors: list[str] = []
        self.recent: deque = deque(maxlen=256)  # (key, bytes, seconds) of the last messages
        self.connections = {"unix": 0, "tcp": 0}  # connections that showed the secret, by way in
        self._refused = dict.fromkeys(REFUSALS, 0)
        self._pool: list[np.ndarray] = []  # receive buffers, reused once no chunk views them
        for listener in self._listeners:
            threading.Thread(target=self._accept, args=(listener,), name="tianji-chunk-sink", daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while not self._closed:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed
            if conn.family != socket.AF_UNIX:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._cond:
                self._conns.append(conn)
            threading.Thread(target=self._read, args=(conn,), name="tianji-chunk-sink-conn", daemon=True).start()

    def _hello(self, conn: socket.socket) -> None:
        """Read the secret, within the hello timeout; raises ``Refused`` without it."""
        conn.settimeout(self._hello_timeout_s)  # a silent stranger does not hold a thread for long
        try:
            shown = _recv_exact(conn, SECRET_BYTES)
        except OSError:  # timed out or reset
            shown = None
        if shown is None:
            raise Refused("no_secret", "the connection ended or went silent before the secret")
        if not hmac.compare_digest(shown, self.secret):
            raise Refused("bad_secret", "the secret does not match")
        conn.settimeout(None)
        with self._cond:
            self.connections["unix" if conn.family == socket.AF_UNIX else "tcp"] += 1

    def _read(self, conn: socket.socket) -> None:
        try:
            with conn:
                self._hello(conn)
                while True:
                    head = _recv_exact(conn, HEAD.size)
                    if head is None:
                        return  # the explorer's process closed the connection
                    magic, description_len, body_len, t_send = HEAD.unpack(head)
                    if magic != MAGIC:
                        raise Refused("bad_header", f"magic {magic!r}, not {MAGIC!r}")
                    if description_len > MAX_DESCRIPTION_BYTES or body_len > MAX_BODY_BYTES:
                        raise Refused("oversized", f"description {description_len} bytes, body {body_len}")
                    description = _recv_exact(conn, description_len)
                    if description is None:
                        return  # cut off mid-message (its task fails or is retried elsewhere)
                    # the description is read while the body's first bytes come in (the sender
                    # keeps filling the socket's buffer), not after the last
                    chunk_plan = plan(description, body_len)
                    body = self.receive_buffer(body_len)  # every array in one allocation: few, large reads
                    if _recv_exact(conn, body_len, into=body) is None:
                        return
                    chunk = assemble(chunk_plan, body)
                    seconds = time.time() - t_send
                    nbytes = HEAD.size + description_len + body_len
                    with self._cond:
                        self.received += 1
                        self.bytes += nbytes
                        self.seconds += seconds
                        self.recent.append((chunk_plan.key, nbytes, seconds))
                        if chunk_plan.key in self._discarded:
                            self._discarded.discard(chunk_plan.key)
                        elif not self._closed:
                            self._chunks[chunk_plan.key] = chunk
                        self._cond.notify_all()
                    conn.sendall(ACK)  # held (or dropped): the sender's task may now return
        except Refused as refusal:  # closed at once (leaving ``with``); nothing it sent is kept
            with self._cond:
                if not self._closed:  # closing cuts connections still saying hello: not refusals
                    self._refused[refusal.reason] += 1
        except Exception as err:  # noqa: BLE001 - a broken connection costs only its chunks (reported lost)
            if not self._closed:
                self.errors.append(f"{type(err).__name__}: {err}")
        finally:
            with self._cond:
                if conn in self._conns:
                    self._conns.remove(conn)

    def refusals(self) -> dict[str, int]:
        """Connections refused so far, by reason (every one of ``REFUSALS``, zeros included)."""
        with self._cond:
            return dict(self._refused)

    def take(self, key: str, timeout: float = 30.0):
        """The chunk sent under ``key``; None if it has not arrived within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while key not in self._chunks:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return None
                self._cond.wait(left)
            return self._chunks.pop(key)

    def discard(self, key: str) -> None:
        with self._cond:
            if self._chunks.pop(key, None) is None:
                self._discarded.add(key)  # dropped on arrival, should it still come
            if len(self._discarded) > 4096:
                self._discarded.clear()  # keys of sends that never came: bounded, not kept

    def connections_open(self) -> int:
        """Senders connected now (a closed connection is forgotten)."""
        with self._cond:
            return len(self._conns)

    def receive_buffer(self, nbytes: int) -> np.ndarray:
        """A receive buffer of ``nbytes``: a pooled one whose last chunk is gone (its pages already
        mapped: a fresh large buffer costs a page fault per 4 KiB), else a new one, pooled
        while the pool holds less than POOL_BYTES."""
        with self._cond:
            for buf in self._pool:
                # no chunk array views it: the pool's reference, the loop's and getrefcount's own
                if nbytes <= buf.nbytes <= 2 * nbytes and sys.getrefcount(buf) <= 3:
                    return buf[:nbytes]
            buf = np.empty(nbytes, np.uint8)
            if sum(b.nbytes for b in self._pool) + nbytes <= POOL_BYTES:
                self._pool.append(buf)
                return buf[:nbytes]
            return buf

    def held(self) -> int:
        with self._cond:
            return len(self._chunks)

    def stats(self) -> dict:
        with self._cond:
            return {"chunks": self.received, "bytes": self.bytes, "seconds": round(self.seconds, 6),
                    "MiB_per_s": round(self.bytes / self.seconds / 2**20, 1) if self.seconds > 0 else None,
                    "connections": dict(self.connections), "errors": self.errors[-3:]}

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._chunks.clear()
            self._pool.clear()
            self._cond.notify_all()
        for listener in self._listeners:
            try:
                listener.shutdown(socket.SHUT_RDWR)  # wakes its accept() (closing alone does not, on Linux)
            except OSError:
                pass
            listener.close()
        with self._cond:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _recv_exact(conn: socket.socket, n: int, into=None):
    buf = bytearray(n) if into is None else into
    view = memoryview(buf).cast("B")
    got = 0
    while got < n:
        k = conn.recv_into(view[got:], n - got)
        if k == 0:
            return None
        got += k
    return buf if into is not None else bytes(buf)
