"""Before a run's learners or explorers start: every module the pipeline names by ``module:attr``
(its algorithm, its encoder, its callbacks, its env, its env registration and wrappers) imports on
every worker, or the run stops with one line naming the field, the worker and why."""

from __future__ import annotations

from tianji_dask.callbacks.entries import parse as parse_callback
from tianji_dask.envs.wrappers import modules as wrapper_modules
from tianji_dask.errors import PipelineError


def named_modules(p) -> dict[str, str]:
    """The modules a pipeline names by ``module:attr`` that the workers will import: {module: field}."""
    named = {}
    if isinstance(p.algo.name, str) and ":" in p.algo.name:
        named[p.algo.name.partition(":")[0]] = "algo.name"
    if isinstance(p.algo.config.get("encoder"), str):
        named.setdefault(p.algo.config["encoder"].partition(":")[0], "algo.config.encoder")
    for i, entry in enumerate(p.callbacks):  # validated with the pipeline
        named.setdefault(parse_callback(entry)[0].partition(":")[0], f"callbacks[{i}]")
    env_module = str(p.env.id).partition(":")[0] if ":" in str(p.env.id) else None
    if env_module and env_module != "__main__":  # a notebook's class travels by value
        named.setdefault(env_module, "env.id")
    if p.env.register:
        named.setdefault(p.env.register.partition(":")[0], "env.register")
    for module in wrapper_modules(p.env.wrappers):
        named.setdefault(module, "env.wrappers")
    return named


def _import_errors(modules: list[str]) -> dict[str, str]:
    import importlib

    errors = {}
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as err:  # noqa: BLE001 - whatever the import raises is the reason
            errors[module] = f"{type(err).__name__}: {err}"
    return errors


def check_worker_imports(client, p) -> None:
    """PipelineError (one line) when a worker cannot import a module the pipeline names: said
    before any learner or explorer fails on it."""
    named = named_modules(p)
    if not named:
        return
    for address, errors in sorted(client.run(_import_errors, sorted(named)).items()):
        for module, why in errors.items():
            raise PipelineError(f"{named[module]}: worker {address} cannot import module {module!r} ({why}); install it "
                                "on the workers or put it on their PYTHONPATH (a class given from Python travels by value)")
