"""Per-role torch set-up (no Dask)."""

from __future__ import annotations


def prepare_torch(threads: int) -> None:
    """Set the intra-op thread count for this process (the nanny leaves it at 1).

    Note for algorithm authors: the first ``step()`` of any ``torch.optim`` optimizer imports
    ``torch._dynamo`` (and sympy), 2 s or more on a small machine, inside the run. The bundled
    algorithms use a few-op Adam (``algos.models.Adam``) that does not.
    """
    import torch

    torch.set_num_threads(threads)
