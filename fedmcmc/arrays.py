"""Host values onto the device without compiling anything.

With JAX 0.10, ``jnp.asarray`` of a NumPy array (or a dtype conversion of it) is staged as a
small XLA program, one per shape and dtype; in a new process each is traced, lowered and
compiled or read from the compilation cache, some 10-20 ms apiece. A sampler's set-up moves a
few dozen host arrays, so in a warm start these small programs cost about as much as reading
the sampler's own compiled loop. :func:`device_array` converts in NumPy and copies with
``jax.device_put``, which runs no program.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import numpy as np

__all__ = ["device_array"]


def device_array(value: Any, dtype: Optional[Any] = None) -> jax.Array:
    """``value`` as a device array (of ``dtype`` if given), converted on the host.

    As ``jnp.asarray``: float64 becomes float32 unless 64-bit mode is on (``jax.enable_x64``),
    since ``jax.device_put`` canonicalises the dtype the same way."""
    return jax.device_put(np.asarray(value, dtype=dtype))
