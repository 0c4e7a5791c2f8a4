"""Single-machine PDMP kernels (Algorithm 1) in the BlackJAX style.

``kernel = zigzag.build_kernel(logdensity_fn, hessian_bound=...)``;
``state = kernel.init(position, key)``; ``state = kernel.step(key, state)``
moves to the next skeleton point: ``state.t, state.x, state.v`` are
(T_k, X_k, V_k). They are the federated kernels of :mod:`.federated` with one
worker holding the whole potential. Run them under ``jax.enable_x64(True)``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..arrays import device_array
from . import federated
from .bounds import as_bound_pair, whitened_bound
from .dynamics import Reference

__all__ = ["SingleKernel", "build_single_kernel", "make_reference"]


class SingleKernel(NamedTuple):
    init: Callable
    step: Callable


def make_reference(mean, cov) -> Reference:
    """The Boomerang's Gaussian reference N(mean, cov) with its Cholesky factor and precision,
    factorised on the host in float64 (set-up runs no eager device program)."""
    mean = np.asarray(mean, np.float64)
    cov = np.asarray(cov, np.float64)
    return Reference(mean=device_array(mean), cov=device_array(cov),
                     chol=device_array(np.linalg.cholesky(cov)),
                     precision=device_array(np.linalg.inv(cov)))


def build_single_kernel(spec, logdensity_fn, *, hessian_bound=None, exact=False, refresh_rate=0.0,
                        reference=None, excess_rate=0.0):
    """Kernel for the target ``exp(logdensity_fn(x))``.

    hessian_bound:
        scalar (spectral) or ``(d, d)`` elementwise bound on the Hessian of
        ``U = -logdensity_fn`` (Appendix A). Not needed when ``exact=True``
        (quadratic U: exact affine rates, Zig-Zag and BPS).
    refresh_rate:
        Zig-Zag: excess switching rate per coordinate; BPS/Boomerang: refreshment rate.
    reference:
        Boomerang only: ``(mean, cov)`` of the Gaussian reference measure.
    """
    if not exact and hessian_bound is None:
        raise ValueError("hessian_bound is required unless exact=True (quadratic potential)")
    if spec.name == "boomerang":
        if reference is None:
            raise ValueError("reference=(mean, cov) is required for the Boomerang sampler")
        if exact:
            raise ValueError("exact=True is for Zig-Zag and BPS (linear dynamics)")
        if not isinstance(reference, Reference):
            reference = make_reference(*reference)

    def make(d):
        if exact:
            q, l = np.zeros((d, d)), 0.0
        else:
            q, l = as_bound_pair(hessian_bound, d)
        lw = 0.0
        if reference is not None:
            lw = whitened_bound(q, l, reference.chol) + 1.0

        def grad_u(x, data, mask):
            g = -jax.grad(logdensity_fn)(x)
            if reference is not None:
                g = g - reference.precision @ (x - reference.mean)
            return g

        workers = federated.Workers(
            data=jnp.zeros((1, 1)), mask=jnp.ones((1, 1)), coords=jnp.ones((1, d)),
            q=jnp.asarray(q)[None], l=jnp.asarray([l]), lw=jnp.asarray([lw]),
            rho=jnp.asarray([excess_rate], jnp.float64), cv_weight=jnp.ones((1,)),
            g_ref=jnp.zeros((1, d)))
        z = jnp.zeros((d,))
        prior = federated.PriorPart(q=jnp.zeros((d, d)), l=jnp.zeros(()), lw=jnp.zeros(()),
                                    g_ref=z, g_total_ref=z)
        cfg = federated.FedConfig(
            spec=spec, dim=d, num_workers=1, prior_worker=False, exact=exact,
            data_grad=grad_u, prior_grad=lambda x: jnp.zeros_like(x),
            refresh_rate=float(refresh_rate), reference=reference, rate_diagnostics=False,
            has_excess=excess_rate > 0)
        return federated.build(cfg, workers, prior)

    def init(position, key):
        position = jnp.asarray(position, jnp.float64)
        return make(position.shape[0])[0](key, position)

    def step(key, state):
        _, event_step, _ = make(state.x.shape[0])
        return event_step(key, state, jnp.inf, jnp.array(False))

    return SingleKernel(init=init, step=step)
