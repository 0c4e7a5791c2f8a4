"""What a private update changes in a kernel (:mod:`fedmcmc.privacy`): clipped per-example
gradients, minibatches of distinct rows, and the factor on the Langevin noise.

* :class:`ClippedFlatModel`: the flat model whose ``grad_log_likelihood_sum`` is
  ``sum_i w_i clip_C(grad log p(x_i | theta))``, ``clip_C(g) = g min(1, C / ||g||)``; the
  kernels' estimators use it unchanged, so every minibatch sum they form has replace-one
  sensitivity 2C.
* :func:`distinct_row_uniforms`: the minibatch's uniforms turned into ``m`` distinct rows
  (Floyd's algorithm, a uniform ``m``-subset of the ``N`` rows from ``m`` uniforms), written
  back as uniforms ``(r + 1/2) / N`` so that the library's minibatch rule
  (:mod:`fedmcmc.minibatch`: row ``floor(u N)``) takes exactly those rows. A client with at
  most ``m`` rows keeps the rule's every-row-once branch (no sampling).
* :class:`PrivateSteps`: what a kernel needs: C and each client's noise inflation.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from .model import FlatModel

__all__ = ["ClippedFlatModel", "clipped", "clip_per_example", "distinct_rows",
           "distinct_row_uniforms", "PrivateSteps"]


def clip_per_example(gradients: jax.Array, clip_norm) -> jax.Array:
    """Each row of ``gradients`` (n, d) scaled to L2 norm at most ``clip_norm``."""
    norms = jnp.sqrt(jnp.sum(gradients * gradients, axis=-1, keepdims=True))
    factor = jnp.minimum(1.0, clip_norm / jnp.maximum(norms, jnp.finfo(gradients.dtype).tiny))
    return gradients * factor.astype(gradients.dtype)


@dataclasses.dataclass(frozen=True)
class ClippedFlatModel(FlatModel):
    """A :class:`~fedmcmc.model.FlatModel` whose likelihood gradient sums clipped
    per-example gradients (norm at most ``clip_norm`` each)."""

    clip_norm: float = 1.0

    def grad_log_likelihood_sum(self, theta, batch, weights=None):
        per_example = jax.vmap(jax.grad(self.log_likelihood), in_axes=(None, 0))(theta, batch)
        clipped_rows = clip_per_example(per_example, self.clip_norm)
        if weights is not None:
            clipped_rows = clipped_rows * weights.astype(clipped_rows.dtype)[:, None]
        return jnp.sum(clipped_rows, axis=0)

    def grad_log_likelihood_per_client(self, positions, rows, owner):
        per_example = jax.vmap(jax.grad(self.log_likelihood))(positions[owner], rows)
        return jax.ops.segment_sum(clip_per_example(per_example, self.clip_norm), owner,
                                   num_segments=positions.shape[0], indices_are_sorted=True)


def clipped(flat_model: FlatModel, clip_norm: float) -> ClippedFlatModel:
    """``flat_model`` with its per-example likelihood gradients clipped at ``clip_norm``."""
    fields = {f.name: getattr(flat_model, f.name) for f in dataclasses.fields(FlatModel)}
    return ClippedFlatModel(**fields, clip_norm=float(clip_norm))


def distinct_rows(uniforms: jax.Array, size) -> jax.Array:
    """``m`` distinct rows of ``range(size)`` (``size >= m``), a uniform random subset, from
    ``m`` uniforms: Floyd's algorithm (for j = N-m .. N-1: t uniform in [0, j]; take t
    unless already taken, else j)."""
    m = uniforms.shape[0]
    slots = jnp.arange(m, dtype=jnp.int32)
    size = jnp.asarray(size, jnp.int32)

    def body(i, rows):
        j = size - m + i
        t = jnp.minimum((uniforms[i] * (j + 1).astype(uniforms.dtype)).astype(jnp.int32), j)
        taken = jnp.any((rows == t) & (slots < i))
        return rows.at[i].set(jnp.where(taken, j, t))

    return jax.lax.fori_loop(0, m, body, jnp.zeros((m,), jnp.int32))


def distinct_row_uniforms(uniforms: jax.Array, size) -> jax.Array:
    """The uniforms whose rows under the minibatch rule are :func:`distinct_rows`; unchanged
    when ``size <= m`` (the rule then takes every row once)."""
    m = uniforms.shape[0]
    rows = distinct_rows(uniforms, jnp.maximum(size, m))
    spread = (rows.astype(uniforms.dtype) + 0.5) / jnp.asarray(size, uniforms.dtype)
    return jnp.where(size > m, spread, uniforms)


class PrivateSteps(NamedTuple):
    """A private kernel's settings: the clip norm C and each client's factor on the
    standard deviation of its Langevin noise (``(S,)``; one entry for SGLD's pooled data)."""

    clip_norm: float
    noise_inflation: jax.Array

    def model(self, flat_model: FlatModel) -> ClippedFlatModel:
        return clipped(flat_model, self.clip_norm)


def uniforms_of(private: Optional[PrivateSteps], uniforms, size):
    """The minibatch uniforms of a (possibly) private update."""
    return uniforms if private is None else distinct_row_uniforms(uniforms, size)
