"""Large chunks' direct path from explorer to learner: a real socket between real processes, and
a real run whose every chunk takes it."""

import multiprocessing as mp
import socket
import sys
import threading
import time

import numpy as np
import pytest

from tianji_dask import Run
from tianji_dask.chunk import make_chunk
from tianji_dask.dataflow.direct import ChunkSink, DirectChunk, decode, encode, send_chunk, sink_host


def _chunk(t: int, n: int, dim: int, salt: int):
    rng = np.random.default_rng(salt)
    return make_chunk(obs=rng.standard_normal((t + 1, n, dim), dtype=np.float32),
                      actions=rng.integers(0, 4, (t, n)), rewards=rng.standard_normal((t, n)).astype(np.float32),
                      terminated=np.zeros((t, n), bool), truncated=np.zeros((t, n), bool), valid=np.ones((t, n), bool),
                      extras={"logprob": np.full((t, n), -0.5, np.float32)}, explorer_id=salt, policy_version=salt,
                      t_start=0.0, t_end=1.0, episodes=[(1.0, 10.0, 10)])


# (T, N, obs dim): a small chunk (packed into one buffer) and a 3 MiB one (one buffer per array)
SIZES = {"small": (16, 2, 4), "large": (128, 8, 768)}


def _sender(address, keys):
    for i, key in enumerate(keys):
        stub = send_chunk(address, key, _chunk(*SIZES["large" if i % 2 else "small"], salt=i))
        assert isinstance(stub, DirectChunk) and stub["key"] == key


LINUX = sys.platform.startswith("linux")


@pytest.mark.parametrize("way", ["unix", "tcp"])
def test_chunks_cross_processes_intact_and_a_discarded_one_is_not_kept(way):
    if way == "unix" and not LINUX:
        pytest.skip("abstract Unix sockets are Linux's")
    sink = ChunkSink("127.0.0.1")
    try:
        sink.discard("k3")  # its task was cancelled before the bytes came
        address = sink.address if way == "unix" else sink.address[:2]  # a sender on another host knows only these
        proc = mp.get_context("spawn").Process(target=_sender, args=(address, ["k0", "k1", "k2", "k3"]))
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
        while sink._conns and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not sink._conns, "the closed connection is forgotten"
        assert sink.take("never-sent", timeout=0.1) is None
    finally:
        sink.close()


def test_any_array_layout_round_trips_and_arrives_writable():
    chunk = _chunk(*SIZES["small"], salt=7)
    chunk.update(strided=np.arange(24.0, dtype=np.float32).reshape(4, 6)[:, ::2], scalar_array=np.array(5, np.int16),
                 empty=np.zeros((0, 3), np.float32), frames=np.arange(96, dtype=np.uint8).reshape(2, 3, 4, 4),
                 numpy_scalar=np.float32(2.5), objects=np.array([None, "a"], dtype=object))
    layout, parts = encode(chunk)
    body = np.frombuffer(b"".join(bytes(p) for p in parts), np.uint8).copy()
    got = decode(layout, body)
    assert type(got) is type(chunk) and got.keys() == chunk.keys()
    for name, value in chunk.items():
        if isinstance(value, np.ndarray):
            assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
            assert np.array_equal(got[name], value), name
        else:
            assert got[name] == value, name
    assert all(got[n].ctypes.data % 64 == body.ctypes.data % 64 for n in ("obs", "frames")), "arrays stay aligned"
    got["frames"][0] = 0  # the learner may write into what it received


def test_only_plain_tcp_workers_get_a_sink():
    assert sink_host("tcp://10.1.2.3:4567") == "10.1.2.3"
    assert sink_host("tcp://[::1]:4567") == "::1"
    assert sink_host("tls://10.1.2.3:4567") is None
    assert sink_host("inproc://10.1.2.3/1/2") is None


def test_a_relaxed_run_takes_every_chunk_the_direct_way(tianji_client, tmp_path):
    run = Run("cartpole_dqn", tianji_client, out=tmp_path / "direct", overrides={
        "learner.direct_chunks_min_mib": 0, "stop.max_env_steps": 30_000, "stop.target_return": None})
    results = run.start().wait()
    assert results["error"] is None and results["updates"] > 0
    direct = results["direct_chunks"]
    assert direct["min_bytes"] == 0 and not direct["errors"]
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
        first = sink._buffer(4096)
        pooled = id(first.base)
        assert id(sink._buffer(4096).base) != pooled, "in use: a chunk's arrays view it"
        view = np.ndarray((8,), np.float32, buffer=first)
        del first
        assert id(sink._buffer(4096).base) != pooled, "a view of it still lives"
        del view
        assert id(sink._buffer(3000).base) == pooled, "free again: its pages are reused"
    finally:
        sink.close()


def test_a_send_returns_only_once_the_sink_holds_the_chunk():
    # the explorer's task returns after the sink's acknowledgement, so when the learner sees the
    # task finished, the chunk's bytes are already there: take() never waits on the socket
    sink = ChunkSink("127.0.0.1")
    try:
        for i in range(5):
            send_chunk(sink.address, f"k{i}", _chunk(*SIZES["large"], salt=i))
            assert sink.take(f"k{i}", timeout=0) is not None, i
    finally:
        sink.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the abstract Unix socket is Linux's")
def test_a_unix_connection_takes_a_megabyte_chunk_in_one_write():
    # its send buffer is raised from the kernel's ~208 KiB (five writes, five hand-overs of both
    # processes' GIL for a 1 MiB chunk) to UNIX_SEND_BUFFER, or as much as the kernel allows
    from pathlib import Path

    from tianji_dask.dataflow import direct

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as plain:
        default = plain.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    sink = ChunkSink("127.0.0.1")
    conn = direct._connect(sink.address)
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
        send_chunk((host, port, f"tianji-sink-not-here-{time.time_ns()}"), "k0", _chunk(*SIZES["small"], salt=0))
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
                send_chunk(listener.getsockname()[:2], f"gone-{size}", _chunk(*SIZES[size], salt=1))
        server.join(10)
        assert not server.is_alive(), "the send was tried once more on a new connection"
