"""Small helpers shared by the model builders."""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..algorithm import check_positive_float, check_positive_int
from ..federation import Federation

PyTree = Any

LOG_2PI = float(np.log(2.0 * np.pi))

#: the model builders' check of a positive integer argument (``ValueError`` naming it)
positive_int = check_positive_int


def as_matrix(value: Any, dim: int, argument: str) -> np.ndarray:
    """A (dim, dim) float64 symmetric positive-definite matrix from a scalar
    (times identity), a (dim,) diagonal or a (dim, dim) matrix."""
    array = np.asarray(value, dtype=np.float64)
    if array.ndim == 0:
        matrix = float(array) * np.eye(dim)
    elif array.shape == (dim,):
        matrix = np.diag(array)
    elif array.shape == (dim, dim):
        matrix = 0.5 * (array + array.T)
    else:
        raise ValueError(
            f"{argument} must be a scalar, a ({dim},) diagonal or a ({dim}, {dim}) matrix, "
            f"got shape {array.shape}"
        )
    if not np.all(np.isfinite(matrix)):
        raise ValueError(f"{argument} contains NaN or infinite values")
    try:
        np.linalg.cholesky(matrix)
    except np.linalg.LinAlgError:
        raise ValueError(f"{argument} must be symmetric positive definite") from None
    return matrix


def as_vector(value: Any, dim: int, argument: str) -> np.ndarray:
    array = np.asarray(value, dtype=np.float64)
    if array.ndim == 0:
        return np.full(dim, float(array))
    if array.shape != (dim,):
        raise ValueError(f"{argument} must be a scalar or have shape ({dim},), got {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{argument} contains NaN or infinite values")
    return array


def positive_float(value: Any, argument: str, allow_none: bool = False) -> Optional[float]:
    if value is None and allow_none:
        return None
    return check_positive_float(value, argument)


def pooled(data: Any) -> PyTree:
    """The rows of ``data``: a pytree with a leading example axis, or a Federation (pooled)."""
    if isinstance(data, Federation):
        return data.pooled()
    return data


def gaussian_log_prior(scale: Optional[float]):
    """Independent N(0, scale^2) on every leaf of a pytree (flat prior when scale is None)."""

    def log_prior(params: PyTree) -> jax.Array:
        leaves = jax.tree_util.tree_leaves(params)
        total = sum(jnp.sum(jnp.asarray(leaf) ** 2) for leaf in leaves)
        if scale is None:
            return 0.0 * total
        count = sum(int(np.size(leaf)) for leaf in leaves)
        return -0.5 * total / scale**2 - count * (np.log(scale) + 0.5 * LOG_2PI)

    return log_prior
