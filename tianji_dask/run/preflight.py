"""The env's pre-flight before a run trains: the env is made as the explorers will make it, reset
and stepped with a random action, and checked by gymnasium's env checker (``env.check``;
``envs/check.py``), once in the driver (``check_driver``, from the run's checks, before any
cluster starts) and once on an explorer worker (``check_worker``, from the Dask backend's start,
right after the workers' imports), where its spaces must be the driver's. A failure is one
PipelineError line naming the env, where it failed (the driver or which worker) and what it
raised; the checker's warnings are one line on the ``tianji_dask.preflight`` logger (none for
gymnasium's own envs, whose warnings are gymnasium's to fix)."""

from __future__ import annotations

import logging

from tianji_dask.dataflow.keys import preflight_key
from tianji_dask.envs.check import EnvCheckError, probe_env, probe_pickled
from tianji_dask.errors import PipelineError, first_line

logger = logging.getLogger("tianji_dask.preflight")
WORKER_TIMEOUT_S = 120
WARNINGS_CHARS = 600
CREATING = ("make", "make_vec")


def _failed(p, where: str, err: str, stage: str | None) -> PipelineError:
    if stage in CREATING:
        what = err.partition(" raised ")[2] or err
        return PipelineError(f"env: cannot create {p.env.id} with kwargs {dict(p.env.kwargs)} {where}: {what}")
    return PipelineError(f"env: {p.env.id} failed its pre-flight {where}: {err}")


def _gymnasiums_own(env_id) -> bool:
    entry = getattr(getattr(env_id, "spec", None), "entry_point", None)
    return isinstance(entry, str) and entry.startswith("gymnasium.envs.")


def _report(p, warnings: list[str], where: str) -> None:
    if warnings and p.env.check and not _gymnasiums_own(p.env.id):
        text = "; ".join(warnings)
        text = text if len(text) <= WARNINGS_CHARS else text[:WARNINGS_CHARS] + " ..."
        logger.warning("tianji: env %s %s: gymnasium's env checker warns (%d): %s", p.env.id, where, len(warnings), text)


def check_driver(p):
    """The env's pre-flight in this process; its spaces and the checker's warnings. A run on a
    cluster also needs the env to pickle (cloudpickle, as Dask sends it) to reach the workers."""
    try:
        probe = probe_env(p.env.id, p.env.kwargs, check=p.env.check, seed=p.seed)
    except EnvCheckError as err:
        raise _failed(p, "in the driver", str(err), err.stage) from None
    if p.mode != "single":
        import cloudpickle

        try:
            cloudpickle.dumps(p.env.id)
        except Exception as err:  # noqa: BLE001
            raise PipelineError(f"env.id: {p.env.id} cannot be pickled to reach the workers ({first_line(err)})") from None
    _report(p, probe.warnings, "in the driver")
    return probe.spaces, probe.warnings


def _explorer_worker(client, hosts) -> str | None:
    workers = client.scheduler_info(n_workers=-1)["workers"]
    found = sorted(a for a, w in workers.items() if w.get("resources", {}).get("EXPLORER") and (hosts is None or a in hosts))
    return found[0] if found else None


def check_worker(client, plan) -> None:
    """The env's pre-flight on one explorer worker of ``plan``'s run: PipelineError (one line)
    when it fails there, or makes other spaces than the driver's (``plan.prepared``)."""
    import cloudpickle

    p = plan.pipeline
    address = _explorer_worker(client, plan.explorer_hosts)
    if address is None:
        return
    future = client.submit(probe_pickled, cloudpickle.dumps(p.env.id), dict(p.env.kwargs), p.env.check, p.seed,
                           key=preflight_key(plan.run_id), resources={"EXPLORER": 1}, workers=[address],
                           pure=False)
    where = f"on worker {address}"
    try:
        report = future.result(timeout=WORKER_TIMEOUT_S)
    except TimeoutError:
        client.cancel([future])
        raise PipelineError(f"env: the pre-flight of {p.env.id} {where} did not finish within {WORKER_TIMEOUT_S} s") from None
    except Exception as err:  # noqa: BLE001 - the worker died under it
        raise PipelineError(f"env: the pre-flight of {p.env.id} {where} failed ({first_line(err)})") from None
    if report["error"] is not None:
        raise _failed(p, where, report["error"], report.get("stage"))
    spaces = tuple(report["spaces"])
    if spaces != tuple(plan.prepared.env_spaces):
        raise PipelineError(f"env: {p.env.id} has other spaces {where} ({spaces[0]}, {spaces[1]}) than in the driver "
                            f"({plan.prepared.env_spaces[0]}, {plan.prepared.env_spaces[1]}); allowed: the same env and "
                            "packages on every machine")
    _report(p, [w for w in report["warnings"] if w not in plan.prepared.env_warnings], where)
