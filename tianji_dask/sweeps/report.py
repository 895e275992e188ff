"""What a sweep leaves in its folder: ``sweep.json`` (every trial), ``best.yaml`` (the pipeline
with the best parameters, trainable as is), ``sweep.png`` (the objective against each
parameter), and the table printed at the end. Every file is replaced whole (written aside,
then renamed), so a sweep stopped at any moment leaves each one as it was or as it is now."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tianji_dask.errors import PipelineError


def make_out(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise PipelineError(f"--out: cannot write {str(out)!r} ({err.strerror or err}); "
                            "allowed: a directory this user can create and write") from None


def _replace(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def summary(study, params, objective: str, budget) -> dict:
    rows = []
    for t in study.get_trials(deepcopy=False):
        attrs = t.user_attrs
        rows.append({"number": t.number, "state": t.state.name, "value": t.value, "params": dict(t.params),
                     "run_dir": attrs.get("run_dir"), "seconds": attrs.get("seconds"),
                     "stop_reason": attrs.get("stop_reason"), "time_to_solve_s": attrs.get("time_to_solve_s"),
                     "final_mean_return": attrs.get("final_mean_return"), "error": attrs.get("error"),
                     "retry_of": attrs.get("retry_of")})
    complete = [r for r in rows if r["state"] == "COMPLETE"]
    best = None
    if complete:
        b = study.best_trial
        best = {"number": b.number, "value": b.value, "params": dict(b.params)}
    return {"objective": objective, "direction": study.direction.name.lower(), "budget_s": budget,
            "space": {p.key: p.spec for p in params}, "trials": rows, "best": best}


def write(out: Path, data: dict, base) -> dict:
    """Write sweep.json, and best.yaml (``base`` with the best parameters) and sweep.png once a
    trial has completed; returns ``data``."""
    from tianji_dask.config import parse_pipeline, pipeline_yaml

    data["pipeline"] = base.name
    _replace(out / "sweep.json", lambda p: p.write_text(json.dumps(data, indent=1, default=str) + "\n"))
    if data["best"] is not None:
        best = parse_pipeline(base.model_dump(mode="json"), overrides=data["best"]["params"])
        header = (f"# {base.name} with the best parameters of the sweep in {out} (trial {data['best']['number']}, "
                  f"{data['objective']} {data['best']['value']:.4g}); train it: tianji-dask train {out / 'best.yaml'}\n")
        _replace(out / "best.yaml", lambda p: p.write_text(header + pipeline_yaml(best)))
        _replace(out / "sweep.png", lambda p: plot(data, p))
    return data


def plot(data: dict, path: Path) -> None:
    """The objective against each parameter: completed trials as dots, the best one ringed."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(data["space"])
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.4), squeeze=False)
    done = [t for t in data["trials"] if t["state"] == "COMPLETE"]
    best = data["best"]
    for ax, key in zip(axes[0], keys):
        xs, ys = [t["params"].get(key) for t in done], [t["value"] for t in done]
        numeric = all(isinstance(x, (int, float)) for x in xs)
        ax.scatter(xs if numeric else [str(x) for x in xs], ys, color="#1f77b4", zorder=2)
        if best is not None:
            bx = best["params"].get(key)
            ax.scatter([bx if numeric else str(bx)], [best["value"]], s=160, facecolors="none", edgecolors="#d62728",
                       linewidths=2, zorder=3, label=f"best (trial {best['number']})")
            ax.legend(loc="best", fontsize=8)
        kind, _, bounds = data["space"][key].partition(":")
        if kind != "choice":  # the whole range searched, so where the trials fell in it shows
            low, high = (float(x) for x in bounds.split(":"))
            pad = (high / low) ** 0.04 if kind == "loguniform" else (high - low) * 0.04
            ax.set_xlim(low / pad, high * pad) if kind == "loguniform" else ax.set_xlim(low - pad, high + pad)
        if kind == "loguniform":
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel(key)
        ax.set_ylabel(data["objective"] + (" (s)" if data["objective"] == "time_to_solve" else ""))
        ax.grid(alpha=0.3)
    fig.suptitle(f"sweep of {data.get('pipeline', '')}: {len(done)} completed of {len(data['trials'])} trials")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)


def table(data: dict) -> str:
    """The trials as a text table (rich), best first."""
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    keys = list(data["space"])
    t = Table(title=f"{data['objective']} ({data['direction']})")
    for col in ("trial", "state", "value", *keys, "run"):
        t.add_column(col, justify="right" if col not in ("state", "run") else "left")
    sign = 1 if data["direction"] == "minimize" else -1
    rows = sorted(data["trials"], key=lambda r: (r["value"] is None, sign * (r["value"] or 0)))
    for r in rows:
        t.add_row(str(r["number"]), r["state"].lower(), "-" if r["value"] is None else f"{r['value']:.4g}",
                  *[_fmt(r["params"].get(k)) for k in keys], r["run_dir"] or "-")
    buf = StringIO()
    Console(file=buf, width=160, force_terminal=False).print(t)
    return buf.getvalue()


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def fmt_params(params: dict) -> str:
    return ", ".join(f"{k}={_fmt(v)}" for k, v in params.items())
