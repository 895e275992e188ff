"""Explorer side of the direct path (see ``sink.py``): one connection per process and sink,
over the Unix socket on the sink's own host, else TCP; a chunk goes as one scatter-gather write
and the task returns only once the sink acknowledges it holds the bytes."""

from __future__ import annotations

import socket
import threading
import time

from tianji_dask.dataflow.direct.sink import ACK, UNIX_SEND_BUFFER, DirectChunk
from tianji_dask.dataflow.direct.wire import HEAD, MAGIC, SECRET_BYTES, Unencodable, encode  # noqa: F401 - Unencodable: the senders' to catch


def _send_all(conn: socket.socket, parts: list) -> None:
    """Send every part, in order, in as few system calls as the socket takes (scatter-gather)."""
    views = [v for v in (p if isinstance(p, memoryview) else memoryview(p) for p in parts) if v.nbytes]
    while views:
        sent = conn.sendmsg(views[:512])
        while sent and sent >= views[0].nbytes:
            sent -= views[0].nbytes
            views.pop(0)
        if sent:
            views[0] = views[0][sent:]


_connections: dict[tuple, socket.socket] = {}
_lock = threading.Lock()


def connect(address: tuple, secret: bytes) -> socket.socket:
    """A connection to the sink at (host, port[, Unix socket name]), the secret already sent: the
    Unix socket where it can be reached (the sink's own host), else TCP."""
    host, port, *local = address
    if local and local[0] and hasattr(socket, "AF_UNIX"):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.settimeout(30)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UNIX_SEND_BUFFER)
            conn.connect("\0" + local[0])
            conn.sendall(secret)
            return conn
        except OSError:  # another host (or network namespace): no such socket here
            conn.close()
    conn = socket.create_connection((host, port), timeout=30)
    try:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(secret)
    except OSError:
        conn.close()
        raise
    return conn


def send_chunk(address: tuple, key: str, chunk: dict, *, secret: bytes) -> DirectChunk:
    """Send ``chunk`` to the sink at ``address`` (a ``ChunkSink.address``, or just its host and
    port for TCP only) under ``key`` and wait for its acknowledgement; return the stub the task
    returns. ``secret`` is the sink's. A broken connection is reopened and the chunk sent once more
    (a second copy replaces the first); a second failure, or no answer within 30 s, raises: the
    task fails, and Dask's retry or the learner's lost-chunk accounting takes over. Raises
    ``Unencodable``, before connecting, for a chunk the wire format cannot carry."""
    t_send = time.time()
    description, body = encode(chunk, key)
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"direct send: the sink's secret is {SECRET_BYTES} bytes, got {len(secret)}")
    body_len = sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in body)
    parts = [HEAD.pack(MAGIC, len(description), body_len, t_send) + description, *body]
    address = tuple(address)
    with _lock:
        for attempt in (0, 1):
            conn = _connections.get((address, secret))
            try:
                if conn is None:
                    conn = _connections[address, secret] = connect(address, secret)
                _send_all(conn, parts)
                if conn.recv(1) != ACK:
                    raise ConnectionError("direct send: the sink closed the connection before it held the chunk")
                break
            except OSError:
                _connections.pop((address, secret), None)
                if conn is not None:
                    conn.close()
                if attempt:
                    raise
    return DirectChunk(key=key)
