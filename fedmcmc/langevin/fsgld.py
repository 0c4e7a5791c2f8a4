"""FSGLD (CG-DSGLD): DSGLD plus conducive gradients, FSGLD equations (5)-(7), Algorithm 1.

During a visit to client s the gradient estimate is

    grad log p(theta) + N_s / (f_s m) grad log p(x_s^(m) | theta) + alpha g_s(theta),
    g_s(theta) = grad log q(theta) - (1/f_s) grad log q_s(theta),

with Gaussian surrogates q_s of the client likelihoods (``fedmcmc.surrogates``).
E_s[g_s] = 0 (Lemma 1), so the estimator stays unbiased for every alpha.

Far from the surrogates' modes: during a visit the estimator's curvature is
(N_s/f_s) H_s(theta) - P_s/f_s + sum_r P_r. Where the client's true curvature
H_s(theta) is much smaller than at its mode (a log link far from the data, a
saturated logistic), -P_s/f_s dominates, the drift turns repulsive and the
chain can run off. :func:`trust_damping` scales the conducive gradient by a
function of theta alone, which keeps the estimator unbiased and bounds the
term far from the surrogates (the default of ``fm.FSGLD``). An optional ramp
of alpha (:func:`alpha_schedule`) can further soften the start of a run.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax

import jax.numpy as jnp

from ..federation import ConcatenatedData
from ..model import FlatModel
from ..surrogates import GaussianSurrogates, ProductSurrogate
from .dsgld import build_federated_kernel
from .estimators import conducive_gradient, dsgld_gradient

__all__ = ["alpha_schedule", "build_kernel"]


def alpha_schedule(alpha: float, warmup_iterations: int) -> Callable:
    """alpha_t = alpha * min(1, t / warmup_iterations): the ramp of Remark 1's constant."""
    if warmup_iterations <= 0:
        return lambda t: jnp.asarray(alpha, jnp.float32) + 0.0 * t
    return lambda t: alpha * jnp.minimum(1.0, t.astype(jnp.float32) / warmup_iterations)


class TrustRegion(NamedTuple):
    """Where conducive gradients are trusted: a ball of ``radius`` around ``center`` in the
    metric ``precision`` (full or diagonal) -- the Laplace fit of prior x prod_s q_s."""

    center: jax.Array
    precision: jax.Array
    radius: float


def trust_damping(theta: jax.Array, region: TrustRegion) -> jax.Array:
    """c(theta) = min(1, radius / ||theta - center||_precision).

    The damping depends on theta only, never on the client, so E_s[c(theta) g_s(theta)]
    = c(theta) E_s[g_s(theta)] = 0: Lemma 1's unbiasedness holds at every theta. Far
    away, c(theta) g_s(theta) stays bounded (g_s grows linearly), so the chain is as
    stable there as DSGLD; inside the ball (radius at the 1 - 1e-4 quantile of the
    surrogate by default) the estimator is exactly FSGLD's.
    """
    delta = theta - region.center
    if region.precision.ndim == 1:
        distance2 = jnp.sum(region.precision * delta**2)
    else:
        distance2 = delta @ (region.precision @ delta)
    distance = jnp.sqrt(jnp.maximum(distance2, 0.0))
    return jnp.minimum(1.0, region.radius / jnp.maximum(distance, 1e-30))


def build_kernel(
    flat_model: FlatModel,
    data: ConcatenatedData,
    client_weights: jax.Array,
    batch_size: int,
    local_steps: int,
    schedule: Callable,
    surrogates: GaussianSurrogates,
    global_surrogate: ProductSurrogate,
    alpha: Callable,
    noise: bool = True,
    trust_region: Optional[TrustRegion] = None,
):
    """The FSGLD update (5) with the exploration constant alpha of equation (7).

    ``alpha(t)`` is the (possibly ramped) constant; with a ``trust_region`` the
    conducive gradient is further scaled by :func:`trust_damping`.
    """

    def estimator(theta, batch, client, client_size, iteration):
        f_s = client_weights[client]
        base = dsgld_gradient(flat_model, theta, batch, client_size, batch_size, f_s)
        conducive = conducive_gradient(theta, client, f_s, surrogates, global_surrogate)
        scale = alpha(iteration).astype(theta.dtype)
        if trust_region is not None:
            scale = scale * trust_damping(theta, trust_region).astype(theta.dtype)
        return base + scale * conducive

    return build_federated_kernel(
        estimator, data, client_weights, batch_size, local_steps, schedule, noise
    )
