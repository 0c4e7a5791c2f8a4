"""Bouncy Particle Sampler (Examples 2.2 and 2.5): Gaussian velocities, reflections, refreshment.

``lambda(x, v) = <v, grad U(x)>_+``; at an event ``v <- v - 2 <v, g> g / |g|^2``
(``R(x) v`` of Example 2.5 with Sigma = I); refreshment at rate ``refresh_rate``
redraws ``v ~ N(0, I)`` (needed for ergodicity). Federated: worker m reflects on
its own gradient grad U_m.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .dynamics import linear_flow, linear_integrals
from .single import build_single_kernel

__all__ = ["BPSSpec", "build_kernel", "reflect"]


def reflect(v, g, metric=None):
    """``R(x) v = v - 2 <v, g> / |Sigma^{1/2} g|^2 Sigma g`` (Example 2.5); identity when g = 0."""
    sg = g if metric is None else metric @ g
    norm2 = jnp.dot(g, sg)
    safe = jnp.where(norm2 > 0, norm2, 1.0)
    return jnp.where(norm2 > 0, v - 2.0 * jnp.dot(v, g) / safe * sg, v)


class BPSSpec:
    name = "bps"
    linear = True

    @staticmethod
    def channels(d: int) -> int:
        return 1

    @staticmethod
    def init_velocity(key, d, ref):
        return jax.random.normal(key, (d,))

    @staticmethod
    def flow(x, v, t, ref):
        return linear_flow(x, v, t)

    @staticmethod
    def integrals(x, v, t, ref):
        return linear_integrals(x, v, t)

    @staticmethod
    def rate(x, v, g, coords, ref):
        return jnp.maximum(jnp.dot(v, g), 0.0)[None]

    @staticmethod
    def anchor(x, v, g, hv, q, l, lw, coords, ref, exact):
        """``a = <v, grad U(x)>``; ``b = v^T H v`` (quadratic U) or
        ``min(|v|^T Q |v|, L |v|^2)`` (Appendix A, Hessian bound)."""
        a = jnp.dot(v, g)
        if exact:
            b = jnp.dot(v, hv)
        else:
            absv = jnp.abs(v)
            b = jnp.minimum(absv @ q @ absv, l * jnp.dot(v, v))
        return a[None], b[None]

    @staticmethod
    def jump(key, x, v, g, channel, ref):
        return reflect(v, g)

    @staticmethod
    def excess(key, v, coords, ref):
        return jax.random.normal(key, v.shape)

    @staticmethod
    def refresh(key, v, ref):
        return jax.random.normal(key, v.shape)

    @staticmethod
    def refresh_total_rate(rate, d):
        return rate


def build_kernel(logdensity_fn, *, hessian_bound=None, exact=False, refresh_rate=1.0):
    """Single-machine BPS kernel (``init``, ``step`` to the next skeleton point); see
    :func:`fedmcmc.pdmp.single.build_single_kernel`."""
    return build_single_kernel(BPSSpec, logdensity_fn, hessian_bound=hessian_bound,
                               exact=exact, refresh_rate=refresh_rate)
