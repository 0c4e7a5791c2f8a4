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


def module_imports():
    """Every fedmcmc module's imports of other fedmcmc modules, at any depth (an import inside
    a function counts); ``from . import x`` names the module x. A module's import of a package
    above it is left out (importing the module runs that package's ``__init__`` first)."""
    modules = {}
    for path in (ROOT / "fedmcmc").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if package else parts)] = (path, package)
    graph = {}
    for name, (path, package) in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom):
                base = name.split(".") if package else name.split(".")[:-1]
                if node.level:
                    base = base[:len(base) - node.level + 1] + ([node.module] if node.module else [])
                    target = ".".join(base)
                else:
                    target = node.module or ""
                for alias in node.names:
                    found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules
                              else target)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[name] = {m for m in found if m in modules and m != name
                       and not (modules[m][1] and name.startswith(m + "."))}
    return graph


def test_no_import_cycle_even_through_imports_inside_functions():
    """A cycle hidden in a function-level import (bench/runner.py <-> bench/workers.py, issue
    43) is a cycle all the same: the two modules cannot be understood or moved apart."""
    graph = module_imports()
    cycles = []
    for start in sorted(graph):  # a path from start back to start
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start:
                    cycles.append(" -> ".join(path + [start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
            if cycles:
                break
    assert cycles == []


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


def test_no_private_name_is_reached_through_another_module():
    """``module._name`` where ``module`` is another fedmcmc module bound by an import
    (``federated._select_lanes`` was, issue 43): as bad as importing the private name."""
    found = []
    for path in sorted((ROOT / "fedmcmc").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        package = parts[:-1]  # the package a relative import starts from
        bound = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    name = f"{target}.{alias.name}".replace(".", "/")
                    if target.startswith("fedmcmc") and (
                            (ROOT / f"{name}.py").exists() or (ROOT / name).is_dir()):
                        bound.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                bound.update(alias.asname for alias in node.names
                             if alias.name.startswith("fedmcmc") and alias.asname)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in bound and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} "
                             f"{node.value.id}.{node.attr}")
    assert found == []


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
