"""What the leaderboard measures, and when it says an algorithm loses.

For draws ``(chains, draws, dim)`` against a reference posterior (mean ``m``, sd ``s``):

``max_abs_z``
    ``max_j |mean_j - m_j| / s_j``: the worst error of the posterior mean, in posterior sd.
``sd_ratio_min``, ``sd_ratio_max``
    Extremes over coordinates of ``sd_j / s_j`` (1 is right; below 1 the sampler is
    overconfident, above 1 too spread).
``w1_max``
    Largest Wasserstein-1 distance between a marginal and the reference's, in posterior sd.
``ess_min``
    Smallest bulk ESS (ArviZ) over coordinates, all chains together.
``ess_per_second``
    ``ess_min`` / wall time of ``fm.sample`` (compilation and set-up included: what a
    user waits for).

Verdict (``verdict`` column). The tolerances are the issue's accuracy targets (0.15
posterior sd for the mean, sd ratios in [0.85, 1.15]) widened by the Monte Carlo error
the run's own ESS allows (4 standard errors: ``4 / sqrt(ess_min)`` for the mean in sd
units, ``4 sqrt(2 / ess_min) / 2`` for an sd ratio) and the reference's:

* ``ok``: within both;
* ``LOSES: ...``: outside; the reason names the worst coordinate and its figure;
* ``LOSES: too few effective draws``: ``ess_min < 20`` (the estimates are noise);
* ``LOSES: over the time budget``: the run was still going after the budget's wall time
  (the quick size gives 45 s per algorithm and problem, the default size 300 s);
* ``FAILED: ...``: the run stopped (diverged, or raised an error); figures are empty;
* ``not available``: the algorithm is not in this version of fedmcmc.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Sequence

import numpy as np

from .. import diagnostics

__all__ = ["MEAN_TOLERANCE", "SD_TOLERANCE", "MIN_ESS", "accuracy", "verdict"]

MEAN_TOLERANCE = 0.15
SD_TOLERANCE = 0.15
MIN_ESS = 20.0
Z = 4.0


def accuracy(draws: np.ndarray, reference, coordinates: Sequence[str]) -> Dict[str, Any]:
    """The leaderboard's accuracy figures of ``draws`` (chains, draws, dim) against ``reference``."""
    draws = np.asarray(draws, dtype=np.float64)
    flat = draws.reshape(-1, draws.shape[-1])
    ref_mean, ref_sd = np.asarray(reference.mean), np.asarray(reference.sd)
    z = (flat.mean(axis=0) - ref_mean) / ref_sd
    ratio = flat.std(axis=0, ddof=1) / ref_sd
    ess = np.asarray(diagnostics.ess(draws), dtype=np.float64)
    w1 = np.asarray(diagnostics.wasserstein_marginal(flat, reference.draws)) / ref_sd
    worst_z = int(np.argmax(np.abs(z)))
    with np.errstate(divide="ignore"):  # a stuck run's sd is 0: its log ratio is -inf, the worst
        worst_ratio = int(np.argmax(np.abs(np.log(ratio))))
    return {
        "max_abs_z": float(np.max(np.abs(z))),
        "worst_mean_coordinate": coordinates[worst_z],
        "z_of_worst": float(z[worst_z]),
        "sd_ratio_min": float(np.min(ratio)),
        "sd_ratio_max": float(np.max(ratio)),
        "worst_sd_coordinate": coordinates[worst_ratio],
        "w1_max": float(np.max(w1)),
        "ess_min": float(np.min(ess)),
    }


def tolerances(ess_min: float, reference_ess: float) -> Dict[str, float]:
    """The mean and sd-ratio bands the verdict uses, given the run's and the reference's ESS."""
    inverse = 1.0 / max(ess_min, 1.0) + 1.0 / max(reference_ess, 1.0)
    return {
        "mean": MEAN_TOLERANCE + Z * math.sqrt(inverse),
        "sd": SD_TOLERANCE + Z * math.sqrt(inverse / 2.0),
    }


def verdict(figures: Dict[str, Any], reference_ess: float) -> str:
    """``ok`` or ``LOSES: <reason>`` (see the module docstring)."""
    if not figures["ess_min"] >= MIN_ESS:  # NaN too: ArviZ cannot estimate it from few draws
        ess = figures["ess_min"]  # one decimal where rounding would print "ESS 20 < 20"
        shown = f"{ess:.1f}" if math.isfinite(ess) and round(ess) >= MIN_ESS else f"{ess:.0f}"
        return f"LOSES: too few effective draws (ESS {shown} < {MIN_ESS:.0f})"
    band = tolerances(figures["ess_min"], reference_ess)
    reasons = []
    if figures["max_abs_z"] > band["mean"]:
        reasons.append(
            f"mean of {figures['worst_mean_coordinate']} off by {figures['z_of_worst']:+.2f} sd "
            f"(tolerance {band['mean']:.2f})"
        )
    low, high = figures["sd_ratio_min"], figures["sd_ratio_max"]
    if low < 1.0 - band["sd"] or high > 1.0 + band["sd"]:
        bad = low if (1.0 - low) > (high - 1.0) else high
        reasons.append(
            f"sd of {figures['worst_sd_coordinate']} {bad:.2f}x the reference "
            f"(tolerance 1 +- {band['sd']:.2f})"
        )
    return "ok" if not reasons else "LOSES: " + "; ".join(reasons)
