"""Group mode seen as one run: status, stop and results pooled over the groups' learners, by the
same stop rules one learner applies to its own books."""

from __future__ import annotations

import numpy as np

from tianji_dask.callbacks.runner import pooled
from tianji_dask.core.env_errors import pooled as pooled_env_errors
from tianji_dask.core.metrics import CHUNK_FIELDS, age_summary, staleness_summary
from tianji_dask.core.stop import StopRules


def pool_status(statuses: list[dict], rules: StopRules, stop_reason: str | None) -> dict:
    """One status over all groups; each group's own under "groups"."""
    if len(statuses) == 1:
        return statuses[0]
    recent = sorted(tuple(e) for s in statuses for e in s.get("recent_episodes", ()))[-rules.mean_episodes:]
    returns = [r for _, r in recent]

    def total(key):
        return sum(s.get(key) or 0 for s in statuses)

    known = [s["staleness_recent_mean"] for s in statuses if s.get("staleness_recent_mean") is not None]
    replayed = [s["replay_staleness_recent_mean"] for s in statuses if s.get("replay_staleness_recent_mean") is not None]
    return {
        "version": min(s.get("version", 0) for s in statuses), "updates": total("updates"),
        "env_steps": total("env_steps"), "episodes": total("episodes"),
        "mean_return": sum(returns) / len(returns) if returns else None,
        "elapsed_s": max((s.get("elapsed_s") or 0) for s in statuses), "env_steps_per_s": total("env_steps_per_s"),
        "staleness_recent_mean": sum(known) / len(known) if known else None,
        "replay_staleness_recent_mean": sum(replayed) / len(replayed) if replayed else None,
        "solved": rules.running_mean_solves(returns),
        "stop_reason": stop_reason or next((s["stop_reason"] for s in statuses if s.get("stop_reason")), None),
        "chunks_lost": total("chunks_lost"), "chunks_dropped": total("chunks_dropped"),
        "chunks_in_flight": total("chunks_in_flight"), "window": total("window"),
        "fusions": min(s.get("fusions", 0) for s in statuses),
        "groups": [{k: v for k, v in s.items() if k != "recent_episodes"} for s in statuses],
    }


def groups_stop_reason(pooled: dict, statuses: list[dict], rules: StopRules) -> str | None:
    """Why the run stops all groups now: the stop rules on the pooled figures (each group's
    learner keeps only its time budget), or one group ended on its own (its time, an error)."""
    reason = rules.reason(solved=pooled["solved"], env_steps=pooled["env_steps"], updates=pooled["updates"],
                          elapsed_s=pooled["elapsed_s"])
    if reason is not None:
        return reason
    ended = next((s for s in statuses if s.get("stop_reason")), None)
    if ended is None:
        return None
    return ended["stop_reason"] if ended["stop_reason"] == "max_seconds" else f"group {ended.get('group')}: {ended['stop_reason']}"


def pool_results(finals: list[dict], rules: StopRules, stop_reason: str | None, fusion: dict) -> tuple[dict, np.ndarray, np.ndarray]:
    """The run's results over all groups' episodes and chunks pooled (time to solve by the same
    rule as one learner's), each group's own under "group_results", and ``fusion`` (the
    reducer's settings and its record of every round) under "fusion"."""
    per = [f["results"] for f in finals]
    episodes = np.concatenate([f["episodes"] for f in finals])
    episodes = episodes[np.argsort(episodes[:, 0], kind="stable")]
    chunks = np.concatenate([f["chunks"] for f in finals])
    chunks = chunks[np.argsort(chunks[:, 0], kind="stable")]
    t0, tp = min(r["t_run_start"] for r in per), per[0]["t_process_start"]
    solved_at = rules.solved_at(episodes)
    wall = max(r["t_run_start"] + r["wall_s"] for r in per) - t0

    def total(key):
        return sum(r[key] for r in per)

    dropped: dict[str, int] = {}
    for r in per:
        for reason, n in r["chunks_dropped"].items():
            dropped[reason] = dropped.get(reason, 0) + n
    errors = [f"group {g}: {r['error']}" for g, r in enumerate(per) if r.get("error")]
    results = dict(per[0])
    results.update(
        solved=solved_at is not None, time_to_solve_s=None if solved_at is None else solved_at - t0,
        time_to_solve_from_process_start_s=None if solved_at is None else solved_at - tp,
        stop_reason=stop_reason or next((r["stop_reason"] for r in per if r["stop_reason"]), None),
        t_run_start=t0, wall_s=wall, env_steps=total("env_steps"), env_steps_trained=total("env_steps_trained"),
        updates=total("updates"), final_version=[r["final_version"] for r in per], episodes=len(episodes),
        final_mean_return=float(episodes[-rules.mean_episodes:, 1].mean()) if len(episodes) else None,
        env_steps_per_s=total("env_steps") / wall, samples_per_s_consumed=total("samples_per_s_consumed"),
        chunks=len(chunks), chunks_per_s=len(chunks) / wall, bytes_per_s=total("bytes_per_s"),
        chunks_lost=total("chunks_lost"), lost=[x for r in per for x in r["lost"]][:100], chunks_dropped=dropped,
        learner_busy_fraction=[r["learner_busy_fraction"] for r in per],
        explorer_busy_fraction=total("explorer_busy_fraction"),
        staleness_versions=staleness_summary(chunks[:, CHUNK_FIELDS.index("staleness_versions")]),
        age_s=age_summary(chunks[:, CHUNK_FIELDS.index("age_s")]),
        error="\n".join(errors) or None, checkpoint=[r["checkpoint"] for r in per], fusion=fusion,
        group_results=[{k: v for k, v in r.items() if k not in ("lost",)} for r in per],
        callbacks=pooled([r.get("callbacks") for r in per]),
        env_errors=pooled_env_errors([r.get("env_errors") for r in per]),
    )
    return results, episodes, chunks
