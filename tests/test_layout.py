"""The package's shape holds: files a reader takes in one sitting, a root that names few modules,
imports that point one way (no cycle, no private name taken from another module), and the
boundaries the design draws (algorithms import no Dask, the dataflow no algorithm internals, the
core no configuration or cluster code). Read from the source with ``ast``; nothing is imported."""

import ast
from pathlib import Path

import pytest

from helpers import cycles

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tianji_dask"
#: a file of one job may run to this many lines; past 400 is a signal for review, not a reason to
#: cut a class in two
MAX_LINES = 500
MAX_BENCHMARK_LINES = 400  # scripts, each one measurement
MAX_ROOT_MODULES = 8


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str) -> list[tuple[str, list[str], int]]:
    """(module imported, names taken from it, line) for every import in ``name``'s file, at any
    depth (a function's lazy import counts as much as one at the top)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            found.append((base, [alias.name for alias in node.names], node.lineno))
    return found


def _edges(name: str) -> set[str]:
    """The project's modules ``name`` imports: ``from pkg import mod`` is an edge to ``pkg.mod``."""
    out = set()
    for module, names, _ in _imports(name):
        if not module.startswith("tianji_dask"):
            continue
        subs = [f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES]
        out.update(subs or ([module] if module in MODULES else []))
        if subs and len(subs) < len(names) and module in MODULES:  # names from the package itself too
            out.add(module)
    out.discard(name)
    return out


def test_no_file_is_longer_than_one_sitting():
    long = {str(p.relative_to(ROOT)): n for p in MODULES.values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines (split them by role): {long}"
    scripts = [*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "benchmarks").glob("*/*.py")]
    long = {str(p.relative_to(ROOT)): n for p in scripts if (n := len(p.read_text().splitlines())) > MAX_BENCHMARK_LINES}
    assert not long, f"benchmark files over {MAX_BENCHMARK_LINES} lines: {long}"


def test_the_package_root_holds_few_modules():
    root = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(root) <= MAX_ROOT_MODULES, f"{len(root)} modules at the package root: {root}"


def test_no_import_cycle():
    graph = {name: _edges(name) for name in MODULES}
    # a package's __init__ re-exporting its own modules is no cycle: importing a module runs it first anyway
    for name in graph:
        graph[name] = {m for m in graph[name] if not (name.startswith(m + ".") and MODULES[m].name == "__init__.py")}
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(found)


def test_no_module_takes_another_modules_private_names():
    taken = []
    for name in MODULES:
        for module, names, line in _imports(name):
            if module.startswith("tianji_dask") and module != name:
                taken += [f"{MODULES[name].relative_to(ROOT)}:{line} takes {module}.{n}" for n in names
                          if n.startswith("_") and not n.startswith("__")]
    assert not taken, "private names imported across modules: " + "; ".join(taken)


def _reaches(name: str) -> set[str]:
    """Every module, the project's and others', that ``name`` imports directly."""
    return {module for module, _, _ in _imports(name)} | {f"{m}.{n}" for m, names, _ in _imports(name) for n in names}


@pytest.mark.parametrize("scope,forbidden", [
    ("tianji_dask.algos", ("dask", "distributed", "tianji_dask.dataflow", "tianji_dask.run", "tianji_dask.launch",
                           "tianji_dask.cli", "tianji_dask.config", "tianji_dask.core")),
    ("tianji_dask.dataflow", ("tianji_dask.algos.", "tianji_dask.run", "tianji_dask.cli", "tianji_dask.config")),
    ("tianji_dask.core", ("dask", "distributed", "tianji_dask.dataflow", "tianji_dask.run", "tianji_dask.launch",
                          "tianji_dask.cli", "tianji_dask.config", "tianji_dask.observe")),
    # the explorer side knows the controller only through the keys it is given (dataflow/keys.py)
    ("tianji_dask.dataflow.explorer", ("tianji_dask.dataflow.controller",)),
    ("tianji_dask.chunk", ("dask", "distributed", "torch")),
    ("tianji_dask.callbacks", ("dask", "distributed", "tianji_dask.dataflow", "tianji_dask.run", "tianji_dask.launch",
                               "tianji_dask.cli")),
    ("tianji_dask.testing", ("dask", "distributed", "tianji_dask.dataflow", "tianji_dask.run", "tianji_dask.launch")),
])
def test_each_layer_imports_only_what_it_may(scope, forbidden):
    bad = []
    for name in MODULES:
        if name == scope or name.startswith(scope + "."):
            bad += [f"{name} imports {m}" for m in sorted(_reaches(name))
                    if any(m == f or m.startswith(f if f.endswith(".") else f + ".") for f in forbidden)]
    assert not bad, "; ".join(bad)


KEYS = "tianji_dask.dataflow.keys"
#: the command's and the distribution's name, in messages, pip extras and temporary files: no key
COMMAND = "tianji-dask"
#: literals outside keys.py that start with "tianji-" and are no key or name the run gives Dask,
#: each with why; (file, literal): for an f-string, its constant start
NOT_KEYS = {
    ("tianji_dask/core/compile.py", "tianji-compile"): "the compiling thread's name (compile.THREAD_NAME)",
    ("tianji_dask/dataflow/learner/actor.py", "tianji-learner"): "the learner actor's thread's name",
    ("tianji_dask/dataflow/direct/sink.py", "tianji-sink-"): "the direct sink's abstract Unix socket, not Dask's",
    ("tianji_dask/dataflow/direct/sink.py", "tianji-chunk-sink"): "the sink's listening thread's name",
    ("tianji_dask/dataflow/direct/sink.py", "tianji-chunk-sink-conn"): "the sink's reading threads' name",
    ("tianji_dask/callbacks/runner.py", "tianji-callbacks"): "the callbacks' thread's name",
    ("tianji_dask/run/backend.py", "tianji-single"): "single mode's training thread's name",
    ("tianji_dask/run/picture.py", "tianji-learning-curve"): "the thread drawing learning_curve.png",
    ("tianji_dask/sweeps/driver.py", "tianji-trial-"): "the thread watching a trial (study.watch)",
    ("tianji_dask/sweeps/pbt.py", "tianji-pbt-"): "the thread watching a PBT member (study.watch)",
    ("tianji_dask/sweeps/study.py", "tianji-sweep"): "the Optuna study's name (study.STUDY_NAME)",
}


def _tianji_literals(path: Path) -> list[tuple[str, int]]:
    """Every string constant in ``path`` starting with ``tianji-`` (an f-string's constant parts
    included), but the command's name: (literal, line)."""
    return [(node.value, node.lineno) for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("tianji-")
            and not node.value.startswith(COMMAND)]


def test_every_dask_key_and_name_is_spelled_in_keys_py_only():
    """A key the run gives Dask (a task's, a scattered value's, a worker plugin's, a worker's, a
    batch job's) is made and parsed in dataflow/keys.py, which the chaos harness, the dashboard
    and the tests rely on: a ``"tianji-`` literal anywhere else is one of NOT_KEYS."""
    found = {(str(path.relative_to(ROOT)), literal): line for name, path in MODULES.items() if name != KEYS
             for literal, line in _tianji_literals(path)}
    stray = [f"{path}:{line} {literal!r}" for (path, literal), line in sorted(found.items()) if (path, literal) not in NOT_KEYS]
    assert not stray, "key literals outside dataflow/keys.py (make them there, or list a non-key in NOT_KEYS): " + "; ".join(stray)
    stale = sorted(set(NOT_KEYS) - set(found))
    assert not stale, f"NOT_KEYS entries no longer in the source: {stale}"


def test_keys_py_imports_only_the_standard_library_and_says_each_form():
    import sys

    imported = {module.partition(".")[0] for module, _, _ in _imports(KEYS)}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, f"keys.py imports {sorted(imported)}"
    tree = ast.parse(MODULES[KEYS].read_text())
    docs = {f.name: ast.get_docstring(f) or "" for f in tree.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")}
    bad = sorted(name for name, doc in docs.items() if "\n" in doc or "``" not in doc)
    assert docs and not bad, f"keys.py functions without a one-line docstring giving their key's form (``...``): {bad}"
