"""Generalised linear models: logistic and Poisson regression.

Both take parameters ``beta`` of shape ``(dim,)`` and examples
``{"x": (dim,), "y": ()}``; add a column of ones to ``x`` for an intercept
(Fed-PDMC section 6.2 does). Prior: independent N(0, prior_scale^2).

PDMP bounds (convention of :mod:`fedmcmc.pdmp.bounds`): logistic regression
carries ``hessian_bound``, ``example -> |x x^T| / 4``, an elementwise bound on
the Hessian of -log p(y | x, beta) for every beta (Fed-PDMC Appendix F.2: the
Hessian is x x^T sigma(z)(1 - sigma(z)) <= x x^T / 4); both models carry
``prior_hessian_bound`` = I / prior_scale^2. The Poisson likelihood's curvature
is unbounded (log link): PDMP samplers fall back to their automatic bound.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln

from ..model import Model
from ._common import gaussian_log_prior, positive_float, positive_int

__all__ = ["logistic_regression", "poisson_regression"]


def _logistic_hessian_bound(example):
    x = jnp.abs(example["x"])
    return 0.25 * jnp.outer(x, x)


def logistic_regression(dim: int, *, prior_scale: float = 1.0) -> Model:
    """Bayesian logistic regression (Fed-PDMC section 6.2, Appendix F.2).

    Parameters: ``beta`` of shape ``(dim,)``.
    Example: ``{"x": (dim,), "y": ()}`` with y in {0, 1}.

    P(y = 1 | x, beta) = sigmoid(x^T beta); log p(y | x, beta) = y x^T beta - log(1 + exp(x^T beta)).
    Prior beta ~ N(0, prior_scale^2 I) (Fed-PDMC: standard normal).
    """
    dim = positive_int(dim, "dim")
    scale = positive_float(prior_scale, "prior_scale")

    def log_likelihood(beta, example):
        eta = example["x"] @ beta
        return example["y"] * eta - jax.nn.softplus(eta)

    return Model(
        gaussian_log_prior(scale),
        log_likelihood,
        name="logistic_regression",
        init=lambda key=None: jnp.zeros((dim,), jnp.float32),
        hessian_bound=_logistic_hessian_bound,
        prior_hessian_bound=np.eye(dim) / scale**2,
        # Loewner: 0 <= sigma(eta)(1 - sigma(eta)) x x^T <= x x^T / 4 (the Boomerang's bound)
        curvature_bound=lambda example: 0.25 * jnp.outer(example["x"], example["x"]),
        prior_curvature_bound=np.eye(dim) / scale**2,
        predict=lambda beta, x: jax.nn.sigmoid(x @ beta),
    )


def poisson_regression(dim: int, *, prior_scale: float = 1.0) -> Model:
    """Bayesian Poisson regression with a log link (issue 8's test model).

    Parameters: ``beta`` of shape ``(dim,)``.
    Example: ``{"x": (dim,), "y": ()}`` with y a count.

    y ~ Poisson(exp(x^T beta)); log p(y | x, beta) = y x^T beta - exp(x^T beta) - log y!.
    Prior beta ~ N(0, prior_scale^2 I).
    """
    dim = positive_int(dim, "dim")
    scale = positive_float(prior_scale, "prior_scale")

    def log_likelihood(beta, example):
        eta = example["x"] @ beta
        y = example["y"]
        return y * eta - jnp.exp(eta) - gammaln(y + 1.0)

    return Model(
        gaussian_log_prior(scale),
        log_likelihood,
        name="poisson_regression",
        init=lambda key=None: jnp.zeros((dim,), jnp.float32),
        prior_hessian_bound=np.eye(dim) / scale**2,
        predict=lambda beta, x: jnp.exp(x @ beta),
    )
