"""The PDMP kernels' random numbers: see :mod:`fedmcmc.rng` (bit for bit ``jax.random``'s,
threefry hash unrolled). Kept as the PDMP family's import path."""

from ..rng import exponential64, split_key, uniform64

__all__ = ["split_key", "uniform64", "exponential64"]
