"""Deterministic dynamics (equation (1)) and exact integrals along a segment (Section 2.4).

* Linear (Zig-Zag, BPS; psi = 0): ``x(t) = x + v t``, ``v(t) = v``.
* Elliptical (Boomerang; psi(x) = -(x - mu), reference N(mu, Sigma)):
  ``x(t) - mu = (x - mu) cos t + v sin t``, ``v(t) = -(x - mu) sin t + v cos t``.

Trajectory averages ``(1/T) int_0^T h(X(s)) ds`` (Section 2.4) are exact for
``h(x) = x`` and ``h(x) = x x^T``: the integrals below are closed forms of the
piecewise linear or elliptical path between skeleton points, not quadratures.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

__all__ = ["Reference", "linear_flow", "elliptic_flow", "linear_integrals", "elliptic_integrals"]


class Reference(NamedTuple):
    """Gaussian reference measure N(mean, cov) of the Boomerang sampler (Example 2.2)."""

    mean: jnp.ndarray  # (d,)
    cov: jnp.ndarray  # (d, d) Sigma
    chol: jnp.ndarray  # (d, d) lower L with L L^T = Sigma
    precision: jnp.ndarray  # (d, d) Sigma^{-1}


def linear_flow(x, v, t):
    return x + v * t, v


def elliptic_flow(x, v, t, mean):
    y = x - mean
    c, s = jnp.cos(t), jnp.sin(t)
    return mean + y * c + v * s, -y * s + v * c


def linear_integrals(x, v, t):
    """``(int_0^t x(s) ds, int_0^t x(s) x(s)^T ds)`` for ``x(s) = x + v s``."""
    first = x * t + v * (0.5 * t * t)
    xv = jnp.outer(x, v)
    second = jnp.outer(x, x) * t + (xv + xv.T) * (0.5 * t * t) + jnp.outer(v, v) * (t**3 / 3.0)
    return first, second


def elliptic_integrals(x, v, t, mean):
    """The same integrals for ``x(s) = mu + y cos s + v sin s`` (y = x - mu)."""
    y = x - mean
    s1, c1 = jnp.sin(t), jnp.cos(t)
    s2 = jnp.sin(2.0 * t)
    int_cos = s1
    int_sin = 1.0 - c1
    int_cos2 = 0.5 * t + 0.25 * s2
    int_sin2 = 0.5 * t - 0.25 * s2
    int_sincos = 0.5 * s1 * s1
    path = y * int_cos + v * int_sin  # int of (x(s) - mu)
    yv = jnp.outer(y, v)
    centred = jnp.outer(y, y) * int_cos2 + jnp.outer(v, v) * int_sin2 + (yv + yv.T) * int_sincos
    first = mean * t + path
    second = centred + jnp.outer(mean, path) + jnp.outer(path, mean) + jnp.outer(mean, mean) * t
    return first, second
