"""Every run checks its own convergence: R-hat and effective sample sizes, and a warning
that says which knob to turn.

After every ``fm.sample`` run (every family, every engine) :func:`check` computes, per
scalar parameter of the kept draws,

* ``r_hat``: the rank-normalised split R-hat (the larger of the bulk and the folded one;
  Vehtari, Gelman, Simpson, Carpenter and Buerkner 2021, ArviZ's ``rhat(method="rank")``),
  also for one chain (its two halves: ArviZ leaves it nan);
* ``ess_bulk`` and ``ess_tail``: ArviZ's bulk and tail effective sample sizes,

into ``result.info["diagnostics"]``, and warns with one :class:`ConvergenceWarning` listing
the worst parameters when an R-hat is above ``max_r_hat`` (1.01) or a bulk ESS below
``min_ess_bulk`` (100). The thresholds are those of Vehtari et al. (2021) and Stan; pass
``fm.sample(..., convergence=fm.ConvergenceCheck(max_r_hat=1.05, min_ess_bulk=400))`` to
change them, or ``convergence=False`` for no warning (the figures are still computed).

The warning says what to change and by how much: from the relaxation time the set-up
predicted (``info["relaxation_time"]``, :mod:`fedmcmc.run_length`) when there is one, else
from the ESS measured (draws per effective draw).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Dict, List, Optional

import numpy as np

from . import diagnostics as _diagnostics
from .callsite import user_stacklevel

__all__ = ["ConvergenceWarning", "ConvergenceCheck", "diagnose", "check", "advice"]

#: parameters named in the warning
WORST_SHOWN = 5
#: bulk ESS per chain below which R-hat's own error is of the 1.01 threshold's size (Vehtari
#: et al. 2021 ask for 100 per chain): the advice for a high R-hat then adds more draws
RELIABLE_ESS_PER_CHAIN = 100.0


class ConvergenceWarning(UserWarning):
    """The draws of a run have not converged: R-hat above or bulk ESS below the thresholds
    of :class:`ConvergenceCheck`. The message names the worst parameters and what to change;
    ``result.info["diagnostics"]`` has every parameter's figures."""


@dataclasses.dataclass(frozen=True)
class ConvergenceCheck:
    """Thresholds of the convergence check every run makes.

    ``max_r_hat``: warn above (default 1.01); ``min_ess_bulk``: warn below (default 100,
    over all chains); ``min_ess_tail``: warn below (default None: not checked);
    ``warn``: False computes the figures without warning."""

    max_r_hat: float = 1.01
    min_ess_bulk: float = 100.0
    min_ess_tail: Optional[float] = None
    warn: bool = True

    def __post_init__(self):
        for name in ("max_r_hat", "min_ess_bulk", "min_ess_tail"):
            value = getattr(self, name)
            if value is None and name == "min_ess_tail":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if self.max_r_hat < 1.0:
            raise ValueError(f"max_r_hat must be at least 1, got {self.max_r_hat!r}")

    @classmethod
    def of(cls, value: Any) -> "ConvergenceCheck":
        """``fm.sample``'s ``convergence`` argument: None/True (defaults), False (no warning),
        a :class:`ConvergenceCheck` or a dict of its fields."""
        if value is None or value is True:
            return cls()
        if value is False:
            return cls(warn=False)
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = set(value) - {f.name for f in dataclasses.fields(cls)}
            if unknown:
                raise ValueError(f"convergence has unknown keys {sorted(unknown)}; "
                                 f"known: max_r_hat, min_ess_bulk, min_ess_tail, warn")
            return cls(**value)
        raise ValueError("convergence must be True, False, a dict or fm.ConvergenceCheck(...), "
                         f"got {value!r}")


def diagnose(draws: np.ndarray, names: Optional[List[str]] = None) -> Dict[str, Any]:
    """Per-parameter ``r_hat``, ``ess_bulk``, ``ess_tail`` of ``draws`` ``(chains, draws,
    dim)`` (lists of ``dim`` floats, nan where a figure is undefined: fewer than 4 draws,
    non-finite draws), the ``parameters``' names, and the extremes."""
    array = np.asarray(draws, np.float64)
    chains, count, dim = array.shape
    names = list(names) if names is not None else [f"theta[{i}]" for i in range(dim)]
    r_hat, ess_bulk, ess_tail = _diagnostics.convergence_figures(array)
    # a chain that never moves: every chain constant (ArviZ leaves its R-hat nan and counts
    # every draw effective); the check flags it
    with np.errstate(invalid="ignore"):
        frozen = (np.all(np.isfinite(array), axis=(0, 1)) & (count >= 2)
                  & np.all(np.ptp(array, axis=1) == 0, axis=0)) if count else np.zeros(dim, bool)

    def extreme(values, function):
        finite = values[np.isfinite(values)]
        return float(function(finite)) if finite.size else None

    return {
        "parameters": names,
        "r_hat": r_hat.tolist(),
        "ess_bulk": ess_bulk.tolist(),
        "ess_tail": ess_tail.tolist(),
        "frozen": [names[i] for i in np.flatnonzero(frozen)],
        "max_r_hat": extreme(r_hat, np.max),
        "min_ess_bulk": extreme(ess_bulk, np.min),
        "min_ess_tail": extreme(ess_tail, np.min),
        "chains": int(chains),
        "draws": int(count),
    }


def coordinate_names(samples) -> List[str]:
    """One name per flat coordinate of a samples pytree (leaves ``(chains, draws, ...)``):
    ``beta[2]``, ``layer_0.bias[1, 3]``, a scalar leaf by its own name."""
    from .results import flatten_names

    names = []
    for name, leaf in flatten_names(samples).items():
        shape = np.shape(leaf)[2:]
        if not shape:
            names.append(name)
            continue
        for index in np.ndindex(*shape):
            names.append(f"{name}[{', '.join(map(str, index))}]")
    return names


def _failing(diagnostics: Dict[str, Any], thresholds: ConvergenceCheck) -> List[int]:
    r_hat = np.asarray(diagnostics["r_hat"], np.float64)
    bulk = np.asarray(diagnostics["ess_bulk"], np.float64)
    tail = np.asarray(diagnostics["ess_tail"], np.float64)
    bad = (r_hat > thresholds.max_r_hat) | (bulk < thresholds.min_ess_bulk)
    if thresholds.min_ess_tail is not None:
        bad |= tail < thresholds.min_ess_tail
    frozen = set(diagnostics.get("frozen") or [])
    bad |= np.array([name in frozen for name in diagnostics["parameters"]], bool)
    return np.flatnonzero(bad).tolist()


def advice(info: Dict[str, Any], diagnostics: Dict[str, Any], thresholds: ConvergenceCheck,
           ) -> str:
    """What to change, and by how much (module docstring)."""
    bulk = np.asarray(diagnostics["ess_bulk"], np.float64)
    r_hat = np.asarray(diagnostics["r_hat"], np.float64)
    worst_ess = float(np.nanmin(bulk)) if np.isfinite(bulk).any() else 0.0
    worst_r_hat = float(np.nanmax(r_hat)) if np.isfinite(r_hat).any() else float("nan")
    draws = diagnostics["draws"] * diagnostics["chains"]
    factor = thresholds.min_ess_bulk / max(worst_ess, 1.0)
    if worst_ess >= thresholds.min_ess_bulk:
        factor = 1.0
    thin = info.get("thin")
    interval = info.get("sample_interval")
    relaxation = info.get("relaxation_time")
    burn_in = info.get("burn_in")
    parts = []
    if relaxation and isinstance(thin, (int, float)) and "sample_interval" not in info:
        needed = int(math.ceil(relaxation))
        if thin < needed:
            parts.append(
                f"the library predicts {relaxation:.3g} iterations per relaxation time and "
                f"thin={thin} keeps a draw every {thin / relaxation:.2g} of one: pass "
                f"thin='auto' (thin={needed}), i.e. about {needed / thin:.3g}x the iterations")
        elif factor > 1:
            parts.append(f"raise num_samples about {factor:.2g}x "
                         f"(to {int(math.ceil(factor * diagnostics['draws']))})")
        if burn_in is not None and thin:
            burn = int(math.ceil(5 * relaxation / max(thin, needed)))
            if burn_in * thin < 5 * relaxation:
                parts.append(f"burn-in covers {burn_in * thin / relaxation:.2g} relaxation times: "
                             f"pass burn_in='auto' (at least {burn} draws of thin={max(thin, needed)})")
    elif relaxation and isinstance(interval, (int, float)):
        if interval < relaxation:
            parts.append(
                f"the library predicts a relaxation time of {relaxation:.3g} in process time "
                f"and sample_interval={interval:g}: pass sample_interval='auto' "
                f"(sample_interval={relaxation:.3g})")
        elif factor > 1:
            parts.append(f"raise num_samples about {factor:.2g}x")
    elif factor > 1:
        # no prediction: measured draws per effective draw
        per_effective = draws / max(worst_ess, 1.0)
        knob = "sample_interval" if interval is not None else "thin"
        current = interval if interval is not None else (thin or 1)
        parts.append(
            f"{draws} draws gave a bulk ESS of {worst_ess:.0f} ({per_effective:.3g} draws per "
            f"effective draw): raise {knob} (now {current:g}) or num_samples about "
            f"{factor:.2g}x, or pass {knob}='auto' where the algorithm offers it")
    if np.isfinite(worst_r_hat) and worst_r_hat > thresholds.max_r_hat and not parts:
        text = ("the chains disagree (R-hat) although each mixes: raise burn_in "
                "(burn_in='auto' where offered) or check for several modes")
        # Vehtari et al. (2021) judge R-hat against 1.01 only with a bulk ESS of at least
        # 100 per chain: below that R-hat's own Monte Carlo error is of the threshold's size
        chains = max(int(diagnostics["chains"]), 1)
        worst = int(np.nanargmax(r_hat))
        per_chain = float(bulk[worst]) / chains if np.isfinite(bulk[worst]) else 0.0
        if per_chain < RELIABLE_ESS_PER_CHAIN:
            needed = RELIABLE_ESS_PER_CHAIN / max(per_chain, 1.0)
            text += (f"; with {per_chain:.0f} effective draws per chain R-hat is itself "
                     f"noisy: raise num_samples about {needed:.2g}x "
                     f"(to {int(math.ceil(needed * diagnostics['draws']))} per chain)")
        parts.append(text)
    if diagnostics.get("frozen"):
        parts.insert(0, "chains that never move make no draws of the posterior: the step size "
                        "(or sample_interval) is far too small, or the update does nothing; try "
                        "step_size='auto'")
    if info.get("step_size_budget_reason"):
        parts.append("the step size was raised to fit the budget "
                     f"({info['step_size_budget_reason']}); raise max_iterations for an exact one")
    return "; ".join(parts)


def check(result, thresholds: ConvergenceCheck) -> Dict[str, Any]:
    """Compute ``result.info["diagnostics"]`` and warn when the run has not converged."""
    flat = result.flat_samples()
    try:
        names = coordinate_names(result.samples)
    except Exception:  # noqa: BLE001 - names are a convenience; never fail a run for them
        names = None
    if names is not None and len(names) != flat.shape[-1]:
        names = None
    diagnostics = diagnose(flat, names)
    bad = _failing(diagnostics, thresholds)
    diagnostics.update(max_r_hat_threshold=thresholds.max_r_hat,
                       min_ess_bulk_threshold=thresholds.min_ess_bulk,
                       converged=not bad)
    result.info["diagnostics"] = diagnostics
    if bad and thresholds.warn:
        warnings.warn(message(result.algorithm, result.info, diagnostics, thresholds, bad),
                      ConvergenceWarning, stacklevel=user_stacklevel())
    return diagnostics


def message(algorithm: str, info: Dict[str, Any], diagnostics: Dict[str, Any],
            thresholds: ConvergenceCheck, bad: Optional[List[int]] = None) -> str:
    """The :class:`ConvergenceWarning`'s text."""
    bad = _failing(diagnostics, thresholds) if bad is None else bad
    r_hat = np.asarray(diagnostics["r_hat"], np.float64)
    bulk = np.asarray(diagnostics["ess_bulk"], np.float64)
    # worst first: by how far each is past its threshold
    badness = np.maximum(np.nan_to_num(r_hat - thresholds.max_r_hat, nan=0.0) * 100,
                         np.nan_to_num(thresholds.min_ess_bulk / np.maximum(bulk, 1e-9),
                                       nan=0.0))
    frozen = set(diagnostics.get("frozen") or [])
    names = diagnostics["parameters"]
    badness = np.where([name in frozen for name in names], np.inf, badness)
    order = sorted(bad, key=lambda i: -badness[i])
    shown = ", ".join(
        f"{names[i]} (never moves: every chain constant)" if names[i] in frozen else
        f"{names[i]} (R-hat {r_hat[i]:.3g}, bulk ESS {bulk[i]:.0f})"
        for i in order[:WORST_SHOWN])
    more = f" and {len(order) - WORST_SHOWN} more" if len(order) > WORST_SHOWN else ""
    text = (f"{algorithm or 'the run'}: {len(order)} of {len(r_hat)} parameters have not "
            f"converged (R-hat > {thresholds.max_r_hat:g}, bulk ESS < "
            f"{thresholds.min_ess_bulk:g} or no move): {shown}{more}.")
    hint = advice(info, diagnostics, thresholds)
    if hint:
        text += " To fix: " + hint + "."
    return text + " Every parameter's figures are in result.info['diagnostics']."
