"""The optional packages the code imports, the extra that installs each, and which of them a
pipeline's env needs: a missing one is one line naming its install command, before anything
starts (``show`` and ``train`` alike)."""

from __future__ import annotations

import importlib
import re

from tianji_dask.errors import PipelineError

#: an optional import: (the distribution it comes from, the extra of tianji-dask that installs it;
#: None: no extra, the distribution itself)
OPTIONAL = {
    "ale_py": ("ale-py", "atari"), "mujoco": ("mujoco", "mujoco"), "minatar": ("minatar", "minatar"),
    "popgym": ("popgym", "popgym"), "mpe2": ("mpe2", "marl"), "pettingzoo": ("pettingzoo", "marl"),
    "optuna": ("optuna", "sweep"), "onnx": ("onnx", "export"), "imageio": ("imageio", "video"),
    "imageio_ffmpeg": ("imageio-ffmpeg", "video"), "mlflow": ("mlflow-skinny", "mlflow"), "wandb": ("wandb", "wandb"),
    "tensorboard": ("tensorboard", None), "envpool": ("envpool", "envpool"),
}

_SPEC = re.compile(r"([A-Za-z_][\w.]*):\S")  # "module:Name" (an env id, a register spec, a base env)


def install_command(module: str) -> str:
    """``pip install 'tianji-dask[atari]'`` for an optional import's top-level module."""
    dist, extra = OPTIONAL[module.partition(".")[0]]
    return f"pip install 'tianji-dask[{extra}]'" if extra else f"pip install {dist}"


def missing(module: str) -> bool:
    """Whether importing ``module`` fails (it, or a package it needs, is not installed)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return True
    return False


def env_modules(env: dict) -> list[str]:
    """The optional modules a pipeline's ``env`` section (as given, not yet validated) needs: the
    module of a ``module:Name`` id or of ``register``, a ``module:Name`` base env among its kwargs
    (``tianji_dask.envs.onehot``), gymnasium's MuJoCo and Atari ids; with ``backend: envpool``, EnvPool
    alone (it brings its own simulators)."""
    if env.get("backend") == "envpool":
        return ["envpool"]
    specs = [env.get("id"), env.get("register"), *(env.get("kwargs") or {}).values()]
    found = [m.group(1).partition(".")[0] for spec in specs if isinstance(spec, str) and (m := _SPEC.match(spec))]
    env_id = env.get("id")
    if isinstance(env_id, str) and ":" not in env_id:
        if env_id.startswith("ALE/"):
            found.append("ale_py")
        else:
            import gymnasium as gym

            entry = getattr(gym.registry.get(env_id), "entry_point", None)
            if isinstance(entry, str) and entry.startswith("gymnasium.envs.mujoco"):
                found.append("mujoco")
    return [m for m in dict.fromkeys(found) if m in OPTIONAL]


def check_env(env) -> None:
    """PipelineError in one line when the env needs an optional package that is not installed."""
    if not isinstance(env, dict):
        return  # the section's own validation says what is wrong
    for module in env_modules(env):
        if missing(module) and module == "envpool":
            raise PipelineError(f"env.backend: envpool is not installed; allowed: {install_command(module)}")
        if missing(module):
            raise PipelineError(f"env: {env.get('id')} needs {OPTIONAL[module][0]}, which is not installed; "
                                f"allowed: {install_command(module)}")
