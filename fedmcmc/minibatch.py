"""The one minibatch rule every family uses: ``batch_size`` is an upper bound.

A client (or an agent, or the pooled data of SGLD) with ``N_s`` rows and a batch size
``m`` contributes

* ``N_s > m``: ``m`` rows drawn uniformly with replacement (row ``floor(u N_s)`` for each of
  ``m`` uniforms on [0, 1)), and the estimator ``(N_s / m) sum_j grad log p(x_j | theta)``,
  unbiased for the client's full-data gradient (FSGLD paper, equations (2) and (4));
* ``N_s <= m``: every row once, ``sum_i grad log p(x_i | theta)``: the exact gradient. The
  batch keeps its compiled length ``m``; slots beyond ``N_s`` repeat the last row with
  weight 0.

In both cases the scale is ``N_s / min(m, N_s)``, so the estimator stays unbiased and a
small client never makes a larger ``batch_size`` invalid. Whether any client can be
smaller than ``m`` is known when the kernel is built (:func:`some_client_smaller`); when
none can, the rule compiles to the plain with-replacement draw with no weights, so runs
on federations whose clients all exceed ``m`` are unchanged by the rule's second branch.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from . import rng

__all__ = ["Minibatch", "some_client_smaller", "minibatch_rows", "take_minibatch",
           "likelihood_gradient", "draw_minibatch", "minibatch_from_uniforms",
           "minibatch_gradient", "client_gradient_estimate"]

PyTree = Any


class Minibatch(NamedTuple):
    """A client's minibatch and what its estimator needs to stay unbiased."""

    data: PyTree  # leaves (m, ...): the rows taken
    row_weights: Optional[jax.Array]  # (m,) 1 on rows used, 0 on padding slots; None: all used
    client_size: jax.Array  # N_s
    rows_used: Any  # min(m, N_s): the estimator's divisor


def some_client_smaller(sizes, batch_size: int) -> bool:
    """Whether any of ``sizes`` (concrete, known when the kernel is built) is below
    ``batch_size``: then the compiled rule needs the whole-client branch and its weights."""
    return bool(np.min(np.asarray(sizes)) < int(batch_size))


def minibatch_rows(uniforms, size, may_be_smaller: bool = True):
    """Row indices (within the client, ``(m,)`` int32), their weights and ``min(m, N_s)``
    from the ``m`` uniforms of one update. See the module docstring for the rule."""
    batch_size = uniforms.shape[0]
    sampled = jnp.minimum((uniforms * size).astype(jnp.int32), size - 1)
    slots = jnp.arange(batch_size, dtype=jnp.int32)
    if not may_be_smaller:
        # N_s >= m for every client: with N_s == m every row once (the exact gradient)
        return jnp.where(batch_size >= size, slots, sampled), None, batch_size
    whole = batch_size >= size
    rows = jnp.where(whole, jnp.minimum(slots, size - 1), sampled)
    weights = jnp.where(whole, (slots < size).astype(jnp.float32), jnp.ones((batch_size,), jnp.float32))
    return rows, weights, jnp.minimum(batch_size, size)


def take_minibatch(uniforms, data: PyTree, offset, size, may_be_smaller: bool = True) -> Minibatch:
    """The minibatch of the client whose rows are ``data[offset : offset + size]``."""
    rows, weights, used = minibatch_rows(uniforms, size, may_be_smaller)
    batch = jax.tree_util.tree_map(lambda leaf: leaf[offset + rows], data)
    return Minibatch(data=batch, row_weights=weights, client_size=size, rows_used=used)


def likelihood_gradient(flat_model, theta, minibatch: Minibatch):
    """``(N_s / min(m, N_s)) sum_j grad log p(x_j | theta)``: unbiased for the client's
    full-data log-likelihood gradient (exact when the client has at most m rows)."""
    used = minibatch.rows_used
    if isinstance(used, (int, np.integer)):
        scale = minibatch.client_size.astype(theta.dtype) / used
    else:
        scale = minibatch.client_size.astype(theta.dtype) / used.astype(theta.dtype)
    return scale * flat_model.grad_log_likelihood_sum(theta, minibatch.data, minibatch.row_weights)


def draw_minibatch(key, layout, client, batch_size: int) -> Minibatch:
    """A minibatch of at most ``batch_size`` rows of ``client`` of the kernels' data layout
    ``layout`` (:class:`~fedmcmc.federation.ConcatenatedData`) by the rule above, from the
    ``batch_size`` uniforms ``jax.random.uniform(key, (batch_size,))``."""
    return minibatch_from_uniforms(rng.uniform(key, (batch_size,)), layout, client)


def minibatch_from_uniforms(uniforms, layout, client,
                            may_be_smaller: Optional[bool] = None) -> Minibatch:
    """:func:`draw_minibatch` from its ``batch_size`` uniforms on [0, 1) (drawn in bulk by
    the engine). ``may_be_smaller``: whether a client can have fewer rows than the batch
    (``None``: read from the layout's sizes, which must then be concrete)."""
    if may_be_smaller is None:
        may_be_smaller = some_client_smaller(layout.sizes, uniforms.shape[0])
    return take_minibatch(uniforms, layout.data, layout.offsets[client], layout.sizes[client],
                          may_be_smaller)


def minibatch_gradient(context, position, key, batch_size: int):
    """``(N_s / m_s) sum_j grad log p(x_j | theta)`` over a minibatch of at most ``batch_size``
    of the client's own rows drawn with ``key`` (``m_s = min(batch_size, N_s)``): unbiased for
    the gradient of the client's full-data log likelihood (FSGLD paper, equation (2) on one
    client). ``context``: the client's :class:`~fedmcmc.protocols.ClientContext` (its flat
    model and rows), ``position`` the flat parameter (d,)."""
    minibatch = draw_minibatch(key, context.data, 0, batch_size)
    return likelihood_gradient(context.flat_model, position, minibatch)


def client_gradient_estimate(context, position, key, batch_size: int, weight):
    """Equation (4) of the FSGLD paper (DSGLD's estimator of the log posterior's gradient on
    client s): ``grad log p(theta) + (1 / f_s) (N_s / m_s) sum_j grad log p(x_j | theta)``,
    ``weight`` the client's selection probability f_s. Unbiased for the full posterior's
    gradient when client s is drawn with probability f_s."""
    flat_model = context.flat_model
    return (flat_model.grad_log_prior(position)
            + minibatch_gradient(context, position, key, batch_size) / weight)
