"""Federated averaging Langevin dynamics (FA-LD) and VR-FALD* as functional kernels.

Papers: Deng, Zhang, Ma, Song, Lin, "On convergence of federated averaging Langevin
dynamics" (UAI 2024, arXiv:2112.05120; FA-LD, independent injected noise, partial device
participation) and Plassier, Durmus, Moulines, "Federated averaging Langevin dynamics:
toward a unified theory and new algorithms" (AISTATS 2023; the heterogeneity bias of FALD
and VR-FALD*, control variates at the global mode theta*).

Step-size convention (the project's, ``papers/README.md``): ``theta + (h/2) v + N(0, h I)``
with ``h = step_size``. Deng et al. write ``beta - eta grad f + sqrt(2 eta / p_c) xi`` with
f = -log pi: eta = h / 2. Plassier et al. write ``theta - gamma grad U + sqrt(2 gamma) Z``:
gamma = h / 2.

The global posterior is pi(theta) ∝ p(theta) prod_s p(x_s | theta), with client weights
f_s (``federation.weights``, summing to 1). Client s's local energy carries the share f_s
of the prior, log pi_s = f_s log p(theta) + log p(x_s | theta), so sum_s log pi_s = log pi.

One ITERATION is one local step of every participating client; a ROUND is ``local_steps``
iterations. At the start of a round the server averages the clients' local chains into the
shared state, chooses the round's participants and sends them the shared state; each then
runs, from it, on its own data (the FA-LD / FALD update of both papers)

    theta_s <- theta_s + (h/2) g_s(theta_s) + sigma_s xi_s,     xi_s ~ N(0, I)

and the server's next state is sum_s a_s theta_s.

* Full participation: a_s = f_s, g_s = grad log p + (1/f_s) grad-hat log p(x_s | .) (the
  client's gradient of (1/f_s) log pi_s) and sigma_s = sqrt(h / f_s), the independent
  noise of Deng et al. (their sqrt(2 eta / p_c)): the average sum_s f_s theta_s then moves
  by (h/2) sum_s f_s g_s + N(0, h I), a Langevin step on pi whenever the clients share a
  state, and one local step per round is ULA/SGLD on pi exactly.
* Partial participation (Deng et al.'s partial device participation, "scheme I" of Li
  et al. 2020, "On the convergence of FedAvg on non-IID data"): K
  clients are drawn per round with replacement with probabilities f_s; client s drawn
  m_s times gets a_s = m_s / K and sigma_s = sqrt(K h / m_s). Then E[sum_s a_s g_s] =
  sum_s f_s g_s (the drift stays unbiased) and sum_s a_s^2 sigma_s^2 = h (the injected
  noise of the average stays N(0, h I) for every draw of the participants).

VR-FALD* (Plassier et al.) replaces g_s by the control-variate direction at the
global mode theta*:

    g_s(theta) = grad log p(theta) - grad log p(theta*)
                 + (1/f_s) (n_s / m) sum_j [grad log p(x_j | theta) - grad log p(x_j | theta*)]
                 + grad log pi(theta*),

(same minibatch at theta and theta*). sum_s f_s g_s is unbiased for grad log pi(theta), and
each client's direction vanishes at theta* up to the shared term grad log pi(theta*) (zero
at the exact mode, kept so that an inexact theta* costs variance, not bias): the client
drift that FA-LD's local steps suffer on heterogeneous clients is gone.

A kept draw (``draw``) is the weighted average sum_s a_s theta_s of the participating
clients' local chains, the sequence Deng et al. analyse; at the end of a round it is the
server's next shared state. Draws taken every ``local_steps`` iterations are exactly the
server's states.

Random numbers through :mod:`fedmcmc.rng` (``jax.random``'s, hash unrolled).

Citations: the formulas are written out in full rather than cited by equation number:
only the papers' abstracts and a reference implementation of QLSD/QLSD++ by the same
group (github.com/VincentPlassier/QLSD) could be consulted when this was written; the
noise scaling, the averaging and the control variates follow from requiring that the
average of the clients' chains be a Langevin step on pi, which the tests check exactly.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import rng
from ..arrays import device_array
from ..clipping import distinct_row_uniforms
from ..federation import ConcatenatedData
from ..model import FlatModel
from .common import batch_likelihood_gradients, client_rows

__all__ = ["FALDState", "ControlVariates", "independent_noise_scales", "init", "build_kernel",
           "draw", "count_draw", "round_participants", "start_round", "local_direction",
           "local_move", "iteration_keys"]


class FALDState(NamedTuple):
    local: jax.Array  # (S, d) the clients' local chains theta_s (absent clients: unused)
    coefficient: jax.Array  # (S,) averaging weights a_s of the current round (0: absent)
    noise_scale: jax.Array  # (S,) sigma_s of the current round (0: absent)
    iteration: jax.Array  # int32: local steps done (iterations)
    rounds: jax.Array  # int32: rounds started (server averages + broadcasts)
    client_rounds: jax.Array  # int32: sum over rounds of the participating clients
    # int32: participants' uploads for draws taken inside a round (kept by the draw loop:
    # such a draw needs every participant's local chain); the kernel does not touch it
    uploads_inside_rounds: jax.Array


class ControlVariates(NamedTuple):
    """VR-FALD*'s reference: the global mode theta* and grad log pi(theta*)."""

    position: jax.Array  # (d,) theta*
    gradient: jax.Array  # (d,) grad log pi(theta*) (0 at the exact mode)


def independent_noise_scales(step_size, weights):
    """sigma_s = sqrt(h / f_s): Deng et al.'s independent noise sqrt(2 eta / p_c) in the
    project's convention (eta = h/2). sum_s f_s^2 sigma_s^2 = h: the f-weighted average of
    the clients' chains receives exactly the N(0, h I) of a Langevin step."""
    return jnp.sqrt(step_size / weights)


def init(position: jax.Array, weights: jax.Array) -> FALDState:
    """Every client at the shared initial state; the first step starts round 1."""
    num_clients = weights.shape[0]
    return FALDState(
        local=jnp.broadcast_to(position, (num_clients,) + position.shape),
        coefficient=jnp.asarray(weights, position.dtype),
        noise_scale=jnp.zeros((num_clients,), position.dtype),
        iteration=jnp.zeros((), jnp.int32),
        rounds=jnp.zeros((), jnp.int32),
        client_rounds=jnp.zeros((), jnp.int32),
        uploads_inside_rounds=jnp.zeros((), jnp.int32),
    )


def draw(state: FALDState) -> jax.Array:
    """sum_s a_s theta_s: the average of the participating clients' chains."""
    return state.coefficient @ state.local


def count_draw(state: FALDState, local_steps: int) -> FALDState:
    """Record a kept draw: inside a round it costs one upload per participant."""
    inside = (state.iteration % local_steps != 0).astype(jnp.int32)
    uploads = inside * jnp.sum(state.coefficient > 0).astype(jnp.int32)
    return state._replace(uploads_inside_rounds=state.uploads_inside_rounds + uploads)


def round_participants(key: jax.Array, weights: jax.Array, cumulative: jax.Array,
                       step_size, clients_per_round: Optional[int] = None):
    """(a_s, sigma_s) of a new round, for every client (the server's draw).

    Full participation (``clients_per_round=None``): a_s = f_s and sigma_s = sqrt(h / f_s)
    (Deng et al.'s independent noise). Partial participation (scheme I of Li et al. 2020):
    K clients drawn with replacement with probabilities f_s from ``key`` (``cumulative``:
    the cumulative f_s, float32); a client drawn m_s times gets a_s = m_s / K and
    sigma_s = sqrt(K h / m_s), 0 for a client not drawn (see the module docstring)."""
    if clients_per_round is None:
        return weights, independent_noise_scales(step_size, weights)
    num_clients = weights.shape[0]
    dtype = weights.dtype
    k = clients_per_round
    u = rng.uniform(key, (k,))
    chosen = jnp.minimum(jnp.searchsorted(cumulative, u, side="right"), num_clients - 1)
    counts = jax.ops.segment_sum(jnp.ones((k,), dtype), chosen, num_segments=num_clients)
    coefficient = counts / k
    scale = jnp.where(counts > 0, jnp.sqrt(k * step_size / jnp.maximum(counts, 1.0)), 0.0)
    return coefficient, scale


def start_round(state: FALDState, coefficient: jax.Array, scale: jax.Array) -> FALDState:
    """The server's average sum_s a_s theta_s of the last round sent to every client as the
    new shared state, with the new round's (a_s, sigma_s)."""
    server = draw(state)
    return state._replace(
        local=jnp.broadcast_to(server, state.local.shape),
        coefficient=coefficient,
        noise_scale=scale,
        rounds=state.rounds + 1,
        client_rounds=state.client_rounds + jnp.sum(coefficient > 0).astype(jnp.int32),
    )


def local_direction(prior, likelihood, weight, control=None):
    """Client s's drift g_s (the module docstring's two formulas), elementwise in its
    arguments (one client's (d,) vectors, or every client's (S, d) rows with ``weight``
    f_s as an (S, 1) column).

    FA-LD: g_s = grad log p(theta_s) + (1/f_s) grad-hat log p(x_s | theta_s), with
    ``prior`` and ``likelihood`` those two gradients. VR-FALD*: ``control`` is
    ``(prior_star, likelihood_star, gradient_star)``, the same at theta* (same minibatch)
    and grad log pi(theta*), and g_s = prior - prior_star + (likelihood -
    likelihood_star) / f_s + gradient_star."""
    if control is None:
        return prior + likelihood / weight
    prior_star, likelihood_star, gradient_star = control
    return prior - prior_star + (likelihood - likelihood_star) / weight + gradient_star


def local_move(local, direction, step_size, scale, xi, present):
    """One local step of a client's chain, theta_s + (h/2) g_s + sigma_s xi_s (``xi``
    ``None``: no noise), applied where ``present`` (the client takes part in the round)."""
    moved = local + 0.5 * step_size * direction
    if xi is not None:
        moved = moved + scale * xi
    return jnp.where(present, moved, local)


def iteration_keys(key: jax.Array):
    """(round, minibatch, noise) keys of one iteration's key: the round key draws the
    participants when the iteration starts a round."""
    return rng.split_key(key, 3)


def build_kernel(
    flat_model: FlatModel,
    data: ConcatenatedData,
    weights: jax.Array,
    batch_size: int,
    local_steps: int,
    step_size: float,
    clients_per_round: Optional[int] = None,
    control_variates: Optional[ControlVariates] = None,
    noise: bool = True,
    private=None,
) -> Callable:
    """One FA-LD iteration ``step(key, state) -> state`` (see the module docstring).

    ``clients_per_round``: ``None`` for full participation, else K (scheme I).
    ``control_variates``: ``None`` for FA-LD, else VR-FALD*'s reference. ``private``: a
    :class:`fedmcmc.clipping.PrivateSteps` (:mod:`fedmcmc.privacy`): clipped per-example
    gradients of distinct rows, client s's noise sigma_s times ``noise_inflation[s]``.
    """
    if private is not None:
        flat_model = private.model(flat_model)
    num_clients = int(weights.shape[0])
    dtype = flat_model.dtype
    f = jnp.asarray(weights, dtype)
    cumulative = device_array(np.cumsum(np.asarray(weights, np.float64)), np.float32)
    may_be_smaller = bool(np.min(np.asarray(data.sizes)) < batch_size)
    likelihood_gradients = batch_likelihood_gradients(flat_model, data)
    prior_gradients = jax.vmap(flat_model.grad_log_prior)
    h = device_array(step_size, dtype)  # on the host: no eager conversion program

    def directions(positions, picked):
        """g_s(theta_s) for every client, (S, d)."""
        likelihood = likelihood_gradients(positions, picked)
        prior = prior_gradients(positions)
        if control_variates is None:
            return local_direction(prior, likelihood, f[:, None])
        star = jnp.broadcast_to(control_variates.position, positions.shape)
        likelihood_star = likelihood_gradients(star, picked)
        prior_star = flat_model.grad_log_prior(control_variates.position)
        return local_direction(prior, likelihood, f[:, None],
                               (prior_star[None, :], likelihood_star,
                                control_variates.gradient[None, :]))

    def new_round(key, state: FALDState) -> FALDState:
        return start_round(state, *round_participants(key, f, cumulative, h, clients_per_round))

    def step(key: jax.Array, state: FALDState) -> FALDState:
        key_round, key_batch, key_noise = iteration_keys(key)
        state = jax.lax.cond(state.iteration % local_steps == 0, new_round,
                             lambda k, s: s, key_round, state)
        uniforms = rng.uniform(key_batch, (num_clients, batch_size))
        if private is not None:
            uniforms = jax.vmap(distinct_row_uniforms)(uniforms, data.sizes)
        picked = client_rows(uniforms, data, may_be_smaller)
        xi = rng.normal(key_noise, state.local.shape, dtype) if noise else None
        if private is not None and xi is not None:
            xi = xi * private.noise_inflation[:, None]
        moved = local_move(state.local, directions(state.local, picked), h,
                           state.noise_scale[:, None], xi, (state.coefficient > 0)[:, None])
        return state._replace(local=moved, iteration=state.iteration + 1)

    return step
