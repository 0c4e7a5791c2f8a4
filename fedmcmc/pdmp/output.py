"""Output summaries of a PDMP run: ESS by batch means over process time."""

from __future__ import annotations

import numpy as np

__all__ = ["ess_from_batch_sums"]


def ess_from_batch_sums(batch_sums: np.ndarray, batch_length: int, variance: np.ndarray) -> np.ndarray:
    """ESS of the trajectory average, per coordinate, summed over chains, by batch means.

    The exact averages of X(t) over consecutive sample intervals are grouped into batches
    of ``batch_length``; with ``s^2`` the variance of the batch means and ``b`` the batch
    length, the asymptotic variance of one interval is ``b s^2`` and
    ``ESS = n variance / (b s^2)`` (``variance``: the target's variance, e.g. the
    trajectory variance).

    ``batch_sums`` has shape ``(chains, nb, d)``: the sum of ``batch_length``
    consecutive interval means per batch (what the samplers accumulate in their
    chain state, so that a resumed run can report the ESS of the whole run).
    """
    sums = np.asarray(batch_sums, dtype=np.float64)
    chains, nb, d = sums.shape
    b = int(batch_length)
    total = np.zeros(d)
    for c in range(chains):
        batches = sums[c] / b
        s2 = batches.var(axis=0, ddof=1) if nb > 1 else np.full(d, np.inf)
        asym = np.maximum(b * s2, 1e-300)
        total += (nb * b) * np.asarray(variance) / asym
    return total
