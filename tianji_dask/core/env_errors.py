"""What the run's envs raised while they were made, reset or stepped, as the learner hears of it
(no Dask): each error is one lost chunk (its stream's envs are rebuilt and the run goes on), counted
here with the first and the last line for the results, a bounded set of tracebacks for the run's
``env_errors.txt``, and ``env.max_errors`` judged: more errors than that within 60 s, all streams
together, stop the run. (A stream that fails every chunk stops it sooner, after
``stop.max_explorer_failures`` in a row: the stream's own count, for any explorer failure.)"""

from __future__ import annotations

import time
from collections import deque
from datetime import datetime

WINDOW_S = 60.0
KEEP_TRACEBACKS = 10  # the first this many, and the last this many
FILE = "env_errors.txt"


class EnvErrors:
    def __init__(self, max_errors: int | None = None):
        self.max_errors = max_errors
        self.count = 0
        self.first: str | None = None
        self.last: str | None = None
        self.per_stream: dict[int, int] = {}
        self._recent: deque[float] = deque()  # when the errors of the last WINDOW_S happened
        self._first_entries: list[str] = []
        self._last_entries: deque[str] = deque(maxlen=KEEP_TRACEBACKS)

    def record(self, stream: int, line: str, detail: str | None, now: float | None = None) -> str | None:
        """Book one error of ``stream`` (``line``: one line; ``detail``: its traceback). The line
        that stops the run when ``max_errors`` is exceeded within ``WINDOW_S``, else None."""
        now = time.time() if now is None else now
        self.count += 1
        self.per_stream[stream] = self.per_stream.get(stream, 0) + 1
        self.first = self.first or line
        self.last = line
        stamp = datetime.fromtimestamp(now).isoformat(timespec="milliseconds")
        entry = f"[{stamp}] error {self.count}, explorer stream {stream}: {line}\n{(detail or '(no traceback)').rstrip()}\n"
        (self._first_entries if len(self._first_entries) < KEEP_TRACEBACKS else self._last_entries).append(entry)
        self._recent.append(now)
        while self._recent and self._recent[0] <= now - WINDOW_S:
            self._recent.popleft()
        if self.max_errors is not None and len(self._recent) > self.max_errors:
            return (f"env: {len(self._recent)} env errors within {WINDOW_S:g} s, more than env.max_errors "
                    f"({self.max_errors}); last: {line}")
        return None

    def text(self) -> str | None:
        """What ``env_errors.txt`` says: the kept tracebacks, and how many between were not kept."""
        if not self.count:
            return None
        left_out = self.count - len(self._first_entries) - len(self._last_entries)
        gap = [f"... {left_out} errors not kept here ...\n"] if left_out else []
        return "\n".join([*self._first_entries, *gap, *self._last_entries])

    def summary(self) -> dict:
        """The results' ``env_errors``; ``tracebacks`` (the file's text) goes to ``env_errors.txt``
        when the results are written (``metrics.write_results``)."""
        return {"count": self.count, "first": self.first, "last": self.last,
                "per_stream": {str(s): n for s, n in sorted(self.per_stream.items())}, "max_errors": self.max_errors,
                "tracebacks": self.text()}


def pooled(per: list[dict | None]) -> dict | None:
    """Group mode: the groups' ``env_errors`` as one (counts summed, the first group's first line,
    the last group's last, their tracebacks one after the other); each group's own keeps no text."""
    found = [(g, e) for g, e in enumerate(per) if e]
    if not found:
        return None
    with_errors = [(g, e) for g, e in found if e["count"]]
    texts = [f"group {g}:\n{e['tracebacks']}" for g, e in with_errors if e.get("tracebacks")]
    per_stream: dict[str, int] = {}
    for _, e in found:
        for s, n in e["per_stream"].items():
            per_stream[s] = per_stream.get(s, 0) + n
    out = {"count": sum(e["count"] for _, e in found), "first": with_errors[0][1]["first"] if with_errors else None,
           "last": with_errors[-1][1]["last"] if with_errors else None, "per_stream": per_stream,
           "max_errors": found[0][1]["max_errors"], "tracebacks": "\n".join(texts) or None}
    for _, e in found:
        e.pop("tracebacks", None)
    return out

