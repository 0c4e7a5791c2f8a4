"""Decentralised Langevin sampling over a communication graph: DULA and GT-DULA.

Bhar, Bai, George, Busart (2025), "Scalability Enhancement and Data-Heterogeneity
Awareness in Gradient Tracking based Decentralized Bayesian Learning"
(``papers/gt-dula-bhar-et-al-2025.md``). Graphs and Condition 1 in ``graphs.py``,
kernels (equations (3)-(8)) in ``kernels.py``, public classes in ``algorithms.py``,
diagnostics and the exact linear-Gaussian oracle in ``diagnostics.py``.
"""

from . import diagnostics, graphs, kernels
from .algorithms import DULA, GTDULA

__all__ = ["DULA", "GTDULA", "graphs", "kernels", "diagnostics"]
