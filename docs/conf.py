"""Sphinx configuration of the fedmcmc documentation.

Build (from the repository root):  sphinx-build -W -b html docs docs/_build/html
The pages are Markdown (MyST); the API reference is generated from the docstrings (autodoc +
napoleon, numpy style). Figures of the tutorials are made by running the pages' own code
(docs/run_examples.py), written to docs/_generated/ and never committed.
"""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent))

import fedmcmc  # noqa: E402

project = "fedmcmc"
author = "the fedmcmc developers"
copyright = "2026, the fedmcmc developers"
release = fedmcmc.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "fedmcmc_docs",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", "_ext", "Thumbs.db", ".DS_Store", "README.md"]

myst_enable_extensions = ["colon_fence", "dollarmath", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"show-inheritance": False}
napoleon_numpy_docstring = True
napoleon_google_docstring = True
napoleon_use_rtype = False

html_theme = "furo"
html_title = f"fedmcmc {release}"
