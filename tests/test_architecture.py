"""The package's dependency rule (issue 14), checked on the source.

* ``lint-imports`` (import-linter, contracts in ``pyproject.toml``): the core imports no
  family, engine, CLI or reproduction, and the families are independent of each other.
* No private name (``_x``) is imported from another fedmcmc module.
"""

import ast
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_import_contracts_hold():
    command = shutil.which("lint-imports")
    if command is None:
        pytest.fail("lint-imports not found: pip install -e '.[test]' (import-linter)")
    run = subprocess.run([command, "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


def private_imports():
    found = []
    for path in sorted((ROOT / "fedmcmc").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (
                    node.level > 0 or (node.module or "").startswith("fedmcmc")):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {alias.name}")
    return found


def test_no_private_name_is_imported_from_another_module():
    assert private_imports() == []
