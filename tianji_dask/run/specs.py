"""From a checked pipeline to what each role is built from: the controller's law, the learner
core's spec, the learner actor's spec, and where each group writes its files."""

from __future__ import annotations

import functools
from pathlib import Path

from tianji_dask.callbacks.runner import CallbackPlan
from tianji_dask.config import Pipeline
from tianji_dask.config.sections import duration_s
from tianji_dask.core.replicas import ReplicaSpec
from tianji_dask.core.spec import CheckpointSettings, CoreSpec
from tianji_dask.core.stop import StopRules
from tianji_dask.dataflow.controller.settings import LawSettings
from tianji_dask.dataflow.keys import reducer_key
from tianji_dask.dataflow.learner.spec import EvalSpec, FusionSpec, LearnerSpec
from tianji_dask.observe.tensorboard import ScalarLog
from tianji_dask.run.checks import Prepared


def group_dirs(run_dir: Path, name: str, groups: int, word: str = "group") -> list[Path]:
    """Each learner's folder under RUN_DIR/name (one learner: RUN_DIR/name itself), named for
    its group, or its replica with ``word`` "replica"."""
    d = Path(run_dir) / name
    return [d] if groups == 1 else [d / f"{word}-{g}" for g in range(groups)]


def rows_dirs(run_dir: Path, p: Pipeline) -> list[Path]:
    """Where each learner of the run (a group's, a replica) spills its rows and writes its final books."""
    word = "replica" if p.learner.replicas > 1 else "group"
    return group_dirs(run_dir, "rows", p.learner_actors, word)


def checkpoint_dirs(run_dir: Path, groups: int, replicas: int = 1) -> list[Path]:
    """Where each group's learner writes its checkpoints; with replicas, each replica: the first
    where one learner would (RUN_DIR/checkpoints, which export and evaluation read), the others
    in RUN_DIR/checkpoints/replica-R."""
    if replicas > 1:
        d = Path(run_dir) / "checkpoints"
        return [d, *(d / f"replica-{r}" for r in range(1, replicas))]
    return group_dirs(run_dir, "checkpoints", groups)


def newest_checkpoints(run_dir: Path, p: Pipeline) -> list[tuple[Path, dict, list[str]]]:
    """Each learner's newest checkpoint that loads (``checkpoint.newest_loadable``). Replicas
    write theirs at the same versions: they resume from the newest version every replica holds
    (one whose write a crash cut short on some replica is skipped, said in the third item)."""
    from tianji_dask.core import checkpoint

    found = [checkpoint.newest_loadable(d) for d in checkpoint_dirs(run_dir, p.groups, p.learner.replicas)]
    if p.learner.replicas == 1:
        return found
    common = min(int(state["version"]) for _, state, _ in found)
    out = []
    for d, (path, state, skipped) in zip(checkpoint_dirs(run_dir, p.groups, p.learner.replicas), found):
        if int(state["version"]) != common:
            skipped = [*skipped, f"{path.name}: newer than the version every replica holds ({common})"]
            path = d / f"ckpt-{common:09d}.pt"
            state = checkpoint.load(path)
        out.append((path, state, skipped))
    return out


def law(p: Pipeline, prepared: Prepared) -> LawSettings:
    """The controller's settings for this run, defaults filled in (``LawSettings.resolve``)."""
    # each learner's books govern its own streams: a group's explorers, or a replica's share of them
    return LawSettings.resolve(p.controller.model_dump(), relaxed=p.mode == "relaxed", explorers=len(p.group_streams(0)),
                               chunks_per_update=prepared.chunks_per_update,
                               own_replay_ratio=prepared.own_replay_ratio,
                               simulated=p.simulated() is not None)


def core_spec(p: Pipeline, prepared: Prepared, *, out: Path, t_process_start: float, explorer_workers: int = 1,
              group: int = 0, resume_from: str | None = None, keep_t_run_start: float | None = None,
              run_id: str = "", callbacks: tuple = (), replica: ReplicaSpec | None = None) -> CoreSpec:
    """``callbacks``: ``Callback`` objects given from Python, called after the pipeline's own;
    ``replica``: this learner's place among the replicas (``learner.replicas`` > 1)."""
    rules = StopRules.of(p.stop)
    ckpt = p.checkpoint
    return CoreSpec(
        make_algo=prepared.make_algo,
        # with groups or replicas the run, not each learner, judges the solve and the budgets, on all pooled
        stop=rules.for_group() if p.learner_actors > 1 else rules,
        t_process_start=t_process_start, threads=p.learner.threads, device=p.learner.device,
        compile=p.learner.compile,
        explorer_workers=explorer_workers,
        # written by the learner, so on the learner's machine for a remote cluster
        rows_dir=str(rows_dirs(out, p)[group].resolve()),
        # every replica writes its own (its books), at versions the replicas agree on
        checkpoint=CheckpointSettings(
            dir=str(checkpoint_dirs(out, p.groups, p.learner.replicas)[group].resolve()),
            every_seconds=ckpt.every_seconds, every_versions=ckpt.every_versions, keep=ckpt.keep,
            replay_buffer=ckpt.replay_buffer,
        ) if ckpt.enabled else None,
        resume_from=resume_from, keep_t_run_start=keep_t_run_start,
        replay_log=p.mode != "single" and p.learner_actors == 1,
        scalar_log=functools.partial(ScalarLog, str((out / "tensorboard").resolve())) if p.logging.tensorboard else None,
        callbacks=callback_plan(p, out=out, run_id=run_id, group=group, objects=callbacks),
        env_max_errors=p.env.max_errors, replica=replica, simulated_step_s=p.learner.simulated_step_ms / 1000,
    )


def callback_plan(p: Pipeline, *, out: Path, run_id: str, group: int, objects: tuple = ()) -> CallbackPlan | None:
    """A learner's callbacks: the pipeline's entries (built where the learner runs), then ``objects``."""
    entries = (*p.callbacks, *objects)
    if not entries:
        return None
    return CallbackPlan(entries=entries, info={"run_id": run_id, "out": str(Path(out).resolve()), "group": group,
                                               "pipeline": p.model_dump(mode="json")})


def learner_spec(p: Pipeline, prepared: Prepared, core: CoreSpec, *, run_id: str, group: int = 0,
                 reducer_address: str | None = None, rebuilt: bool = False,
                 explorer_hosts: tuple[str, ...] | None = None) -> LearnerSpec:
    mib, kib = p.learner.direct_chunks_min_mib, p.learner.inline_weights_max_kib
    fusion = None
    if p.groups > 1:
        fusion = FusionSpec(reducer_address=reducer_address, reducer_key=reducer_key(run_id),
                            every=prepared.reduce_every, barrier=prepared.reduce_barrier)
    return LearnerSpec(
        run_id=run_id, mode=p.mode, core=core, streams=tuple(p.group_streams(group)), chunk_steps=p.chunk_steps,
        chunk_env_steps=p.chunk_steps * p.env.num_envs, law=law(p, prepared), publish_every=p.learner.publish_every,
        updates_per_pass=p.updates_per_pass, drop_on_refresh=p.learner.drop_on_refresh,
        direct_min_bytes=None if mib is None else int(mib * 2**20),
        inline_weights_max_bytes=None if kib is None else int(kib * 2**10),
        max_explorer_failures=p.stop.max_explorer_failures, group=group, fusion=fusion, rebuilt=rebuilt,
        eval=None if p.eval is None else EvalSpec(p.eval.every_s, p.eval.every_versions, p.eval.episodes,
                                                  p.eval.deterministic, seed=p.seed + EVAL_SEED_OFFSET),
        explorer_hosts=explorer_hosts,
        lifetime_s=None if p.cluster.learner_lifetime is None else duration_s(p.cluster.learner_lifetime, "learner_lifetime"),
    )


EVAL_SEED_OFFSET = 1_000_003  # evaluation envs' seeds, apart from every explorer stream's
