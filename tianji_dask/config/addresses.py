"""The network addresses a pipeline names, checked before anything connects or listens: one line
naming the value and what is allowed, rather than a traceback from deep inside distributed."""

from __future__ import annotations

import re

SCHEDULER_PROTOCOLS = ("tcp", "tls")
_HOST = r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)"  # a name, an IPv4 address, or [an IPv6 address]


def _port(text: str, lowest: int) -> int | None:
    return int(text) if text.isdigit() and lowest <= int(text) <= 65535 else None


def scheduler_address(value: str) -> str:
    """``PROTOCOL://HOST:PORT`` of a running scheduler."""
    allowed = f"allowed: PROTOCOL://HOST:PORT with PROTOCOL {' or '.join(SCHEDULER_PROTOCOLS)} and PORT 1-65535"
    m = re.fullmatch(rf"([a-z]+)://{_HOST}:(\w+)", value.strip())
    if m is None or m.group(1) not in SCHEDULER_PROTOCOLS or _port(m.group(3), 1) is None:
        raise ValueError(f"not a scheduler address ({allowed}, e.g. tcp://10.0.0.5:8786)")
    return value.strip()


def listen_address(value: str) -> str:
    """``[HOST]:PORT`` for a server this process starts (the dashboard); port 0 takes a free one."""
    m = re.fullmatch(rf"{_HOST}?:(\w+)", value.strip())
    if m is None or _port(m.group(2), 0) is None:
        raise ValueError("not a listening address (allowed: [HOST]:PORT with PORT 0-65535, e.g. :8787 or 127.0.0.1:0)")
    return value.strip()
