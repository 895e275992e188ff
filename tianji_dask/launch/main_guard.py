"""A script that starts a run from its top level, not under ``if __name__ == "__main__":``.

Worker processes (forked from the forkserver, or spawned) run the script that started them again
as they start, as multiprocessing does for any child that is not a plain fork: a call at the top
level would start another run in every worker, and each would die with multiprocessing's
bootstrapping error. This finds that case before any process starts, from the frame of the
script's top level that made the call and the statement of the script that holds it.
"""

from __future__ import annotations

import ast
import sys
import tokenize
from pathlib import Path

FIX = 'if __name__ == "__main__":'


def unguarded_call() -> tuple[str, int] | None:
    """(the script, the line of its top-level statement) when this call comes from the top level
    of the process's main script outside a ``__name__`` guard; None otherwise (a notebook, ``-c``,
    a call from a function the script calls under the guard, a thread)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path or not Path(path).is_file():
        return None
    # what multiprocessing runs again, as its spawn module decides: a package's or a folder's
    # __main__ (``python -m tianji_dask``) and IPython's launcher it does not
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name == "__main__" or (name or "").endswith(".__main__") or Path(path).stem == "ipython":
        return None
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals is vars(main)):
        frame = frame.f_back
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        with tokenize.open(path) as fh:
            tree = ast.parse(fh.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None
    for stmt in tree.body:
        if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
            return None if _guard(stmt) else (path, stmt.lineno)
    return None


def _guard(stmt: ast.stmt) -> bool:
    """An ``if`` whose test reads ``__name__`` (``if __name__ == "__main__":`` and its variants)."""
    return isinstance(stmt, ast.If) and any(isinstance(n, ast.Name) and n.id == "__name__" for n in ast.walk(stmt.test))


def refuse_unguarded() -> None:
    """End the process with one line naming the fix (exit 2) when ``unguarded_call`` finds the
    case: no process has started, nothing is written, and no run could have gone on."""
    found = unguarded_call()
    if found is None:
        return
    script, line = found
    print(f"tianji_dask: {script}:{line} starts a run from the script's top level; the cluster's worker processes "
          f"run the script again as they start, so put the call under `{FIX}` "
          f"(nothing was started or written)", file=sys.stderr, flush=True)
    raise SystemExit(2)
