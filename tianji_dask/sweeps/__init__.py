"""Sweeps on one cluster: Optuna studies (``sweep``) and population-based training (``pbt``)."""

from tianji_dask.sweeps.driver import sweep

__all__ = ["sweep"]
