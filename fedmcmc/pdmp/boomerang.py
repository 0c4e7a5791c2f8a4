"""Boomerang sampler (Examples 2.2, 2.5): elliptical dynamics around a Gaussian reference N(mu, Sigma).

The dynamics preserve ``N(mu, Sigma)(dx) x N(0, Sigma)(dv)``; events correct for
the remaining potential ``U(x) - (1/2)(x - mu)^T Sigma^{-1} (x - mu)`` at rate
``<v, grad U(x)>_+`` with the Sigma-reflection ``R(x)`` of Example 2.5;
refreshment redraws ``v ~ N(0, Sigma)``.

Rate bound (Appendix A adapted to the ellipse). In whitened coordinates
``z = L^{-1}(x - mu)``, ``w = L^{-1} v`` the radius ``R^2 = |z|^2 + |w|^2`` is
constant, ``|w(t)| <= R`` and ``|z(t) - z(0)| <= R t``. With
``||L^T H L||_2 <= L_w`` this gives
``lambda(t) <= R |L^T grad U(x)| + L_w R^2 t`` -- affine, valid for all t
(:meth:`BoomerangSpec.anchor` uses two tighter ones).

With control variates centred at x* (Remark 4.3; Bierkens, Grazzi, Kamatani & Roberts 2020,
Section 3's bound for the Boomerang with control variates) a worker's shifted gradient
``G`` is nearly zero at x*, and the rate is bounded by a constant along the whole orbit:
``<v(t), G(x(t))> <= |w(t)| |L^T G(x*)| + |w(t)| L_w |z(t) - z*|`` and, as
``|z(t)|^2 + |w(t)|^2 = R^2``, ``|w| |z| <= R^2 / 2``, so
``lambda(t) <= R |L^T G(x*)| + L_w (R^2 / 2 + R |z*|)`` (``z* = L^{-1}(x* - mu)``, 0 when
x* is the Laplace reference's mean). It does not grow with t as the affine bound does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .bps import reflect
from .dynamics import elliptic_flow, elliptic_integrals
from .events import affine_first_time
from .single import build_single_kernel

__all__ = ["BoomerangSpec", "build_kernel"]


class BoomerangSpec:
    name = "boomerang"
    linear = False

    @staticmethod
    def channels(d: int) -> int:
        return 1

    @staticmethod
    def init_velocity(key, d, ref):
        return ref.chol @ jax.random.normal(key, (d,))

    @staticmethod
    def flow(x, v, t, ref):
        return elliptic_flow(x, v, t, ref.mean)

    @staticmethod
    def integrals(x, v, t, ref):
        return elliptic_integrals(x, v, t, ref.mean)

    @staticmethod
    def rate(x, v, g, coords, ref):
        return jnp.maximum(jnp.dot(v, g), 0.0)[None]

    @staticmethod
    def anchor(x, v, g, hv, q, l, lw, coords, ref, exact, centre=None):
        """Affine bound ``(a + b t)_+`` of ``<v(t), grad U(x(t))>_+`` along the orbit from (x, v).

        Split the rate as ``<v(t), g> + <v(t), grad U(x(t)) - g>`` (g: the gradient at the
        anchor). The first term is ``p cos t - r sin t`` with ``p = <v, g>``,
        ``r = <x - mu, g>``: at most its amplitude ``A = sqrt(p^2 + r^2)``, and, since it
        starts at p and its slope is at most A, at most ``p + A t``. The second is at most
        ``L_w R^2 t`` (module docstring). Two affine bounds valid for all t >= 0:
        ``A + L_w R^2 t`` (A <= R |L^T g|, the bound of the module docstring: never looser)
        and ``p + (A + L_w R^2) t`` (far tighter for short times when p < A, e.g. just after
        a reflection). The second is taken when its integral is the smaller one up to the
        time ``h`` at which the first bound's integrated rate reaches 1 (its typical first
        proposal): ``h < 2 (A - p) / A``. The choice depends on the anchor only, so thinning
        stays exact (issue 48).

        ``centre = (offset, zeta, scale)`` (control variates; ``offset = |L^T G(x*)|``,
        ``zeta = |z*|``, ``scale`` the worker's bound enlargement, which the caller applies to
        the slope): the orbit's constant bound ``K = R offset + scale L_w (R^2 / 2 + R zeta)``
        of the module docstring is a third candidate, ``(K, 0)``, taken when its integral up to
        ``h`` (the time at which the affine bound's integral reaches 1) is at most 1: a
        far smaller bound for the many small workers whose ``L_w R^2`` is well below 1 and
        whose affine bound would grow for several time units before its first proposal.
        """
        y = x - ref.mean
        z = jax.scipy.linalg.solve_triangular(ref.chol, y, lower=True)
        w = jax.scipy.linalg.solve_triangular(ref.chol, v, lower=True)
        radius2 = jnp.dot(z, z) + jnp.dot(w, w)
        p, r = jnp.dot(v, g), jnp.dot(y, g)
        amplitude = jnp.sqrt(p * p + r * r)
        slope = lw * radius2
        h = affine_first_time(amplitude, slope, 1.0)
        starting = h * amplitude < 2.0 * (amplitude - p)
        a = jnp.where(starting, p, amplitude)
        b = jnp.where(starting, amplitude + slope, slope)
        if centre is not None:
            offset, zeta, scale = centre
            radius = jnp.sqrt(radius2)
            constant = radius * offset + scale * lw * (0.5 * radius2 + radius * zeta)
            flat = constant * affine_first_time(a, scale * b, 1.0) <= 1.0
            a = jnp.where(flat, constant, a)
            b = jnp.where(flat, 0.0, b)
        return a[None], b[None]

    @staticmethod
    def jump(key, x, v, g, channel, ref):
        return reflect(v, g, ref.cov)

    @staticmethod
    def excess(key, v, coords, ref):
        return ref.chol @ jax.random.normal(key, v.shape)

    @staticmethod
    def refresh(key, v, ref):
        return ref.chol @ jax.random.normal(key, v.shape)

    @staticmethod
    def refresh_total_rate(rate, d):
        return rate


def build_kernel(logdensity_fn, reference, *, hessian_bound=None, refresh_rate=0.1):
    """Single-machine Boomerang kernel with reference ``(mean, cov)``; see
    :func:`fedmcmc.pdmp.single.build_single_kernel`."""
    return build_single_kernel(BoomerangSpec, logdensity_fn, hessian_bound=hessian_bound,
                               exact=False, refresh_rate=refresh_rate, reference=reference)
