"""The PDMP kernels' random numbers, bit for bit ``jax.random``'s, with the threefry hash unrolled.

On CPU ``jax.random`` lowers every call as a rolled while loop (see
:mod:`fedmcmc.decentralised.kernels`); the thinning loop of :mod:`.federated` makes
three calls per proposal (key split, exponential, uniform), which were a large part of
a proposal's cost. These helpers compute the same numbers with the unrolled hash for
threefry keys (``jax.random`` otherwise), so trajectories and the Ray engine's
equivalence with the in-process engine are unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..decentralised.kernels import _hash_iota, _unrolled, split_key

__all__ = ["split_key", "uniform64", "exponential64"]


def _unit_floats64(key, shape):
    """``jax.random.uniform(key, shape, float64)`` before clipping: 52 mantissa bits of the
    64-bit word ``(hash word 1 << 32) | hash word 2``."""
    b1, b2 = _hash_iota(key, shape)
    bits = (b1.astype(jnp.uint64) << np.uint64(32)) | b2.astype(jnp.uint64)
    one = np.array(1.0, np.float64)
    float_bits = (bits >> np.uint64(64 - 52)) | one.view(np.uint64)
    return jax.lax.bitcast_convert_type(float_bits, jnp.float64) - one


def uniform64(key, shape=()):
    """``jax.random.uniform(key, shape, dtype=float64)``, bit for bit."""
    if not _unrolled(key):
        return jax.random.uniform(key, shape, dtype=jnp.float64)
    return jax.lax.max(np.float64(0.0), _unit_floats64(key, tuple(shape)))


def exponential64(key, shape=()):
    """``jax.random.exponential(key, shape, dtype=float64)``, bit for bit: ``-log1p(-u)``."""
    if not _unrolled(key):
        return jax.random.exponential(key, shape, dtype=jnp.float64)
    return -jnp.log1p(-uniform64(key, shape))
