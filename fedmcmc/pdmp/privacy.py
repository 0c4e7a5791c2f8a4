"""Differential privacy of the communicated switching times (Section 5, Theorem 5.1, Appendix C).

If every worker's rate satisfies ``lambda >= rho`` and changing one data row
moves it by at most ``K`` (``|lambda - lambda~| <= K``, e.g. ``K = max ||xi_i||``
for logistic regression with ``|v| = 1``, Example 5.2), then a worker's proposed
switching time is (epsilon, delta)-differentially private with

    delta = exp(-(rho / K) [epsilon - log(1 + K / rho)]),  epsilon > log(1 + K / rho),

and equation (7): ``rho >= K (1 + log(1/delta)) / epsilon`` suffices. ``rho`` is
added to each worker's rate as a constant excess rate (``lambda_m + rho``).

Notes on the paper: Theorem 5.1 states K > 1, which the proof never uses
(only K > 0 is needed); the first display of the last step of Appendix C's
proof drops a ``log`` (it should read ``log(1 + K/rho) <= log(1 + epsilon / (1 + log(1/delta)))``).
The guarantee covers one communicated time; composition over many events is
not part of Theorem 5.1: :func:`composed_privacy` composes it over the times a worker
proposes during a run (every event round, each worker sends one proposed time), which a
private run reports in ``result.info["privacy"]`` (:func:`composed_report`).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["rho_for_privacy", "privacy_delta", "privacy_of_rate", "minimal_rho_for_privacy",
           "composed_privacy", "composed_report"]


def _check(value, name, positive=True):
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(x) or (x <= 0 if positive else x < 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return x


def rho_for_privacy(epsilon, delta, sensitivity) -> float:
    """Equation (7): the excess rate ``rho = K (1 + log(1/delta)) / epsilon`` giving (epsilon, delta)-DP."""
    epsilon = _check(epsilon, "epsilon")
    delta = _check(delta, "delta")
    if delta >= 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    k = _check(sensitivity, "sensitivity")
    return k * (1.0 + math.log(1.0 / delta)) / epsilon


def privacy_delta(rho, epsilon, sensitivity) -> float:
    """Theorem 5.1: the delta achieved by rate ``rho`` at a given ``epsilon`` (1.0 -- no guarantee --
    when ``epsilon <= log(1 + K / rho)``)."""
    rho = _check(rho, "rho")
    epsilon = _check(epsilon, "epsilon")
    k = _check(sensitivity, "sensitivity")
    floor = math.log1p(k / rho)
    if epsilon <= floor:
        return 1.0
    return min(1.0, math.exp(-(rho / k) * (epsilon - floor)))


def privacy_of_rate(rho, sensitivity, epsilon=None):
    """The (epsilon, delta) pairs achieved by ``rho``: at ``epsilon`` (scalar or array) if given,
    otherwise the pair with ``epsilon = 2 log(1 + K/rho)``. Returns ``(epsilon, delta)``."""
    rho = _check(rho, "rho")
    k = _check(sensitivity, "sensitivity")
    if epsilon is None:
        epsilon = 2.0 * math.log1p(k / rho)
    eps = np.asarray(epsilon, dtype=np.float64)
    deltas = np.vectorize(lambda e: privacy_delta(rho, e, k))(eps)
    if eps.ndim == 0:
        return float(eps), float(deltas)
    return eps, deltas


def minimal_rho_for_privacy(epsilon, delta, sensitivity, tol=1e-10) -> float:
    """The smallest rho whose Theorem 5.1 delta is <= ``delta`` (bisection; never above equation (7))."""
    hi = rho_for_privacy(epsilon, delta, sensitivity)
    lo = 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid > 0 and privacy_delta(mid, epsilon, sensitivity) <= delta:
            hi = mid
        else:
            lo = mid
        if hi - lo <= tol * hi:
            break
    return hi


def composed_privacy(epsilon, delta, events) -> tuple:
    """A worker's guarantee over ``events`` proposed switching times, each
    (epsilon, delta)-DP by Theorem 5.1 (the rows enter a proposal only through the worker's
    rate): the better of basic composition, ``(K epsilon, K delta)``, and the advanced
    composition theorem (Dwork, Rothblum and Vadhan 2010; Dwork and Roth 2014, Theorem 3.20)
    with slack ``delta' = delta``: ``(epsilon sqrt(2 K log(1/delta')) + K epsilon (e^epsilon
    - 1), (K + 1) delta)``. Returns ``(epsilon_total, delta_total, rule)``; a delta_total of
    1 or more is no guarantee (it is reported as computed)."""
    epsilon = _check(epsilon, "epsilon")
    delta = _check(delta, "delta")
    k = int(events)
    if k < 0:
        raise ValueError(f"events must be a non-negative integer, got {events!r}")
    if k == 0:
        return 0.0, 0.0, "none"
    basic = (k * epsilon, k * delta, "basic")
    advanced = (epsilon * math.sqrt(2.0 * k * math.log(1.0 / delta))
                + k * epsilon * math.expm1(epsilon), (k + 1) * delta, "advanced")
    return min(basic, advanced, key=lambda pair: pair[0])


def composed_report(epsilon, delta, sensitivity, rho, events_per_worker) -> dict:
    """``result.info["privacy"]`` of a private Fed-PDMC run: Theorem 5.1's per-event pair
    composed over the events each worker proposed (:func:`composed_privacy`)."""
    composed = [composed_privacy(epsilon, delta, k) for k in events_per_worker]
    return {
        "epsilon": [c[0] for c in composed],
        "delta": max(c[1] for c in composed),
        "delta_per_worker": [c[1] for c in composed],
        "composition": [c[2] for c in composed],
        "per_event": {"epsilon": float(epsilon), "delta": float(delta)},
        "events": [int(k) for k in events_per_worker],
        "sensitivity": float(sensitivity),
        "rho": float(rho),
        "accountant": "Theorem 5.1 per event; basic or advanced composition over the events",
        "guarantee": all(c[1] < 1 for c in composed),
    }
