"""Event-time simulation: closed-form inversion of affine rates (Appendix A, F.1).

Every rate bound used by the PDMP kernels is affine in time on its validity
window, ``lambda_bar(t) = (a + b t)_+``. Its integrated rate can be inverted in
closed form (equation (8) with ``H(y) = inf{t : int_0^t lambda_bar >= y}``), so
``H(-log U)`` is the first arrival time of the bounding Poisson process
(Appendix A); thinning (Algorithm 3) then accepts it with probability
``lambda / lambda_bar``.
"""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["affine_first_time", "affine_integrated_rate"]


def affine_first_time(a, b, e):
    """First ``t >= 0`` with ``int_0^t (a + b s)_+ ds = e`` (``inf`` if the mass never reaches ``e``).

    Appendix F.1: for the affine Zig-Zag/BPS rate ``max(0, a + b t)`` this is the
    exact inverse ``H(e; x, v)`` of equation (8). For ``a > 0`` the root of
    ``a t + b t^2 / 2 = e`` is written in the stable form ``2e / (a + sqrt(a^2 + 2 b e))``
    (papers README): the textbook ``sqrt((a/b)^2 + 2e/b) - a/b`` cancels
    catastrophically when ``b`` is small. It also covers ``b < 0`` (a decaying
    rate), where the total mass ``a^2 / (2|b|)`` may be below ``e`` (no event).
    For ``a <= 0 < b`` the rate is zero until ``-a/b`` and ``b (t + a/b)`` after.
    Broadcasts over arrays.
    """
    a = jnp.asarray(a)
    b = jnp.asarray(b)
    e = jnp.asarray(e)
    disc = a * a + 2.0 * b * e
    t_pos = 2.0 * e / (a + jnp.sqrt(jnp.maximum(disc, 0.0)))
    t_pos = jnp.where(disc >= 0.0, t_pos, jnp.inf)
    safe_b = jnp.where(b > 0.0, b, 1.0)
    t_neg = -a / safe_b + jnp.sqrt(2.0 * e / safe_b)
    return jnp.where(a > 0.0, t_pos, jnp.where(b > 0.0, t_neg, jnp.inf))


def affine_integrated_rate(a, b, t):
    """``int_0^t (a + b s)_+ ds`` (the function that :func:`affine_first_time` inverts)."""
    a = jnp.asarray(a)
    b = jnp.asarray(b)
    t = jnp.asarray(t)
    # Piecewise: the positive part changes sign at most once, at s0 = -a / b.
    raw = a * t + 0.5 * b * t * t
    safe_b = jnp.where(b != 0.0, b, 1.0)
    s0 = jnp.clip(-a / safe_b, 0.0, t)
    left = a * s0 + 0.5 * b * s0 * s0  # integral of (a + b s) over [0, s0]
    right = raw - left
    increasing = b > 0.0
    value = jnp.where(
        b == 0.0,
        jnp.maximum(a, 0.0) * t,
        jnp.where(increasing, jnp.where(a >= 0.0, raw, right), jnp.where(a <= 0.0, 0.0, left)),
    )
    return value
