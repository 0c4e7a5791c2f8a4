"""The baselines with the library's choices on the three real federations of issue 44
(``tests/real_federations.py``: exam-schools, contraception, grouseticks; 60 to 65 clients
of very unequal sizes, exact or NUTS references on the pooled rows).

* QLSD and FA-LD with ``step_size="auto"``, ``thin="auto"``, ``burn_in="auto"`` are within
  the issue's bar (every |z| < 0.15, every sd ratio in [0.85, 1.15]), R-hat below 1.05 and
  bulk ESS above 100. FA-LD runs one local step per round: with more, its client drift
  biases the mean whatever the run length (Plassier et al.), which the set-up predicts
  from the same Laplace fits and reports with a ``ClientDriftWarning`` (checked on
  exam-schools, where 10 local steps at the benchmark's step gave max |z| 0.26 measured
  and 0.27 predicted).
* A run too short for the chain (``thin=1``) raises a ConvergenceWarning; a broken chain
  (a step 10^4 times too small: it never moves) is flagged: the run lengths it needs
  exceed ``max_iterations`` (RunLengthWarning) and the draws fail the convergence check.
* ConsensusMC with ``"auto"`` on exam-schools (Gaussian subposteriors: its combination
  with the default Stein weights is exact; the inverse sample covariances of the same
  draws miss the bar, and their predicted error says so).

``num_samples=200`` with 4 chains: thin="auto" keeps one relaxation time per draw, a
predicted bulk ESS of 370 (about 0.05 sd of Monte Carlo error on a mean).
"""

import time

import numpy as np
import pytest

import fedmcmc as fm

from real_federations import REAL_FEDERATIONS, describe, run_against_reference

pytestmark = pytest.mark.slow

NUM_SAMPLES = 200
CHAINS = 4
BATCH_SIZE = 32  # the benchmark's

ALGORITHMS = {
    "QLSD": lambda step: fm.QLSD(step_size=step, batch_size=BATCH_SIZE),
    "FALD": lambda step: fm.FALD(step_size=step, batch_size=BATCH_SIZE, local_steps=1),
}


def figures(outcome, seconds):
    info = outcome["info"]
    return (f"{describe(outcome)}; z {np.round(outcome['z'], 3).tolist()}, ratios "
            f"{np.round(outcome['ratio'], 3).tolist()}, {seconds:.0f} s, step_size_exact "
            f"{info.get('step_size_exact')}, minibatch ratio {info.get('minibatch_noise_ratio')}")


# FA-LD on grouseticks (one local step, every client within batch_size: ULA) was xfailed
# with figures (bulk ESS 51 of 370 predicted, R-hat 1.06) that no run reproduces, at this
# commit or at the xfail's (f5a2dcf): seed 1 gives bulk ESS 447, R-hat 1.004, max |z| 0.072
# (QLSD: 439, as recorded then); seeds 2-6 a smallest bulk ESS of 314 to 505, R-hat <= 1.014.
# The prediction holds mode by mode: h lambda_max / 2 = 0.10 (no oscillation), the slowest
# Laplace mode's lag-1 autocorrelation of kept draws 0.32 measured, 0.37 predicted, and the
# draws' smallest precision eigenvalue 114 against the fit's 107.
CASES = [(name, algorithm) for name in REAL_FEDERATIONS for algorithm in ALGORITHMS]


@pytest.mark.parametrize("name,algorithm", CASES)
def test_auto_is_within_the_bar(name, algorithm):
    started = time.perf_counter()
    outcome = run_against_reference(name, ALGORITHMS[algorithm]("auto"),
                                    num_samples=NUM_SAMPLES, chains=CHAINS)
    report = figures(outcome, time.perf_counter() - started)
    print(f"{name} {algorithm}: {report}")
    info = outcome["info"]
    assert info["thin_auto"] and info["burn_in_auto"] and info["step_size_auto"]
    assert info["step_size_budget_reason"] is None, report
    assert outcome["ok"], report
    # R-hat's own noise at ~400 effective draws is about 0.01 (contraception's FA-LD run
    # had 1.013 and a ConvergenceWarning); a run that has not mixed is far above
    assert info["diagnostics"]["max_r_hat"] < 1.05, report
    assert info["diagnostics"]["min_ess_bulk"] > 100, report


@pytest.mark.parametrize("name", REAL_FEDERATIONS)
def test_too_short_and_broken_runs_are_flagged(name):
    started = time.perf_counter()
    short = run_against_reference(name, ALGORITHMS["QLSD"]("auto"), num_samples=NUM_SAMPLES,
                                  chains=CHAINS, thin=1)
    print(f"{name} thin=1: {figures(short, time.perf_counter() - started)}")
    assert short["info"]["thin"] == 1 and short["info"]["relaxation_time"] > 100
    assert short["convergence_warnings"], describe(short)

    started = time.perf_counter()
    tiny = short["info"]["step_size"] * 1e-4
    # burn_in=0: with burn_in="auto" under a budget run_length.resolve keeps the burn-in's
    # time, past max_iterations (1.2 million iterations here; reported to the lead)
    broken = run_against_reference(name, ALGORITHMS["QLSD"](tiny), num_samples=NUM_SAMPLES,
                                   chains=CHAINS, max_iterations=20_000, burn_in=0)
    print(f"{name} step/1e4: {figures(broken, time.perf_counter() - started)}")
    assert any(w.startswith("RunLengthWarning") for w in broken["warnings"]), describe(broken)
    assert broken["convergence_warnings"], describe(broken)
    assert not broken["ok"]


def test_fald_local_steps_drift_is_reported():
    """Ten local steps per round on exam-schools: the predicted drift bias is reported
    before sampling (the run itself is cut short: the warning comes from the set-up)."""
    outcome = run_against_reference(
        "exam-schools", fm.FALD(step_size="auto", batch_size=BATCH_SIZE, local_steps=10),
        num_samples=20, chains=2, thin=10, burn_in=0)
    drift = [w for w in outcome["warnings"] if w.startswith("ClientDriftWarning")]
    assert drift and "variance_reduction" in drift[0], outcome["warnings"]
    assert outcome["info"]["predicted_drift_bias_sd"] > 0.15
    # VR-FALD*'s control variates remove it: nothing predicted, nothing reported
    outcome = run_against_reference(
        "exam-schools", fm.FALD(step_size="auto", batch_size=BATCH_SIZE, local_steps=10,
                                variance_reduction=True),
        num_samples=20, chains=2, thin=10, burn_in=0)
    assert not [w for w in outcome["warnings"] if w.startswith("ClientDriftWarning")]
    assert "predicted_drift_bias_sd" not in outcome["info"]


def test_consensus_auto_on_exam_schools():
    """ConsensusMC with its default Stein weights (each client's sym(K_s C_s^-1) from its
    draws and gradients) on exam-schools' 65 clients (Gaussian subposteriors: the weights
    are exact) is within the bar, predicts no combination error and does not warn. The
    broken variant, the inverse sample covariances of the same client draws (the former
    default, combined here from ``info["client_samples"]``), misses the bar (max |z| 0.204
    measured) and its predicted error is above the CombinationWarning's threshold."""
    from fedmcmc.baselines import consensus
    from real_federations import MAX_ABS_Z, problem

    started = time.perf_counter()
    outcome = run_against_reference("exam-schools", fm.ConsensusMC(), num_samples=NUM_SAMPLES,
                                    chains=CHAINS)
    report = figures(outcome, time.perf_counter() - started)
    info = outcome["info"]
    print(f"exam-schools ConsensusMC: {report}, combination error "
          f"{info['combination_error_sd']:.3f} sd")
    assert (info["thin"], info["burn_in"], info["warmup_steps"]) == (1, 200, 200)
    assert info["weighting"] == "stein" and info["stein_fallback_clients"] == [], report
    assert outcome["ok"], report
    assert info["diagnostics"]["max_r_hat"] < 1.05, report
    assert info["diagnostics"]["min_ess_bulk"] > 100, report
    assert info["combination_error_sd"] < consensus.COMBINATION_ERROR_WARNING, report
    assert not [w for w in outcome["warnings"] if w.startswith("CombinationWarning")], report
    # the same client draws combined with inverse sample covariances
    _, reference = problem("exam-schools")
    client_draws = np.asarray(info["client_samples"])
    combined, _ = consensus.combine(client_draws, "precision")
    z = ((combined.reshape(-1, client_draws.shape[-1]).mean(axis=0) - np.asarray(reference.mean))
         / np.asarray(reference.sd))
    predicted = float(np.max(consensus.combination_error(client_draws, "precision")))
    print(f"  the same draws with weighting='precision': max|z| {np.max(np.abs(z)):.3f}, "
          f"predicted combination error {predicted:.3f} sd")
    assert np.max(np.abs(z)) > MAX_ABS_Z, z
    assert predicted > consensus.COMBINATION_ERROR_WARNING, predicted
