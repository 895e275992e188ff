"""Large chunks' direct path from explorer to learner: a real socket between real processes, and
a real run whose every chunk takes it."""

import json
import multiprocessing as mp
import os
import pickle
import socket
import struct
import sys
import threading
import time

import direct_peer
import numpy as np
import pytest

from tianji_dask import Run
from tianji_dask.dataflow.direct import send as direct_send
from tianji_dask.dataflow.direct import sink as direct
from tianji_dask.dataflow.direct.sink import (
    REFUSALS,
    ChunkSink,
    DirectChunk,
    Refused,
    Unencodable,
    decode,
    encode,
    sink_host,
)
from tianji_dask.dataflow.direct.send import send_chunk

_chunk = direct_peer.chunk
SIZES = direct_peer.SIZES  # (T, N, obs dim): a small chunk (packed into one buffer) and a 3 MiB one
LINUX = sys.platform.startswith("linux")


@pytest.mark.parametrize("way", ["unix", "tcp"])
def test_chunks_cross_processes_intact_and_a_discarded_one_is_not_kept(way):
    if way == "unix" and not LINUX:
        pytest.skip("abstract Unix sockets are Linux's")
    sink = ChunkSink("127.0.0.1")
    try:
        sink.discard("k3")  # its task was cancelled before the bytes came
        address = sink.address if way == "unix" else sink.address[:2]  # a sender on another host knows only these
        # a process of its own, as an explorer's: it imports only the sending side (direct_peer)
        proc = mp.get_context("spawn").Process(target=direct_peer.sender,
                                               args=(address, sink.secret, ["k0", "k1", "k2", "k3"]))
        proc.start()
        for i, key in enumerate(["k0", "k1", "k2"]):
            got = sink.take(key, timeout=60)
            want = _chunk(*SIZES["large" if i % 2 else "small"], salt=i)
            assert got is not None, key
            assert got.keys() == want.keys()
            for name, value in want.items():
                if isinstance(value, np.ndarray):
                    assert got[name].dtype == value.dtype and np.array_equal(got[name], value), name
                else:
                    assert got[name] == value, name
            got["obs"][0] = 0  # the learner may write into what it received
        proc.join(60)
        assert proc.exitcode == 0
        stats = sink.stats()
        assert stats["chunks"] == 4 and stats["bytes"] > 2 * 3 * 2**20 and not stats["errors"]
        assert stats["connections"] == {"unix": int(way == "unix"), "tcp": int(way == "tcp")}, "one connection, this way"
        assert sink.held() == 0, "the discarded chunk was dropped on arrival"
        deadline = time.monotonic() + 10
        while sink.connections_open() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not sink.connections_open(), "the closed connection is forgotten"
        assert sink.take("never-sent", timeout=0.1) is None
        assert sink.refusals() == dict.fromkeys(REFUSALS, 0)
    finally:
        sink.close()


def test_any_array_layout_round_trips_and_arrives_writable():
    chunk = _chunk(*SIZES["small"], salt=7)
    chunk.update(strided=np.arange(24.0, dtype=np.float32).reshape(4, 6)[:, ::2], scalar_array=np.array(5, np.int16),
                 empty=np.zeros((0, 3), np.float32), frames=np.arange(96, dtype=np.uint8).reshape(2, 3, 4, 4),
                 numpy_scalar=np.float32(2.5), flag=True, note="text", nothing=None, big_endian=np.arange(3, dtype=">i4"))
    description, parts = encode(chunk)
    body = np.frombuffer(b"".join(bytes(p) for p in parts), np.uint8).copy()
    got = decode(description, body)
    assert type(got) is type(chunk) and got.keys() == chunk.keys()
    for name, value in chunk.items():
        if isinstance(value, np.ndarray):
            assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
            assert np.array_equal(got[name], value), name
        else:
            assert type(got[name]) is type(value) and got[name] == value, name
    assert all(got[n].ctypes.data % 64 == body.ctypes.data % 64 for n in ("obs", "frames")), "arrays stay aligned"
    got["frames"][0] = 0  # the learner may write into what it received


def test_only_plain_tcp_workers_get_a_sink():
    assert sink_host("tcp://10.1.2.3:4567") == "10.1.2.3"
    assert sink_host("tcp://[::1]:4567") == "::1"
    assert sink_host("tls://10.1.2.3:4567") is None
    assert sink_host("inproc://10.1.2.3/1/2") is None


def test_a_relaxed_run_takes_every_chunk_the_direct_way(tianji_client, tmp_path):
    run = Run("cartpole_dqn", tianji_client, out=tmp_path / "direct", overrides={
        "learner.direct_chunks_min_mib": 0, "stop.max_env_steps": 8_192, "stop.target_return": None})
    results = run.start().wait()
    assert results["error"] is None and results["updates"] > 0
    direct = results["direct_chunks"]
    assert direct["min_bytes"] == 0 and not direct["errors"]
    assert results["direct_refused"] == dict.fromkeys(REFUSALS, 0), "every explorer showed the run's secret"
    assert json.loads((run.out / "results.json").read_text())["direct_refused"] == results["direct_refused"]
    # explorers and learner share this host: on Linux every connection is the abstract Unix
    # socket's, elsewhere TCP's
    ways = direct["connections"]
    assert (ways["tcp"], ways["unix"] >= 1) == (0, True) if LINUX else (ways["unix"], ways["tcp"] >= 1) == (0, True)
    # every chunk the learner consumed came over the socket (stop may catch a few more in the air)
    assert results["chunks"] > 0 and direct["chunks"] >= results["chunks"]
    p = run.pipeline  # at least each chunk's float32 observations (T + 1 steps of 4 numbers per env)
    assert direct["bytes"] >= results["chunks"] * p.env.num_envs * (p.chunk_steps + 1) * 4 * 4
    # taking them is timed as its own part; near zero (it may round to 0 s), as a finished task
    # means the sink already holds the bytes
    assert "receive" in results["learner_time"]["seconds"]
    assert all("stop" in row["reason"] for row in results["lost"]), results["lost"]


def test_receive_buffers_are_reused_only_once_no_chunk_views_them():
    sink = ChunkSink("127.0.0.1")
    try:
        first = sink.receive_buffer(4096)
        pooled = id(first.base)
        assert id(sink.receive_buffer(4096).base) != pooled, "in use: a chunk's arrays view it"
        view = np.ndarray((8,), np.float32, buffer=first)
        del first
        assert id(sink.receive_buffer(4096).base) != pooled, "a view of it still lives"
        del view
        assert id(sink.receive_buffer(3000).base) == pooled, "free again: its pages are reused"
    finally:
        sink.close()


def test_a_send_returns_only_once_the_sink_holds_the_chunk():
    # the explorer's task returns after the sink's acknowledgement, so when the learner sees the
    # task finished, the chunk's bytes are already there: take() never waits on the socket
    sink = ChunkSink("127.0.0.1")
    try:
        for i in range(5):
            send_chunk(sink.address, f"k{i}", _chunk(*SIZES["large"], salt=i), secret=sink.secret)
            assert sink.take(f"k{i}", timeout=0) is not None, i
    finally:
        sink.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the abstract Unix socket is Linux's")
def test_a_unix_connection_takes_a_megabyte_chunk_in_one_write():
    # its send buffer is raised from the kernel's ~208 KiB (five writes, five hand-overs of both
    # processes' GIL for a 1 MiB chunk) to UNIX_SEND_BUFFER, or as much as the kernel allows
    from pathlib import Path

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as plain:
        default = plain.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    sink = ChunkSink("127.0.0.1")
    conn = direct_send.connect(sink.address, sink.secret)
    try:
        assert conn.family == socket.AF_UNIX
        got = conn.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        cap = Path("/proc/sys/net/core/wmem_max")
        want = min(direct.UNIX_SEND_BUFFER, int(cap.read_text())) if cap.exists() else direct.UNIX_SEND_BUFFER
        assert got > default, (got, default)  # the kernel doubles what it is given, up to its cap
        assert got >= want, (got, want)
    finally:
        conn.close()
        sink.close()


def test_a_sender_that_cannot_reach_the_unix_socket_falls_back_to_tcp():
    # as on another host: the abstract name does not exist there, so the connection goes over TCP
    sink = ChunkSink("127.0.0.1")
    try:
        host, port, _ = sink.address
        send_chunk((host, port, f"tianji-sink-not-here-{time.time_ns()}"), "k0", _chunk(*SIZES["small"], salt=0),
                   secret=sink.secret)
        assert sink.take("k0", timeout=0) is not None
        assert sink.stats()["connections"] == {"unix": 0, "tcp": 1}
    finally:
        sink.close()


def _closing_server(listener, accepts):
    for _ in range(accepts):
        conn, _ = listener.accept()
        conn.recv(1 << 16)
        conn.close()  # takes the chunk's first 64 KiB, then goes away without acknowledging it


def test_a_send_to_a_sink_that_goes_away_fails_its_task():
    # the task fails (Dask retries it, or the learner reports it lost) instead of returning a stub
    # whose bytes never come
    with socket.create_server(("127.0.0.1", 0)) as listener:
        server = threading.Thread(target=_closing_server, args=(listener, 4), daemon=True)
        server.start()
        for size in ("small", "large"):  # the small one is taken whole before the sink goes away
            with pytest.raises(OSError):
                send_chunk(listener.getsockname()[:2], f"gone-{size}", _chunk(*SIZES[size], salt=1),
                           secret=bytes(direct.SECRET_BYTES))
        server.join(10)
        assert not server.is_alive(), "the send was tried once more on a new connection"


# ---- the trust boundary: strangers on the sink's port ---------------------------------------------
HEAD = struct.Struct("!4sIQd")  # the wire's per-message header, as a stranger would pack it


def _wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _stranger(sink, data: bytes, unix: bool = False) -> bytes:
    """Connect as a peer that is not an explorer, send ``data``, end its side and return what the
    sink answers before it closes the connection (b"" when it answers nothing)."""
    if unix:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect("\0" + sink.address[2])
    else:
        conn = socket.create_connection(sink.address[:2])
    with conn:
        conn.settimeout(10)
        try:
            conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := conn.recv(1 << 16):
                answer += chunk
        except TimeoutError:
            raise AssertionError("the sink left a stranger's connection open") from None
        except OSError:  # closed with our bytes unread: a reset, not a FIN (perhaps before we finished)
            answer = b""
        return answer


def _message(description: bytes, body: bytes = b"", magic: bytes = b"TJC1") -> bytes:
    return HEAD.pack(magic, len(description), len(body), time.time()) + description + body


def _description(key: str, fields: list, values: dict | None = None) -> bytes:
    return json.dumps({"key": key, "type": "SampleChunk", "fields": fields, "values": values or {}}).encode()


def test_strangers_are_refused_and_counted_while_an_explorers_chunk_arrives_intact(tmp_path):
    sink = ChunkSink("127.0.0.1")
    secret = sink.secret
    try:
        want = _chunk(*SIZES["large"], salt=3)
        send_chunk(sink.address, "before", want, secret=secret)
        bool_field = [{"name": "valid", "dtype": "|b1", "shape": [4]}]
        # a pickle that creates a file when loaded: what the old layout format would have run
        marker = tmp_path / "pwned"
        gadget = pickle.dumps(_FileMaker(str(marker)))
        strangers = {
            "no_secret": [b""],
            "bad_secret": [bytes(direct.SECRET_BYTES), os.urandom(4096),
                           b"GET / HTTP/1.1\r\nHost: learner\r\nAccept: */*\r\n\r\n"],
            "oversized": [secret + HEAD.pack(b"TJC1", 2**31, 0, 0.0), secret + HEAD.pack(b"TJC1", 2, 2**40, 0.0)],
            "bad_header": [
                secret + os.urandom(4096),  # garbage after the secret
                secret + struct.pack("!HIQd", 3, len(gadget), 0, 0.0) + b"key" + gadget,  # the old format
                secret + _message(gadget),  # a pickle where the JSON goes
                secret + _message(_description("evil", [{"name": "o", "dtype": "|O", "shape": [2]}]), bytes(64)),
                secret + _message(_description("evil", [{"name": "v", "dtype": "|V8", "shape": [1]}]), bytes(64)),
                secret + _message(_description("evil", bool_field), bytes(128)),  # body longer than its fields
                secret + _message(_description("evil", [{"name": "x", "dtype": "<f4", "shape": [2**40, 2**40]}])),
                secret + _message(_description("evil", [], {"nested": {"a": 1}})),
                secret + _message(json.dumps({"key": "evil", "type": "os.system", "fields": [], "values": {}}).encode()),
                secret + _message(b"[" * 100_000),
            ],
            "malformed_body": [secret + _message(_description("evil", bool_field), bytes([0, 1, 7, 0]) + bytes(60))],
        }
        for reason, attempts in strangers.items():
            for data in attempts:
                assert _stranger(sink, data) == b"", (reason, data[:80])  # closed, never acknowledged
        counts = {reason: len(attempts) for reason, attempts in strangers.items()}
        if LINUX:  # the same-host way in asks for the same secret
            assert _stranger(sink, os.urandom(64), unix=True) == b""
            counts["bad_secret"] += 1
        _wait_for(lambda: sink.refusals() == {**dict.fromkeys(REFUSALS, 0), **counts})
        assert not marker.exists(), "the pickle was loaded"
        assert sink.take("evil", timeout=0) is None, "nothing from a refused connection is kept"
        send_chunk(sink.address, "after", want, secret=secret)
        for key in ("before", "after"):
            got = sink.take(key, timeout=10)
            assert got is not None and got.keys() == want.keys(), key
            assert all(np.array_equal(got[k], v) if isinstance(v, np.ndarray) else got[k] == v for k, v in want.items())
        stats = sink.stats()
        assert stats["chunks"] == 2 and not stats["errors"]
        showed_secret = sum(counts[reason] for reason in ("oversized", "bad_header", "malformed_body"))
        assert sum(stats["connections"].values()) == 1 + showed_secret, "a connection counts once it shows the secret"
    finally:
        sink.close()


class _FileMaker:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")  # unpickling this opens (so creates) the file


def test_the_pickle_path_is_gone(tmp_path):
    # the gadget does run when unpickled (so the test means something), but decode only parses JSON
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(_FileMaker(str(control)))).close()
    assert control.exists()
    marker = tmp_path / "pwned"
    gadget = pickle.dumps(_FileMaker(str(marker)), protocol=5)
    with pytest.raises(Refused) as refused:
        decode(gadget, np.zeros(0, np.uint8))
    assert refused.value.reason == "bad_header" and not marker.exists()
    assert not hasattr(direct, "pickle") and not hasattr(direct_send, "pickle"), "the direct path does not import pickle"


def test_a_sender_without_the_right_secret_fails_its_task_and_a_silent_stranger_is_dropped():
    sink = ChunkSink("127.0.0.1", hello_timeout_s=0.2)
    try:
        with pytest.raises(OSError):
            send_chunk(sink.address, "k0", _chunk(*SIZES["small"], salt=0), secret=os.urandom(direct.SECRET_BYTES))
        assert sink.take("k0", timeout=0.1) is None
        # part of a secret, then silence: closed once the hello times out
        assert _stranger_silent(sink, sink.secret[:5]) == b""
        # the send and its one retry: two wrong secrets
        _wait_for(lambda: sink.refusals() == {**dict.fromkeys(REFUSALS, 0), "no_secret": 1, "bad_secret": 2})
    finally:
        sink.close()


def _stranger_silent(sink, data: bytes) -> bytes:
    with socket.create_connection(sink.address[:2]) as conn:
        conn.settimeout(10)
        conn.sendall(data)  # and keeps the connection open, saying nothing more
        try:
            return conn.recv(1)
        except TimeoutError:
            raise AssertionError("the sink left a silent stranger's connection open") from None
        except OSError:  # a reset
            return b""


def test_what_the_format_cannot_carry_is_not_sent():
    chunk = _chunk(*SIZES["small"], salt=1)
    for name, value in {"objects": np.array([None, "a"], dtype=object), "a_list": [1, 2],
                        "when": np.array(["2024-01-01"], dtype="datetime64[D]")}.items():
        with pytest.raises(Unencodable):
            encode({**chunk, name: value})
    with pytest.raises(Unencodable):
        encode(DirectChunk(chunk))  # only a dict or a SampleChunk
