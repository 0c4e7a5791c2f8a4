"""Run lengths the library chooses: ``thin="auto"``, ``burn_in="auto"`` (and the PDMPs'
``sample_interval="auto"``), and the budget rule every ``"auto"`` step size obeys.

Every family predicts, from what the clients report, the **relaxation time** ``R`` of its
chain: the number of iterations (PDMPs: units of process time) in which the slowest
direction of the posterior forgets its past by a factor ``e``. For Langevin updates
``theta' = theta + (h/2) grad log pi + N(0, h)`` on a posterior of precision ``P`` the
slowest direction is an AR(1) with coefficient ``1 - h lambda_min(P) / 2``, so
``R = 2 / (h lambda_min(P))``; the network average of DULA / GT-DULA is such a chain with
``h = 2 alpha``. From ``R``:

``thin="auto"``
    ``thin = ceil(R)``: one relaxation time between kept draws. Two successive kept draws
    then correlate by ``e^-1`` in the slowest direction, an integrated autocorrelation time
    of ``(1 + e^-1) / (1 - e^-1) = 2.16`` draws: ``chains x num_samples / 2.16`` effective
    draws predicted (:func:`predicted_ess`), faster directions more.
``burn_in="auto"``
    Enough relaxation times to shrink the chains' initial offset from the posterior to
    :data:`BURN_IN_TOLERANCE` posterior sd: ``k = max(5, 2 ln(z0 / 0.05))`` relaxation times,
    ``z0`` the initial offset in posterior sds along the Laplace fit (the factor 2 allows for
    the slower, non-linear transient far from the mode), and never fewer draws than a tenth
    of ``num_samples``. ``z0`` unknown: 100 sds assumed.
The budget of an ``"auto"`` step size
    A run makes at most ``max_iterations`` iterations per chain (default
    :data:`DEFAULT_MAX_ITERATIONS`; a ``fm.sample`` keyword). When the step size that meets
    the accuracy tolerance relaxes too slowly for the run (:func:`affordable_relaxation`:
    with ``thin="auto"``, ``(k + num_samples) R > max_iterations``; with a given ``thin``,
    a predicted ESS below ``min_ess``), the step size is raised until it fits, but never
    past the budget tolerance (predicted variance inflation :data:`BUDGET_TOLERANCE`, 25 %)
    unless the run would otherwise not make a single relaxation time in ``max_iterations``
    iterations; it never passes the stability limit. What was chosen, the exact step size,
    the predicted inflation and the predicted ESS are in ``info`` and a
    :class:`RunLengthWarning` says what to change.

The values used are recorded in ``result.info`` (``thin``, ``burn_in``,
``relaxation_time``, ``predicted_ess``, ``thin_auto``, ``burn_in_auto``, ``max_iterations``).
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any, NamedTuple, Optional, Union

from .callsite import user_stacklevel

__all__ = [
    "AUTO",
    "DEFAULT_MAX_ITERATIONS",
    "DEFAULT_MIN_ESS",
    "BURN_IN_TOLERANCE",
    "BUDGET_TOLERANCE",
    "RunLengthWarning",
    "RunRequest",
    "RunLength",
    "check_run_length",
    "is_auto",
    "predicted_ess",
    "burn_in_relaxations",
    "affordable_relaxation",
    "resolve",
    "budget_step_size",
    "warn_step_raised",
]

AUTO = "auto"
#: iterations per chain an ``"auto"`` setting may plan (``fm.sample(max_iterations=...)``)
DEFAULT_MAX_ITERATIONS = 1_000_000
#: the bulk ESS below which a run warns (:mod:`fedmcmc.convergence`), and that budgets aim at
DEFAULT_MIN_ESS = 100
#: burn-in shrinks the initial offset to this many posterior sds
BURN_IN_TOLERANCE = 0.05
#: burn-in relaxation times at least, and the factor on ln(z0 / tolerance)
MIN_BURN_IN_RELAXATIONS = 5.0
BURN_IN_SAFETY = 2.0
#: initial offset (posterior sds) assumed when a family cannot measure it
UNKNOWN_INITIAL_OFFSET = 100.0
#: burn-in is at least this fraction of num_samples
MIN_BURN_IN_FRACTION = 0.1
#: the predicted variance inflation a budget may trade for speed
BUDGET_TOLERANCE = 0.25
#: the budget's floor aims at one relaxation time in this fraction of max_iterations
FLOOR_MARGIN = 0.95


class RunLengthWarning(UserWarning):
    """A run's length or an ``"auto"`` step size was limited by the budget
    (``max_iterations``) or the run is too short for what the library predicts."""


def is_auto(value: Any) -> bool:
    return isinstance(value, str) and value == AUTO


def check_run_length(value: Any, argument: str, minimum: int) -> Union[int, str]:
    """``value`` as given: ``"auto"`` or an integer ``>= minimum`` (ValueError naming
    ``argument`` otherwise)."""
    if is_auto(value):
        return AUTO
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        kind = "a positive" if minimum > 0 else "a non-negative"
        raise ValueError(f"{argument} must be {kind} integer or 'auto', got {value!r}")
    return int(value)


class RunRequest(NamedTuple):
    """What the user asked of a run's length, before the set-up resolves ``"auto"``."""

    num_samples: int
    burn_in: Union[int, str]
    thin: Union[int, str]
    chains: int
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    min_ess: float = DEFAULT_MIN_ESS

    @property
    def auto_thin(self) -> bool:
        return is_auto(self.thin)

    @property
    def auto_burn_in(self) -> bool:
        return is_auto(self.burn_in)

    @property
    def any_auto(self) -> bool:
        return self.auto_thin or self.auto_burn_in


class RunLength(NamedTuple):
    """A resolved run length and what it predicts."""

    thin: int
    burn_in: int
    relaxation_time: Optional[float]  # iterations (PDMPs: process time); None: unknown
    predicted_ess: Optional[float]
    thin_auto: bool
    burn_in_auto: bool

    def info(self) -> dict:
        out = {"thin": int(self.thin), "burn_in": int(self.burn_in),
               "thin_auto": bool(self.thin_auto), "burn_in_auto": bool(self.burn_in_auto)}
        if self.relaxation_time is not None:
            out["relaxation_time"] = float(self.relaxation_time)
        if self.predicted_ess is not None:
            out["predicted_ess"] = float(self.predicted_ess)
        return out


def predicted_ess(relaxation_time: float, thin: float, num_samples: int, chains: int) -> float:
    """The bulk ESS of the slowest direction: ``chains x num_samples / tau`` with the kept
    draws an AR(1) of coefficient ``exp(-thin / R)``, ``tau = (1 + rho) / (1 - rho)``."""
    total = float(chains * num_samples)
    if not relaxation_time or not math.isfinite(relaxation_time) or relaxation_time <= 0:
        return 0.0 if relaxation_time and not math.isfinite(relaxation_time) else total
    rho = math.exp(-float(thin) / float(relaxation_time))
    if rho >= 1.0:
        return 0.0
    return total * (1.0 - rho) / (1.0 + rho)


def burn_in_relaxations(initial_offset: Optional[float] = None) -> float:
    """Relaxation times of burn-in for chains that start ``initial_offset`` posterior sds
    from the posterior (module docstring)."""
    offset = UNKNOWN_INITIAL_OFFSET if initial_offset is None or not math.isfinite(
        initial_offset) else max(float(initial_offset), 1.0)
    return max(MIN_BURN_IN_RELAXATIONS, BURN_IN_SAFETY * math.log(offset / BURN_IN_TOLERANCE))


def affordable_relaxation(request: RunRequest, initial_offset: Optional[float] = None,
                          ) -> Optional[float]:
    """The longest relaxation time (iterations) with which the requested run still meets its
    budget: with ``thin="auto"``, burn-in and one relaxation time per kept draw within
    ``max_iterations``; with a given ``thin``, a predicted ESS of at least ``min_ess``.
    ``None``: no relaxation time suffices (``chains x num_samples < min_ess``: the run is
    too short whatever the step size)."""
    if request.auto_thin:
        # resolve() rounds thin and burn-in up and keeps a burn-in of at least a tenth of
        # num_samples: the margin keeps the planned iterations within max_iterations
        burn_in = (max(burn_in_relaxations(initial_offset),
                       MIN_BURN_IN_FRACTION * request.num_samples)
                   if request.auto_burn_in else float(request.burn_in))
        return request.max_iterations / (burn_in + 1.0 + request.num_samples) - 1.0
    ratio = request.chains * request.num_samples / float(request.min_ess)  # tau at most
    if ratio <= 1.0:
        return None
    # (1 + rho) / (1 - rho) <= ratio  <=>  rho <= (ratio - 1) / (ratio + 1)
    return float(request.thin) / math.log((ratio + 1.0) / (ratio - 1.0))


def resolve(request: RunRequest, relaxation_time: Optional[float],
            initial_offset: Optional[float] = None, *, name: str = "",
            info: Optional[dict] = None) -> RunLength:
    """``thin`` and ``burn_in`` from the predicted ``relaxation_time`` (module docstring);
    values the user gave are kept. ``relaxation_time=None`` (not predicted): ``"auto"`` is
    refused with a ``ValueError`` naming the argument. Records the choice in ``info``."""
    if relaxation_time is None or not math.isfinite(relaxation_time) or relaxation_time <= 0:
        for argument in ("thin", "burn_in"):
            if is_auto(getattr(request, argument)):
                raise ValueError(
                    f"{argument}='auto' needs the relaxation time {name or 'the algorithm'} "
                    f"predicts from the clients' reports, and it gave none "
                    f"({relaxation_time!r}); give {argument} as an integer")
        relaxation_time = None
    thin = request.thin
    if request.auto_thin:
        thin = max(1, int(math.ceil(relaxation_time)))
    burn_in = request.burn_in
    if request.auto_burn_in:
        relaxations = burn_in_relaxations(initial_offset)
        burn_in = max(int(math.ceil(relaxations * relaxation_time / thin)),
                      int(math.ceil(MIN_BURN_IN_FRACTION * request.num_samples)))
    if request.auto_thin:
        iterations = (burn_in + request.num_samples) * thin
        if iterations > request.max_iterations:
            # the budget: fewer iterations per draw (and a burn-in of the same time)
            # (an "auto" burn-in keeps its number of draws: it shrinks with thin, in proportion)
            fitted = max(1, request.max_iterations // (burn_in + request.num_samples))
            warnings.warn(
                f"{name}: thin='auto' wants {thin} iterations per draw (one relaxation time) "
                f"but {burn_in + request.num_samples} draws of it make {iterations:,} iterations, "
                f"over max_iterations={request.max_iterations:,}; thin={fitted} is used "
                f"(predicted bulk ESS "
                f"{predicted_ess(relaxation_time, fitted, request.num_samples, request.chains):.0f}). "
                f"Raise max_iterations to {iterations:,} to keep one relaxation time per draw",
                RunLengthWarning, stacklevel=user_stacklevel())
            thin = fitted
    ess = None if relaxation_time is None else predicted_ess(
        relaxation_time, thin, request.num_samples, request.chains)
    length = RunLength(thin=int(thin), burn_in=int(burn_in), relaxation_time=relaxation_time,
                       predicted_ess=ess, thin_auto=request.auto_thin,
                       burn_in_auto=request.auto_burn_in)
    if info is not None:
        info.update(length.info(), max_iterations=int(request.max_iterations))
        if initial_offset is not None and math.isfinite(initial_offset):
            info["initial_offset_sd"] = float(initial_offset)
    return length


def budget_step_size(step_size: float, relaxation_of, request: Optional[RunRequest], *,
                     accuracy_ceiling: float, stability_ceiling: float,
                     initial_offset: Optional[float] = None) -> tuple:
    """The budget rule of an ``"auto"`` step size (module docstring).

    ``step_size``: the step that meets the accuracy tolerance; ``relaxation_of(h)``: the
    predicted relaxation time at ``h`` (iterations), decreasing in ``h`` and proportional to
    ``1 / h``; ``accuracy_ceiling``: the largest step within :data:`BUDGET_TOLERANCE`;
    ``stability_ceiling``: the largest stable step. Returns ``(h, reason)`` with ``reason``
    None when ``step_size`` is kept, else a sentence saying why it was raised."""
    if request is None:
        return step_size, None
    relaxation = relaxation_of(step_size)
    if not math.isfinite(relaxation) or relaxation <= 0:
        return step_size, None
    afford = affordable_relaxation(request, initial_offset)
    target = step_size
    reason = None
    if afford is not None and relaxation > afford:
        target = step_size * relaxation / afford  # R proportional to 1 / h
        reason = (f"its relaxation time of {relaxation:.3g} iterations is more than the run "
                  f"affords ({afford:.3g}: "
                  + ("burn-in and one relaxation time per draw within "
                     f"max_iterations={request.max_iterations:,}" if request.auto_thin else
                     f"a predicted bulk ESS of {request.min_ess:g} with thin={request.thin}")
                  + ")")
        target = min(target, max(accuracy_ceiling, step_size))
    # never a step with which max_iterations make less than one relaxation time (a margin
    # of 5 %: resolve() fits whole draws into max_iterations)
    floor = step_size * relaxation / (FLOOR_MARGIN * request.max_iterations)
    if target < floor:
        target = floor
        reason = reason or (f"its relaxation time of {relaxation:.3g} iterations is longer "
                            f"than max_iterations={request.max_iterations:,}")
    target = min(target, max(stability_ceiling, step_size))
    if target <= step_size:
        return step_size, None
    return float(target), reason


def warn_step_raised(name: str, tolerance: float, exact: float, used: float, reason: str,
                     inflation: float, relaxation: float, detail: str = "") -> None:
    """The :class:`RunLengthWarning` of an ``"auto"`` step size the budget raised (every
    family's): what the tolerance wanted, why and what is used, the predicted variance
    inflation (``detail``: its parts) and the relaxation time at the step used."""
    warnings.warn(
        f"{name}: step_size='auto' meets the tolerance {tolerance:g} with h={exact:.3g}, "
        f"but {reason}; h={used:.3g} is used instead, with a predicted variance inflation "
        f"of {inflation:.3g}{detail} and {relaxation:.3g} iterations per relaxation time. "
        f"Raise max_iterations (fm.sample) to keep h={exact:.3g}",
        RunLengthWarning, stacklevel=user_stacklevel())
