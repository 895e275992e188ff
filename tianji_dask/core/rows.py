"""An append-only table of float64 rows, bounded in memory by spilling to disk (no Dask)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


class Rows:
    """An append-only table of float64 rows: a numpy buffer, and optionally a file on disk.

    The chunk log and the episodes grow with every chunk for the whole run (they become
    chunks.csv and episodes.csv), so a row is 8 bytes a field, not a tuple of Python floats. With
    ``spill`` (a path), the
    buffer is bounded: when it fills, its older half is appended to that file as raw float64, so
    the learner's memory stays flat however long the run. Without it, the buffer doubles."""

    def __init__(self, width: int, rows: np.ndarray | None = None, *, spill: str | os.PathLike | None = None,
                 capacity: int = 8192):
        self.width = width
        self._spill = None if spill is None else Path(spill)
        self._spilled = 0
        self._spilling = True
        if self._spill is not None:
            try:
                self._spill.parent.mkdir(parents=True, exist_ok=True)
                self._spill.write_bytes(b"")  # a learner rebuilt from a checkpoint starts its file over
            except OSError:  # no writable run directory on this machine: keep every row in memory
                self._spill = None
        self._buf = np.empty((max(capacity, 2) if self._spill is not None else 1024, width))
        self._n = 0
        if rows is not None:
            self.extend(np.asarray(rows, dtype=np.float64).reshape(-1, width))

    def _reserve(self, extra: int) -> None:
        if self._n + extra <= len(self._buf):
            return
        if self._spill is not None and self._n and self._spilling:
            out = self._n - min(self._n, len(self._buf) // 2)  # keep the newer half in memory
            try:
                with open(self._spill, "ab") as f:
                    f.write(np.ascontiguousarray(self._buf[:out]).tobytes())
            except OSError:  # disk full or gone: the rows on disk stay readable, the rest stays in memory
                self._spilling = False
                return self._reserve(extra)
            self._spilled += out
            self._buf[: self._n - out] = self._buf[out: self._n]
            self._n -= out
            if self._n + extra <= len(self._buf):
                return
        bigger = np.empty((max(2 * len(self._buf), self._n + extra), self.width))
        bigger[: self._n] = self._buf[: self._n]
        self._buf = bigger

    def append(self, row) -> None:
        self._reserve(1)
        self._buf[self._n] = row
        self._n += 1

    def extend(self, rows: np.ndarray) -> None:
        self._reserve(len(rows))
        self._buf[self._n: self._n + len(rows)] = rows
        self._n += len(rows)

    def __len__(self) -> int:
        return self._spilled + self._n

    def tail(self, n: int) -> np.ndarray:
        """The last ``n`` rows (a copy)."""
        if n <= self._n or not self._spilled:
            return self._buf[max(0, self._n - n): self._n].copy()
        return self.all()[-n:]

    def all(self) -> np.ndarray:
        """Every row so far (a copy): the spilled ones read back from disk, then the buffer's."""
        mem = self._buf[: self._n]
        if not self._spilled:
            return mem.copy()
        disk = np.fromfile(self._spill, dtype=np.float64, count=self._spilled * self.width).reshape(-1, self.width)
        return np.concatenate([disk, mem])

    def in_memory_bytes(self) -> int:
        return self._buf.nbytes

    def discard(self) -> None:
        """Remove the spill file (once the rows are written elsewhere)."""
        if self._spill is not None:
            self._spill.unlink(missing_ok=True)
