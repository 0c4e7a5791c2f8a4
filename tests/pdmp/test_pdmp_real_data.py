"""Fed-PDMC on real data with a natural grouping and many unequal clients: MASS's Cars93 by
manufacturer (32 workers of 1 to 8 rows, tests/toy_problems.py), Bayesian linear regression
with known noise sd, whose posterior is exact. Every worker proposes from its own rows
(Algorithm 2/3, the server takes the earliest); the exact trajectory averages must match the
posterior within ESS-based tolerances, and a run with the likelihood scaled wrong (noise sd
1.0 instead of 0.5: posterior variances 4x) must fail the same check."""

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm

from stats import trajectory_check
from toy_problems import cars93_federation

NOISE_SD = 0.5


def _check(algorithm, noise_sd):
    federation = cars93_federation()
    assert federation.num_clients == 32
    assert federation.sizes.min() == 1 and federation.sizes.max() == 8
    exact = fm.models.linear_regression(3, noise_std=NOISE_SD)
    mean, cov = exact.attributes["exact_posterior"](federation)
    model = fm.models.linear_regression(3, noise_std=noise_sd)
    result = fm.sample(model, federation, algorithm, init=jnp.zeros(3), num_samples=1000,
                       burn_in=100, chains=4, seed=0, progress=False)
    assert np.isfinite(result.flat_samples()).all()
    return trajectory_check(result.info, mean, cov, result.flat_samples())


ALGORITHMS = [
    lambda: fm.FedZigZag(sample_interval=0.5),
    lambda: fm.FedBPS(sample_interval=0.5, refresh_rate=1.0),
]


@pytest.mark.parametrize("make", ALGORITHMS, ids=["FedZigZag", "FedBPS"])
def test_cars93_by_manufacturer_matches_the_exact_posterior(make):
    ok, figures = _check(make(), NOISE_SD)
    assert ok, figures


@pytest.mark.parametrize("make", ALGORITHMS, ids=["FedZigZag", "FedBPS"])
def test_cars93_with_the_likelihood_scaled_wrong_is_rejected(make):
    ok, figures = _check(make(), 2 * NOISE_SD)
    assert not ok, figures
