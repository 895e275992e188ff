"""Algorithms: pure torch/numpy, no Dask. The bundled ones by name; a researcher's own by
``"module:Class"`` or the class itself (a subclass of ``Algorithm`` naming its hyperparameters'
pydantic model as ``Config``)."""

from __future__ import annotations

import inspect

from pydantic import BaseModel

from tianji_dask.algos.base import AlgoConfig, Algorithm
from tianji_dask.importing import load_object

ALLOWED = ("one of dqn, impala, maddpg, ppo, sac, or 'module:Class' naming a subclass of tianji_dask.Algorithm "
           "(from Python, the class itself)")


def algorithm_registry() -> dict[str, type[Algorithm]]:
    """The bundled algorithms by name."""
    from tianji_dask.algos.dqn import DQN
    from tianji_dask.algos.impala import IMPALA
    from tianji_dask.algos.maddpg import MADDPG
    from tianji_dask.algos.ppo import PPO
    from tianji_dask.algos.sac import SAC

    return {"dqn": DQN, "impala": IMPALA, "maddpg": MADDPG, "ppo": PPO, "sac": SAC}


def resolve_algorithm(name) -> type[Algorithm]:
    """The class ``name`` stands for: a bundled name, ``"module:Class"`` (imported here, so in
    each process that resolves it) or a class. ValueError, one line, when it names none, is not an
    ``Algorithm``, leaves abstract methods unwritten or names no ``Config`` model."""
    if isinstance(name, str) and ":" not in name:
        registry = algorithm_registry()
        if name not in registry:
            raise ValueError(f"must be {ALLOWED}")
        return registry[name]
    cls = load_object(name, ALLOWED) if isinstance(name, str) else name
    label = name if isinstance(name, str) else getattr(name, "__qualname__", repr(name))
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ValueError(f"{label} is not a subclass of tianji_dask.Algorithm (got {cls!r}); allowed: {ALLOWED}")
    if inspect.isabstract(cls):
        raise ValueError(f"{label} does not implement {', '.join(sorted(cls.__abstractmethods__))} (abstract in Algorithm)")
    config_model(cls)
    return cls


def config_model(cls: type[Algorithm]) -> type[BaseModel]:
    """The pydantic model of ``cls``'s hyperparameters (its ``Config``); ValueError when none."""
    cfg = getattr(cls, "Config", None)
    if not (isinstance(cfg, type) and issubclass(cfg, BaseModel)):
        raise ValueError(f"{cls.__qualname__} names no hyperparameter model: set Config = YourConfig on the class, "
                         "a pydantic model (subclass tianji_dask.AlgoConfig to refuse unknown keys)")
    return cfg


def algorithm_label(name) -> str:
    """What messages call the algorithm: its bundled name, its spec, or its class's name."""
    return name if isinstance(name, str) else name.__qualname__


def validate_config(cls: type[Algorithm], config: BaseModel | dict) -> BaseModel:
    """``config`` as ``cls.Config``. Unknown keys are refused even when the model would ignore
    them (pydantic's default), as the bundled models do: pydantic's ValidationError otherwise."""
    cfg = config_model(cls)
    if isinstance(config, cfg):
        return config
    if isinstance(config, BaseModel):
        config = config.model_dump()
    if cfg.model_config.get("extra") not in ("forbid", "allow"):
        strict = type(cfg.__name__, (cfg,), {"model_config": {**cfg.model_config, "extra": "forbid"},
                                             "__module__": cfg.__module__})
        strict.model_validate(config)  # raises, naming the unknown key
    return cfg.model_validate(config)


def make_algorithm(name, obs_space, action_space, config: BaseModel | dict, seed: int = 0) -> Algorithm:
    """The algorithm ``name`` (see ``resolve_algorithm``) built for these spaces."""
    cls = resolve_algorithm(name)
    return cls(obs_space, action_space, validate_config(cls, config), seed=seed)


__all__ = ["ALLOWED", "AlgoConfig", "Algorithm", "algorithm_label", "algorithm_registry", "config_model",
           "make_algorithm", "resolve_algorithm", "validate_config"]
