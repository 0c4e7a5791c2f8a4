"""The package's dependency rule (issue 14), checked on the source.

* ``lint-imports`` (import-linter, contracts in ``pyproject.toml``): the core imports no
  family, engine, CLI or reproduction, and the families are independent of each other.
* No private name (``_x``) is imported from another fedmcmc module.
* ``import fedmcmc`` loads no library that only some functions need (issue 18: every Ray
  client process imports fedmcmc, and 30 of them share two cores).
"""

import ast
import pathlib
import shutil
import subprocess

import pytest

from probes import modules_loaded_by

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_import_contracts_hold():
    command = shutil.which("lint-imports")
    if command is None:
        pytest.fail("lint-imports not found: pip install -e '.[test]' (import-linter)")
    run = subprocess.run([command, "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


def test_the_engines_contract_lists_every_engine_module():
    """A new module under fedmcmc/engines (the Ray engine is split into actors, placement,
    direct channels and transport) is held to "engines import no family" only if listed."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [contract] = [c for c in config["tool"]["importlinter"]["contracts"]
                  if c["name"].startswith("Engines import no family")]
    modules = {"fedmcmc.engines" + ("" if path.stem == "__init__" else f".{path.stem}")
               for path in (ROOT / "fedmcmc" / "engines").glob("*.py")}
    assert modules - set(contract["source_modules"]) == set()


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


#: imported by the functions that need them, not by ``import fedmcmc`` (~0.35 s of 0.9 s)
LAZY_LIBRARIES = ("networkx", "scipy", "arviz", "matplotlib", "pandas", "ray", "rich")


def test_import_fedmcmc_does_not_load_libraries_only_some_functions_need():
    assert modules_loaded_by("import fedmcmc", LAZY_LIBRARIES, timeout=120) == []


def test_no_private_name_is_imported_from_another_module():
    assert private_imports() == []


def test_tests_mirror_the_package_and_share_helpers_only_through_helper_modules():
    """Test modules live in folders named after the package's parts, import no other test
    module (shared problems, checks and fresh-process probes are in tests/toy_problems.py,
    tests/stats.py and tests/probes.py) and
    never edit sys.path (tests/conftest.py's folder is on it)."""
    tests = ROOT / "tests"
    folders = {"core", "langevin", "pdmp", "decentralised", "baselines", "engines", "cli"}
    found = []
    for path in sorted(tests.rglob("*.py")):
        relative = path.relative_to(tests)
        if path.name.startswith("test_") and relative.parts[0] not in folders:
            found.append(f"{relative}: not in one of {sorted(folders)}")
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [
                    alias.name for alias in node.names]
                found += [f"{relative}:{node.lineno} imports {name}" for name in names
                          if name.split(".")[0].startswith("test_")]
            if (isinstance(node, ast.Attribute) and node.attr in ("insert", "append")
                    and isinstance(node.value, ast.Attribute) and node.value.attr == "path"
                    and getattr(node.value.value, "id", None) == "sys"):
                found.append(f"{relative}:{node.lineno} edits sys.path")
    assert found == []
