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
chain can run off. ``alpha_warmup`` ramps alpha linearly from 0 to its value
over the first iterations (DSGLD first brings the chain near the posterior);
the ramp ends before the first kept draw, so the target is unchanged.
"""

from __future__ import annotations

from typing import Callable

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
):
    """The FSGLD update (5) with the exploration constant alpha of equation (7)."""

    def estimator(theta, batch, client, client_size, iteration):
        f_s = client_weights[client]
        base = dsgld_gradient(flat_model, theta, batch, client_size, batch_size, f_s)
        conducive = conducive_gradient(theta, client, f_s, surrogates, global_surrogate)
        return base + alpha(iteration).astype(theta.dtype) * conducive

    return build_federated_kernel(
        estimator, data, client_weights, batch_size, local_steps, schedule, noise
    )
