"""The notebooks run top to bottom in a real kernel, with what the ``notebooks`` extra installs."""

import ast
import importlib.metadata
import json
import re
import shutil
import sys
import tomllib
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
#: what each notebook must print: evidence that it did its job, not only that it ran
EXPECT = {
    "01-quickstart.ipynb": ["results in", "env steps:", "deterministic policy of version"],
    "02-staleness.ipynb": ["results in", "target 2: mean staleness", "target 6: mean staleness"],
    "04-sweep.ipynb": ["best: {'number'", "files: ['best.yaml', 'study.db', 'sweep.json', 'sweep.png', 'trials']",
                       "best.yaml trained: solved"],
    "05-your-own-algorithm.ipynb": ["contract violations: []", "algorithm: ClippedPG  env steps:",
                                    "random play scores about 20): True", "results in",
                                    "ONNX and load_policy agree on 1000 of 1000"],
    "06-your-own-env.ipynb": ["check_env: passed", "refused: env: __main__:BrokenCorridor failed its pre-flight in the "
                              "driver: check_env raised AssertionError", "solved: True  env: __main__:Corridor",
                              "masked actions taken: 0", "random play scores about -0.9): True",
                              "deterministic policy of version", "ONNX and load_policy agree on 1000 of 1000",
                              "left chosen where only right is allowed: 0 of"],
    "03-scale-out.ipynb": ["existing cluster: solved", "results in"]
    + (["slurm: solved"] if shutil.which("sbatch") else []),
}


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path, monkeypatch):
    import nbformat  # here, not at the top: a second of Jupyter's imports the fast tier has no use for
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit notebooks with outputs cleared"
    monkeypatch.setenv("TIANJI_NOTEBOOK_SECONDS", "10")
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    for marker in EXPECT[path.name]:
        assert marker in outputs, f"{path.name} did not print {marker!r}"


def _extra(name: str) -> set[str]:
    """The distributions an extra of ours names, its own extras followed."""
    pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    names = set()
    for req in pyproject["project"]["optional-dependencies"][name]:
        dist = re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].lower().replace("_", "-")
        names |= _extra(req.split("[")[1].split("]")[0]) if dist == "tianji-dask" else {dist}
    return names


def _imports(path: Path) -> set[str]:
    """The top-level modules a notebook's code cells import."""
    found = set()
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "code":
            for node in ast.walk(ast.parse("".join(cell["source"]))):
                if isinstance(node, ast.Import):
                    found |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module:
                    found.add(node.module.split(".")[0])
    return found


def test_the_notebooks_extra_installs_every_module_the_notebooks_import():
    provided = _extra("notebooks") | {d.lower() for d in ("tianji-dask", *_core())}
    by_module = importlib.metadata.packages_distributions()
    for path in NOTEBOOKS:
        for module in sorted(_imports(path) - set(sys.stdlib_module_names)):
            dists = {d.lower().replace("_", "-") for d in by_module.get(module, [])} or {module}
            # a module that comes with a dependency of a listed one (IPython with ipykernel) counts
            assert dists & provided or dists & _requirements_of(provided), f"{path.name} imports {module}: in no extra"
    assert {"jupyterlab", "nbconvert", "onnxruntime"} <= _extra("notebooks")
    assert _extra("notebooks") <= _extra("test")  # the tests run the notebooks with it


def _core() -> list[str]:
    pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    return [re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0] for req in pyproject["project"]["dependencies"]]


def _requirements_of(dists: set[str]) -> set[str]:
    """The distributions those installed ``dists`` require, one level down."""
    found = set()
    for dist in dists:
        try:
            reqs = importlib.metadata.requires(dist) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        found |= {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs if "extra ==" not in r}
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_every_cell_has_an_id(path):
    cells = json.loads(path.read_text())["cells"]
    assert all(cell.get("id") for cell in cells), [i for i, c in enumerate(cells) if not c.get("id")]
