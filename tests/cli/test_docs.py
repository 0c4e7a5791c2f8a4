"""The documentation builds with warnings as errors and every ```python block in it runs.

Two steps, each in its own process (the test process's JAX state stays untouched):

1. ``docs/run_examples.py`` runs every page's ```python blocks in order, and the README's (the
   tutorials' plots are written by their own code into docs/_generated/<page>/);
2. ``sphinx-build -W`` builds the site into a temporary folder, reusing those figures, so an
   example that stops working, a name that leaves the API or a docstring that breaks the
   build fails here.

Plus checks of the block extraction and of the build command the README gives.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BUILD_COMMAND = "sphinx-build -W -b html docs docs/_build/html"

pytest.importorskip("sphinx", reason="the docs extra is not installed (pip install -e '.[docs]')")
pytest.importorskip("myst_parser")

# docs/run_examples.py, the docs' own runner, loaded by its path (docs/ is no package)
_spec = importlib.util.spec_from_file_location("run_examples", DOCS / "run_examples.py")
run_examples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_examples)


def _env():
    env = dict(os.environ, MPLBACKEND="Agg")
    env.pop("PYTHONSTARTUP", None)
    return env


def test_python_blocks_are_extracted_in_order_and_other_fences_skipped():
    page = "\n".join([
        "# A page",
        "```python",
        "a = 1",
        "```",
        "```bash",
        "echo not python",
        "```",
        "```{code-block} python",
        "not_run()",
        "```",
        "````",
        "```python",
        "inside a four-backtick fence: shown, not run",
        "```",
        "````",
        "```python",
        "b = a + 1",
        "",
        "```",
    ])
    blocks = run_examples.python_blocks(page)
    assert [code for _, code in blocks] == ["a = 1", "b = a + 1\n"]
    assert [line for line, _ in blocks] == [3, 17]


def test_a_failing_block_is_reported_with_its_page_and_line(tmp_path, monkeypatch):
    page = tmp_path / "broken.md"
    page.write_text(
        "# Broken\n\n```python\nx = 1\n```\n\n```python\nraise RuntimeError('rotted')\n```\n"
    )
    monkeypatch.setattr(run_examples, "output_dir", lambda p: tmp_path / "out")
    failures = run_examples.run_page(page)
    assert len(failures) == 1
    failed_page, line, text = failures[0]
    assert failed_page == page and line == 8 and "rotted" in text


def test_readme_gives_the_docs_build_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert BUILD_COMMAND in readme
    assert 'pip install -e ".[docs]"' in readme


def test_every_page_runs_and_the_docs_build_with_warnings_as_errors(tmp_path):
    pages = run_examples.pages()
    assert len(pages) >= 15, [str(p) for p in pages]
    ran = subprocess.run(
        [sys.executable, str(DOCS / "run_examples.py"), *map(str, pages), str(ROOT / "README.md")],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1800,
    )
    assert ran.returncode == 0, ran.stdout[-20000:] + ran.stderr[-5000:]

    out = tmp_path / "html"
    built = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), str(DOCS), str(out)],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900,
    )
    assert built.returncode == 0, built.stdout[-10000:] + built.stderr[-10000:]
    for page in pages:
        html = out / page.relative_to(DOCS).with_suffix(".html")
        assert html.exists(), html
    api = (out / "api" / "fedmcmc.html").read_text(encoding="utf-8")
    import types

    import fedmcmc

    for name in fedmcmc.__all__:
        obj = getattr(fedmcmc, name)
        is_module = isinstance(obj, types.ModuleType)
        anchor = f"module-{obj.__name__}" if is_module else f"fedmcmc.{name}"
        assert f'id="{anchor}"' in api, f"fedmcmc.{name} is missing from the API reference"
