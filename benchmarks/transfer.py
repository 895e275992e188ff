"""Bandwidth of sample chunks (>= 1 MiB) moved worker to worker by Dask and by tianji_dask's
direct path, against plain socket pairs (loopback TCP, Unix) measured in the same invocation.

    python benchmarks/transfer.py [--sizes-mib 1 4 16 64] [--repeats 5] [--out benchmarks/results/transfer]

A SampleChunk of each size is made on one worker process and consumed by a task on another (one
LocalCluster, two worker processes). "Dask comm alone" sends the same chunk over one Dask TCP comm
between two processes, with no scheduler or worker around it. "Direct" is how tianji_dask moves a
large chunk: a socket to a sink thread in the receiving worker's process (an abstract Unix socket
on one host; "direct over TCP" as a sender on another host). Each round sends the chunk every way
back to back and the "per round" ratios are each round's own, against raw TCP. Writes OUT.json
(every rate) and OUT.md (the table, with what each column measures).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import ROOT, load_average, measured, write_outputs  # noqa: E402


def _make_chunk_of(mib: float, salt: int) -> dict:
    import numpy as np

    from tianji_dask.chunk import make_chunk

    t, n = 128, 16
    dim = max(1, int(mib * 2**20 / ((t + 1) * n * 4)))
    rng = np.random.default_rng(salt)
    return make_chunk(obs=rng.standard_normal((t + 1, n, dim), dtype=np.float32), actions=np.zeros((t, n), np.int64),
                      rewards=np.ones((t, n), np.float32), terminated=np.zeros((t, n), bool),
                      truncated=np.zeros((t, n), bool), valid=np.ones((t, n), bool),
                      extras={"logp": np.zeros((t, n), np.float32)}, explorer_id=0, policy_version=0,
                      t_start=0.0, t_end=0.0, episodes=[])


def _chunk_nbytes(chunk: dict) -> int:
    return chunk["nbytes"]


def _start_sink(dask_worker) -> tuple:
    """A direct-path sink in this worker's process, as a learner has one (tianji_dask/dataflow/direct/sink.py)."""
    from tianji_dask.dataflow.direct.sink import ChunkSink, sink_host

    dask_worker.bench_sink = ChunkSink(sink_host(dask_worker.address))
    return dask_worker.bench_sink.address, dask_worker.bench_sink.secret


def _send_direct(chunk: dict, address: tuple, key: str, secret: bytes) -> str:
    from tianji_dask.dataflow.direct.send import send_chunk

    send_chunk(address, key, chunk, secret=secret)
    return key


def _sink_take(key: str, dask_worker) -> tuple[int, float]:
    """(bytes, seconds from the send's start to the message received and decoded) of ``key``."""
    sink = dask_worker.bench_sink
    if sink.take(key, timeout=60) is None:
        raise RuntimeError(f"direct chunk {key} never arrived: {sink.stats()}")
    return next((nbytes, seconds) for k, nbytes, seconds in reversed(sink.recent) if k == key)


def _raw_peer(port: int, unix_name: str | None, nbytes: int) -> None:
    """Send a timestamp and ``nbytes`` on the connection each request names (b"t": TCP, b"u": Unix)."""
    import socket
    import struct

    message = bytearray(8) + os.urandom(nbytes)
    tcp = socket.create_connection(("127.0.0.1", port))
    tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    unix = None
    if unix_name is not None:
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.connect("\0" + unix_name)
    while (op := tcp.recv(1)) in (b"t", b"u"):
        conn = tcp if op == b"t" else unix
        struct.pack_into("!d", message, 0, time.time())  # the clock starts as the send does, as a direct send's
        conn.sendall(message)
    tcp.close()
    if unix is not None:
        unix.close()


class RawLoopback:
    """A plain socket pair to a spawned process, over loopback TCP and (on Linux) an abstract Unix
    socket: the raw figures the transfers are compared with. Each message is timed like a direct
    send, from the sender's clock as it starts to the last byte received here."""

    def __init__(self, nbytes: int):
        import multiprocessing as mp
        import socket

        self.nbytes = nbytes
        self._buf = bytearray(8 + nbytes)
        srv = socket.create_server(("127.0.0.1", 0))
        unix_name, usrv = None, None
        if sys.platform.startswith("linux"):
            unix_name = f"tianji-bench-{os.getpid()}-{time.time_ns()}"
            usrv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            usrv.bind("\0" + unix_name)
            usrv.listen(1)
        self._proc = mp.get_context("spawn").Process(target=_raw_peer, args=(srv.getsockname()[1], unix_name, nbytes))
        self._proc.start()
        self._conns = {"tcp": srv.accept()[0]}
        self._conns["tcp"].setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if usrv is not None:
            self._conns["unix"] = usrv.accept()[0]
            usrv.close()
        srv.close()

    def rate(self, way: str) -> float | None:
        """Bytes/s of one message over ``way`` ("tcp" or "unix"); None where there is no such way."""
        import struct

        if way not in self._conns:
            return None
        self._conns["tcp"].sendall(b"t" if way == "tcp" else b"u")
        conn, view, got = self._conns[way], memoryview(self._buf), 0
        while got < len(self._buf):
            k = conn.recv_into(view[got:], len(self._buf) - got)
            if not k:
                raise ConnectionError("raw loopback: the sender went away")
            got += k
        return self.nbytes / (time.time() - struct.unpack_from("!d", self._buf)[0])

    def close(self) -> None:
        self._conns["tcp"].sendall(b"q")
        self._proc.join(timeout=30)
        for conn in self._conns.values():
            conn.close()


def _comm_server(queue, mib: float, repeats: int) -> None:
    """Answer each request on one Dask comm with the same chunk, as a worker answers get_data."""
    import asyncio

    from distributed.comm import listen
    from distributed.protocol import to_serialize

    async def serve():
        chunk = _make_chunk_of(mib, 0)
        done = asyncio.Event()

        async def handle(comm):
            for _ in range(repeats + 1):  # one warm-up
                await comm.read()
                await comm.write({"status": "OK", "data": {"chunk": to_serialize(chunk)}})
            await comm.read()  # the client's goodbye: everything it asked for has arrived
            await comm.close()
            done.set()

        listener = listen("tcp://127.0.0.1:0", handle, deserialize=True)
        await listener.start()
        queue.put(listener.contact_address)
        await done.wait()
        listener.stop()

    asyncio.run(serve())


def dask_comm_bandwidth(mib: float, nbytes: int, repeats: int) -> list[float]:
    """Bytes/s of the chunk sent over one Dask TCP comm (msgpack framing, serialization, tornado),
    request to reply, without a scheduler or worker: Dask's transport alone."""
    import asyncio
    import multiprocessing as mp

    from distributed.comm import connect

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_comm_server, args=(queue, mib, repeats))
    proc.start()

    async def pull(address):
        comm = await connect(address)
        rates = []
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            await comm.write({"op": "get_data"})
            await comm.read()
            dt = time.perf_counter() - t0
            if i:
                rates.append(nbytes / dt)
        await comm.write("OK")
        await comm.close()
        return rates

    try:
        return asyncio.run(pull(queue.get(timeout=60)))
    finally:
        proc.join(timeout=30)


def transfer(args, argv=None) -> int:
    """Every size's rounds, then OUT.json and OUT.md (``argv``: the command's arguments, for the record)."""
    from distributed import Client, LocalCluster, wait

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)

    results = {"meta": measured("transfer.py", argv), "sizes": []}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        a, b = sorted(client.scheduler_info()["workers"])
        sink_address, sink_secret = client.run(_start_sink, workers=[b])[b]
        for mib in args.sizes_mib:
            # each round sends every way back to back, so its ratios compare the same minute of a noisy machine
            dask_rates, e2e_rates, paired = [], [], {"transfer": [], "direct": [], "direct_tcp": []}
            rates = {"direct": [], "direct_tcp": [], "raw_tcp": [], "raw_unix": []}
            raw_pair = None
            for i in range(args.repeats + 1):  # one warm-up
                x = client.submit(_make_chunk_of, mib, i, workers=[a], pure=False)
                wait(x)
                t0 = time.perf_counter()
                y = client.submit(_chunk_nbytes, x, workers=[b], pure=False)
                nbytes = y.result()
                dt = time.perf_counter() - t0
                log = client.run(lambda dask_worker: list(dask_worker.transfer_incoming_log)[-1:], workers=[b])[b]
                del y
                # direct by Unix socket (one host) and by TCP (as from another), alternately first: the first is slower
                round_rates, ways = {}, [("direct", sink_address), ("direct_tcp", tuple(sink_address[:2]))]
                for way, address in ways[::-1] if i % 2 else ways:
                    key = client.submit(_send_direct, x, address, f"{way}-{mib}-{i}", sink_secret, workers=[a],
                                        pure=False).result()
                    sent, seconds = client.run(_sink_take, key, workers=[b])[b]
                    round_rates[way] = sent / seconds
                del x
                if raw_pair is None:
                    raw_pair = RawLoopback(nbytes)
                round_rates["raw_tcp"], round_rates["raw_unix"] = raw_pair.rate("tcp"), raw_pair.rate("unix")
                if not i or not log:
                    continue
                dask_rate = log[-1]["total"] / log[-1]["duration"]
                dask_rates.append(dask_rate)
                e2e_rates.append(nbytes / dt)
                for way, rate in round_rates.items():
                    if rate is not None:
                        rates[way].append(rate)
                paired["transfer"].append(dask_rate / round_rates["raw_tcp"])
                paired["direct"].append(round_rates["direct"] / round_rates["raw_tcp"])
                paired["direct_tcp"].append(round_rates["direct_tcp"] / round_rates["raw_tcp"])
            raw_pair.close()
            comm = dask_comm_bandwidth(mib, nbytes, args.repeats)
            row = {"mib": mib, "chunk_bytes": nbytes,
                   "dask_transfer_Bps": statistics.median(dask_rates),
                   "dask_end_to_end_Bps": statistics.median(e2e_rates),
                   "dask_comm_Bps": statistics.median(comm),
                   **{f"{way}_Bps": statistics.median(v) if v else None for way, v in rates.items()},
                   **{f"{way}_Bps_all": v for way, v in rates.items()},
                   "dask_transfer_Bps_all": dask_rates, "dask_end_to_end_Bps_all": e2e_rates,
                   "dask_comm_Bps_all": comm}
            row["ratio_transfer_vs_raw"] = row["dask_transfer_Bps"] / row["raw_tcp_Bps"]
            row["ratio_comm_vs_raw"] = row["dask_comm_Bps"] / row["raw_tcp_Bps"]
            row["ratio_end_to_end_vs_raw"] = row["dask_end_to_end_Bps"] / row["raw_tcp_Bps"]
            row["ratio_direct_vs_raw"] = row["direct_Bps"] / row["raw_tcp_Bps"]
            row["ratio_transfer_vs_raw_paired"] = statistics.median(paired["transfer"])
            row["ratio_direct_vs_raw_paired"] = statistics.median(paired["direct"])
            row["ratio_direct_tcp_vs_raw_paired"] = statistics.median(paired["direct_tcp"])
            results["sizes"].append(row)
            print(f"{mib:>6g} MiB chunk, MiB/s: Dask {row['dask_transfer_Bps'] / 2**20:,.0f} (worker transfer log), "
                  f"{row['dask_end_to_end_Bps'] / 2**20:,.0f} end to end, comm alone {row['dask_comm_Bps'] / 2**20:,.0f}; "
                  f"direct {row['direct_Bps'] / 2**20:,.0f}, over TCP {row['direct_tcp_Bps'] / 2**20:,.0f}; raw TCP "
                  f"{row['raw_tcp_Bps'] / 2**20:,.0f}; direct ÷ raw TCP per round {row['ratio_direct_vs_raw_paired']:.2f}, "
                  f"over TCP {row['ratio_direct_tcp_vs_raw_paired']:.2f}", flush=True)
    results["meta"]["load_end"] = load_average()
    lines = ["# Chunk transfer through Dask vs raw loopback TCP", "",
             "Generated by `benchmarks/transfer.py`. A SampleChunk of the given size is made on one "
             "worker process and consumed by a task on another (one LocalCluster, two worker processes). "
             "\"Dask comm alone\" sends the same chunk over one Dask TCP comm "
             "between two processes, request to reply, as a worker answers `get_data` but with no scheduler, "
             "worker or task around it: the part of the gap that is Dask's transport (framing, serialization, "
             "tornado) rather than its worker-to-worker gather protocol. \"Direct path\" is how tianji_dask moves chunks "
             "of at least `learner.direct_chunks_min_mib` (default 1 MiB): the task on the first worker sends the chunk "
             "(a small pickled layout, then the arrays' own memory) over a socket to a sink thread in "
             "the second worker's process, timed from the send's start to the message received and decoded there. "
             "On Linux the sink also listens on an abstract Unix socket, which a sender on its host uses: "
             "\"direct\" is that way, as a pipeline on one host sends; \"direct over TCP\" gives the sink only its "
             "host and port, as a sender on another host knows it. Raw TCP and raw Unix send the same number of "
             "bytes between two other processes, each message timed the same way as a direct send (from the "
             "sender's clock as the send starts to the last byte received) and, like it, after a pause (the "
             "rest of the round) rather than in a stream. Each round sends the chunk once through Dask, once each "
             "way directly and once each way raw, back to back; the \"per round\" columns are the medians of each "
             "round's own ratio to raw TCP (a noisy machine changes speed between minutes). Medians of the rounds "
             "after one warm-up.", "",
             f"Command: `{results['meta']['command']}`. Machine: {results['meta']['machine']}, "
             f"{results['meta']['date']}, load average {results['meta']['load_start']} → {results['meta']['load_end']}.", "",
             "| chunk | Dask transfer (worker log) | Dask end to end (submit → result) | Dask comm alone | direct path "
             "| direct over TCP | raw TCP | raw Unix | ratio comm alone ÷ raw TCP | transfer ÷ raw TCP, per round "
             "| direct ÷ raw TCP, per round | direct over TCP ÷ raw TCP, per round |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def mibs(value):
        return "–" if value is None else f"{value / 2**20:,.0f} MiB/s"

    for r in results["sizes"]:
        lines.append(f"| {r['chunk_bytes'] / 2**20:.2f} MiB | {mibs(r['dask_transfer_Bps'])} | "
                     f"{mibs(r['dask_end_to_end_Bps'])} | {mibs(r['dask_comm_Bps'])} | {mibs(r['direct_Bps'])} | "
                     f"{mibs(r['direct_tcp_Bps'])} | {mibs(r['raw_tcp_Bps'])} | {mibs(r['raw_unix_Bps'])} | "
                     f"{r['ratio_comm_vs_raw']:.2f} | {r['ratio_transfer_vs_raw_paired']:.2f} | "
                     f"{r['ratio_direct_vs_raw_paired']:.2f} | {r['ratio_direct_tcp_vs_raw_paired']:.2f} |")
    write_outputs(args.out, results, "\n".join(lines))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", nargs="+", type=float, default=[1, 4, 16, 64])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "transfer"), help="writes OUT.json and OUT.md")
    return transfer(parser.parse_args(argv), argv)


if __name__ == "__main__":
    sys.exit(main())
