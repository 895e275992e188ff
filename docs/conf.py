"""Sphinx configuration of the docs site: the Markdown pages of docs/ (MyST) and an API reference
read from the docstrings (autodoc). Build it with warnings as errors, as CI does:

    sphinx-build -W --keep-going -b html docs docs/_build/html
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # document this checkout's package, whatever else is installed

import tianji_dask  # noqa: E402

project = "tianji_dask"
author = "the tianji_dask authors"
copyright = "2026, the tianji_dask authors"
release = version = tianji_dask.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.viewcode"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# the pages link to each other's headings by GitHub's anchors (#modes, #a-gpu-learner)
myst_heading_anchors = 4

autodoc_member_order = "bysource"
autodoc_typehints = "signature"

html_theme = "furo"
html_title = f"tianji_dask {release}"
