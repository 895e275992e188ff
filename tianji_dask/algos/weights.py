"""Moving networks' weights about as plain CPU arrays, and building networks reproducibly (no Dask)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def seeded_init(seed: int, build):
    """Call ``build()`` with torch's global RNG seeded, restoring that RNG afterwards, so that
    making an algorithm neither depends on nor disturbs anyone else's random stream."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    """A state dict that later updates of ``module`` don't change (state_dict() shares storage)."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def weights_of(module: nn.Module, keys=None) -> dict[str, np.ndarray]:
    """Parameters and buffers (all, or those named in ``keys``) as independent CPU float32
    numpy arrays."""
    state = module.state_dict()
    keys = state.keys() if keys is None else keys
    return {k: state[k].detach().to("cpu", torch.float32).numpy().copy() for k in keys}


def load_weights(module: nn.Module, weights: dict[str, np.ndarray], keys=None) -> None:
    """Copy a ``weights_of`` dict into ``module`` in place; it must hold exactly ``keys`` (default:
    every entry of the module's state dict), with matching shapes."""
    state = module.state_dict()
    expected = set(state.keys() if keys is None else keys)
    missing = expected - weights.keys()
    extra = weights.keys() - expected
    if missing or extra:
        raise ValueError(f"weights do not match the network: missing {sorted(missing)}, unexpected {sorted(extra)}")
    with torch.no_grad():
        for k in expected:
            v = state[k]
            src = torch.as_tensor(np.asarray(weights[k]))
            if src.shape != v.shape:
                raise ValueError(f"weights[{k!r}]: shape {tuple(src.shape)} != {tuple(v.shape)}")
            v.copy_(src)
