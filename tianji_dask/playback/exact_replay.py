"""Re-execute an asynchronous run exactly, in one process, from its replay log (no Dask).

The log (``replay.csv``, ``core/exact_replay_log.py``) holds, per consumed chunk in consumption order,
the explorer stream and its env instance (by seed) and chunk serial, the policy version and the
exploration settings it acted with, and the learner's update count when it was consumed. Here
each stream's envs are rebuilt from their seeds and stepped chunk by chunk in their own order,
each chunk acting with the weights of its policy version (kept while a later chunk needs them)
and its action sampling seeded as the explorer seeded it; the learner ingests the chunks in the
recorded order and makes the recorded number of updates between them. The final weights must
have the digest the run recorded.
"""

from __future__ import annotations

import csv
import json
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from tianji_dask.errors import PipelineError, TianjiError


class ReplayMismatch(TianjiError):
    """The re-execution did not reach the recorded weights; ``str()`` is one line."""


@dataclass
class Replayed:
    digest: str
    expected: str
    chunks: int
    updates: int

    @property
    def same(self) -> bool:
        return self.digest == self.expected


def _read(run_dir: Path) -> tuple[dict, list[dict]]:
    for name in ("pipeline.yaml", "results.json", "replay.csv"):
        if not (run_dir / name).is_file():
            raise PipelineError(f"run_dir: {str(run_dir)!r} has no {name}; allowed: the results directory of a "
                                "finished relaxed or lockstep run")
    try:
        results = json.loads((run_dir / "results.json").read_text())
        with open(run_dir / "replay.csv", newline="") as fh:
            rows = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(fh)]
    except (ValueError, OSError) as err:
        raise PipelineError(f"run_dir: the replay log of {str(run_dir)!r} cannot be read ({err})") from None
    meta = results.get("replay") or {}
    if not meta.get("replayable"):
        why = meta.get("why_not") or "it kept no replay log (single mode, or group mode)"
        from tianji_dask.run.legs import leg_dirs

        first = next(iter(leg_dirs(run_dir)), None)  # a resumed run's first leg is a run folder of its own
        also = f"; its first leg can be: tianji-dask replay {first}" if first and (first / "replay.csv").is_file() else ""
        raise PipelineError(f"replay: this run cannot be replayed exactly: {why}{also}")
    if results.get("learner_restarts"):
        raise PipelineError("replay: this run cannot be replayed exactly: its learner was rebuilt after a worker loss")
    if len(rows) != meta.get("rows"):
        raise PipelineError(f"replay: replay.csv has {len(rows)} rows, results.json says {meta.get('rows')}; the log was changed")
    return results, rows


def replay(run_dir: str | os.PathLike) -> Replayed:
    """Re-execute the run in ``run_dir``; ``Replayed.same`` says whether it reached the recorded
    final weights. PipelineError (one line) for a run that cannot be replayed."""
    from tianji_dask.config import load_pipeline
    from tianji_dask.core.exact_replay_log import weights_digest
    from tianji_dask.core.torch_setup import prepare_torch
    from tianji_dask.envs.rollout import Rollout
    from tianji_dask.run.checks import check_pipeline

    run_dir = Path(run_dir)
    results, rows = _read(run_dir)
    p = load_pipeline(run_dir / "pipeline.yaml")  # simulated step costs only cost time: replayed without them
    prepare_torch(p.learner.threads)
    make_algo = check_pipeline(p, has_client=False).make_algo
    policy = make_algo()  # the explorer side: acts with whatever version a chunk names
    # built last, as in its own process: building an algorithm seeds torch's global generator
    learner = make_algo()
    keys = results["replay"]["explore_keys"]
    kinds = {k: type(v) for k, v in learner.exploration(0, 0).items()}

    def explore_of(row: dict) -> dict:
        out = {}
        for i, k in enumerate(keys):
            value = row[f"explore_{i}"]
            out[k] = bool(value) if kinds.get(k) is bool else value
        return out

    # which weights each version's chunks need, and after which row they are needed no more
    last_use: dict[int, int] = {}
    for i, row in enumerate(rows):
        last_use[int(row["policy_version"])] = i
    expires = defaultdict(list)
    for version, i in last_use.items():
        expires[i].append(version)
    weights: dict[int, dict] = {}

    def keep_weights(version: int) -> None:
        if version in last_use:
            weights[version] = {k: v.copy() for k, v in learner.get_weights().items()}

    by_serial = {(int(r["stream"]), int(r["env_seed"]), int(r["stream_serial"])): r for r in rows}
    rollouts: dict[tuple[int, int], Rollout] = {}
    made: dict[tuple[int, int, int], dict] = {}
    updates = 0
    keep_weights(0)

    def produce(stream: int, seed: int, serial: int) -> dict:
        """The chunk ``serial`` of that env instance, and every earlier one not made yet."""
        if (stream, seed) not in rollouts:
            rollouts[(stream, seed)] = Rollout(p.env.id, p.env.num_envs, seed, p.env_kwargs_for(stream))
        rollout = rollouts[(stream, seed)]
        while rollout.serial <= serial:
            k = rollout.serial
            row = by_serial.get((stream, seed, k))
            if row is None:
                raise PipelineError(f"replay: chunk {k} of stream {stream} was made but never consumed "
                                    "(lost with a worker); this run cannot be replayed exactly")
            version = int(row["policy_version"])
            if version not in weights:
                raise ReplayMismatch(f"chunk {k} of stream {stream} acted with version {version}, "
                                     f"which the re-execution has not reached at update {updates}")
            policy.set_weights(weights[version])
            policy.seed_acting([rollout.seed, k])
            made[(stream, seed, k)] = rollout.run(policy, p.chunk_steps, explore_of(row), policy_version=version,
                                                  explorer_id=stream)
        return made.pop((stream, seed, serial))

    def learn() -> None:
        nonlocal updates
        try:
            learner.learn()
        except Exception as err:  # noqa: BLE001 - the run made this update; the re-execution cannot
            raise ReplayMismatch(f"update {updates + 1} failed ({type(err).__name__}: {err})") from None
        updates += 1
        keep_weights(updates)

    for i, row in enumerate(rows):
        while updates < int(row["updates_before"]):
            learn()
        chunk = produce(int(row["stream"]), int(row["env_seed"]), int(row["stream_serial"]))
        if not row["skipped"]:
            learner.ingest(chunk, updates - int(row["policy_version"]))
        for version in expires.pop(i, ()):
            weights.pop(version, None)
    while updates < int(results["updates"]):
        learn()
    for rollout in rollouts.values():
        rollout.close()
    return Replayed(weights_digest(learner.get_weights()), results["final_weights_sha256"], len(rows), updates)
