"""AR(1) time series with Student-t noise (Fed-PDMC section 6.3, Appendix F.3).

Y_k = c + phi Y_{k-1} + eps_k, eps_k ~ Student-t(nu) (unit scale). N independent
trajectories, each observed at K + 1 points y_0..y_K; the likelihood of a
trajectory conditions on its first point:

    log p(y | phi, c) = sum_{k=1}^K log g(y_k - c - phi y_{k-1}).

The paper names the AR coefficient ``x``; here it is ``phi``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln

from ..model import Model
from ._common import gaussian_log_prior, pooled, positive_float

__all__ = ["ar1_student_t", "student_t_bounds"]


def student_t_bounds(nu: float):
    """Uniform bounds of h(z) = -log g(z) = ((nu + 1)/2) log(1 + z^2 / nu) (Appendix F.3):

    |h'(z)| <= (nu + 1) / (2 sqrt(nu))  (maximum at z = sqrt(nu); the appendix's
    printed (nu + 1) sqrt(nu) / (2 nu^2) is not the maximum of h'), and
    |h''(z)| <= (nu + 1) / nu (at z = 0).
    """
    nu = positive_float(nu, "nu")
    return (nu + 1.0) / (2.0 * np.sqrt(nu)), (nu + 1.0) / nu


def ar1_student_t(*, nu: float = 3.0, prior_scale: float = None) -> Model:
    """AR(1) with Student-t(nu) innovations (Fed-PDMC section 6.3).

    Parameters: ``{"c": (), "phi": ()}`` (flat order: c, phi).
    Example: ``{"y": (K + 1,)}``, one trajectory y_0..y_K.

    Prior: flat (``prior_scale=None``, as in the paper: pi_0 constant in (x, c))
    or N(0, prior_scale^2) on both.

    ``attributes["hessian_bound"]``: ``data -> Q`` (2 x 2, order (c, phi)) with
    ``|Hessian of the log likelihood|_jk <= Q_jk`` for all parameters:
    Q = ((nu + 1)/nu) sum_{i,k} |(1, y_{k-1})| |(1, y_{k-1})|^T, from
    nabla^2 U_{i,k} = h''(.) (1, y)(1, y)^T (Appendix F.3).
    ``attributes["gradient_bound"]`` is sup |h'| (see :func:`student_t_bounds`).
    """
    nu = positive_float(nu, "nu")
    scale = positive_float(prior_scale, "prior_scale", allow_none=True)
    log_norm = float(
        gammaln((nu + 1) / 2) - gammaln(nu / 2) - 0.5 * np.log(nu * np.pi)
    )
    grad_bound, curvature_bound = student_t_bounds(nu)

    def log_likelihood(params, example):
        y = example["y"]
        z = y[1:] - params["c"] - params["phi"] * y[:-1]
        return jnp.sum(log_norm - 0.5 * (nu + 1.0) * jnp.log1p(z**2 / nu))

    def hessian_bound(data):
        y = np.asarray(pooled(data)["y"], dtype=np.float64)
        lag = np.abs(y[..., :-1]).ravel()
        features = np.stack([np.ones_like(lag), lag], axis=1)
        return curvature_bound * features.T @ features

    return Model(
        gaussian_log_prior(scale),
        log_likelihood,
        name="ar1_student_t",
        init=lambda key=None: {"c": jnp.zeros((), jnp.float32), "phi": jnp.zeros((), jnp.float32)},
        hessian_bound=hessian_bound,
        gradient_bound=grad_bound,
        nu=nu,
    )
