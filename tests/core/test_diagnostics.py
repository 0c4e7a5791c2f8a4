"""fm.diagnostics against known values: W1 between Gaussians, ESS of AR(1), KL, MMD, R-hat."""

import math

import numpy as np
import pytest

import fedmcmc as fm

from probes import modules_loaded_by

d = fm.diagnostics


def test_w1_between_shifted_gaussians_is_the_shift():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20000, 2))
    y = rng.standard_normal((20000, 2)) + np.array([0.5, -1.0])
    w1 = d.wasserstein_marginal(x, y)
    # sampling error of the empirical W1 is O(n^-1/2) ~ 0.01
    np.testing.assert_allclose(w1, [0.5, 1.0], atol=0.03)
    # joint W1 of a pure shift is the norm of the shift (plus finite-sample excess)
    joint = d.wasserstein_joint(x, y, max_points=800)
    assert math.hypot(0.5, 1.0) - 0.02 < joint < math.hypot(0.5, 1.0) + 0.25


def test_w1_between_scaled_gaussians():
    # W1(N(0, s1^2), N(0, s2^2)) = |s1 - s2| sqrt(2 / pi)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(40000)
    y = 2.0 * rng.standard_normal(40000)
    assert d.wasserstein_marginal(x, y)[0] == pytest.approx(math.sqrt(2 / math.pi), abs=0.03)


def test_joint_w1_is_exact_on_equal_size_sets():
    # a permutation of the same points: distance 0; shifted copy: exactly the shift length
    rng = np.random.default_rng(2)
    x = rng.standard_normal((300, 3))
    assert d.wasserstein_joint(x, x[rng.permutation(300)]) == pytest.approx(0.0, abs=1e-12)
    shift = np.array([0.3, 0.0, 0.4])
    assert d.wasserstein_joint(x, x + shift) == pytest.approx(0.5, abs=1e-9)


def _ar1(rng, phi, chains, n):
    x = np.empty((chains, n))
    x[:, 0] = rng.standard_normal(chains) / math.sqrt(1 - phi**2)
    noise = rng.standard_normal((chains, n))
    for t in range(1, n):
        x[:, t] = phi * x[:, t - 1] + noise[:, t]
    return x


@pytest.mark.parametrize("phi", [0.0, 0.5, 0.9])
def test_ess_of_ar1_matches_theory(phi):
    # integrated autocorrelation time of AR(1): (1 + phi) / (1 - phi)
    rng = np.random.default_rng(3)
    chains, n = 4, 5000
    x = _ar1(rng, phi, chains, n)
    expected = chains * n * (1 - phi) / (1 + phi)
    ess = d.ess(x)[0]
    assert ess == pytest.approx(expected, rel=0.15)
    # rhat of well-mixed stationary chains is ~1
    assert abs(d.rhat(x)[0] - 1.0) < 0.02


def test_rhat_flags_chains_that_disagree():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 1000))
    x[0] += 3.0
    assert d.rhat(x)[0] > 1.2


def test_gaussian_kl_closed_form_and_fit():
    # KL(N(0, 1) || N(1, 4)) = log 2 + (1 + 1) / 8 - 1/2
    expected = math.log(2.0) + 2.0 / 8.0 - 0.5
    assert d.gaussian_kl([0.0], [[1.0]], [1.0], [[4.0]]) == pytest.approx(expected, rel=1e-12)
    rng = np.random.default_rng(5)
    x = rng.standard_normal(50000)
    y = 1.0 + 2.0 * rng.standard_normal(50000)
    assert d.kl_gaussian_fit(x, y) == pytest.approx(expected, abs=0.02)


def test_mmd_separates_and_accepts():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1000, 2))
    same = rng.standard_normal((1000, 2))
    shifted = rng.standard_normal((1000, 2)) + 1.0
    assert d.mmd(x, same) < 0.1
    assert d.mmd(x, shifted) > 0.3


def test_inputs_and_errors():
    rng = np.random.default_rng(7)
    chains = rng.standard_normal((2, 100, 3))
    out = d.compare(chains, chains.reshape(-1, 3))
    assert out["w1_marginal_mean"] == pytest.approx(0.0, abs=1e-12)
    assert len(out["w1_marginal"]) == 3
    with pytest.raises(ValueError, match="dimensions"):
        d.wasserstein_marginal(rng.standard_normal((10, 2)), rng.standard_normal((10, 3)))
    with pytest.raises(ValueError, match="at least 2"):
        d.mmd(np.full((5, 1), np.nan), rng.standard_normal((5, 1)))


def _ess_cases():
    """(chains, draws) arrays of every kind the bias estimate can meet: independent,
    autocorrelated, tied, alternating, heavy-tailed, odd lengths, one chain, constant."""
    rng = np.random.default_rng(3)
    cases = []
    for index in range(60):
        chains, draws = int(rng.integers(1, 6)), int(rng.integers(4, 300))
        x = rng.standard_normal((chains, draws))
        if index % 3 == 1:
            for t in range(1, draws):
                x[:, t] = 0.9 * x[:, t - 1] + x[:, t]
        if index % 5 == 2:
            x = np.round(x, 1)
        if index % 7 == 3:
            x[:, ::2] += 3.0
        if index % 11 == 4:
            x = rng.standard_cauchy((chains, draws))
        cases.append(x)
    cases += [np.ones((2, 10)), np.r_[np.ones(10), 2 * np.ones(10)].reshape(2, 10)]
    return cases


def test_bulk_ess_rank_rhat_and_mcse_are_arvizs():
    """fm.diagnostics.ess and rhat (default methods) and the bias estimate's MCSE of the mean
    are computed in NumPy, so that neither a decentralised run nor a reference needs to import
    ArviZ: they are ArviZ's numbers. The same check rejects the ESS without the rank
    normalisation (what "bulk" adds) and R-hat without the folded (tail) part."""
    az = pytest.importorskip("arviz")
    from fedmcmc.diagnostics import (_bulk_ess, _ess_of_chains, _mcse_mean, _rank_normalised,
                                     _split_chains, _split_rhat)

    unranked_differs = unfolded_differs = False
    for x in _ess_cases():
        expected_ess = float(az.ess(x, method="bulk"))
        assert _bulk_ess(x) == pytest.approx(expected_ess, rel=1e-10, abs=1e-12)
        assert _mcse_mean(x) == pytest.approx(float(az.mcse(x, method="mean")),
                                              rel=1e-10, abs=1e-12)
        unranked = _ess_of_chains(_split_chains(x))
        unranked_differs |= abs(unranked - expected_ess) > 1e-3 * expected_ess
        if x.shape[0] >= 2:
            expected_rhat = float(az.rhat(x, method="rank"))
            ours = float(d.rhat(x)[0])
            if np.isnan(expected_rhat):
                assert np.isnan(ours)
                continue
            assert ours == pytest.approx(expected_rhat, rel=1e-10)
            bulk_only = _split_rhat(_rank_normalised(_split_chains(x)))
            unfolded_differs |= abs(bulk_only - expected_rhat) > 1e-3
        assert float(d.ess(x)[0]) == pytest.approx(expected_ess, rel=1e-10, abs=1e-12)
    assert unranked_differs and unfolded_differs
    assert np.isnan(d.rhat(np.zeros((1, 10)))[0])  # one chain: ArviZ's nan
    assert np.isnan(_bulk_ess(np.full((2, 10), np.nan)))
    assert np.isnan(_mcse_mean(np.zeros((2, 3))))  # fewer than 4 draws: ArviZ's nan


def test_a_decentralised_run_does_not_import_arviz():
    """ArviZ (with matplotlib, pandas and xarray) took 1.3 s to import, more than half of a
    small DULA run in a new process: the run's bias estimate must not need it, nor the
    default ESS and R-hat."""
    probe = """
import numpy as np
import fedmcmc as fm
rs = np.random.default_rng(0)
clients = [{"x": rs.normal(size=(n, 2)).astype(np.float32)} for n in (30, 50, 20)]
model = fm.Model(log_prior=lambda p: -0.5 * (p ** 2).sum(),
                 log_likelihood=lambda p, ex: -0.5 * ((ex["x"] - p) ** 2).sum())
result = fm.sample(model, fm.Federation(clients), fm.DULA(), init=np.zeros(2, np.float32),
                   num_samples=40, burn_in=10, chains=2, seed=0, progress=False)
assert set(result.info["bias_estimate"]) == {"in_sd", "standard_error", "ess"}
assert np.isfinite(fm.diagnostics.ess(result)).all() and np.isfinite(fm.diagnostics.rhat(result)).all()
"""
    assert modules_loaded_by(probe, ["arviz"]) == []
