"""The notebooks run top to bottom in a real kernel."""

import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

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
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit notebooks with outputs cleared"
    monkeypatch.setenv("TIANJI_NOTEBOOK_SECONDS", "10")
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    for marker in EXPECT[path.name]:
        assert marker in outputs, f"{path.name} did not print {marker!r}"
