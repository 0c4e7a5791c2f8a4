"""Quantised Langevin stochastic dynamics (QLSD) and QLSD++ as functional kernels.

Paper: Vono, Plassier, Durmus, Dieuleveut, Moulines, "QLSD: Quantised Langevin stochastic
dynamics for Bayesian federated learning" (AISTATS 2022, arXiv:2106.00797); reference
implementation by the authors: github.com/VincentPlassier/QLSD (``toy_tools_func.py``:
``Qlsd``, ``QlsdPp``, ``StochasticQuantization``; ``qlsdpp.py``: the SVRG reference and
memory terms), consulted for the algorithms' structure (no code is copied).

Step-size convention (the project's): ``theta + (h/2) v + N(0, h I)``, ``h = step_size``.
The paper writes ``theta - gamma sum_i C(H_i(theta)) + sqrt(2 gamma) Z``: gamma = h / 2.

The global potential splits over clients, log pi = sum_s log pi_s with
log pi_s = f_s log p(theta) + log p(x_s | theta) (the prior shared by the weights f_s =
``federation.weights``; the reference code shares it equally, any split summing to one
targets the same pi). Each iteration every client sends one compressed vector; the server
updates

    QLSD:    theta <- theta + (h/2) sum_s C(H_s(theta)) + sqrt(h) xi

with H_s(theta) = f_s grad log p(theta) + (n_s / m) sum_j grad log p(x_j | theta) the
client's unbiased minibatch gradient (the project's rule: a client with at most m rows
uses all of them, its exact gradient) and C the unbiased stochastic quantiser of QSGD
(Alistarh et al. 2017) that the paper uses:

    C(v)_j = ||v||_2 sign(v_j) xi_j / s,   xi_j = floor(r_j) + Bernoulli(r_j - floor(r_j)),
    r_j = s |v_j| / ||v||_2,

with s quantisation levels. E[C(v)] = v and E||C(v) - v||^2 <= omega ||v||^2 with
omega = min(d / s^2, sqrt(d) / s). With ``bits`` b, s = 2^(b-1) - 1: each coordinate is a
sign and a level in {0, ..., s}, b bits in a fixed-length code, plus one float32 norm per
vector: 32 + b d bits per client and iteration (the paper's reference code counts an
Elias code, which is shorter for sparse vectors; we count the plain fixed-length code).

QLSD++ adds the paper's two variance reductions:

* control variates at a reference point zeta, refreshed every ``reference_every``
  iterations (SVRG): at a refresh, zeta <- theta and each client computes its exact
  gradient G_s = grad log pi_s(zeta) and uses H_s = G_s; otherwise
  H_s(theta) = G_s + f_s (grad log p(theta) - grad log p(zeta))
  + (n_s / m) sum_j [grad log p(x_j | theta) - grad log p(x_j | zeta)];
* memory terms eta_s (DIANA-style): client s sends q_s = C(H_s - eta_s), the server uses
  sum_s (eta_s + q_s) (unbiased for sum_s H_s) and both update eta_s <- eta_s + alpha q_s,
  alpha = 1 / (omega + 1) by default, eta_s = 0 at the start;

so the compressed quantity tends to zero as the chain settles, and with it the
quantisation noise.

All chains of a run live in one state (leading chain axis on every array except the
iteration counter): the refresh is then a real branch, not a select evaluated for every
chain (which would compute every client's full gradient at every iteration).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import rng
from ..arrays import device_array
from ..federation import ConcatenatedData
from ..model import FlatModel
from ..clipping import distinct_row_uniforms
from .common import batch_likelihood_gradients, client_likelihood_gradients, client_rows

__all__ = [
    "levels_for_bits",
    "variance_bound",
    "quantize",
    "QLSDState",
    "QLSDPlusPlusState",
    "init",
    "init_plus_plus",
    "build_kernel",
    "build_kernel_plus_plus",
    "langevin_move",
    "client_gradient",
    "controlled_gradient",
    "iteration_keys",
    "draws_per_chain",
    "client_noise_scales",
]


def draws_per_chain(on_draws, chains: int, dim: int):
    """``on_draws`` for an engine whose draws hold every chain in one row, ``(1, k, chains *
    dim)`` (QLSD's server state is one draw of all its chains): the callback gets them as
    ``(chains, k, dim)``, the layout of every other sampler's chunks."""

    def per_chain(draws, stats, first_index):
        on_draws(draws.reshape(draws.shape[1], chains, dim).transpose(1, 0, 2), stats,
                 first_index)

    return per_chain


def levels_for_bits(bits: Optional[int]) -> Optional[int]:
    """s = 2^(bits-1) - 1 quantisation levels (a sign bit and bits-1 level bits per
    coordinate); ``None``: no compression."""
    return None if bits is None else 2 ** (int(bits) - 1) - 1


def variance_bound(levels: Optional[int], dim: int) -> float:
    """omega = min(d / s^2, sqrt(d) / s): E||C(v) - v||^2 <= omega ||v||^2 (0 without
    compression)."""
    if levels is None:
        return 0.0
    return float(min(dim / levels**2, np.sqrt(dim) / levels))


def quantize(uniforms: jax.Array, vector: jax.Array, levels: Optional[int]) -> jax.Array:
    """The unbiased stochastic quantiser C_s of QSGD (see the module docstring) with the
    uniforms ``uniforms`` (same shape as ``vector``) deciding the random rounding.
    ``levels=None`` returns ``vector`` (no compression)."""
    if levels is None:
        return vector
    norm = jnp.sqrt(jnp.sum(vector**2))
    safe = jnp.where(norm > 0, norm, 1.0)
    ratio = levels * jnp.abs(vector) / safe
    low = jnp.floor(ratio)
    level = low + (uniforms < ratio - low).astype(vector.dtype)
    return jnp.where(norm > 0, jnp.sign(vector) * level * (safe / levels), 0.0)


class QLSDState(NamedTuple):
    position: jax.Array  # (d,) theta (one chain; the algorithm stacks chains)
    iteration: jax.Array  # int32, shared by all chains


class QLSDPlusPlusState(NamedTuple):
    position: jax.Array  # (d,) theta
    memory: jax.Array  # (S, d) eta_s
    reference: jax.Array  # (d,) zeta
    reference_gradients: jax.Array  # (S, d) G_s = grad log pi_s(zeta)
    iteration: jax.Array  # int32, shared by all chains


def init(position: jax.Array) -> QLSDState:
    return QLSDState(position=position, iteration=jnp.zeros((), jnp.int32))


def init_plus_plus(position: jax.Array, num_clients: int) -> QLSDPlusPlusState:
    """eta_s = 0; zeta and G_s are set by the refresh at iteration 0."""
    zeros = jnp.zeros((num_clients,) + position.shape, position.dtype)
    return QLSDPlusPlusState(position=position, memory=zeros, reference=position,
                             reference_gradients=zeros, iteration=jnp.zeros((), jnp.int32))


class _Pieces(NamedTuple):
    f: jax.Array
    may_be_smaller: bool
    likelihood_gradients: Callable
    num_clients: int


def _pieces(flat_model, data, weights, batch_size) -> _Pieces:
    return _Pieces(
        f=jnp.asarray(weights, flat_model.dtype),
        may_be_smaller=bool(np.min(np.asarray(data.sizes)) < batch_size),
        likelihood_gradients=batch_likelihood_gradients(flat_model, data),
        num_clients=int(np.asarray(weights).shape[0]),
    )


def langevin_move(position, direction, step_size, key, noise):
    """The server's step theta + (h/2) v + sqrt(h) xi, with v the sum of what the clients
    sent (QLSD) or sum_s (eta_s + q_s) (QLSD++); ``key`` draws xi."""
    moved = position + 0.5 * step_size * direction
    if noise:
        moved = moved + jnp.sqrt(step_size) * rng.normal(key, position.shape, position.dtype)
    return moved


def client_gradient(prior_gradient, likelihood_gradient, weight):
    """H_s(theta) = f_s grad log p(theta) + (n_s / m) sum_j grad log p(x_j | theta): client
    s's unbiased stochastic gradient of log pi_s (``likelihood_gradient``: the minibatch
    estimate), elementwise (one client, or every client's rows with an (S, 1) ``weight``)."""
    return weight * prior_gradient + likelihood_gradient


def controlled_gradient(exact, prior_difference, likelihood_difference, weight):
    """QLSD++'s control-variate gradient G_s + f_s (grad log p(theta) - grad log p(zeta)) +
    (n_s / m) sum_j [grad log p(x_j | theta) - grad log p(x_j | zeta)] (same minibatch at
    theta and zeta), from G_s = grad log pi_s(zeta) and the two differences."""
    return exact + weight * prior_difference + likelihood_difference


def client_noise_scales(weights, step_size, noise_inflation):
    """The standard deviations ``2 sqrt(f_s / h) a_s`` of the Langevin noise a private QLSD's
    client s adds to H_s (the server's noise moved to the clients, before quantisation).
    The server moves theta by (h/2) times their sum, so the noise reaching theta has
    variance (h/2)^2 sum_s 4 f_s a_s^2 / h = h sum_s f_s a_s^2: the Langevin step's h when
    every a_s = 1 (the f_s sum to one)."""
    return 2.0 * jnp.sqrt(weights / step_size) * noise_inflation


def iteration_keys(key: jax.Array):
    """(minibatch, quantisation, noise) keys of one chain's iteration key."""
    return rng.split_key(key, 3)


def build_kernel(
    flat_model: FlatModel,
    data: ConcatenatedData,
    weights: jax.Array,
    batch_size: int,
    step_size: float,
    levels: Optional[int],
    noise: bool = True,
    private=None,
) -> Callable:
    """One QLSD iteration for one chain: theta + (h/2) sum_s C(H_s(theta)) + sqrt(h) xi.

    ``private``: a :class:`fedmcmc.clipping.PrivateSteps` (:mod:`fedmcmc.privacy`). The
    Langevin noise then moves to the clients, before quantisation: client s sends
    C(H_s + 2 sqrt(f_s / h) a_s xi_s), H_s from clipped per-example gradients of distinct
    rows, a_s = ``noise_inflation[s]``; the server adds none. With every a_s = 1 the noise
    reaching theta, (h/2)^2 sum_s 4 f_s / h = h, is exactly the Langevin step's.
    """
    if private is not None:
        flat_model = private.model(flat_model)
    p = _pieces(flat_model, data, weights, batch_size)
    h = device_array(step_size, flat_model.dtype)
    if private is not None:
        client_noise = client_noise_scales(p.f, step_size, private.noise_inflation)

    def step(key: jax.Array, state: QLSDState) -> QLSDState:
        key_batch, key_quant, key_noise = iteration_keys(key)
        theta = state.position
        uniforms = rng.uniform(key_batch, (p.num_clients, batch_size))
        if private is not None:
            uniforms = jax.vmap(distinct_row_uniforms)(uniforms, data.sizes)
        picked = client_rows(uniforms, data, p.may_be_smaller)
        positions = jnp.broadcast_to(theta, (p.num_clients,) + theta.shape)
        gradients = client_gradient(flat_model.grad_log_prior(theta)[None, :],
                                    p.likelihood_gradients(positions, picked), p.f[:, None])
        if private is not None:
            gradients = gradients + client_noise[:, None] * rng.normal(
                key_noise, gradients.shape, gradients.dtype)
        uniforms = rng.uniform(key_quant, gradients.shape)
        sent = jax.vmap(lambda u, v: quantize(u, v, levels))(uniforms, gradients)
        return QLSDState(position=langevin_move(theta, jnp.sum(sent, axis=0), h, key_noise,
                                                noise and private is None),
                         iteration=state.iteration + 1)

    return step


def build_kernel_plus_plus(
    flat_model: FlatModel,
    data: ConcatenatedData,
    weights: jax.Array,
    batch_size: int,
    step_size: float,
    levels: Optional[int],
    reference_every: int,
    memory_rate: float,
    noise: bool = True,
) -> Callable:
    """One QLSD++ iteration for one chain (control variates refreshed every
    ``reference_every`` iterations, memory terms with rate ``memory_rate``)."""
    p = _pieces(flat_model, data, weights, batch_size)
    h = device_array(step_size, flat_model.dtype)  # on the host: no eager conversions
    full_gradients = client_likelihood_gradients(flat_model, data)
    alpha = device_array(memory_rate, flat_model.dtype)

    def refreshed(theta, state, picked):
        exact = client_gradient(flat_model.grad_log_prior(theta)[None, :],
                                full_gradients(theta), p.f[:, None])
        return theta, exact, exact

    def controlled(theta, state, picked):
        zeta, exact = state.reference, state.reference_gradients
        shape = (p.num_clients,) + theta.shape
        difference = (p.likelihood_gradients(jnp.broadcast_to(theta, shape), picked)
                      - p.likelihood_gradients(jnp.broadcast_to(zeta, shape), picked))
        prior = flat_model.grad_log_prior(theta) - flat_model.grad_log_prior(zeta)
        return zeta, exact, controlled_gradient(exact, prior[None, :], difference, p.f[:, None])

    def step(key: jax.Array, state: QLSDPlusPlusState) -> QLSDPlusPlusState:
        key_batch, key_quant, key_noise = iteration_keys(key)
        theta = state.position
        picked = client_rows(rng.uniform(key_batch, (p.num_clients, batch_size)), data,
                             p.may_be_smaller)
        zeta, exact, gradients = jax.lax.cond(state.iteration % reference_every == 0,
                                              refreshed, controlled, theta, state, picked)
        uniforms = rng.uniform(key_quant, gradients.shape)
        sent = jax.vmap(lambda u, v: quantize(u, v, levels))(uniforms, gradients - state.memory)
        direction = jnp.sum(state.memory + sent, axis=0)
        return QLSDPlusPlusState(
            position=langevin_move(theta, direction, h, key_noise, noise),
            memory=state.memory + alpha * sent,
            reference=zeta,
            reference_gradients=exact,
            iteration=state.iteration + 1,
        )

    return step
