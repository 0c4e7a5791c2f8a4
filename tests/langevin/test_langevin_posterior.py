"""SGLD, DSGLD and FSGLD against exact posteriors, on non-IID clients.

Tolerances: mean z-scores from the bulk ESS; variance ratio within
z * sqrt(2 / ESS) of the *discretised* chain's stationary variance. For the
Gaussian-mean model the unadjusted recursion with a gradient-noise variance
sigma^2 (independent of theta) has the exact stationary variance

    (1 + h sigma^2 / 4) / (lambda (1 - h lambda / 4))

per coordinate (lambda = posterior precision, papers' convention
theta + h/2 v + N(0, h)); the test computes sigma^2 in closed form from the
data, independently of the library. Each check is shown to reject a
deliberately broken sampler (dropped 1/f_s, dropped noise).
"""

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc.langevin import dsgld
from fedmcmc.langevin.algorithms import DSGLD

from stats import check_gaussian_moments
from toy_problems import (DIM, GAUSSIAN_MODEL, expected_variance, gaussian_federation,
                          gaussian_posterior, gradient_noise_variance, step_size_for)

def sample_gaussian(algorithm, federation, step_size, num_samples=1000, thin=None, chains=8, seed=1):
    precision = federation.total_size + 1.0
    if thin is None:
        thin = int(np.ceil(2.0 / (step_size * precision)))  # ~ one autocorrelation time
    result = fm.sample(
        GAUSSIAN_MODEL, federation, algorithm, init=jnp.zeros(DIM), num_samples=num_samples,
        burn_in=200, thin=thin, chains=chains, seed=seed,
    )
    return result.flat_samples()


CASES = [
    ("sgld", lambda h: fm.SGLD(step_size=h, batch_size=10)),
    ("dsgld", lambda h: fm.DSGLD(step_size=h, batch_size=10, local_steps=1)),
    ("fsgld", lambda h: fm.FSGLD(step_size=h, batch_size=10, local_steps=20, surrogate="exact")),
    ("fsgld", lambda h: fm.FSGLD(step_size=h, batch_size=10, local_steps=20, surrogate="laplace")),
]


@pytest.mark.parametrize("kind, make", CASES, ids=["SGLD", "DSGLD", "FSGLD-exact", "FSGLD-laplace"])
def test_gaussian_mean_posterior(kind, make):
    federation = gaussian_federation()
    mean, _ = gaussian_posterior(federation)
    step_size = step_size_for(federation, kind, batch_size=10)
    variance = expected_variance(federation, kind, step_size, batch_size=10)
    draws = sample_gaussian(make(step_size), federation, step_size)
    figures = check_gaussian_moments(draws, mean, np.diag(variance))
    assert figures["ok"], figures


def test_dropping_inverse_client_weight_is_rejected():
    """The same check rejects DSGLD without the 1/f_s factor of equation (4)."""
    federation = gaussian_federation()
    mean, _ = gaussian_posterior(federation)
    h = step_size_for(federation, "dsgld", batch_size=10)
    variance = expected_variance(federation, "dsgld", h, batch_size=10)

    class WithoutInverseWeight(DSGLD):
        def _kernel(self, flat_model, data, weights, settings, private=None):
            return dsgld.build_kernel(
                flat_model, data, weights, self.batch_size, self.local_steps,
                lambda t: h + 0.0 * t, weight_scaling=jnp.ones_like(weights),
            )

    draws = sample_gaussian(WithoutInverseWeight(step_size=h, batch_size=10, local_steps=1), federation, h)
    assert not check_gaussian_moments(draws, mean, np.diag(variance))["ok"]


def test_dropping_noise_is_rejected():
    federation = gaussian_federation()
    mean, _ = gaussian_posterior(federation)
    h = step_size_for(federation, "fsgld", batch_size=10)
    variance = expected_variance(federation, "fsgld", h, batch_size=10)
    algorithm = fm.FSGLD(step_size=h, batch_size=10, local_steps=20, surrogate="exact", noise=False)
    draws = sample_gaussian(algorithm, federation, h, num_samples=300)
    assert not check_gaussian_moments(draws, mean, np.diag(variance))["ok"]


# --------------------------------------------------------------------- linear regression


def regression_federation(seed=0, sizes=(30, 50, 40, 60, 20), dim=3, noise_sd=0.5):
    """Non-IID clients: each client's inputs are shifted and scaled differently."""
    rng = np.random.default_rng(seed)
    beta = rng.normal(size=dim)
    clients = []
    for s, n in enumerate(sizes):
        shift = rng.uniform(-2, 2, size=dim)
        scale = rng.uniform(0.5, 1.5, size=dim)
        x = (rng.normal(size=(n, dim)) * scale + shift).astype(np.float32)
        y = (x @ beta + noise_sd * rng.normal(size=n)).astype(np.float32)
        clients.append({"x": x, "y": y})
    return fm.Federation(clients), noise_sd


def regression_model(noise_sd, prior_precision=1.0):
    return fm.Model(
        log_prior=lambda b: -0.5 * prior_precision * jnp.sum(b**2),
        log_likelihood=lambda b, row: -0.5 * (row["y"] - jnp.dot(row["x"], b)) ** 2 / noise_sd**2,
        name="linear_regression",
    )


def regression_posterior(federation, noise_sd, prior_precision=1.0):
    pooled = federation.pooled()
    x, y = pooled["x"].astype(np.float64), pooled["y"].astype(np.float64)
    precision = x.T @ x / noise_sd**2 + prior_precision * np.eye(x.shape[1])
    covariance = np.linalg.inv(precision)
    return covariance @ (x.T @ y) / noise_sd**2, covariance


def discretised_covariance(covariance, step_size):
    """Stationary covariance of unadjusted Langevin with the exact gradient on a Gaussian
    target of covariance Sigma (papers' convention): (A (I - h A / 4))^-1, A = Sigma^-1."""
    precision = np.linalg.inv(covariance)
    return np.linalg.inv(precision @ (np.eye(len(precision)) - step_size * precision / 4))


@pytest.mark.parametrize(
    "make",
    [
        # batch = all data / whole client: exact gradients, so the discretised law is known exactly
        lambda h: fm.SGLD(step_size=h, batch_size=200),
        lambda h: fm.FSGLD(step_size=h, batch_size=40, local_steps=50, surrogate="exact"),
        lambda h: fm.FSGLD(step_size=h, batch_size=40, local_steps=50, surrogate="laplace"),
    ],
    ids=["SGLD", "FSGLD-exact", "FSGLD-laplace"],
)
def test_linear_regression_posterior(make):
    federation, noise_sd = regression_federation(sizes=(40,) * 5)
    mean, covariance = regression_posterior(federation, noise_sd)
    largest = 1.0 / np.linalg.eigvalsh(covariance).min()
    smallest = 1.0 / np.linalg.eigvalsh(covariance).max()
    h = 0.4 / largest
    thin = int(np.ceil(2.0 / (h * smallest)))
    result = fm.sample(
        regression_model(noise_sd), federation, make(h), init=jnp.zeros(3), num_samples=800,
        burn_in=100, thin=thin, chains=8, seed=3,
    )
    target = discretised_covariance(covariance, h)
    figures = check_gaussian_moments(result.flat_samples(), mean, target)
    assert figures["ok"], figures
    # and the discretised law is within 11% of the posterior in variance
    assert np.all(np.diag(target) / np.diag(covariance) < 1.11)


def test_linear_regression_rejects_dropped_noise():
    federation, noise_sd = regression_federation(sizes=(40,) * 5)
    mean, covariance = regression_posterior(federation, noise_sd)
    h = 0.4 * np.linalg.eigvalsh(covariance).min()
    algorithm = fm.FSGLD(step_size=h, batch_size=40, local_steps=50, surrogate="exact", noise=False)
    result = fm.sample(
        regression_model(noise_sd), federation, algorithm, init=jnp.zeros(3), num_samples=200,
        burn_in=100, thin=50, chains=4, seed=3,
    )
    assert not check_gaussian_moments(result.flat_samples(), mean, discretised_covariance(covariance, h))["ok"]


@pytest.mark.slow
def test_linear_regression_posterior_dsgld_minibatch():
    """DSGLD (1 local step) and minibatch FSGLD on unequal non-IID clients: small steps, slow."""
    federation, noise_sd = regression_federation()
    mean, covariance = regression_posterior(federation, noise_sd)
    smallest = 1.0 / np.linalg.eigvalsh(covariance).max()
    for algorithm in (
        fm.DSGLD(step_size=5e-7, batch_size=20, local_steps=1),
        fm.FSGLD(step_size=2e-6, batch_size=20, local_steps=50, surrogate="exact"),
    ):
        thin = int(np.ceil(2.0 / (algorithm.step_size * smallest)))
        result = fm.sample(
            regression_model(noise_sd), federation, algorithm, init=jnp.zeros(3), num_samples=600,
            burn_in=100, thin=thin, chains=8, seed=3,
        )
        figures = check_gaussian_moments(result.flat_samples(), mean, covariance, extra_var_rtol=0.08)
        assert figures["ok"], (algorithm, figures)


# ------------------------------------------------------------ variance-chosen client selection


def test_variance_chosen_client_selection_keeps_the_posterior():
    """``client_selection="variance"`` (issue 15): f_s chosen to lower the estimator's noise,
    with the estimator's 1/f_s scaled by the same f_s. The chain's stationary law is then the
    closed form for those f_s (DSGLD, one local step); a kernel that draws clients with the
    chosen f_s but scales by the size-proportional ones is rejected by the same check."""
    federation = gaussian_federation(sizes=(8, 60, 20, 120))
    mean, _ = gaussian_posterior(federation)
    probe = fm.sample(GAUSSIAN_MODEL, federation,
                      fm.DSGLD(step_size=1e-6, batch_size=10, local_steps=1,
                               client_selection="variance"),
                      init=jnp.zeros(DIM), num_samples=2, burn_in=0, chains=1, seed=0,
                      progress=False)
    chosen = np.asarray(probe.info["client_weights"])
    assert probe.info["client_selection"] == "variance"
    proportional = federation.weights
    assert np.all(chosen >= 0.25 * proportional - 1e-12) and abs(chosen.sum() - 1) < 1e-9
    assert np.max(np.abs(chosen / proportional - 1)) > 0.1  # a real change of f_s
    as_chosen = fm.Federation(federation.clients, weights=chosen)
    # the chosen f_s lower the noise the closed form predicts, hence a larger h for the same
    # inflation: that is what the selection is for
    assert (gradient_noise_variance(as_chosen, "dsgld", 10).max()
            < gradient_noise_variance(federation, "dsgld", 10).max())
    h = step_size_for(as_chosen, "dsgld", batch_size=10)
    variance = expected_variance(as_chosen, "dsgld", h, batch_size=10)
    algorithm = fm.DSGLD(step_size=h, batch_size=10, local_steps=1, client_selection="variance")
    draws = sample_gaussian(algorithm, federation, h)
    figures = check_gaussian_moments(draws, mean, np.diag(variance))
    assert figures["ok"], figures

    class MismatchedScaling(DSGLD):
        def _kernel(self, flat_model, data, weights, settings, private=None):
            return dsgld.build_kernel(
                flat_model, data, jnp.asarray(chosen, jnp.float32), self.batch_size,
                self.local_steps, lambda t: h + 0.0 * t, weight_scaling=weights)

    draws = sample_gaussian(MismatchedScaling(step_size=h, batch_size=10, local_steps=1),
                            federation, h)
    assert not check_gaussian_moments(draws, mean, np.diag(variance))["ok"]


def test_variance_selection_refuses_user_weights():
    federation = fm.Federation(gaussian_federation().clients, weights=[0.25] * 4)
    with pytest.raises(ValueError, match="client_selection"):
        fm.sample(GAUSSIAN_MODEL, federation,
                  fm.DSGLD(step_size=1e-4, batch_size=10, local_steps=1,
                           client_selection="variance"),
                  init=jnp.zeros(DIM), num_samples=2, burn_in=0, chains=1, seed=0)
    with pytest.raises(ValueError, match="client_selection"):
        fm.DSGLD(step_size=1e-4, batch_size=10, local_steps=1, client_selection="size")
