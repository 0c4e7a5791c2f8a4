"""DULA and GT-DULA as functional kernels (Bhar, Bai, George, Busart 2025).

One kernel state holds EVERY agent of one chain: positions ``w`` of shape
``(n, d)`` (agent ``i`` is row ``i``), and for GT-DULA the gradient trackers
``d`` and the last local gradient estimates ``g_hat``. A step updates all
agents at once (``vmap`` over agents for the gradients, one mixing product
for the consensus terms); the engine ``vmap``s it again over chains.

Conventions (see ``papers/README.md``): ``step_size`` alpha is the paper's;
the drift is ``alpha * n * d_i`` (GT-DULA) or ``alpha * n * grad E_i`` (DULA)
and the noise ``sqrt(2 alpha n) v_i``, so that the network average follows a
ULA step of size alpha on the global target. Local energies split the prior
(equation (1)): ``grad E_i(w) = -grad log p(X_i | w) - (1/n) grad log p(w)``.

Equations:

* DULA (3):    w_{k+1} = W_beta w_k - alpha n g_hat(w_k) + sqrt(2 alpha n) v_k
* GT-DULA (7): w_{k+1} = W_beta w_k - alpha n d_k + sqrt(2 alpha n) v_k
* GT-DULA (8): d_{k+1} = W_gamma d_k + g_hat_{k+1} - g_hat_k,  d_0 = g_hat_0  (eq. (6))

with ``W_x = I - x L`` and the local estimate (section 3)
``g_hat_i = -(1/f_i) grad log p(X_hat_i | w_i) - (1/n) grad log p(w_i)``,
``f_i = m_i / M_i``.

Random numbers: the kernels draw exactly what ``jax.random.split``, ``jax.random.normal``
and ``jax.random.uniform`` draw for the same keys (the Ray engine's ``AgentClient``
reproduces them), but for threefry keys they compute the threefry-2x32 hash with the
rounds unrolled (:func:`_threefry2x32`) instead of calling ``jax.random``: on CPU,
``jax.random`` lowers the hash as a rolled 5-iteration while loop (one loop per call,
with loop-carried rotation amounts and the hash computed once per output word), which
made the key split and the (n, d) normal draw most of an iteration. Unrolled, the hash
fuses with the update into one loop. Other key implementations, or
``jax_threefry_partitionable=False``, go through ``jax.random``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..federation import PaddedData
from ..model import FlatModel

__all__ = [
    "DULAState",
    "GTDULAState",
    "local_gradient_fn",
    "full_gradient_fn",
    "dula_init",
    "dula_kernel",
    "gtdula_init",
    "gtdula_kernel",
    "consensus_error",
    "tracking_error",
]

# (key, positions (n, d), iteration) -> local gradient estimates (n, d)
LocalGradient = Callable[[jax.Array, jax.Array], jax.Array]
# (positions (n, d), coefficient) -> positions - coefficient * (L positions)
Mixer = Callable[[jax.Array, jax.Array], jax.Array]


class DULAState(NamedTuple):
    position: jax.Array  # (n, d) agents' samples w_{i,k}
    iteration: jax.Array  # int32 k


class GTDULAState(NamedTuple):
    position: jax.Array  # (n, d) agents' samples w_{i,k}
    tracker: jax.Array  # (n, d) gradient trackers d_{i,k}
    gradient: jax.Array  # (n, d) last local gradient estimates g_hat_{i,k}
    iteration: jax.Array  # int32 k


# ------------------------------------------------------------ random numbers
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry2x32(k1, k2, x1, x2):
    """The threefry-2x32 hash (20 rounds) of ``jax.random``'s ``threefry2x32_p``, unrolled.

    ``k1, k2``: the key words (broadcastable against the counters ``x1, x2``, uint32).
    """
    ks = (k1, k2, k1 ^ k2 ^ np.uint32(0x1BD11BDA))
    x1 = x1 + ks[0]
    x2 = x2 + ks[1]
    for block in range(5):
        for r in _ROTATIONS[block % 2]:
            x1 = x1 + x2
            x2 = ((x2 << np.uint32(r)) | (x2 >> np.uint32(32 - r))) ^ x1
        x1 = x1 + ks[(block + 1) % 3]
        x2 = x2 + ks[(block + 2) % 3] + np.uint32(block + 1)
    return x1, x2


def _unrolled(key) -> bool:
    """Whether the unrolled hash reproduces ``jax.random`` for ``key`` (a typed key)."""
    return (
        jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
        and str(jax.random.key_impl(key)) == "threefry2x32"
        and bool(jax.config.jax_threefry_partitionable)
    )


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
    if not _unrolled(key):
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
    if not _unrolled(key) or dtype != jnp.float32:
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
    if not _unrolled(key) or jnp.dtype(dtype) != jnp.float32:
        return jax.random.normal(key, shape, dtype)
    dtype = np.dtype(np.float32)
    b1, b2 = _hash_iota(key, tuple(shape))
    floats = _unit_floats(b1 ^ b2, dtype)
    lo = np.nextafter(np.array(-1.0, dtype), np.array(0.0, dtype), dtype=dtype)
    hi = np.array(1.0, dtype)
    u = jax.lax.max(lo, floats * (hi - lo) + lo)
    return np.array(np.sqrt(2), dtype) * jax.lax.erf_inv(u)


# ------------------------------------------------------------------ gradients
def full_gradient_fn(flat_model: FlatModel, padded: PaddedData) -> Callable:
    """``positions (n, d) -> (grad E_i(w_i))_i``: exact local gradients on each agent's full data.

    grad E_i(w) = -grad log p(X_i | w) - (1/n) grad log p(w) (section 2), on the
    padded layout (padded rows have weight 0).
    """
    n = padded.mask.shape[0]

    def one(theta, data, mask):
        return -flat_model.grad_log_likelihood_sum(theta, data, mask) - (
            flat_model.grad_log_prior(theta) / n
        )

    def gradients(positions):
        return jax.vmap(one)(positions, padded.data, padded.mask)

    return gradients


def local_gradient_fn(
    flat_model: FlatModel, padded: PaddedData, batch_size: Optional[int] = None
) -> LocalGradient:
    """The local gradient estimates g_hat_i of all agents, ``(key, positions) -> (n, d)``.

    ``batch_size=None``: full-batch, g_hat_i = grad E_i(w_i) exactly (``key`` unused).
    Otherwise each agent draws m rows uniformly with replacement from its M_i
    rows and uses ``-(M_i / m) grad log p(X_hat_i | w_i) - (1/n) grad log p(w_i)``,
    the 1/f_i-scaled estimator of section 3 (unbiased for grad E_i).
    An agent whose data has exactly m rows uses all of them.
    """
    if batch_size is None:
        full = full_gradient_fn(flat_model, padded)
        return lambda key, positions: full(positions)
    n = padded.mask.shape[0]
    m = int(batch_size)

    def one(u, theta, data, size):
        sampled = jnp.minimum((u * size).astype(jnp.int32), size - 1)
        rows = jnp.where(m >= size, jnp.arange(m, dtype=jnp.int32), sampled)
        batch = jax.tree_util.tree_map(lambda leaf: leaf[rows], data)
        scale = size.astype(theta.dtype) / m
        return -scale * flat_model.grad_log_likelihood_sum(theta, batch) - (
            flat_model.grad_log_prior(theta) / n
        )

    def gradients(key, positions):
        # agent i's rows from uniform(split(key, n)[i], (m,)): one draw for all agents
        u = uniform(split_key(key, n), (m,))
        return jax.vmap(one)(u, positions, padded.data, padded.sizes)

    return gradients


def _noise(key, positions, alpha, n):
    return jnp.sqrt(2.0 * alpha * n) * normal(key, positions.shape, positions.dtype)


# ----------------------------------------------------------------------- DULA
def dula_init(positions: jax.Array) -> DULAState:
    return DULAState(position=positions, iteration=jnp.zeros((), jnp.int32))


def dula_kernel(
    local_gradient: LocalGradient,
    mix: Mixer,
    beta: float,
    schedule: Callable,
    n: int,
    noise: bool = True,
):
    """One DULA iteration, equation (3), for all agents:
    ``w_i <- w_i - beta sum_{j in N_i} (w_i - w_j) - alpha n g_hat_i(w_i) + sqrt(2 alpha n) v_i``.
    """

    def step(key: jax.Array, state: DULAState) -> DULAState:
        key_grad, key_noise = split_key(key)
        w = state.position
        alpha = jnp.asarray(schedule(state.iteration), dtype=w.dtype)
        g = local_gradient(key_grad, w)
        new = mix(w, beta) - alpha * n * g
        if noise:
            new = new + _noise(key_noise, w, alpha, n)
        return DULAState(position=new, iteration=state.iteration + 1)

    return step


# -------------------------------------------------------------------- GT-DULA
def gtdula_init(key: jax.Array, positions: jax.Array, local_gradient: LocalGradient) -> GTDULAState:
    """d_{i,0} = g_hat_{i,0} (section 3, before equation (6))."""
    g = local_gradient(key, positions)
    return GTDULAState(
        position=positions, tracker=g, gradient=g, iteration=jnp.zeros((), jnp.int32)
    )


def gtdula_kernel(
    local_gradient: LocalGradient,
    mix: Mixer,
    beta: float,
    gamma: float,
    schedule: Callable,
    n: int,
    noise: bool = True,
):
    """One GT-DULA iteration, equations (7)-(8) with (6), for all agents:

    ``w_{k+1} = W_beta w_k - alpha n d_k + sqrt(2 alpha n) v_k``;
    ``d_{k+1} = W_gamma d_k + g_hat(w_{k+1}) - g_hat(w_k)``.

    Because 1^T L = 0, the mean of the trackers equals the mean of the current
    local estimates at every step (the tracking invariant).
    """

    def step(key: jax.Array, state: GTDULAState) -> GTDULAState:
        key_grad, key_noise = split_key(key)
        w, d = state.position, state.tracker
        alpha = jnp.asarray(schedule(state.iteration), dtype=w.dtype)
        new_w = mix(w, beta) - alpha * n * d
        if noise:
            new_w = new_w + _noise(key_noise, w, alpha, n)
        new_g = local_gradient(key_grad, new_w)
        new_d = mix(d, gamma) + (new_g - state.gradient)
        return GTDULAState(
            position=new_w, tracker=new_d, gradient=new_g, iteration=state.iteration + 1
        )

    return step


# ---------------------------------------------------------------- diagnostics
def consensus_error(positions: jax.Array) -> jax.Array:
    """(1/n) sum_i ||w_i - w_bar||^2 (section 4.1, equation (12), per agent)."""
    centred = positions - jnp.mean(positions, axis=0, keepdims=True)
    return jnp.sum(centred**2) / positions.shape[0]


def tracking_error(trackers: jax.Array, positions: jax.Array, full_gradient: Callable) -> jax.Array:
    """||d - 1 (x) u_bar|| with u_bar = (1/n) sum_i grad E_i(w_bar) (section 4.3).

    ``full_gradient(positions) -> (grad E_i(w_i))_i`` (exact local gradients);
    it is evaluated with every agent at w_bar.
    """
    w_bar = jnp.mean(positions, axis=0)
    u_bar = jnp.mean(full_gradient(jnp.broadcast_to(w_bar, positions.shape)), axis=0)
    return jnp.sqrt(jnp.sum((trackers - u_bar[None, :]) ** 2))
