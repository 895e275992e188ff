"""Group mode, or learner replicas, seen as one run: status, stop and results pooled over the
learners, by the same stop rules one learner applies to its own books. Groups train models of
their own (their updates add up); replicas train one policy (its updates and version are any
replica's, the same on each)."""

from __future__ import annotations

import numpy as np

from tianji_dask.callbacks.runner import pooled
from tianji_dask.core.env_errors import pooled as pooled_env_errors
from tianji_dask.core.metrics import CHUNK_FIELDS, age_summary, staleness_summary
from tianji_dask.core.stop import StopRules


def pool_status(statuses: list[dict], rules: StopRules, stop_reason: str | None, replicas: bool = False) -> dict:
    """One status over all learners; each one's own under "groups" (or "replicas")."""
    if len(statuses) == 1:
        return statuses[0]
    recent = sorted(tuple(e) for s in statuses for e in s.get("recent_episodes", ()))[-rules.mean_episodes:]
    returns = [r for _, r in recent]

    def total(key):
        return sum(s.get(key) or 0 for s in statuses)

    known = [s["staleness_recent_mean"] for s in statuses if s.get("staleness_recent_mean") is not None]
    replayed = [s["replay_staleness_recent_mean"] for s in statuses if s.get("replay_staleness_recent_mean") is not None]
    updates = max(s.get("updates") or 0 for s in statuses) if replicas else total("updates")
    per = [{k: v for k, v in s.items() if k != "recent_episodes"} for s in statuses]
    return {
        "version": min(s.get("version", 0) for s in statuses), "updates": updates,
        "env_steps": total("env_steps"), "episodes": total("episodes"),
        "mean_return": sum(returns) / len(returns) if returns else None,
        "elapsed_s": max((s.get("elapsed_s") or 0) for s in statuses), "env_steps_per_s": total("env_steps_per_s"),
        "staleness_recent_mean": sum(known) / len(known) if known else None,
        "replay_staleness_recent_mean": sum(replayed) / len(replayed) if replayed else None,
        "solved": rules.running_mean_solves(returns),
        "stop_reason": stop_reason or next((s["stop_reason"] for s in statuses if s.get("stop_reason")), None),
        "chunks_lost": total("chunks_lost"), "chunks_dropped": total("chunks_dropped"),
        "chunks_in_flight": total("chunks_in_flight"), "window": total("window"),
        **({"replicas": per} if replicas else {"fusions": min(s.get("fusions", 0) for s in statuses), "groups": per}),
    }


def groups_stop_reason(pooled: dict, statuses: list[dict], rules: StopRules, word: str = "group") -> str | None:
    """Why the run stops all learners now: the stop rules on the pooled figures (each learner
    keeps only its time budget), or one ended on its own (its time, an error), named as its
    ``word`` ("group" or "replica") and index."""
    reason = rules.reason(solved=pooled["solved"], env_steps=pooled["env_steps"], updates=pooled["updates"],
                          elapsed_s=pooled["elapsed_s"])
    if reason is not None:
        return reason
    ended = next((s for s in statuses if s.get("stop_reason")), None)
    if ended is None:
        return None
    if ended["stop_reason"] == "max_seconds":
        return ended["stop_reason"]
    return f"{word} {ended.get('group')}: {ended['stop_reason']}"


def pool_results(finals: list[dict], rules: StopRules, stop_reason: str | None, fusion: dict | None,
                 replicas: bool = False) -> tuple[dict, np.ndarray, np.ndarray]:
    """The run's results over all learners' episodes and chunks pooled (time to solve by the same
    rule as one learner's), each learner's own under "group_results" (or "replica_results"), and
    ``fusion`` (the reducer's settings and its record of every round) under "fusion". Replicas'
    updates, version and env steps trained are the policy's: one replica's."""
    per = [f["results"] for f in finals]
    episodes = np.concatenate([f["episodes"] for f in finals])
    episodes = episodes[np.argsort(episodes[:, 0], kind="stable")]
    chunks = np.concatenate([f["chunks"] for f in finals])
    chunks = chunks[np.argsort(chunks[:, 0], kind="stable")]
    t0, tp = min(r["t_run_start"] for r in per), per[0]["t_process_start"]
    solved_at = rules.solved_at(episodes)
    wall = max(max(r["t_run_start"] + r["wall_s"] for r in per) - t0, 1e-9)  # learners only heard of: as long as heard

    def total(key):
        return sum(r[key] for r in per)

    dropped: dict[str, int] = {}
    for r in per:
        for reason, n in r["chunks_dropped"].items():
            dropped[reason] = dropped.get(reason, 0) + n
    word = "replica" if replicas else "group"
    errors = [f"{word} {g}: {r['error']}" for g, r in enumerate(per) if r.get("error")]
    results = dict(per[0])
    results.update(
        solved=solved_at is not None, time_to_solve_s=None if solved_at is None else solved_at - t0,
        time_to_solve_from_process_start_s=None if solved_at is None else solved_at - tp,
        stop_reason=stop_reason or next((r["stop_reason"] for r in per if r["stop_reason"]), None),
        t_run_start=t0, wall_s=wall, env_steps=total("env_steps"), env_steps_trained=total("env_steps_trained"),
        updates=max(r["updates"] for r in per) if replicas else total("updates"),
        final_version=per[0]["final_version"] if replicas else [r["final_version"] for r in per], episodes=len(episodes),
        final_mean_return=float(episodes[-rules.mean_episodes:, 1].mean()) if len(episodes) else None,
        env_steps_per_s=total("env_steps") / wall, samples_per_s_consumed=total("samples_per_s_consumed"),
        chunks=len(chunks), chunks_per_s=len(chunks) / wall, bytes_per_s=total("bytes_per_s"),
        chunks_lost=total("chunks_lost"), lost=[x for r in per for x in r["lost"]][:100], chunks_dropped=dropped,
        learner_busy_fraction=[r["learner_busy_fraction"] for r in per],
        explorer_busy_fraction=total("explorer_busy_fraction"),
        staleness_versions=staleness_summary(chunks[:, CHUNK_FIELDS.index("staleness_versions")]),
        age_s=age_summary(chunks[:, CHUNK_FIELDS.index("age_s")]),
        error="\n".join(errors) or None, fusion=fusion,
        checkpoint=per[0]["checkpoint"] if replicas else [r["checkpoint"] for r in per],
        **{f"{word}_results": [{k: v for k, v in r.items() if k not in ("lost",)} for r in per]},
        callbacks=pooled([r.get("callbacks") for r in per]),
        env_errors=pooled_env_errors([r.get("env_errors") for r in per]),
    )
    if replicas:
        results["replicas"] = replica_figures(per)
    return results, episodes, chunks


def learner_results(results: dict) -> list[dict]:
    """Each learner's own results within the run's: a group's, a replica's, or the one learner's."""
    return results.get("group_results") or results.get("replica_results") or [results]


def replica_figures(per: list[dict]) -> dict:
    """What the results say of the replicas: how many, and each one's busy fraction, updates and
    time in all-reduces and agreements."""
    rows = [{**(r.get("replica") or {}), "learner_busy_fraction": r["learner_busy_fraction"],
             "env_steps": r["env_steps"]} for r in per]
    return {"n": len(per), "per_replica": rows}
