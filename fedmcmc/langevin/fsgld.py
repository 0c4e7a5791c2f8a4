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
chain can run off. :func:`trust_damping` (the default of ``fm.FSGLD``) cuts
the conducive term outside a trust region wherever it pushes the chain away
from the posterior; inside the region the estimator is unchanged. An
optional ramp of alpha (:func:`alpha_schedule`) can soften the start of a run.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax

import jax.numpy as jnp
import numpy as np

from ..arrays import device_array
from ..federation import ConcatenatedData
from ..model import FlatModel
from ..surrogates import GaussianSurrogates, ProductSurrogate, matvec
from .dsgld import build_federated_kernel
from .preconditioning import trust_radius_widening
from .estimators import (
    ControlVariates,
    conducive_gradient_from_terms,
    conducive_terms,
    dsgld_gradient,
    dsgld_gradient_with_control_variates,
)

__all__ = ["alpha_schedule", "build_kernel", "check_alpha_warmup"]


def alpha_schedule(alpha: float, warmup_iterations: int) -> Callable:
    """alpha_t = alpha * min(1, t / warmup_iterations): the ramp of Remark 1's constant."""
    if warmup_iterations <= 0:
        return lambda t: jnp.full(jnp.shape(t), alpha, jnp.float32)
    return lambda t: alpha * jnp.minimum(1.0, t.astype(jnp.float32) / warmup_iterations)


class TrustRegion(NamedTuple):
    """Where conducive gradients are trusted: a ball of ``radius`` around ``center`` in the
    metric ``precision`` (full or diagonal) -- the Laplace fit of prior x prod_s q_s."""

    center: jax.Array
    precision: jax.Array
    radius: float


def noise_trace_from_moments(weights, means, second_moments) -> float:
    """tr C of the FSGLD estimator from the clients' moments (``estimators.estimator_moments``):
    ``sum_s f_s E_s|g|^2 - |sum_s f_s E_s g|^2`` (law of total variance over the scheduler's
    client draw)."""
    w = np.asarray(weights, np.float64)
    mean = w @ np.asarray(means, np.float64)
    return float(w @ np.asarray(second_moments, np.float64) - mean @ mean)


def auto_trust_radius(dim: int, step_size: float, noise_trace: float,
                      preconditioned_rows: Optional[int] = None) -> float:
    """``trust_radius="auto"``: the 1 - 1e-4 quantile of the *discretised chain's* distance to
    the centre.

    For the unadjusted recursion theta' = theta - (h/2) A theta + (h/2) eps + sqrt(h) xi
    with gradient noise eps ~ (0, C), the stationary law satisfies, to first order in h,
    E[delta^T A delta] = d + (h/4) tr(C). The chi-square quantile of the posterior is
    therefore widened by 1 + (h/4) tr(C) / d. Without this, large minibatch noise would put
    the chain outside the radius often and the damping would change what is sampled.
    ``preconditioned_rows``: N of a pSGLD chain (``preconditioning.trust_radius_widening``, an
    upper bound of its widening); ``None``: not preconditioned.
    """
    # the chi-square quantile from scipy.special, exactly what scipy.stats.chi2.ppf(q, dim)
    # computes (chdtri(dim, 1 - q)): importing scipy.stats took about 0.6 s of every FSGLD
    # run's start-up, scipy.special about 0.15 s
    from scipy.special import chdtri

    if preconditioned_rows is None:
        widening = 1.0 + step_size * noise_trace / (4.0 * dim)
    else:
        widening = trust_radius_widening(step_size, noise_trace, dim, preconditioned_rows)
    widening = max(widening, 1.0) if np.isfinite(widening) else 1.0  # tr C >= 0 up to rounding
    quantile = 1 - 1e-4
    return float(np.sqrt(chdtri(dim, 1.0 - quantile) * widening))


def trust_damping(theta, base, conducive, region: TrustRegion):
    """The factor c in [0, 1] applied to the conducive gradient (the FSGLD safeguard).

    Inside the trust region (distance to ``center`` in the metric ``precision``
    at most ``radius``) c = 1: the estimator is exactly FSGLD's, unbiased
    (Lemma 1). Outside it, c = 1 as long as the conducive gradient pulls
    towards the centre or the total drift does; when the conducive term
    pushes the chain outward and wins (the repulsion of a surrogate whose
    curvature exceeds the client's true curvature there), c is cut to the
    largest value for which the drift no longer points away from the centre
    (0 if the data term alone already points away). So far from the posterior
    the chain moves at worst like DSGLD, which brings it back; the default
    radius is the 1 - 1e-4 quantile of the chain's stationary distance, so the
    modification acts almost only during the transient.
    """
    delta = theta - region.center
    metric = region.precision * delta if region.precision.ndim == 1 else matvec(region.precision, delta)
    # the three inner products with delta as one reduction (one fused operation on CPU)
    distance2, outward_base, outward_conducive = jnp.sum(
        jnp.stack([metric, base, conducive]) * delta, axis=1)
    outside = distance2 > region.radius**2
    pushes_out = (outward_conducive > 0) & (outward_base + outward_conducive > 0)
    partial = jnp.clip(-outward_base / jnp.where(outward_conducive > 0, outward_conducive, 1.0), 0.0, 1.0)
    return jnp.where(outside & pushes_out, partial, 1.0)


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
    control_variates: Optional[ControlVariates] = None,
    private=None,
    preconditioner=None,
    total_rows=None,
):
    """The FSGLD update (5) with the exploration constant alpha of equation (7).

    ``alpha(t)`` is the (possibly ramped) constant; with a ``trust_region`` the
    conducive gradient is further scaled by :func:`trust_damping`. The clients' g_s are
    precomputed as affine maps (``estimators.conducive_terms``): one matrix-vector product
    per step, whatever the number of clients. ``control_variates``: equation (4)'s part
    with control variates (``estimators.dsgld_gradient_with_control_variates``).
    ``private``: a :class:`fedmcmc.clipping.PrivateSteps` (:mod:`fedmcmc.privacy`).
    ``preconditioner``, ``total_rows``: pSGLD's (``dsgld.build_federated_kernel``; V averages
    the whole estimate, conducive gradient included); ``total_rows`` defaults to the rows of
    ``data``.
    """
    if private is not None:
        flat_model = private.model(flat_model)
    if preconditioner is not None and total_rows is None:
        total_rows = np.asarray(data.sizes).sum(dtype=np.int32)
    terms = conducive_terms(surrogates, global_surrogate, client_weights)
    if trust_region is not None and isinstance(trust_region.radius, (float, int, np.number)):
        # the radius as a device array, not a Python float: it comes from the data, and as an
        # array it is an argument of the run program (cache.jit_with_constants_as_arguments),
        # so a run on other data of the same shapes is the same program (a hand-off visit
        # already receives it as a traced parameter)
        trust_region = trust_region._replace(
            radius=device_array(trust_region.radius, flat_model.dtype))

    def estimator(theta, minibatch, client, iteration):
        f_s = client_weights[client]
        if control_variates is None:
            base = dsgld_gradient(flat_model, theta, minibatch, f_s)
        else:
            base = dsgld_gradient_with_control_variates(
                flat_model, theta, minibatch, f_s, client, control_variates)
        conducive = alpha(iteration).astype(theta.dtype) * conducive_gradient_from_terms(
            theta, client, terms)
        if trust_region is not None:
            conducive = trust_damping(theta, base, conducive, trust_region).astype(theta.dtype) * conducive
        return base + conducive

    return build_federated_kernel(
        estimator, data, client_weights, batch_size, local_steps, schedule, noise,
        flat_model.dim, flat_model.dtype, private, preconditioner, total_rows,
    )


def check_alpha_warmup(alpha_warmup: int, burn_in: int, thin: int) -> None:
    """FSGLD's alpha ramp must end within burn-in (ValueError naming ``alpha_warmup``)."""
    if alpha_warmup > burn_in * thin:
        raise ValueError(
            f"alpha_warmup={alpha_warmup} iterations is longer than burn-in "
            f"({burn_in} draws x thin {thin} = {burn_in * thin} iterations): kept draws "
            "would not target the posterior"
        )
