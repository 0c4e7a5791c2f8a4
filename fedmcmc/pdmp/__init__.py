"""Federated piecewise-deterministic Monte Carlo (Bierkens & Duncan 2022, issue 3).

Files: ``events.py`` (closed-form inversion of affine rates), ``dynamics.py``
(linear / elliptical flows and exact path integrals), ``zigzag.py``, ``bps.py``,
``boomerang.py`` (the three samplers and their single-machine kernels),
``federated.py`` (Algorithm 2, thinning by Algorithm 3, Algorithm 4),
``bounds.py`` (Hessian bounds, automatic bounds), ``privacy.py`` (Theorem 5.1),
``setup.py`` (federated Newton for the Laplace reference and control variates),
``output.py`` (batch-means ESS), ``models.py`` (Appendix F models),
``algorithms.py`` (public classes).
"""

from . import bps, boomerang, bounds, dynamics, events, federated, privacy, zigzag
from .algorithms import FedBoomerang, FedBPS, FedZigZag, PDMPBoundError

__all__ = [
    "FedZigZag",
    "FedBPS",
    "FedBoomerang",
    "PDMPBoundError",
    "zigzag",
    "bps",
    "boomerang",
    "events",
    "dynamics",
    "federated",
    "bounds",
    "privacy",
]
