"""Engines run an algorithm's kernels: ``local`` (one compiled JAX program)."""

from .local import run_chains

__all__ = ["run_chains"]
