"""Per-role torch set-up (no Dask)."""

from __future__ import annotations


def prepare_torch(threads: int) -> None:
    """Set the intra-op thread count and pay torch's one-off import costs now.

    The first ``optimizer.step()`` imports ``torch._dynamo`` (and sympy with it), which takes
    2 s or more on a small machine; doing it while the learner is being built keeps that cost out
    of training time. The process-start time-to-solve still includes it.
    """
    import torch
    import torch._dynamo  # noqa: F401

    torch.set_num_threads(threads)
