"""Zig-Zag sampler (Examples 2.1 and 2.4): velocities in {-1, +1}^d, one rate per coordinate.

``lambda_i(x, v) = (v_i d_i U(x))_+ + gamma_i`` and the jump ``F_i`` flips
coordinate i. In the federated sampler (Algorithm 2) worker m runs these d
channels on its own potential U_m; the excess rate gamma (``refresh_rate``,
per coordinate) is simulated by the server, the privacy rate rho (Section 5)
by each worker (a uniformly chosen flip among the worker's coordinates).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..rng import uniform64
from .dynamics import linear_flow, linear_integrals
from .single import build_single_kernel

__all__ = ["ZigZagSpec", "build_kernel"]


class ZigZagSpec:
    name = "zigzag"
    linear = True

    @staticmethod
    def channels(d: int) -> int:
        return d

    @staticmethod
    def init_velocity(key, d, ref):
        # jax.random.bernoulli(key, 0.5, (d,)) bit for bit (float64 uniforms under x64)
        return jnp.where(uniform64(key, (d,)) < 0.5, 1.0, -1.0)

    @staticmethod
    def flow(x, v, t, ref):
        return linear_flow(x, v, t)

    @staticmethod
    def integrals(x, v, t, ref):
        return linear_integrals(x, v, t)

    @staticmethod
    def rate(x, v, g, coords, ref):
        """Example 2.4: ``(v_i d_i U_m(x))_+`` on the worker's coordinates."""
        return jnp.maximum(v * g, 0.0) * coords

    @staticmethod
    def anchor(x, v, g, hv, q, l, lw, coords, ref, exact):
        """Affine bound ``(a_i + b_i t)_+`` of the rate of coordinate i along ``x + v t``.

        ``a_i = v_i d_i U(x)``. Exact (quadratic U, F.1): ``b_i = v_i (H v)_i``.
        Otherwise Appendix A: ``b_i = min(sum_j Q_ij |v_j|, L ||v||_2) |v_i|`` with
        ``|H_ij| <= Q_ij`` and ``||H||_2 <= L`` (a p = infinity and a p = 2 bound).
        """
        a = v * g * coords
        if exact:
            b = v * hv
        else:
            absv = jnp.abs(v)
            b = jnp.minimum(q @ absv, l * jnp.sqrt(jnp.sum(v * v))) * absv
        return a, b * coords

    @staticmethod
    def jump(key, x, v, g, channel, ref):
        return v.at[channel].multiply(-1.0)

    @staticmethod
    def excess(key, v, coords, ref):
        """A constant-rate flip of a uniformly chosen coordinate among ``coords``."""
        logits = jnp.where(coords > 0, 0.0, -jnp.inf)
        i = jax.random.categorical(key, logits)
        return v.at[i].multiply(-1.0)

    @staticmethod
    def refresh(key, v, ref):
        """Server excess switching (gamma_i per coordinate): flip a uniform coordinate."""
        i = jax.random.randint(key, (), 0, v.shape[0])
        return v.at[i].multiply(-1.0)

    @staticmethod
    def refresh_total_rate(rate, d):
        return rate * d


def build_kernel(logdensity_fn, *, hessian_bound=None, exact=False, excess_rate=0.0):
    """Single-machine Zig-Zag as a BlackJAX-style kernel: ``init(position, key) -> state``,
    ``step(key, state) -> state`` moves to the next skeleton point (T_k, X_k, V_k) (Algorithm 1).

    See :func:`fedmcmc.pdmp.single.build_single_kernel` for the arguments.
    """
    return build_single_kernel(ZigZagSpec, logdensity_fn, hessian_bound=hessian_bound,
                               exact=exact, refresh_rate=excess_rate)
