"""Gradient estimators of the federated Langevin samplers.

Equation numbers refer to El Mekkaoui et al., "Distributed stochastic gradient
MCMC for federated learning" (``fsgld-cg-dsgld-early-version.md``).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from ..federation import ConcatenatedData
from .. import rng
from ..minibatch import Minibatch, likelihood_gradient
from ..minibatch import draw_minibatch, minibatch_from_uniforms  # noqa: F401 - re-exported
from ..model import FlatModel
from ..protocols import client_from_uniform, draw_client  # noqa: F401 - re-exported: the scheduler
from ..surrogates import GaussianSurrogates, ProductSurrogate, grad_log_surrogate
from .step_size import client_noise

__all__ = [
    "draw_minibatch",
    "client_gradient",
    "dsgld_gradient",
    "ControlVariates",
    "anchor_of",
    "control_variate_gradient",
    "dsgld_gradient_with_control_variates",
    "conducive_gradient",
    "ConduciveTerms",
    "conducive_terms",
    "conducive_gradient_from_terms",
    "draw_client",
    "client_from_uniform",
    "minibatch_from_uniforms",
    "estimator_moments",
    "unscaled_noise",
]


def client_gradient(flat_model: FlatModel, theta, minibatch: Minibatch):
    """(N_s / m_s) grad log p(x_s^(m_s) | theta) with m_s = min(m, N_s): unbiased for the
    client's full-data gradient, and exact when the client has at most m rows."""
    return likelihood_gradient(flat_model, theta, minibatch)


def dsgld_gradient(flat_model: FlatModel, theta, minibatch: Minibatch, client_weight):
    """Equation (4): grad log p(theta) + N_s / (f_s m_s) grad log p(x_s^(m_s) | theta),
    m_s = min(m, N_s) (``batch_size`` is an upper bound; unbiased either way)."""
    return flat_model.grad_log_prior(theta) + client_gradient(flat_model, theta, minibatch) / client_weight


class ControlVariates(NamedTuple):
    """Control variates of the minibatch estimator (issue 15): an anchor theta* and each
    client's full-data likelihood gradient there, computed by the client on its own rows
    (``anchor_gradients[s]``; on a real deployment it never leaves the client).

    ``anchor``: (d,), one anchor known to every client (the mode of the product of the
    clients' Laplace fits: ``control_variates="global"``), or (S, d), each client's own
    (its Laplace fit's mode, which it already has: ``control_variates="client"``)."""

    anchor: jax.Array  # (d,) or (S, d)
    anchor_gradients: jax.Array  # (S, d): grad log p(x_s | theta*_s), each client's own


def anchor_of(variates: ControlVariates, client):
    """Client ``client``'s anchor theta*_s (the shared one, or its own)."""
    return variates.anchor if variates.anchor.ndim == 1 else variates.anchor[client]


def control_variate_gradient(flat_model: FlatModel, theta, minibatch: Minibatch, client,
                             variates: ControlVariates):
    """``G_s + (N_s/m_s) sum_j (grad log p(x_j|theta) - grad log p(x_j|theta*_s))``: unbiased
    for the client's full-data gradient grad log p(x_s|theta) (the minibatch sum has
    expectation grad log p(x_s|theta) - G_s), with noise that vanishes at theta*_s and grows
    with ``|theta - theta*_s|`` only, instead of with the spread of the rows' gradients."""
    difference = likelihood_gradient(flat_model, theta, minibatch) - likelihood_gradient(
        flat_model, anchor_of(variates, client), minibatch)
    return variates.anchor_gradients[client] + difference


def dsgld_gradient_with_control_variates(flat_model: FlatModel, theta, minibatch: Minibatch,
                                         client_weight, client, variates: ControlVariates):
    """Equation (4) with control variates at theta*_s (as in Baker et al.'s SGLD-CV):
    grad log p(theta) + (1/f_s) [G_s + (N_s/m_s) sum_j (grad log p(x_j|theta) - grad log p(x_j|theta*_s))],
    G_s = grad log p(x_s | theta*_s) (:func:`control_variate_gradient`). Unbiased like (4)
    for any anchor."""
    return flat_model.grad_log_prior(theta) + control_variate_gradient(
        flat_model, theta, minibatch, client, variates) / client_weight


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


class ConduciveTerms(NamedTuple):
    """Every client's conducive gradient as one affine map, g_s(theta) = c_s - M_s theta.

    From section 3's g_s = grad log q - (1/f_s) grad log q_s with Gaussian natural
    parameters (P, b) of q and (P_s, b_s) of q_s: M_s = P - P_s / f_s, c_s = b - b_s / f_s.
    """

    precision: jax.Array  # M_s: (S, d, d), or (S, d) for diagonal surrogates
    shift: jax.Array  # c_s: (S, d)


def conducive_terms(surrogates: GaussianSurrogates, global_surrogate: ProductSurrogate,
                    client_weights) -> ConduciveTerms:
    """Precompute :class:`ConduciveTerms` once per run (the same memory as the P_s).

    A step then needs one matrix-vector product with M_s instead of one with P and one
    with P_s, and no separate combination: :func:`conducive_gradient_from_terms`.
    """
    return _conducive_terms(surrogates, global_surrogate,
                            jnp.asarray(client_weights, surrogates.shift.dtype))


@jax.jit
def _conducive_terms(surrogates, global_surrogate, weights) -> ConduciveTerms:
    # one compiled program instead of an op-by-op set-up
    per_client = weights.reshape((-1,) + (1,) * (surrogates.precision.ndim - 1))
    return ConduciveTerms(
        precision=global_surrogate.precision[None] - surrogates.precision / per_client,
        shift=global_surrogate.shift[None] - surrogates.shift / weights[:, None],
    )


def conducive_gradient_from_terms(theta, client, terms: ConduciveTerms):
    """:func:`conducive_gradient` from the precomputed :class:`ConduciveTerms`: c_s - M_s theta."""
    return grad_log_surrogate(terms.precision[client], terms.shift[client], theta)


def estimator_moments(flat_model: FlatModel, data: ConcatenatedData, client, client_weight,
                      batch_size: int, alpha, surrogates: GaussianSurrogates,
                      global_surrogate: ProductSurrogate, theta, key, probes: int):
    """Client s's moments of the FSGLD estimator (equation 5) at ``theta``, over ``probes``
    minibatch draws from its own data: ``(mean (d,), mean squared norm ())``.

    d + 1 floats a client can send instead of its data: with f_s the client
    probabilities, the estimator's total variance is
    ``tr C = sum_s f_s E_s|g|^2 - |sum_s f_s E_s g|^2`` (see
    ``fsgld.noise_trace_from_moments``).
    """

    def estimate(probe_key):
        minibatch = draw_minibatch(probe_key, data, client, batch_size)
        return dsgld_gradient(flat_model, theta, minibatch, client_weight) + (
            alpha * conducive_gradient(theta, client, client_weight, surrogates, global_surrogate)
        )

    # lax.map over the probes: compiles in about half the time of vmap (step_size.client_noise)
    values = jax.lax.map(estimate, rng.split_key(key, probes))
    return jnp.mean(values, axis=0), jnp.mean(jnp.sum(values * values, axis=-1))


def unscaled_noise(flat_model: FlatModel, data: ConcatenatedData, client, batch_size: int,
                   center, points, key, probes: int, full: bool,
                   variates: Optional[ControlVariates] = None, conducive=None):
    """Client s's noise statistics (``step_size.client_noise``) of the unscaled part r_s of its
    estimator (``step_size.ClientNoise``), from its own minibatches: its minibatch gradient
    (:func:`client_gradient`, or :func:`control_variate_gradient` with ``variates``), minus
    FSGLD's ``alpha grad log q_s`` when ``conducive = (alpha, P_s, b_s)``. Returns
    ``(within, mean)``: (d, d) or () and (d,); with ``conducive`` also the surrogate's
    prediction statistics (4,) (``step_size.client_noise``).

    The one computation of both engines: the in-process set-up maps it over the clients of
    the whole federation's layout, a client on Ray runs it on its own one-client layout
    (``client`` 0), with the key ``fold_in(noise key, s)`` either way."""

    def estimate(theta, probe_key):
        minibatch = draw_minibatch(probe_key, data, client, batch_size)
        if variates is None:
            value = client_gradient(flat_model, theta, minibatch)
        else:
            value = control_variate_gradient(flat_model, theta, minibatch, client, variates)
        if conducive is not None:
            alpha, precision, shift = conducive
            value = value - alpha * grad_log_surrogate(precision, shift, theta)
        return value

    surrogate = None
    if conducive is not None:
        alpha, precision, shift = conducive
        surrogate = (alpha, lambda theta: grad_log_surrogate(precision, shift, theta))
    return client_noise(estimate, center, points, key, probes, full, surrogate)
