"""Federated stochastic-gradient Langevin dynamics: SGLD, DSGLD, FSGLD, and federated SGHMC.

Kernels (pure functions of explicit state): ``sgld.py`` (eq. 1-2),
``dsgld.py`` (eq. 3-4), ``fsgld.py`` (eq. 5-7, Algorithm 1); estimators in
``estimators.py``; public classes in ``algorithms.py``; the set-up before sampling
(``"auto"`` h, control variates, client selection, surrogates, trust radius, run lengths) in
``setup.py``, one for every engine; the in-process run in ``run.py``; the hand-off protocols
of the message-passing engines in ``handoff.py``; pSGLD's diagonal preconditioner (Li et al.,
2016), an option of all three, in ``preconditioning.py``. ``sghmc.py``: SGHMC (Chen et al.,
2014) whose momentum travels with the chain, written as a hand-off protocol only.
"""

from . import dsgld, estimators, fsgld, sgld
from . import sghmc
from . import preconditioning
from .algorithms import DSGLD, FSGLD, SGLD
from .preconditioning import RMSPropPreconditioner
from .sghmc import FedSGHMC

__all__ = ["SGLD", "DSGLD", "FSGLD", "FedSGHMC", "RMSPropPreconditioner", "sgld", "dsgld",
           "fsgld", "sghmc", "estimators", "preconditioning"]
