"""The field's baselines: FA-LD / VR-FALD* (``FALD``), QLSD / QLSD++ (``QLSD``) and
consensus Monte Carlo (``ConsensusMC``). Kernels in ``fald.py``, ``qlsd.py``,
``consensus.py``; public classes in ``algorithms.py``."""

from .algorithms import FALD, QLSD, ConsensusMC

__all__ = ["FALD", "QLSD", "ConsensusMC"]
