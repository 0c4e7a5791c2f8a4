"""SGLD, Welling & Teh (2011), as written in FSGLD equations (1)-(2).

Step-size convention (the papers'): ``theta <- theta + (h/2) v(theta) + N(0, h I)``.
BlackJAX's ``sgld`` writes ``theta + eps grad + N(0, 2 eps)``: eps = h / 2.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from ..federation import ConcatenatedData
from ..model import FlatModel

__all__ = ["SGLDState", "init", "langevin_update", "build_kernel"]


class SGLDState(NamedTuple):
    position: jax.Array  # flat theta
    iteration: jax.Array  # int32, t


def init(position: jax.Array) -> SGLDState:
    return SGLDState(position=position, iteration=jnp.zeros((), jnp.int32))


def langevin_update(key, position, gradient, step_size):
    """Equation (1): theta + (h/2) v + eta, eta ~ N(0, h I)."""
    noise = jax.random.normal(key, position.shape, position.dtype)
    return position + 0.5 * step_size * gradient + jnp.sqrt(step_size) * noise


def build_kernel(
    flat_model: FlatModel,
    data: ConcatenatedData,
    batch_size: int,
    schedule: Callable,
    noise: bool = True,
):
    """SGLD on the pooled data (the centralised baseline).

    Equation (2): v(theta) = grad log p(theta) + (N/m) grad log p(x^(m) | theta),
    the minibatch drawn uniformly (with replacement) from all N examples;
    ``batch_size == N`` uses every example once (exact gradient).
    """
    total = jnp.sum(data.sizes)

    def step(key: jax.Array, state: SGLDState) -> SGLDState:
        key_batch, key_noise = jax.random.split(key)
        u = jax.random.uniform(key_batch, (batch_size,))
        sampled = jnp.minimum((u * total).astype(jnp.int32), total - 1)
        # a batch as large as the data is the full-data gradient (every row once)
        rows = jnp.where(batch_size >= total, jnp.arange(batch_size, dtype=jnp.int32), sampled)
        batch = jax.tree_util.tree_map(lambda leaf: leaf[rows], data.data)
        theta = state.position
        gradient = flat_model.grad_log_prior(theta) + (
            total.astype(theta.dtype) / batch_size
        ) * flat_model.grad_log_likelihood_sum(theta, batch)
        h = schedule(state.iteration)
        if noise:
            position = langevin_update(key_noise, theta, gradient, h)
        else:
            position = theta + 0.5 * h * gradient
        return SGLDState(position=position, iteration=state.iteration + 1)

    return step
