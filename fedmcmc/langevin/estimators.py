"""Gradient estimators of the federated Langevin samplers.

Equation numbers refer to El Mekkaoui et al., "Distributed stochastic gradient
MCMC for federated learning" (``fsgld-cg-dsgld-early-version.md``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..federation import ConcatenatedData
from ..model import FlatModel
from ..surrogates import GaussianSurrogates, ProductSurrogate, grad_log_surrogate

__all__ = [
    "draw_minibatch",
    "client_gradient",
    "dsgld_gradient",
    "conducive_gradient",
    "draw_client",
]


def draw_minibatch(key, layout: ConcatenatedData, client, batch_size: int):
    """A uniform minibatch of ``batch_size`` rows of ``client`` (with replacement).

    When the batch is the whole client (``batch_size == N_s``) every row is
    taken once, so the estimator is the exact client gradient.
    Returns the batch pytree and the client size N_s.
    """
    size = layout.sizes[client]
    u = jax.random.uniform(key, (batch_size,))
    sampled = jnp.minimum((u * size).astype(jnp.int32), size - 1)
    whole = jnp.arange(batch_size, dtype=jnp.int32)
    rows = layout.offsets[client] + jnp.where(batch_size >= size, whole, sampled)
    batch = jax.tree_util.tree_map(lambda leaf: leaf[rows], layout.data)
    return batch, size


def client_gradient(flat_model: FlatModel, theta, batch, client_size, batch_size: int):
    """(N_s / m) grad log p(x_s^(m) | theta): unbiased for the client's full-data gradient."""
    scale = client_size.astype(theta.dtype) / batch_size
    return scale * flat_model.grad_log_likelihood_sum(theta, batch)


def dsgld_gradient(flat_model: FlatModel, theta, batch, client_size, batch_size: int, client_weight):
    """Equation (4): grad log p(theta) + N_s / (f_s m) grad log p(x_s^(m) | theta)."""
    return flat_model.grad_log_prior(theta) + client_gradient(
        flat_model, theta, batch, client_size, batch_size
    ) / client_weight


def conducive_gradient(
    theta, client, client_weight, surrogates: GaussianSurrogates, global_surrogate: ProductSurrogate
):
    """Section 3: g_s(theta) = grad log q(theta) - (1/f_s) grad log q_s(theta).

    One product with the precomputed global precision and one with client s's:
    the cost does not depend on the number of clients.
    """
    global_term = grad_log_surrogate(global_surrogate.precision, global_surrogate.shift, theta)
    local_term = grad_log_surrogate(surrogates.precision[client], surrogates.shift[client], theta)
    return global_term - local_term / client_weight


def draw_client(key, cumulative_weights):
    """The scheduler: client s with probability f_s (binary search on the cumulative weights)."""
    u = jax.random.uniform(key, (), dtype=cumulative_weights.dtype) * cumulative_weights[-1]
    index = jnp.searchsorted(cumulative_weights, u, side="right")
    return jnp.minimum(index, cumulative_weights.shape[0] - 1).astype(jnp.int32)
