"""What the baseline samplers share: client gradients, the global mode, results.

Client gradients are computed for every client of a chain at once (``vmap`` over
clients) on the concatenated layout of the federation (:meth:`Federation.concatenated`):
client ``s`` owns rows ``offsets[s] : offsets[s] + sizes[s]``.

The minibatch rule (the project's: ``batch_size`` is an upper bound). A client with
``n_s`` rows and a batch size ``m``:

* ``n_s > m``: ``m`` rows drawn uniformly with replacement (row ``floor(u n_s)``), and
  ``(n_s / m) sum_j grad log p(x_j | theta)``, unbiased for the client's full-data gradient;
* ``n_s <= m``: every row once (slots past ``n_s`` repeat a row with weight 0): the exact
  gradient.

In both cases the scale is ``n_s / min(m, n_s)``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..arrays import device_array
from ..federation import ConcatenatedData
from ..model import FlatModel

__all__ = [
    "ClientRows",
    "client_rows",
    "batch_likelihood_gradients",
    "client_likelihood_gradients",
    "GlobalMode",
    "global_mode",
    "unravel_numpy",
]


class ClientRows(NamedTuple):
    """Every client's minibatch rows (indices into the concatenated data) for one update."""

    rows: jax.Array  # (S, m) int32
    weights: Optional[jax.Array]  # (S, m) 1 on rows used, 0 on padding slots; None: all used
    scale: jax.Array  # (S,) n_s / min(m, n_s)


def client_rows(uniforms: jax.Array, data: ConcatenatedData, may_be_smaller: bool) -> ClientRows:
    """The rows of every client's minibatch from ``uniforms`` of shape ``(S, m)``.

    ``may_be_smaller``: whether some client has fewer than ``m`` rows (known when the
    kernel is built); when none has, the rule compiles to the plain with-replacement
    draw with no weights.
    """
    m = uniforms.shape[-1]
    sizes = data.sizes[:, None]
    sampled = jnp.minimum((uniforms * sizes).astype(jnp.int32), sizes - 1)
    slots = jnp.arange(m, dtype=jnp.int32)[None, :]
    if not may_be_smaller:
        # n_s >= m for every client; n_s == m takes every row once (the exact gradient)
        within = jnp.where(m >= sizes, jnp.broadcast_to(slots, sampled.shape), sampled)
        scale = data.sizes.astype(jnp.float32) / m
        return ClientRows(data.offsets[:, None] + within, None, scale)
    whole = m >= sizes
    within = jnp.where(whole, jnp.minimum(slots, sizes - 1), sampled)
    weights = jnp.where(whole, (slots < sizes).astype(jnp.float32), 1.0)
    used = jnp.minimum(m, data.sizes).astype(jnp.float32)
    scale = data.sizes.astype(jnp.float32) / used
    return ClientRows(data.offsets[:, None] + within, weights, scale)


def batch_likelihood_gradients(flat_model: FlatModel, data: ConcatenatedData) -> Callable:
    """``(positions (S, d), rows: ClientRows) -> (S, d)``: every client's unbiased estimate
    ``(n_s / min(m, n_s)) sum_j grad log p(x_j | theta_s)`` at its own position."""

    def one(theta, rows, weights, scale):
        batch = jax.tree_util.tree_map(lambda leaf: leaf[rows], data.data)
        return scale * flat_model.grad_log_likelihood_sum(theta, batch, weights)

    def gradients(positions, picked: ClientRows):
        if picked.weights is None:
            return jax.vmap(lambda t, r, s: one(t, r, None, s))(
                positions, picked.rows, picked.scale)
        return jax.vmap(one)(positions, picked.rows, picked.weights, picked.scale)

    return gradients


def client_likelihood_gradients(flat_model: FlatModel, data: ConcatenatedData) -> Callable:
    """``theta (d,) -> (S, d)``: every client's exact gradient sum_i grad log p(x_i | theta)
    at one common point (per-example gradients over all rows, summed per client)."""
    num_clients = int(data.sizes.shape[0])
    owner = device_array(np.repeat(np.arange(num_clients), np.asarray(data.sizes)), np.int32)

    def gradients(theta):
        per_example = jax.vmap(
            lambda row: jax.grad(flat_model.log_likelihood)(theta, row)
        )(data.data)
        return jax.ops.segment_sum(per_example, owner, num_segments=num_clients,
                                   indices_are_sorted=True)

    return gradients


class GlobalMode(NamedTuple):
    """The mode of the global posterior found by a federated optimisation."""

    position: jax.Array  # (d,)
    gradient_norm: float  # ||grad log pi|| at ``position``
    iterations: int  # L-BFGS iterations
    evaluations: int  # gradient evaluations: one communication round each


def global_mode(flat_model: FlatModel, data: ConcatenatedData, theta0: jax.Array,
                max_iterations: int = 500, tolerance: float = 1e-6) -> GlobalMode:
    """argmax_theta log p(theta) + sum_s log p(x_s | theta) by L-BFGS (optax, zoom line
    search), started at ``theta0``.

    Federated reading: every evaluation of the objective and its gradient is one round in
    which the server sends theta to every client and each returns its log-likelihood and
    gradient (d + 1 floats). Deterministic (no random numbers). Stops when the gradient
    norm, relative to ``1 + |log pi|``, is below ``tolerance``, when an iteration does not
    decrease -log pi (float32 precision reached), or after ``max_iterations`` iterations.
    """
    import optax

    solver = optax.lbfgs()

    class Carry(NamedTuple):
        theta: jax.Array
        state: Any
        value: jax.Array
        previous: jax.Array
        grad_norm: jax.Array
        iteration: jax.Array

    # the rows are an argument of the compiled program, not constants of it: a program that
    # closed over them embedded every row in its text (compile time and memory grew with the
    # data, issue 45)
    @jax.jit
    def run(theta, rows):
        def negative_log_posterior(theta):
            return -(flat_model.log_prior(theta) + flat_model.log_likelihood_sum(theta, rows))

        value_and_grad = optax.value_and_grad_from_state(negative_log_posterior)

        def step(carry: Carry) -> Carry:
            value, grad = value_and_grad(carry.theta, state=carry.state)
            updates, state = solver.update(grad, carry.state, carry.theta, value=value,
                                           grad=grad, value_fn=negative_log_posterior)
            theta = optax.apply_updates(carry.theta, updates)
            return Carry(theta, state, value, carry.value, jnp.linalg.norm(grad),
                         carry.iteration + 1)

        def keep_going(carry: Carry):
            small = carry.grad_norm <= tolerance * (1.0 + jnp.abs(carry.value))
            finite = jnp.isfinite(carry.grad_norm) & jnp.isfinite(carry.value)
            progress = (carry.iteration < 2) | (carry.value < carry.previous)
            return (carry.iteration == 0) | (
                (carry.iteration < max_iterations) & ~small & finite & progress)

        inf = jnp.asarray(jnp.inf, theta.dtype)
        start = Carry(theta, solver.init(theta), inf, inf, inf, jnp.zeros((), jnp.int32))
        end = jax.lax.while_loop(keep_going, step, start)
        final_grad = jax.grad(negative_log_posterior)(end.theta)
        linesearch = optax.tree_utils.tree_get(end.state, "num_linesearch_steps")
        return end.theta, jnp.linalg.norm(final_grad), end.iteration, linesearch

    theta, grad_norm, iterations, linesearch = run(jnp.asarray(theta0), data.data)
    iterations = int(iterations)
    # each iteration evaluates at least once, plus its line-search steps (best effort:
    # the last iteration's count; optax keeps no running total)
    evaluations = iterations + (int(linesearch) if linesearch is not None else 0) + 1
    return GlobalMode(theta, float(grad_norm), iterations, evaluations)


def unravel_numpy(flat_model: FlatModel, draws: np.ndarray):
    """``flat_model.unravel_draws`` in NumPy: slices of the flat axis reshaped to each leaf
    (``ravel_pytree`` concatenates the leaves in ``tree_leaves`` order)."""
    template = jax.eval_shape(flat_model.unravel,
                              jax.ShapeDtypeStruct((flat_model.dim,), flat_model.dtype))
    leaves, treedef = jax.tree_util.tree_flatten(template)
    lead = draws.shape[:-1]
    out, offset = [], 0
    for leaf in leaves:
        size = int(np.prod(leaf.shape, dtype=np.int64))
        out.append(np.asarray(draws[..., offset:offset + size])
                   .reshape(lead + tuple(leaf.shape)).astype(leaf.dtype))
        offset += size
    return jax.tree_util.tree_unflatten(treedef, out)


