"""Random numbers bit for bit ``jax.random``'s, with the threefry hash unrolled.

On CPU ``jax.random`` lowers the threefry-2x32 hash as a rolled 5-iteration while loop,
one loop per call (with loop-carried rotation amounts and the hash computed once per
output word). In a small model's step that loop was most of the time (DULA/GT-DULA
iterations, PDMP thinning proposals, Langevin updates), and XLA took seconds to compile
the vmapped calls (a Langevin run's random numbers: 3.7 s against 1.3 s unrolled,
``benchmarks/bench_overheads.py``). The
helpers here compute the same numbers with the 20 rounds unrolled, which XLA fuses into
the consumer. The unrolled hash is one primitive (:data:`threefry2x32_unrolled_p`), so a
trace holds one equation per hash and the rounds are built only when the program is
lowered. Only for threefry keys with ``jax_threefry_partitionable`` (JAX's default);
other key implementations go through ``jax.random``. Every family draws through this
module, so its random streams, and the Ray engines' equivalence with the in-process
engine, are those of ``jax.random``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as _jax_core
from jax.interpreters import batching as _batching
from jax.interpreters import mlir as _mlir

__all__ = ["seed_key", "split_key", "fold_in", "fold_in_compiled", "uniform", "normal",
           "uniform64", "exponential64", "is_unrolled"]

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry2x32_rounds(k1, k2, x1, x2):
    """The threefry-2x32 hash (20 rounds) of ``jax.random``'s ``threefry2x32_p``, unrolled:
    the lowering of :data:`threefry2x32_unrolled_p`.

    ``k1, k2``: the key words (broadcastable against the counters ``x1, x2``, uint32).
    Written with ``jax.lax`` operations on operands broadcast once.
    """
    shape = jax.lax.broadcast_shapes(np.shape(k1), np.shape(k2), np.shape(x1), np.shape(x2))

    def full(word):
        word = jnp.asarray(word, jnp.uint32)
        if word.shape == shape:
            return word
        return jax.lax.broadcast_in_dim(word, shape, tuple(range(len(shape) - word.ndim,
                                                                 len(shape))))

    k1, k2, x1, x2 = full(k1), full(k2), full(x1), full(x2)
    add, xor = jax.lax.add, jax.lax.bitwise_xor
    ks = (k1, k2, xor(xor(k1, k2), np.uint32(0x1BD11BDA)))
    x1 = add(x1, ks[0])
    x2 = add(x2, ks[1])
    for block in range(5):
        for r in _ROTATIONS[block % 2]:
            x1 = add(x1, x2)
            rotated = jax.lax.bitwise_or(jax.lax.shift_left(x2, np.uint32(r)),
                                         jax.lax.shift_right_logical(x2, np.uint32(32 - r)))
            x2 = xor(rotated, x1)
        x1 = add(x1, ks[(block + 1) % 3])
        x2 = add(add(x2, ks[(block + 2) % 3]), np.uint32(block + 1))
    return x1, x2


def _threefry2x32_abstract(k1, k2, x1, x2):
    """Two uint32 words of the operands' broadcast shape."""
    words = (k1, k2, x1, x2)
    if any(word.dtype != np.uint32 for word in words):
        raise TypeError(f"threefry2x32_unrolled takes uint32 words, got "
                        f"{[str(word.dtype) for word in words]}")
    shape = jax.lax.broadcast_shapes(*(word.shape for word in words))
    return (jax.core.ShapedArray(shape, np.dtype(np.uint32)),) * 2


#: The unrolled threefry-2x32 hash as one primitive: a sampler's trace holds one equation per
#: hash instead of its ~130 operations, traced and batched under every ``vmap`` (a Fed Zig-Zag
#: run program's hashes were 43 % of its equations). Its lowering is built once per operand
#: shapes in a program (JAX caches primitive lowerings) and inlined at each use, so XLA sees the
#: same operations as before and fuses them into their consumers. Batched by broadcasting, like
#: ``jax.random``'s own hash.
threefry2x32_unrolled_p = _jax_core.Primitive("fedmcmc_threefry2x32_unrolled")
threefry2x32_unrolled_p.multiple_results = True
threefry2x32_unrolled_p.def_abstract_eval(_threefry2x32_abstract)
# outside a trace: the same operations, compiled
threefry2x32_unrolled_p.def_impl(jax.jit(_threefry2x32_rounds))
_batching.defbroadcasting(threefry2x32_unrolled_p)
_mlir.register_lowering(threefry2x32_unrolled_p,
                        _mlir.lower_fun(_threefry2x32_rounds, multiple_results=True))


def _threefry2x32(k1, k2, x1, x2):
    """The hash of the counter words ``x1, x2`` under the key words ``k1, k2`` (broadcast
    against each other; any of them uint32 or convertible), bit for bit ``jax.random``'s."""
    words = [jnp.asarray(word, jnp.uint32) for word in (k1, k2, x1, x2)]
    b1, b2 = threefry2x32_unrolled_p.bind(*words)
    return b1, b2


def seed_key(seed: int):
    """``jax.random.key(seed)``, as one compiled program for seeds in [0, 2**31): an eager
    ``jax.random.key`` compiles two small programs in every new process."""
    seed = int(seed)
    if 0 <= seed < 2**31:
        return _seed_key_program(np.int32(seed))
    return jax.random.key(seed)


@jax.jit
def _seed_key_program(seed):
    return jax.random.key(seed)


def is_unrolled(key) -> bool:
    """Whether the unrolled hash reproduces ``jax.random`` for ``key`` (a typed key)."""
    return (
        jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
        and str(jax.random.key_impl(key)) == "threefry2x32"
        and bool(jax.config.jax_threefry_partitionable)
    )


@functools.partial(jax.jit, static_argnums=1)
def _hash_iota(key, shape):
    """``threefry2x32(key, iota_2x32_shape(shape))``: the two output words, each of ``shape``.

    The counters are the flat index as (high, low) uint32 words, as ``jax.random``
    with ``jax_threefry_partitionable`` builds them; ``key`` may carry leading axes
    (e.g. one key per agent), which broadcast against ``shape``'s last axes.
    """
    size = int(np.prod(shape, dtype=np.int64))
    if size >= 2**32:  # pragma: no cover - far beyond any agent count
        raise ValueError("more than 2**32 random numbers in one draw")
    data = jax.random.key_data(key)
    k1, k2 = data[..., 0], data[..., 1]
    k1 = k1.reshape(k1.shape + (1,) * len(shape))
    k2 = k2.reshape(k2.shape + (1,) * len(shape))
    low = jax.lax.iota(jnp.uint32, size).reshape(shape)
    return _threefry2x32(k1, k2, jnp.zeros_like(low), low)


def split_key(key, num: int = 2):
    """``jax.random.split(key, num)``, bit for bit (unrolled hash for threefry keys)."""
    if not is_unrolled(key):
        return jax.random.split(key, num)
    b1, b2 = _hash_iota(key, (num,))
    # the barrier keeps XLA from fusing this small hash into every element of the
    # draws made with the new keys (it would recompute it per element)
    data = jax.lax.optimization_barrier(jnp.stack([b1, b2], axis=-1))
    return jax.random.wrap_key_data(data, impl="threefry2x32")


def _unit_floats(bits, dtype):
    """uint32 bits -> floats in [0, 1) as ``jax.random.uniform`` makes them (23 mantissa bits)."""
    one = np.array(1.0, dtype)
    float_bits = (bits >> np.uint32(32 - 23)) | one.view(np.uint32)
    return jax.lax.bitcast_convert_type(float_bits, dtype) - one


def uniform(key, shape):
    """``jax.random.uniform(key, shape)`` (default dtype), bit for bit.

    ``key`` may have leading axes: then one draw of ``shape`` per key (as ``vmap``
    over the keys would give), shape ``key.shape + shape``.
    """
    dtype = jax.dtypes.canonicalize_dtype(float)
    if not is_unrolled(key) or dtype != jnp.float32:
        draw = lambda k: jax.random.uniform(k, shape)  # noqa: E731
        for _ in range(key.ndim):
            draw = jax.vmap(draw)
        return draw(key)
    b1, b2 = _hash_iota(key, shape)
    floats = _unit_floats(b1 ^ b2, dtype)
    zero, one = np.array(0.0, dtype), np.array(1.0, dtype)
    return jax.lax.max(zero, floats * (one - zero) + zero)


def normal(key, shape, dtype):
    """``jax.random.normal(key, shape, dtype)``, bit for bit: sqrt(2) erfinv(u),
    u uniform on (-1, 1) (unrolled hash for threefry keys and float32)."""
    if not is_unrolled(key) or jnp.dtype(dtype) != jnp.float32:
        return jax.random.normal(key, shape, dtype)
    dtype = np.dtype(np.float32)
    b1, b2 = _hash_iota(key, tuple(shape))
    floats = _unit_floats(b1 ^ b2, dtype)
    lo = np.nextafter(np.array(-1.0, dtype), np.array(0.0, dtype), dtype=dtype)
    hi = np.array(1.0, dtype)
    u = jax.lax.max(lo, floats * (hi - lo) + lo)
    return np.array(np.sqrt(2), dtype) * jax.lax.erf_inv(u)


def _unit_floats64(key, shape):
    """``jax.random.uniform(key, shape, float64)`` before clipping: 52 mantissa bits of the
    64-bit word ``(hash word 1 << 32) | hash word 2``."""
    b1, b2 = _hash_iota(key, shape)
    bits = (b1.astype(jnp.uint64) << np.uint64(32)) | b2.astype(jnp.uint64)
    one = np.array(1.0, np.float64)
    float_bits = (bits >> np.uint64(64 - 52)) | one.view(np.uint64)
    return jax.lax.bitcast_convert_type(float_bits, jnp.float64) - one


def _float64_or_narrower():
    """float64, or the float JAX gives for it with 64-bit mode off (float32): then the
    64-bit draws below are ``jax.random``'s own at that width (no 64-bit hash words)."""
    return jax.dtypes.canonicalize_dtype(jnp.float64)


def uniform64(key, shape=()):
    """``jax.random.uniform(key, shape, dtype=float64)``, bit for bit (float32 with 64-bit
    mode off, as ``jax.random`` gives it)."""
    dtype = _float64_or_narrower()
    if not is_unrolled(key) or dtype != jnp.float64:
        return jax.random.uniform(key, shape, dtype=dtype)
    return jax.lax.max(np.float64(0.0), _unit_floats64(key, tuple(shape)))


def exponential64(key, shape=()):
    """``jax.random.exponential(key, shape, dtype=float64)``, bit for bit: ``-log1p(-u)``
    (float32 with 64-bit mode off, as ``jax.random`` gives it)."""
    dtype = _float64_or_narrower()
    if not is_unrolled(key) or dtype != jnp.float64:
        return jax.random.exponential(key, shape, dtype=dtype)
    return -jnp.log1p(-uniform64(key, shape))


def fold_in(key, data):
    """``jax.random.fold_in(key, data)`` for a non-negative 32-bit integer ``data``, bit for
    bit: the hash of the counter words (0, data) under ``key``."""
    if not is_unrolled(key):
        return jax.random.fold_in(key, data)
    words = jax.random.key_data(key)
    low = jnp.asarray(data).astype(jnp.uint32)
    b1, b2 = _threefry2x32(words[..., 0], words[..., 1], jnp.zeros_like(low), low)
    return jax.random.wrap_key_data(jnp.stack([b1, b2], axis=-1), impl="threefry2x32")


@jax.jit
def fold_in_compiled(key, data):
    """``jax.random.fold_in(key, data)`` as one compiled program shared by every call site: for
    set-up code outside any trace, where an eager ``fold_in`` compiles (or loads) small
    programs of its own in a new process (its conversion of ``data`` included)."""
    return jax.random.fold_in(key, data)


def numpy_generator(seed) -> np.random.Generator:
    """A NumPy ``Generator`` from a seed (an int or ``None``) or the generator itself: how the
    data-side code (partitions, synthetic data, data-set splits) draws its random numbers."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None or (isinstance(seed, (int, np.integer)) and not isinstance(seed, bool)):
        return np.random.default_rng(seed)
    raise ValueError(f"seed must be an int, None or a numpy Generator, got {type(seed).__name__}")
