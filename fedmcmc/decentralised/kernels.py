"""DULA and GT-DULA as functional kernels (Bhar, Bai, George, Busart 2025).

One kernel state holds EVERY agent of one chain: positions ``w`` of shape
``(n, d)`` (agent ``i`` is row ``i``), and for GT-DULA the gradient trackers
``d`` and the last local gradient estimates ``g_hat``. A step updates all
agents at once (``vmap`` over agents for the gradients, one mixing product
for the consensus terms); the engine vmaps it again over chains.

Conventions (see ``papers/README.md``): ``step_size`` alpha is the paper's;
the drift is ``alpha * n * d_i`` (GT-DULA) or ``alpha * n * grad E_i`` (DULA)
and the noise ``sqrt(2 alpha n) v_i``, so that the network average follows a
ULA step of size alpha on the global target. Local energies split the prior
(equation (1)): ``grad E_i(w) = -grad log p(X_i | w) - (1/n) grad log p(w)``.

Equations:

* DULA (3):    w_{k+1} = W_beta w_k - alpha n g_hat(w_k) + sqrt(2 alpha n) v_k
* GT-DULA (7): w_{k+1} = W_beta w_k - alpha n d_k + sqrt(2 alpha n) v_k
* GT-DULA (8): d_{k+1} = W_gamma d_k + g_hat_{k+1} - g_hat_k,  d_0 = g_hat_0  (eq. (6))

with ``W_x = I - x L`` and the local estimate (section 3)
``g_hat_i = -(1/f_i) grad log p(X_hat_i | w_i) - (1/n) grad log p(w_i)``,
``f_i = m_i / M_i``.

Random numbers: the kernels draw exactly what ``jax.random.split``, ``jax.random.normal``
and ``jax.random.uniform`` draw for the same keys (the Ray engine's ``AgentClient``
reproduces them), but for threefry keys they compute the threefry-2x32 hash with the
rounds unrolled (:mod:`fedmcmc.rng`) instead of calling ``jax.random``: on CPU,
``jax.random`` lowers the hash as a rolled 5-iteration while loop (one loop per call,
with loop-carried rotation amounts and the hash computed once per output word), which
made the key split and the (n, d) normal draw most of an iteration. Unrolled, the hash
fuses with the update into one loop. Other key implementations, or
``jax_threefry_partitionable=False``, go through ``jax.random``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..federation import PaddedData
from ..minibatch import likelihood_gradient, some_client_smaller, take_minibatch
from ..model import FlatModel
from ..rng import normal, split_key, uniform  # bit for bit jax.random's (fedmcmc.rng)

__all__ = [
    "DULAState",
    "GTDULAState",
    "consensus_langevin_step",
    "tracker_step",
    "local_gradient_fn",
    "full_gradient_fn",
    "dula_init",
    "dula_kernel",
    "gtdula_init",
    "gtdula_kernel",
    "consensus_error",
    "tracking_error",
    "tracking_error_from",
]

# (key, positions (n, d), iteration) -> local gradient estimates (n, d)
LocalGradient = Callable[[jax.Array, jax.Array], jax.Array]
# (positions (n, d), coefficient) -> positions - coefficient * (L positions)
Mixer = Callable[[jax.Array, jax.Array], jax.Array]


class DULAState(NamedTuple):
    position: jax.Array  # (n, d) agents' samples w_{i,k}
    iteration: jax.Array  # int32 k


class GTDULAState(NamedTuple):
    position: jax.Array  # (n, d) agents' samples w_{i,k}
    tracker: jax.Array  # (n, d) gradient trackers d_{i,k}
    gradient: jax.Array  # (n, d) last local gradient estimates g_hat_{i,k}
    iteration: jax.Array  # int32 k


# ------------------------------------------------------------------ gradients
def full_gradient_fn(flat_model: FlatModel, padded: PaddedData) -> Callable:
    """``positions (n, d) -> (grad E_i(w_i))_i``: exact local gradients on each agent's full data.

    grad E_i(w) = -grad log p(X_i | w) - (1/n) grad log p(w) (section 2). Agents of equal
    size use the padded layout (padded rows have weight 0). When padding would exceed
    ``fedmcmc.federation.UNPADDED_ABOVE_PADDING`` of the rows (60 districts of 2 to 118
    rows: 73%), the real rows are stacked once with the index of their agent and the
    likelihood is differentiated with respect to the (n, d) positions through the row ->
    agent gather (the transpose is a sorted segment sum): the same gradients to float
    rounding, with the work of the real rows only (about 1.9x faster per iteration on that
    federation).
    """
    n = padded.mask.shape[0]

    def prior_terms(positions):
        return jax.vmap(flat_model.grad_log_prior)(positions) / n

    if padded.mostly_padding:
        rows, agent_index = padded.unpadded()

        def ragged_gradients(positions):
            return (-flat_model.grad_log_likelihood_per_client(positions, rows, agent_index)
                    - prior_terms(positions))

        return ragged_gradients

    def one(theta, data, mask):
        return -flat_model.grad_log_likelihood_sum(theta, data, mask) - (
            flat_model.grad_log_prior(theta) / n
        )

    def gradients(positions):
        return jax.vmap(one)(positions, padded.data, padded.mask)

    return gradients


def local_gradient_fn(
    flat_model: FlatModel, padded: PaddedData, batch_size: Optional[int] = None
) -> LocalGradient:
    """The local gradient estimates g_hat_i of all agents, ``(key, positions) -> (n, d)``.

    ``batch_size=None``: full-batch, g_hat_i = grad E_i(w_i) exactly (``key`` unused).
    Otherwise ``batch_size`` is an upper bound (:mod:`fedmcmc.minibatch`, the library's
    one rule): an agent with M_i > m rows draws m rows uniformly with replacement and uses
    ``-(M_i / m) grad log p(X_hat_i | w_i) - (1/n) grad log p(w_i)``, the 1/f_i-scaled
    estimator of section 3 (unbiased for grad E_i); an agent with M_i <= m rows uses all of
    them, its exact gradient.
    """
    if batch_size is None:
        full = full_gradient_fn(flat_model, padded)
        return lambda key, positions: full(positions)
    n = padded.mask.shape[0]
    m = int(batch_size)
    may_be_smaller = some_client_smaller(np.asarray(padded.sizes), m)

    def one(u, theta, data, size):
        batch = take_minibatch(u, data, 0, size, may_be_smaller)
        return -likelihood_gradient(flat_model, theta, batch) - (
            flat_model.grad_log_prior(theta) / n
        )

    def gradients(key, positions):
        # agent i's rows from uniform(split(key, n)[i], (m,)): one draw for all agents
        u = uniform(split_key(key, n), (m,))
        return jax.vmap(one)(u, positions, padded.data, padded.sizes)

    return gradients


def consensus_langevin_step(mixed, drift, alpha, n: int, noise=None):
    """Equations (3) and (7), given the mixed positions ``W_beta w`` (all agents, or one
    agent's row): ``W_beta w - alpha n drift + sqrt(2 alpha n) v``, with ``drift`` DULA's
    g_hat(w) or GT-DULA's tracker d and ``noise`` the standard normal v (``None``: no noise).
    The in-process kernels below and the agents of ``decentralised.distributed`` both call
    it, so the update is written once."""
    new = mixed - alpha * n * drift
    if noise is not None:
        new = new + jnp.sqrt(2.0 * alpha * n) * noise
    return new


def tracker_step(mixed_tracker, new_gradient, old_gradient):
    """Equation (8), given the mixed trackers ``W_gamma d``: ``W_gamma d + g_hat_{k+1} - g_hat_k``."""
    return mixed_tracker + (new_gradient - old_gradient)


# ----------------------------------------------------------------------- DULA
def dula_init(positions: jax.Array) -> DULAState:
    return DULAState(position=positions, iteration=jnp.zeros((), jnp.int32))


def dula_kernel(
    local_gradient: LocalGradient,
    mix: Mixer,
    beta: float,
    schedule: Callable,
    n: int,
    noise: bool = True,
):
    """One DULA iteration, equation (3), for all agents:
    ``w_i <- w_i - beta sum_{j in N_i} (w_i - w_j) - alpha n g_hat_i(w_i) + sqrt(2 alpha n) v_i``.
    """

    def step(key: jax.Array, state: DULAState) -> DULAState:
        key_grad, key_noise = split_key(key)
        w = state.position
        alpha = jnp.asarray(schedule(state.iteration), dtype=w.dtype)
        g = local_gradient(key_grad, w)
        v = normal(key_noise, w.shape, w.dtype) if noise else None
        new = consensus_langevin_step(mix(w, beta), g, alpha, n, v)
        return DULAState(position=new, iteration=state.iteration + 1)

    return step


# -------------------------------------------------------------------- GT-DULA
def gtdula_init(key: jax.Array, positions: jax.Array, local_gradient: LocalGradient) -> GTDULAState:
    """d_{i,0} = g_hat_{i,0} (section 3, before equation (6))."""
    g = local_gradient(key, positions)
    return GTDULAState(
        position=positions, tracker=g, gradient=g, iteration=jnp.zeros((), jnp.int32)
    )


def gtdula_kernel(
    local_gradient: LocalGradient,
    mix: Mixer,
    beta: float,
    gamma: float,
    schedule: Callable,
    n: int,
    noise: bool = True,
):
    """One GT-DULA iteration, equations (7)-(8) with (6), for all agents:

    ``w_{k+1} = W_beta w_k - alpha n d_k + sqrt(2 alpha n) v_k``;
    ``d_{k+1} = W_gamma d_k + g_hat(w_{k+1}) - g_hat(w_k)``.

    Because 1^T L = 0, the mean of the trackers equals the mean of the current
    local estimates at every step (the tracking invariant).
    """

    def step(key: jax.Array, state: GTDULAState) -> GTDULAState:
        key_grad, key_noise = split_key(key)
        w, d = state.position, state.tracker
        alpha = jnp.asarray(schedule(state.iteration), dtype=w.dtype)
        v = normal(key_noise, w.shape, w.dtype) if noise else None
        new_w = consensus_langevin_step(mix(w, beta), d, alpha, n, v)
        new_g = local_gradient(key_grad, new_w)
        new_d = tracker_step(mix(d, gamma), new_g, state.gradient)
        return GTDULAState(
            position=new_w, tracker=new_d, gradient=new_g, iteration=state.iteration + 1
        )

    return step


# ---------------------------------------------------------------- diagnostics
def consensus_error(positions: jax.Array) -> jax.Array:
    """(1/n) sum_i ||w_i - w_bar||^2 (section 4.1, equation (12), per agent)."""
    centred = positions - jnp.mean(positions, axis=0, keepdims=True)
    return jnp.sum(centred**2) / positions.shape[0]


def tracking_error(trackers: jax.Array, positions: jax.Array, full_gradient: Callable) -> jax.Array:
    """||d - 1 (x) u_bar|| with u_bar = (1/n) sum_i grad E_i(w_bar) (section 4.3).

    ``full_gradient(positions) -> (grad E_i(w_i))_i`` (exact local gradients);
    it is evaluated with every agent at w_bar.
    """
    w_bar = jnp.mean(positions, axis=0)
    return tracking_error_from(trackers, full_gradient(jnp.broadcast_to(w_bar, positions.shape)))


def tracking_error_from(trackers: jax.Array, gradients_at_average: jax.Array) -> jax.Array:
    """||d - 1 (x) u_bar|| given every agent's exact gradient at w_bar, ``(n, d)``."""
    u_bar = jnp.mean(gradients_at_average, axis=0)
    return jnp.sqrt(jnp.sum((trackers - u_bar[None, :]) ** 2))
