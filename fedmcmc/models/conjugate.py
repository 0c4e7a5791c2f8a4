"""Conjugate models with exact posteriors: Gaussian mean, Bernoulli, Bayesian linear regression.

Each builder returns an :class:`fm.Model <fedmcmc.Model>` whose
``attributes["exact_posterior"]`` is a function ``data -> (mean, covariance)``
over the flat parameter vector (``data``: the pooled data pytree or an
``fm.Federation``); the same function is available at module level
(:func:`gaussian_mean_posterior`, ...). ``attributes["init"]`` is a function
``key -> params`` (zeros: these posteriors are unimodal).

For the PDMP samplers (convention of :mod:`fedmcmc.pdmp.bounds`), the Gaussian
mean and linear regression models are ``quadratic_potential`` (affine rates,
exact event times) and carry ``hessian_bound`` (per example, elementwise) and
``prior_hessian_bound``.
"""

from __future__ import annotations

from typing import Any, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from ..model import Model
from ._common import LOG_2PI, as_matrix, as_vector, pooled, positive_float, positive_int

__all__ = [
    "gaussian_mean",
    "gaussian_mean_posterior",
    "bernoulli",
    "bernoulli_posterior",
    "linear_regression",
    "linear_regression_posterior",
]


# --------------------------------------------------------------------------- Gaussian mean


def gaussian_mean_posterior(
    data: Any, *, prior_mean: Any = 0.0, prior_cov: Any = 1.0, noise_cov: Any = 1.0
) -> Tuple[np.ndarray, np.ndarray]:
    """Exact posterior N(m, C) of mu in x_i ~ N(mu, Sigma), mu ~ N(m0, Sigma0):

    C^{-1} = Sigma0^{-1} + n Sigma^{-1},  m = C (Sigma0^{-1} m0 + Sigma^{-1} sum_i x_i)

    (``prior_cov=None``: flat prior, C = Sigma / n, m = mean of x). FSGLD eq. (9).
    """
    x = np.asarray(pooled(data), dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    n, dim = x.shape
    noise_precision = np.linalg.inv(as_matrix(noise_cov, dim, "noise_cov"))
    precision = n * noise_precision
    shift = noise_precision @ x.sum(axis=0)
    if prior_cov is not None:
        prior_precision = np.linalg.inv(as_matrix(prior_cov, dim, "prior_cov"))
        precision = precision + prior_precision
        shift = shift + prior_precision @ as_vector(prior_mean, dim, "prior_mean")
    cov = np.linalg.inv(precision)
    return cov @ shift, 0.5 * (cov + cov.T)


def gaussian_mean(
    dim: int = 2, *, prior_mean: Any = 0.0, prior_cov: Any = 1.0, noise_cov: Any = 1.0
) -> Model:
    """Mean of Gaussian data with known covariance (FSGLD section 5.1, eq. 9; Fed-PDMC 6.1).

    Parameters: ``mu``, an array of shape ``(dim,)``.
    Example: an array of shape ``(dim,)`` (one observation x_i).

    Likelihood x_i ~ N(mu, noise_cov); prior mu ~ N(prior_mean, prior_cov)
    (``prior_cov=None``: flat improper prior, as in Fed-PDMC section 6.1).
    Covariances are a scalar (times I), a diagonal vector or a full matrix.
    Exact posterior: :func:`gaussian_mean_posterior`.
    """
    dim = positive_int(dim, "dim")
    noise = as_matrix(noise_cov, dim, "noise_cov")
    noise_precision = jnp.asarray(np.linalg.inv(noise), dtype=jnp.float32)
    log_norm = float(-0.5 * (dim * LOG_2PI + np.linalg.slogdet(noise)[1]))
    if prior_cov is None:
        prior_precision = None
    else:
        prior = as_matrix(prior_cov, dim, "prior_cov")
        prior_precision = jnp.asarray(np.linalg.inv(prior), dtype=jnp.float32)
        prior_log_norm = float(-0.5 * (dim * LOG_2PI + np.linalg.slogdet(prior)[1]))
    m0 = jnp.asarray(as_vector(prior_mean, dim, "prior_mean"), dtype=jnp.float32)

    def log_prior(mu):
        if prior_precision is None:
            return 0.0 * jnp.sum(mu)
        r = mu - m0
        return -0.5 * r @ (prior_precision @ r) + prior_log_norm

    def log_likelihood(mu, x):
        r = x - mu
        return -0.5 * r @ (noise_precision @ r) + log_norm

    def exact_posterior(data):
        return gaussian_mean_posterior(
            data, prior_mean=prior_mean, prior_cov=prior_cov, noise_cov=noise_cov
        )

    abs_noise_precision = jnp.abs(noise_precision)
    return Model(
        log_prior,
        log_likelihood,
        name="gaussian_mean",
        exact_posterior=exact_posterior,
        init=lambda key=None: jnp.zeros((dim,), jnp.float32),
        quadratic_potential=True,
        hessian_bound=lambda x: abs_noise_precision,
        prior_hessian_bound=(
            np.zeros((dim, dim)) if prior_precision is None else np.abs(np.asarray(prior_precision, np.float64))
        ),
        # Loewner bounds (the Hessians themselves): the Boomerang's whitened bound
        curvature_bound=lambda x: noise_precision,
        prior_curvature_bound=(
            np.zeros((dim, dim)) if prior_precision is None else np.asarray(prior_precision, np.float64)
        ),
    )


# --------------------------------------------------------------------------- Bernoulli


def bernoulli_posterior(data: Any, *, a: float = 1.0, b: float = 1.0) -> Tuple[float, float]:
    """Beta(a + k, b + n - k) parameters of p given n coin tosses with k ones."""
    x = np.asarray(pooled(data), dtype=np.float64).ravel()
    k = float(x.sum())
    return a + k, b + x.size - k


def bernoulli(*, a: float = 1.0, b: float = 1.0, parametrization: str = "logit") -> Model:
    """Coin tosses x_i ~ Bernoulli(p) with p ~ Beta(a, b) (FSGLD Figure 1: a = b = 1).

    Parameters: a scalar array, either ``logit(p)`` (``parametrization="logit"``,
    default: unconstrained, for samplers; the prior includes the Jacobian so that
    p ~ Beta(a, b)) or ``p`` itself (``"probability"``: gradients as in FSGLD
    Figure 1; the log prior is -inf outside (0, 1)).
    Example: a scalar 0/1 (a data leaf of shape ``(n,)``).

    Exact posterior p ~ Beta(a + k, b + n - k) (:func:`bernoulli_posterior`);
    ``attributes["exact_posterior"]`` gives (mean, variance) of the parameter as
    ``(1,)`` and ``(1, 1)`` arrays: for the logit, mean psi(alpha) - psi(beta) and
    variance psi'(alpha) + psi'(beta) (the logit of a Beta variable).
    """
    a = positive_float(a, "a")
    b = positive_float(b, "b")
    if parametrization not in ("logit", "probability"):
        raise ValueError(f"parametrization must be 'logit' or 'probability', got {parametrization!r}")
    from scipy import special  # here, not at import: `import fedmcmc` does without scipy

    log_beta = float(special.betaln(a, b))

    if parametrization == "logit":

        def log_prior(theta):
            return a * jax.nn.log_sigmoid(theta) + b * jax.nn.log_sigmoid(-theta) - log_beta

        def log_likelihood(theta, x):
            return x * jax.nn.log_sigmoid(theta) + (1.0 - x) * jax.nn.log_sigmoid(-theta)

    else:

        def log_prior(p):
            inside = (p > 0) & (p < 1)
            q = jnp.where(inside, p, 0.5)
            value = (a - 1) * jnp.log(q) + (b - 1) * jnp.log1p(-q) - log_beta
            return jnp.where(inside, value, -jnp.inf)

        def log_likelihood(p, x):
            return x * jnp.log(p) + (1.0 - x) * jnp.log1p(-p)

    def exact_posterior(data):
        alpha, beta = bernoulli_posterior(data, a=a, b=b)
        if parametrization == "logit":
            mean = special.digamma(alpha) - special.digamma(beta)
            var = special.polygamma(1, alpha) + special.polygamma(1, beta)
        else:
            mean = alpha / (alpha + beta)
            var = alpha * beta / ((alpha + beta) ** 2 * (alpha + beta + 1))
        return np.array([mean]), np.array([[var]])

    init_value = 0.0 if parametrization == "logit" else 0.5
    return Model(
        log_prior,
        log_likelihood,
        name="bernoulli",
        exact_posterior=exact_posterior,
        init=lambda key=None: jnp.asarray(init_value, jnp.float32),
        parametrization=parametrization,
    )


# --------------------------------------------------------------------------- linear regression


def linear_regression_posterior(
    data: Any, *, prior_precision: float = 1.0, noise_std: float = 1.0, prior_mean: Any = 0.0
) -> Tuple[np.ndarray, np.ndarray]:
    """Exact posterior N(m, C) of beta in y_i ~ N(beta^T x_i, sigma^2), beta ~ N(m0, lambda^{-1} I):

    C = (lambda I + X^T X / sigma^2)^{-1},  m = C (X^T y / sigma^2 + lambda m0)

    (FSGLD Appendix F.1; the appendix's ``(sum y_i x_i) Sigma^{-1}`` is a slip,
    see ``../shared/papers/README.md``).
    """
    rows = pooled(data)
    x = np.asarray(rows["x"], dtype=np.float64)
    y = np.asarray(rows["y"], dtype=np.float64).reshape(-1)
    dim = x.shape[1]
    precision = prior_precision * np.eye(dim) + x.T @ x / noise_std**2
    cov = np.linalg.inv(precision)
    shift = x.T @ y / noise_std**2 + prior_precision * as_vector(prior_mean, dim, "prior_mean")
    return cov @ shift, 0.5 * (cov + cov.T)


def linear_regression(
    dim: int, *, prior_precision: float = 1.0, noise_std: float = 1.0, prior_mean: Any = 0.0
) -> Model:
    """Bayesian linear regression with known noise (FSGLD Appendix F.1).

    Parameters: ``beta``, an array of shape ``(dim,)`` (add a column of ones to
    ``x`` for an intercept).
    Example: ``{"x": (dim,), "y": ()}``.

    y_i ~ N(beta^T x_i, noise_std^2), beta ~ N(prior_mean, prior_precision^{-1} I).
    Exact posterior: :func:`linear_regression_posterior`.
    """
    dim = positive_int(dim, "dim")
    lam = positive_float(prior_precision, "prior_precision")
    sigma = positive_float(noise_std, "noise_std")
    m0 = jnp.asarray(as_vector(prior_mean, dim, "prior_mean"), jnp.float32)
    prior_norm = float(0.5 * dim * (np.log(lam) - LOG_2PI))
    lik_norm = float(-0.5 * LOG_2PI - np.log(sigma))

    def log_prior(beta):
        r = beta - m0
        return -0.5 * lam * jnp.sum(r**2) + prior_norm

    def log_likelihood(beta, example):
        r = example["y"] - example["x"] @ beta
        return -0.5 * r**2 / sigma**2 + lik_norm

    def exact_posterior(data):
        return linear_regression_posterior(
            data, prior_precision=lam, noise_std=sigma, prior_mean=prior_mean
        )

    return Model(
        log_prior,
        log_likelihood,
        name="linear_regression",
        exact_posterior=exact_posterior,
        init=lambda key=None: jnp.zeros((dim,), jnp.float32),
        predict=lambda beta, x: x @ beta,
        quadratic_potential=True,
        hessian_bound=lambda example: jnp.abs(jnp.outer(example["x"], example["x"])) / sigma**2,
        prior_hessian_bound=lam * np.eye(dim),
        # Loewner bounds (the Hessians themselves): the Boomerang's whitened bound
        curvature_bound=lambda example: jnp.outer(example["x"], example["x"]) / sigma**2,
        prior_curvature_bound=lam * np.eye(dim),
    )
