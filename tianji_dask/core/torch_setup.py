"""Per-role torch set-up (no Dask)."""

from __future__ import annotations


def prepare_torch(threads: int) -> None:
    """Set the intra-op thread count for this process (the nanny leaves it at 1).

    Note for algorithm authors: the first ``step()`` of any ``torch.optim`` optimizer imports
    ``torch._dynamo`` (and sympy), seconds on a small machine, inside the run. The bundled
    algorithms use a few-op Adam (``algos.optim.Adam``) that does not.
    """
    import torch

    torch.set_num_threads(threads)


def learner_device(name: str):
    """The torch device for ``learner.device``; RuntimeError naming the field when this machine
    cannot provide it (the learner may run on another machine than the client)."""
    import torch

    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"learner.device: {name} asked for, but torch on this machine "
                               f"({'a CPU-only build' if torch.version.cuda is None else 'no CUDA device visible'}) cannot use it")
        index = int(name.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise RuntimeError(f"learner.device: {name} asked for, but only {torch.cuda.device_count()} CUDA device(s) here")
    return torch.device(name)
