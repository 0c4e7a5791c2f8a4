"""Federated stochastic-gradient Langevin dynamics: SGLD, DSGLD, FSGLD.

Kernels (pure functions of explicit state): ``sgld.py`` (eq. 1-2),
``dsgld.py`` (eq. 3-4), ``fsgld.py`` (eq. 5-7, Algorithm 1); estimators in
``estimators.py``; public classes in ``algorithms.py``.
"""

from . import dsgld, estimators, fsgld, sgld
from .algorithms import DSGLD, FSGLD, SGLD

__all__ = ["SGLD", "DSGLD", "FSGLD", "sgld", "dsgld", "fsgld", "estimators"]
