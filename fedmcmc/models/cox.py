"""Log-Gaussian Cox process on a d x d grid (Fed-PDMC Appendix E.1, F.4).

Counts y_ij ~ Poisson(exp(x_ij)) given a latent Gaussian field x with mean 0 and
precision P = beta (I - alpha A), A the 4-neighbour adjacency matrix of the grid:

    log pi(x | y) = sum_ij (y_ij x_ij - exp(x_ij)) - (beta / 2) x^T (I - alpha A) x + const.

The field is flattened row-major, k = d i + j (the appendix's k = d(i - 1) + j
with 0-based indices). Each example is one grid cell, so a federation whose
clients hold spatial blocks of cells (``fm.partition.by_key`` on a block id, see
:func:`fedmcmc.models.synthetic.lgcp_data`) is the paper's setting: worker m's
potential U_m touches only the coordinates of its cells (Remark 3.1), the prior
couples them.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln

from ..model import Model
from ._common import LOG_2PI, positive_float, positive_int

__all__ = ["lgcp", "grid_adjacency"]


def grid_adjacency(grid_size: int) -> np.ndarray:
    """(d^2, d^2) adjacency matrix of the d x d grid with 4-neighbours, row-major cells."""
    d = positive_int(grid_size, "grid_size")
    a = np.zeros((d * d, d * d))
    for i in range(d):
        for j in range(d):
            k = d * i + j
            if i + 1 < d:
                a[k, k + d] = a[k + d, k] = 1.0
            if j + 1 < d:
                a[k, k + 1] = a[k + 1, k] = 1.0
    return a


def lgcp(grid_size: int = 4, *, alpha: float = 0.1, beta: float = 1.0) -> Model:
    """Log-Gaussian Cox process on a grid (Fed-PDMC Appendix E.1: d = 4, alpha = 0.1, beta = 1).

    Parameters: the latent field ``x`` of shape ``(d * d,)`` (row-major).
    Example: ``{"index": () int, "count": ()}``, one grid cell k and its count y_k.

    Prior x ~ N(0, P^{-1}), P = beta (I - alpha A) (positive definite requires
    alpha < 1 / lambda_max(A)); ``attributes["prior_precision"]`` is P.
    Per-cell log likelihood y_k x_k - exp(x_k) - log y_k!.
    """
    d = positive_int(grid_size, "grid_size")
    beta = positive_float(beta, "beta")
    alpha = float(alpha)
    adjacency = grid_adjacency(d)
    precision = beta * (np.eye(d * d) - alpha * adjacency)
    eigenvalues = np.linalg.eigvalsh(precision)
    if eigenvalues.min() <= 0:
        raise ValueError(
            f"alpha={alpha}: the prior precision beta (I - alpha A) is not positive definite "
            f"(needs alpha < {1.0 / np.linalg.eigvalsh(adjacency).max():.4g})"
        )
    log_norm = float(0.5 * np.sum(np.log(eigenvalues)) - 0.5 * d * d * LOG_2PI)
    p = jnp.asarray(precision, jnp.float32)

    def log_prior(x):
        return -0.5 * x @ (p @ x) + log_norm

    def log_likelihood(x, example):
        value = x[example["index"]]
        y = example["count"]
        return y * value - jnp.exp(value) - gammaln(y + 1.0)

    return Model(
        log_prior,
        log_likelihood,
        name="lgcp",
        init=lambda key=None: jnp.zeros((d * d,), jnp.float32),
        prior_precision=precision,
        grid_size=d,
    )
