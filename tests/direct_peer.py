"""The explorer's side of test_direct's cross-process test, in a module of its own: a spawned
process imports only this (numpy and the direct path), not the test module's run machinery."""

from __future__ import annotations

import numpy as np

from tianji_dask.chunk import make_chunk
from tianji_dask.dataflow.direct.send import send_chunk
from tianji_dask.dataflow.direct.sink import DirectChunk

# (T, N, obs dim): a small chunk (packed into one buffer) and a 3 MiB one (one buffer per array)
SIZES = {"small": (16, 2, 4), "large": (128, 8, 768)}


def chunk(t: int, n: int, dim: int, salt: int):
    rng = np.random.default_rng(salt)
    return make_chunk(obs=rng.standard_normal((t + 1, n, dim), dtype=np.float32),
                      actions=rng.integers(0, 4, (t, n)), rewards=rng.standard_normal((t, n)).astype(np.float32),
                      terminated=np.zeros((t, n), bool), truncated=np.zeros((t, n), bool), valid=np.ones((t, n), bool),
                      extras={"logprob": np.full((t, n), -0.5, np.float32)}, explorer_id=salt, policy_version=salt,
                      t_start=0.0, t_end=1.0, episodes=[(1.0, 10.0, 10)])


def sender(address, secret, keys):
    """Send chunk i under keys[i], small and large in turn, as an explorer's process does."""
    for i, key in enumerate(keys):
        stub = send_chunk(address, key, chunk(*SIZES["large" if i % 2 else "small"], salt=i), secret=secret)
        assert isinstance(stub, DirectChunk) and stub["key"] == key
