"""What a run shows in a terminal or a notebook: its live progress line, redrawn in place on a
terminal (rich), updated in place in a Jupyter notebook (an IPython display), a plain whole line
every few seconds anywhere else (a pipe, a log file, a batch job), which the command line and
``Run(..., progress=True)`` share; and its dashboard page in a notebook (``Run.live``)."""

from __future__ import annotations

import sys
import time

PLAIN_EVERY_S = 5.0


def _fmt(value, spec=".1f", none="-"):
    return none if value is None else format(value, spec)


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (where a run shows its progress by default)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return type(shell).__name__ == "ZMQInteractiveShell" or "google.colab" in type(shell).__module__


def status_line(mode: str, s: dict) -> str:
    """One status as one line: elapsed training seconds, version, env steps and their rate, the
    running mean return, recent staleness, chunks in flight against the window."""
    return (
        f"[{mode}] {_fmt(s.get('elapsed_s'))} s  version {s.get('version', 0)}  "
        f"env steps {s.get('env_steps', 0):,}  ({_fmt(s.get('env_steps_per_s'), ',.0f')}/s)  "
        f"mean return {_fmt(s.get('mean_return'))}  staleness {_fmt(s.get('staleness_recent_mean'), '.2f')}  "
        f"in flight {s.get('chunks_in_flight', '-')}/{s.get('window') or '-'}"
        + (f"  replay ratio {s['replay_ratio']:.1f}" if s.get("replay_ratio") is not None else "")
        + (f"  groups {len(s['groups'])}, fusions {s.get('fusions', 0)}" if s.get("groups") else "")
    )


class Progress:
    """A context manager called with each status the run polls. ``show=False``: nothing at all."""

    def __init__(self, mode: str, show: bool = True):
        self.mode = mode
        self.show = show
        self.live = None  # rich's Live on a terminal
        self.display = None  # an IPython display handle in a notebook
        self.last_line = 0.0

    def __enter__(self):
        if not self.show:
            return self
        if in_notebook():
            from IPython.display import display

            self.display = display({"text/plain": f"[{self.mode}] starting…"}, raw=True, display_id=True)
            return self
        from rich.console import Console

        console = Console(stderr=True)
        # isatty too: FORCE_COLOR would make rich draw (and pad) its live display into a log file
        if console.is_terminal and sys.stderr.isatty():
            from rich.live import Live

            self.live = Live("starting…", console=console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __call__(self, status: dict) -> None:
        if not self.show or "version" not in status:
            return
        line = status_line(self.mode, status)
        if self.display is not None:
            self.display.update({"text/plain": line}, raw=True)
        elif self.live is not None:
            from rich.text import Text

            self.live.update(Text(line))  # plain text: "[relaxed]" is not markup
        elif time.time() - self.last_line > PLAIN_EVERY_S:
            print(line, file=sys.stderr, flush=True)  # whole lines: no wrapping, no padding
            self.last_line = time.time()

    def __exit__(self, *exc):
        if self.live is not None:
            self.live.__exit__(*exc)
            self.live = None


def show_page(dashboard_link: str, run_id: str, height: int) -> str:
    """In Jupyter: a run's ``/tianji`` dashboard page in the notebook, with links to it and to the
    whole dashboard; returns the page's address."""
    from IPython.display import HTML, IFrame, display

    page = dashboard_link.rsplit("/", 1)[0] + f"/tianji?run={run_id}"
    display(HTML(f'<p>tianji run {run_id}: <a href="{page}" target="_blank">{page}</a> · '
                 f'<a href="{dashboard_link}" target="_blank">Dask dashboard</a></p>'))
    display(IFrame(page, width="100%", height=height))
    return page
