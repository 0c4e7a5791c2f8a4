"""Switching rate of Fed Zig-Zag on the Section 6.1 problem (Figure 1): it grows like sqrt(N M)."""

import numpy as np
import pytest
from scipy import stats as sps

import fedmcmc as fm
from fedmcmc.pdmp import models

N, D = 50, 10


def _data():
    return models.gaussian_data(11, N, np.full(D, 0.5), np.eye(D))


def expected_rate(clients):
    """Exact E_mu sum_m sum_i (v_i d_i U_m(x))_+ for the flat-prior Gaussian: under the posterior
    d_i U_m = n_m (x_i - ybar_{m,i}) ~ N(n_m (ybar_i - ybar_{m,i}), n_m^2 / N), and E(v a)_+ = E|a| / 2."""
    y = np.concatenate(clients)
    ybar = y.mean(axis=0)
    total = 0.0
    for c in clients:
        n = len(c)
        mu = n * (ybar - c.mean(axis=0))
        s = n / np.sqrt(len(y))
        folded = s * np.sqrt(2 / np.pi) * np.exp(-mu**2 / (2 * s**2)) + mu * (1 - 2 * sps.norm.cdf(-mu / s))
        total += 0.5 * folded.sum()
    return total


def _rates(num_workers):
    y = _data()
    clients = np.array_split(y, num_workers)  # equal shares, as in Section 6.1
    model = models.gaussian_model(np.eye(D))  # flat prior
    # the rates of Section 4.1 are those without Remark 4.3's shift (which the default,
    # control_variates="auto", would take here)
    result = fm.sample(model, fm.Federation(clients),
                       fm.FedZigZag(sample_interval=0.1, control_variates=False),
                       init=np.full(D, 0.5, np.float32), num_samples=400, burn_in=20, chains=2,
                       seed=0, progress=False)
    return result.info, expected_rate(clients)


def _growth_ok(rates, workers):
    slope = np.polyfit(np.log(workers), np.log(rates), 1)[0]
    return 0.35 < slope < 0.65, slope


@pytest.fixture(scope="module")
def runs():
    return {m: _rates(m) for m in (1, 16)}


def test_switching_rate_matches_expectation_and_grows_like_sqrt_nm(runs):
    workers = sorted(runs)
    observed = [runs[m][0]["effective_switching_rate"] for m in workers]
    for m in workers:
        info, expected = runs[m]
        assert abs(info["effective_switching_rate"] / expected - 1) < 0.1, (m, info, expected)
        # the paper's leading order sigma_0 sqrt(N M), sigma_0 = alpha d, bounds it from above
        assert info["effective_switching_rate"] < D * np.sqrt(N * m)
    ok, slope = _growth_ok(observed, workers)
    assert ok, slope
    # Broken variant: the canonical (non-federated) rate measured in the same runs does not grow.
    canonical = [runs[m][0]["mean_rate_canonical"] for m in workers]
    assert not _growth_ok(canonical, workers)[0]


@pytest.mark.slow
def test_switching_rate_over_more_worker_counts():
    workers = [1, 2, 4, 8, 16]
    observed = []
    for m in workers:
        info, expected = _rates(m)
        assert abs(info["effective_switching_rate"] / expected - 1) < 0.1
        observed.append(info["effective_switching_rate"])
    assert _growth_ok(observed, workers)[0]
