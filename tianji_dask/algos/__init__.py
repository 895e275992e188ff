"""Algorithms: pure torch/numpy, no Dask."""

from __future__ import annotations

from tianji_dask.algos.base import AlgoConfig, Algorithm


def algorithm_registry() -> dict[str, tuple[type[Algorithm], type[AlgoConfig]]]:
    from tianji_dask.algos.dqn import DQN, DQNConfig
    from tianji_dask.algos.impala import IMPALA, IMPALAConfig
    from tianji_dask.algos.maddpg import MADDPG, MADDPGConfig
    from tianji_dask.algos.ppo import PPO, PPOConfig
    from tianji_dask.algos.sac import SAC, SACConfig

    return {"dqn": (DQN, DQNConfig), "impala": (IMPALA, IMPALAConfig), "maddpg": (MADDPG, MADDPGConfig),
            "ppo": (PPO, PPOConfig), "sac": (SAC, SACConfig)}


def make_algorithm(name: str, obs_space, action_space, config: AlgoConfig | dict, seed: int = 0) -> Algorithm:
    cls, cfg_cls = algorithm_registry()[name]
    if not isinstance(config, cfg_cls):
        config = cfg_cls.model_validate(config)
    return cls(obs_space, action_space, config, seed=seed)


__all__ = ["AlgoConfig", "Algorithm", "algorithm_registry", "make_algorithm"]
