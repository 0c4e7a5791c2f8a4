"""Every run checks its own convergence (fedmcmc.convergence) and run lengths "auto"
(fedmcmc.run_length): ArviZ's figures, the warning, its thresholds, the rules."""

import math
import warnings

import arviz as az
import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc import convergence, run_length


def _ar1(rng, chains, draws, dim, rho):
    out = np.empty((chains, draws, dim))
    out[:, 0] = rng.standard_normal((chains, dim))
    for t in range(1, draws):
        out[:, t] = rho * out[:, t - 1] + math.sqrt(1 - rho**2) * rng.standard_normal((chains, dim))
    return out


def test_figures_are_arvizs_and_one_chain_gets_its_split_r_hat():
    rng = np.random.default_rng(0)
    draws = _ar1(rng, 3, 400, 2, 0.9)
    figures = convergence.diagnose(draws, ["a", "b"])
    for i in range(2):
        assert figures["ess_bulk"][i] == pytest.approx(float(az.ess(draws[:, :, i])), rel=1e-9)
        assert figures["ess_tail"][i] == pytest.approx(
            float(az.ess(draws[:, :, i], method="tail")), rel=1e-9)
        assert figures["r_hat"][i] == pytest.approx(float(az.rhat(draws[:, :, i])), rel=1e-9)
    single = convergence.diagnose(draws[:1])
    assert np.isfinite(single["r_hat"][0])  # ArviZ gives nan; the halves of the one chain
    # a single chain that drifts: its halves disagree
    drifting = np.linspace(0, 5, 400)[None, :, None] + 0.1 * rng.standard_normal((1, 400, 1))
    assert convergence.diagnose(drifting)["r_hat"][0] > 1.5


def _model_and_federation(rng):
    sizes = [3, 8, 40, 150]
    clients = [{"x": rng.normal(0.5, 1.0, size=(n,)).astype(np.float32)} for n in sizes]
    model = fm.Model(log_prior=lambda p: -0.5 * jnp.sum(p["mu"] ** 2),
                     log_likelihood=lambda p, e: -0.5 * (e["x"] - p["mu"][0]) ** 2)
    return model, fm.Federation(clients)


def test_a_run_too_short_warns_naming_the_parameter_and_the_knob():
    model, federation = _model_and_federation(np.random.default_rng(1))
    with pytest.warns(fm.ConvergenceWarning, match=r"mu\[0\].*thin") as record:
        result = fm.sample(model, federation, fm.SGLD(step_size=1e-5, batch_size=10),
                           init={"mu": jnp.zeros(1)}, num_samples=200, thin=1, chains=2)
    assert len([w for w in record if issubclass(w.category, fm.ConvergenceWarning)]) == 1
    figures = result.info["diagnostics"]
    assert set(figures) >= {"r_hat", "ess_bulk", "ess_tail", "parameters"}
    assert figures["parameters"] == ["mu[0]"]
    assert figures["ess_bulk"][0] < 100 and not figures["converged"]


def test_thresholds_are_configurable_and_can_be_silenced():
    model, federation = _model_and_federation(np.random.default_rng(1))
    algorithm = fm.SGLD(step_size=1e-5, batch_size=10)
    common = dict(init={"mu": jnp.zeros(1)}, num_samples=100, thin=1, chains=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fm.ConvergenceWarning)
        result = fm.sample(model, federation, algorithm, convergence=False, **common)
        assert result.info["diagnostics"]["converged"] is False
        fm.sample(model, federation, algorithm, **common,
                  convergence=fm.ConvergenceCheck(max_r_hat=100.0, min_ess_bulk=1.0))
    with pytest.raises(ValueError, match="max_r_hat"):
        fm.ConvergenceCheck(max_r_hat=0.5)
    with pytest.raises(ValueError, match="convergence"):
        fm.sample(model, federation, algorithm, convergence="yes", **common)
    with pytest.raises(ValueError, match="thin"):
        fm.sample(model, federation, algorithm, **{**common, "thin": "often"})
    with pytest.raises(ValueError, match="max_iterations"):
        fm.sample(model, federation, algorithm, max_iterations=0, **common)


def test_the_check_rejects_frozen_chains_and_accepts_independent_draws():
    """The broken variant: a chain that never moves (its draws are init plus rounding) is
    flagged; draws of the same length that are independent are not."""
    rng = np.random.default_rng(3)
    good = convergence.diagnose(rng.standard_normal((4, 500, 3)))
    assert good["max_r_hat"] < 1.01 and good["min_ess_bulk"] > 100
    frozen = np.zeros((4, 500, 3)) + np.arange(4)[:, None, None] * 1e-3 \
        + 1e-7 * rng.standard_normal((4, 500, 3))
    bad = convergence.diagnose(frozen)
    assert bad["max_r_hat"] > 1.01
    thresholds = convergence.ConvergenceCheck()
    assert convergence._failing(good, thresholds) == []
    assert convergence._failing(bad, thresholds) == [0, 1, 2]
    # chains that are exactly constant (ArviZ: R-hat nan, every draw "effective")
    constant = convergence.diagnose(np.ones((4, 500, 2)))
    assert constant["frozen"] == ["theta[0]", "theta[1]"]
    assert convergence._failing(constant, thresholds) == [0, 1]
    assert "never moves" in convergence.message("X", {}, constant, thresholds)


def test_run_length_rules():
    request = run_length.RunRequest(num_samples=1000, burn_in="auto", thin="auto", chains=4)
    length = run_length.resolve(request, 250.4, initial_offset=10.0)
    assert length.thin == 251
    relaxations = max(5.0, 2.0 * math.log(10.0 / 0.05))
    assert length.burn_in == max(math.ceil(relaxations * 250.4 / 251), 100)
    assert length.predicted_ess == pytest.approx(
        4000 * (1 - math.exp(-251 / 250.4)) / (1 + math.exp(-251 / 250.4)))
    # a given thin and burn-in are kept
    kept = run_length.resolve(request._replace(thin=7, burn_in=3), 250.4)
    assert (kept.thin, kept.burn_in) == (7, 3)
    # the budget: thin cut to fit max_iterations, with a warning
    with pytest.warns(fm.RunLengthWarning, match="max_iterations"):
        capped = run_length.resolve(request._replace(max_iterations=100_000), 250.4)
    assert (capped.burn_in + 1000) * capped.thin <= 100_000
    # a relaxation time far beyond the budget: thin 1, and burn-in within the budget too
    with pytest.warns(fm.RunLengthWarning):
        tight = run_length.resolve(run_length.RunRequest(200, "auto", "auto", 4,
                                                         max_iterations=20_000), 5.3e6, 50.0)
    assert (tight.burn_in + 200) * tight.thin <= 20_000 and tight.burn_in < 200
    with pytest.raises(ValueError, match="thin='auto'"):
        run_length.resolve(request, None)


def test_budget_rule_raises_a_step_only_as_far_as_it_may():
    request = run_length.RunRequest(num_samples=1000, burn_in="auto", thin="auto", chains=4,
                                    max_iterations=100_000)

    def relaxation(h):
        return 2.0 / (h * 1.0)  # lambda_min = 1

    # exact step too slow: raised until it fits, within the accuracy ceiling
    h, reason = run_length.budget_step_size(1e-4, relaxation, request,
                                            accuracy_ceiling=1.0, stability_ceiling=2.0)
    afford = run_length.affordable_relaxation(request)
    assert relaxation(h) == pytest.approx(afford) and reason
    # the accuracy ceiling holds it back, except that one relaxation time must fit
    h, _ = run_length.budget_step_size(1e-4, relaxation, request,
                                       accuracy_ceiling=2e-4, stability_ceiling=2.0)
    assert h == pytest.approx(2e-4)
    h, _ = run_length.budget_step_size(1e-8, relaxation, request,
                                       accuracy_ceiling=2e-8, stability_ceiling=2.0)
    assert relaxation(h) == pytest.approx(0.95 * 100_000)
    # never past stability; a fast step is kept
    h, _ = run_length.budget_step_size(1e-8, relaxation, request,
                                       accuracy_ceiling=2e-8, stability_ceiling=1e-6)
    assert h == pytest.approx(1e-6)
    assert run_length.budget_step_size(0.5, relaxation, request, accuracy_ceiling=1.0,
                                       stability_ceiling=2.0) == (0.5, None)


def test_every_coordinate_at_once_gives_the_per_coordinate_figures():
    """diagnostics.convergence_figures (vectorised over coordinates: a network's parameters)
    against the per-coordinate functions that tests/core/test_diagnostics.py checks against
    ArviZ, with constant, tied, short, one-chain and non-finite coordinates."""
    from fedmcmc import diagnostics as d

    rng = np.random.default_rng(5)
    for trial in range(12):
        chains, draws = int(rng.integers(1, 5)), int(rng.integers(4, 300))
        x = np.cumsum(rng.normal(size=(chains, draws, 4)), axis=1) * rng.uniform(0, 1) \
            + rng.normal(size=(chains, draws, 4))
        x[:, :, 0] = 1.0
        if trial % 2:
            x = np.round(x, 1)
        if trial % 3 == 0:
            x[0, 1, 3] = np.nan
        r_hat, bulk, tail = d.convergence_figures(x)
        for i in range(4):
            values = x[:, :, i]
            expected = (d._rank_rhat_of_split(d._split_chains(values)), d._bulk_ess(values),
                        d._tail_ess(values))
            if not np.all(np.isfinite(values)):
                expected = (np.nan, np.nan, np.nan)
            np.testing.assert_allclose([r_hat[i], bulk[i], tail[i]], expected, rtol=1e-10)


def test_a_high_r_hat_from_few_effective_draws_asks_for_more_draws():
    """R-hat above 1.01 with fewer than 100 effective draws per chain (Vehtari et al. 2021)
    may be R-hat's own noise: the advice adds num_samples to burn-in and modes; with plenty of
    effective draws per chain it does not."""
    thresholds = convergence.ConvergenceCheck()
    figures = {"parameters": ["a"], "r_hat": [1.02], "ess_bulk": [240.0], "ess_tail": [300.0],
               "draws": 400, "chains": 4}
    text = convergence.advice({}, figures, thresholds)
    assert "chains disagree" in text and "burn_in" in text
    assert "60 effective draws per chain" in text and "raise num_samples about 1.7x" in text
    assert "(to 667 per chain)" in text
    plenty = dict(figures, ess_bulk=[4000.0])
    text = convergence.advice({}, plenty, thresholds)
    assert "chains disagree" in text and "num_samples" not in text
