"""fm.FedSGHMC (SGHMC of Chen, Fox & Guestrin 2014, momentum travelling between clients)
against the exact law of its discretisation on a Bayesian linear regression.

The clients hold 1, 2 and 3 copies of one block of rows (20, 40 and 60 rows), and the batch is
the largest client, so each client's estimator (4), grad log p(theta) + (1/f_s) grad log
p(x_s | theta) with f_s proportional to size, is the exact posterior gradient: the chain is
then the linear recursion

    (x, v) -> (x + h v, v - h P (x + h v) - h C v + N(0, 2 C h)),   x = theta - m,

whose stationary covariance solves a discrete Lyapunov equation. The test compares the draws'
mean and marginal variances with it (tolerances from the effective sample size; that law is
within 5% of the posterior here), and the same check rejects a broken variant: an
overestimated gradient noise, B_hat = C / 2 (``noise_estimate``), which halves the injected
noise although the gradient has none.
"""

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm

from stats import check_gaussian_moments

DIM, NOISE_SD, COPIES = 3, 2.0, (1, 2, 3)


def replicated_federation(seed=0, rows=20):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, DIM)).astype(np.float32)
    y = (x @ np.array([1.0, -0.5, 0.3]) + NOISE_SD * rng.normal(size=rows)).astype(np.float32)
    return fm.Federation([{"x": np.tile(x, (k, 1)), "y": np.tile(y, k)} for k in COPIES])


MODEL = fm.Model(
    log_prior=lambda b: -0.5 * jnp.sum(b**2),
    log_likelihood=lambda b, row: -0.5 * (row["y"] - row["x"] @ b) ** 2 / NOISE_SD**2,
    name="linear_regression",
)


def posterior(federation):
    pooled = federation.pooled()
    x, y = pooled["x"].astype(np.float64), pooled["y"].astype(np.float64)
    precision = x.T @ x / NOISE_SD**2 + np.eye(DIM)
    covariance = np.linalg.inv(precision)
    return covariance @ (x.T @ y) / NOISE_SD**2, precision


def sghmc_stationary_covariance(precision, h, friction):
    """The position block of the stationary covariance of the exact-gradient SGHMC recursion
    z' = A z + N(0, Q), z = (x, v): Sigma = A Sigma A^T + Q, solved as a linear system."""
    d = len(precision)
    eye = np.eye(d)
    a = np.block([[eye, h * eye], [-h * precision, (1 - h * friction) * eye - h * h * precision]])
    q = np.zeros((2 * d, 2 * d))
    q[d:, d:] = 2 * friction * h * eye
    vec = np.linalg.solve(np.eye(4 * d * d) - np.kron(a, a), q.reshape(-1))
    return vec.reshape(2 * d, 2 * d)[:d, :d]


def settings(precision):
    eigenvalues = np.linalg.eigvalsh(precision)
    h = 0.1 / np.sqrt(eigenvalues.max())
    friction = 2.0 * np.sqrt(eigenvalues.min())  # the slowest direction critically damped
    return float(h), float(friction)


def run(noise_estimate=0.0, num_samples=500, chains=4, engine="local"):
    federation = replicated_federation()
    _, precision = posterior(federation)
    h, friction = settings(precision)
    algorithm = fm.FedSGHMC(step_size=h, friction=friction, batch_size=max(COPIES) * 20,
                            local_steps=20, noise_estimate=noise_estimate * friction)
    return fm.sample(MODEL, federation, algorithm, init=jnp.zeros(DIM), num_samples=num_samples,
                     burn_in=50, thin=20, chains=chains, seed=4, engine=engine,
                     convergence=False)


def check(result):
    federation = replicated_federation()
    mean, precision = posterior(federation)
    h, friction = settings(precision)
    target = sghmc_stationary_covariance(precision, h, friction)
    # the discretised law is the posterior up to O(h): within 5% in variance here
    exact = np.diag(np.linalg.inv(precision))
    assert np.all(np.abs(np.diag(target) / exact - 1) < 0.05)
    return check_gaussian_moments(result.flat_samples(), mean, target)


def test_fed_sghmc_samples_the_linear_regression_posterior():
    result = run()
    figures = check(result)
    assert figures["ok"], figures
    info = result.info
    assert info["algorithm"] == "FedSGHMC" and info["engine"] == "local"
    assert info["friction"] > 0 and info["local_steps"] == 20
    assert np.all(np.asarray(info["visits_per_client"]) > 0)


def test_the_same_check_rejects_an_overestimated_gradient_noise():
    # half the variance: 250 draws per chain (an ESS near 300) are rejection enough
    figures = check(run(noise_estimate=0.5, num_samples=250))
    assert not figures["ok"], figures
    assert np.all(figures["var_ratio"] < 0.6), figures


@pytest.mark.parametrize("arguments, argument", [
    ({"step_size": 0.0}, "step_size"), ({"friction": -1.0}, "friction"),
    ({"batch_size": 0}, "batch_size"), ({"local_steps": 1.5}, "local_steps"),
    ({"noise_estimate": 3.0}, "noise_estimate"), ({"step_size": "auto"}, "step_size")])
def test_bad_hyper_parameters_name_the_argument(arguments, argument):
    given = dict(step_size=0.01, friction=2.0, batch_size=10, local_steps=5) | arguments
    with pytest.raises(ValueError, match=argument):
        fm.FedSGHMC(**given)
