"""The package's shape holds: files a reader takes in one sitting, a root that names few modules,
imports that point one way (no cycle, no private name taken from another module), and the
boundaries the design draws (algorithms import no Dask, the dataflow no algorithm internals, the
core no configuration or cluster code). Read from the source with ``ast``; nothing is imported."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tianji_dask"
MAX_LINES = 400
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


def test_the_package_root_holds_few_modules():
    root = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(root) <= MAX_ROOT_MODULES, f"{len(root)} modules at the package root: {root}"


def test_no_import_cycle():
    graph = {name: _edges(name) for name in MODULES}
    # a package's __init__ re-exporting its own modules is no cycle: importing a module runs it first anyway
    for name in graph:
        graph[name] = {m for m in graph[name] if not (name.startswith(m + ".") and MODULES[m].name == "__init__.py")}
    state, cycles = {}, []

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


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
                          "tianji_dask.cli", "tianji_dask.config")),
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
