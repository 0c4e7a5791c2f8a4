"""Registry of the paper reproductions behind ``fedmcmc reproduce``.

A reproduction is a function ``(out_dir: Path, quick: bool) -> None`` that
writes its plots, numbers and ``out_dir/README.md`` (our result beside the
paper's, and where the setting differs). Register it in a module of this
package::

    from fedmcmc.reproduce import register

    @register("fsgld-figure-2", "FSGLD Fig. 2-3: delayed communication, MSE against draws")
    def figure_2(out_dir: Path, quick: bool) -> None:
        ...

Every module in ``fedmcmc/reproduce/`` is imported when the registry is first
listed, so a new file is picked up without editing this one. A module that
fails to import is reported by :func:`import_errors`, not silently skipped.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from pathlib import Path
from typing import Callable, Dict, List

__all__ = ["Reproduction", "register", "available", "get", "run", "import_errors"]


@dataclasses.dataclass(frozen=True)
class Reproduction:
    name: str
    description: str
    function: Callable[[Path, bool], None]


_REGISTRY: Dict[str, Reproduction] = {}
_IMPORT_ERRORS: Dict[str, str] = {}
_DISCOVERED = False


def register(name: str, description: str):
    """Decorator registering ``function(out_dir, quick)`` under ``name`` (unique, no spaces)."""
    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        raise ValueError(f"name must be a non-empty string without spaces, got {name!r}")
    if not isinstance(description, str):
        raise ValueError("description must be a string")

    def decorator(function: Callable[[Path, bool], None]):
        if not callable(function):
            raise ValueError("register(...) decorates a function (out_dir, quick) -> None")
        existing = _REGISTRY.get(name)
        if existing is not None and existing.function is not function:
            raise ValueError(f"a reproduction named {name!r} is already registered")
        _REGISTRY[name] = Reproduction(name, description, function)
        return function

    return decorator


def _discover() -> None:
    global _DISCOVERED
    if _DISCOVERED:
        return
    _DISCOVERED = True
    for module in pkgutil.iter_modules(__path__):
        if module.name.startswith("_"):
            continue
        try:
            importlib.import_module(f"{__name__}.{module.name}")
        except Exception as error:  # noqa: BLE001 - reported by import_errors()
            _IMPORT_ERRORS[module.name] = f"{type(error).__name__}: {error}"


def available() -> List[Reproduction]:
    """Registered reproductions, sorted by name."""
    _discover()
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


def import_errors() -> Dict[str, str]:
    """Modules of this package that failed to import: name -> error."""
    _discover()
    return dict(_IMPORT_ERRORS)


def get(name: str) -> Reproduction:
    _discover()
    if name not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY)) or "none registered yet"
        raise KeyError(f"unknown reproduction {name!r}; available: {known}")
    return _REGISTRY[name]


def run(name: str, out_dir, quick: bool = False) -> Path:
    """Run one reproduction into ``out_dir``; returns the README it wrote."""
    reproduction = get(name)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    reproduction.function(out_dir, bool(quick))
    readme = out_dir / "README.md"
    if not readme.is_file():
        raise RuntimeError(f"reproduction {name!r} finished without writing {readme}")
    return readme
