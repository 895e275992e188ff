"""A client of an existing Dask scheduler (``cluster.kind: address``, ``--scheduler``), or one line
saying why there is none: a host that does not resolve, nobody listening, no answer, or an answer
that is not a Dask scheduler's."""

from __future__ import annotations

from distributed import Client

CONNECT_TIMEOUT_S = 10


def connect(address: str, security=None, timeout: float = CONNECT_TIMEOUT_S, *, field: str = "cluster.address",
            hint: str = "allowed: the address of a running Dask scheduler") -> Client:
    """A client of the scheduler at ``address``, or PipelineError in one line within ``timeout``
    (``field``: why ``at`` the address; ``hint``): a host that does not resolve or a port nobody
    listens on says so at once."""
    import socket
    from urllib.parse import urlsplit

    from tianji_dask.errors import PipelineError

    def fail(why: str):
        raise PipelineError(f"{field}: {why} at {address}; {hint}")

    parts = urlsplit(address)
    try:
        socket.create_connection((parts.hostname, parts.port), timeout=timeout).close()
    except socket.gaierror:
        fail(f"the host {parts.hostname!r} does not resolve")
    except ConnectionRefusedError:
        fail("nothing listens")
    except OSError as err:  # unreachable, timed out
        fail(f"no answer within {timeout:g} s ({err.strerror or type(err).__name__})")
    # a Client's own timeout does not bound the handshake: a port that accepts and never answers
    # would hold it for as long as the peer keeps the connection open
    try:
        identity = _identity(address, security, timeout)
    except (OSError, TimeoutError):
        fail(f"no Dask scheduler answered within {timeout:g} s")
    except Exception as err:  # noqa: BLE001 - whatever answered does not speak Dask's protocol
        fail(f"what answered is not a Dask scheduler ({type(err).__name__})")
    if not isinstance(identity, dict) or identity.get("type") != "Scheduler":
        fail("what answered is not a Dask scheduler")
    return Client(address, security=security, timeout=timeout)


def _identity(address: str, security, timeout: float) -> dict:
    """The scheduler's answer to ``identity``, within ``timeout``; in a thread of its own, so that
    a caller inside an event loop (Jupyter) can wait for it."""
    import asyncio
    import concurrent.futures

    from distributed.comm import connect

    async def ask():
        args = security.get_connection_args("client") if security is not None else {}
        comm = await connect(address, timeout=timeout, **args)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, asyncio.wait_for(ask(), timeout)).result()
