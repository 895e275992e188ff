"""The numeric guard: nothing non-finite is trained on further, published or checkpointed (no Dask)."""

from __future__ import annotations

import math

import numpy as np

from tianji_dask.errors import TianjiError


class NumericFault(TianjiError, RuntimeError):
    """A non-finite loss or weights: the run stops and nothing non-finite is published."""


def all_finite(weights: dict) -> bool:
    """True when every array of a weights dict is finite."""
    return all(np.isfinite(np.asarray(w)).all() for w in weights.values())


def check_metrics(metrics: dict, version: int) -> None:
    """Raise NumericFault naming the non-finite metrics of the update that made ``version``."""
    bad = [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        raise NumericFault(f"numeric: non-finite {', '.join(bad)} at version {version}; the run stops, "
                           f"the last good checkpoint is kept")


def check_weights(weights: dict, version: int, published: bool = False) -> dict:
    """``weights`` if all finite; else NumericFault (they are neither published nor checkpointed)."""
    if not all_finite(weights):
        raise NumericFault(f"numeric: non-finite weights at version {version}; {'not published, ' if published else ''}"
                           f"the run stops, the last good checkpoint is kept")
    return weights
