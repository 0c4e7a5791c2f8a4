"""fedmcmc.rng: the unrolled threefry gives exactly jax.random's numbers.

Every family draws through it (Langevin step noise, the engine's per-draw keys, DULA/GT-DULA,
PDMP thinning), and the Ray engines, which draw with jax.random on the clients, must get the
same numbers. Compared under jit and under vmap over keys; a hash with one rotation changed
is rejected by the same comparison; other key implementations go through jax.random.
"""

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc import rng
from fedmcmc.langevin.sgld import step_noise


def same(a, b):
    return np.array_equal(np.asarray(a), np.asarray(b))


def test_split_uniform_normal_are_jax_randoms_bit_for_bit():
    keys = jax.random.split(jax.random.key(2**31 - 1), 3)  # several keys: vmap over them

    def ours(k):
        agent_keys = rng.split_key(k, 6)
        return (jax.random.key_data(rng.split_key(k, 3)),
                rng.normal(rng.split_key(k)[1], (10, 20), jnp.float32),
                rng.normal(k, (3, 5, 7), jnp.float32),
                jax.random.key_data(agent_keys),
                rng.uniform(agent_keys, (5,)))

    def theirs(k):
        agent_keys = jax.random.split(k, 6)
        return (jax.random.key_data(jax.random.split(k, 3)),
                jax.random.normal(jax.random.split(k)[1], (10, 20)),
                jax.random.normal(k, (3, 5, 7)),
                jax.random.key_data(agent_keys),
                jax.vmap(lambda a: jax.random.uniform(a, (5,)))(agent_keys))

    expected = jax.jit(jax.vmap(theirs))(keys)
    for got in (jax.jit(jax.vmap(ours))(keys), jax.jit(ours)(keys[0])):
        for a, b in zip(got, expected):
            assert same(a, b[0] if a.ndim < b.ndim else b)
    rbg = jax.random.key(1, impl="rbg")
    assert same(jax.jit(lambda k: rng.normal(k, (4, 2), jnp.float32))(rbg),
                jax.jit(lambda k: jax.random.normal(k, (4, 2)))(rbg))

    rotations = rng._ROTATIONS
    try:
        rng._ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 25))
        rng._hash_iota.clear_cache()  # its traces are cached (jitted helper)
        broken = jax.jit(lambda k: rng.normal(k, (10, 20), jnp.float32))(keys[0])
    finally:
        rng._ROTATIONS = rotations
        rng._hash_iota.clear_cache()
    assert not same(broken, jax.jit(lambda k: jax.random.normal(k, (10, 20)))(keys[0]))


def test_fold_in_is_jax_randoms_bit_for_bit():
    """The engine keys draw i by fold_in(key, i): every index, and per-chain keys under vmap."""
    key = jax.random.key(12345)
    indices = jnp.concatenate([jnp.arange(0, 3000), jnp.array([2**31 - 1, 123456789])]).astype(jnp.int32)
    ours = jax.jit(jax.vmap(lambda i: jax.random.key_data(rng.fold_in(key, i))))(indices)
    theirs = jax.jit(jax.vmap(lambda i: jax.random.key_data(jax.random.fold_in(key, i))))(indices)
    assert same(ours, theirs)
    keys = jax.random.split(jax.random.key(7), 50)
    assert same(jax.vmap(lambda k, i: jax.random.key_data(rng.fold_in(k, i)))(keys, indices[:50]),
                jax.vmap(lambda k, i: jax.random.key_data(jax.random.fold_in(k, i)))(keys, indices[:50]))
    # data 0 and 1 must give different keys (a hash that ignored the counter would not)
    assert not same(jax.random.key_data(rng.fold_in(key, 0)), jax.random.key_data(rng.fold_in(key, 1)))


def test_float64_uniform_and_exponential_are_jax_randoms():
    with jax.enable_x64(True):
        key = jax.random.key(3)
        assert same(jax.jit(lambda k: rng.uniform64(k, (1000,)))(key),
                    jax.random.uniform(key, (1000,), dtype=jnp.float64))
        assert same(jax.jit(lambda k: rng.exponential64(k, (1000,)))(key),
                    jax.random.exponential(key, (1000,), dtype=jnp.float64))


def test_langevin_step_noise_is_jax_randoms():
    """A Langevin update's (scheduler uniform, minibatch uniforms, Gaussian noise), as the
    Ray hand-off's clients draw them with jax.random."""
    keys = jax.random.split(jax.random.key(3), 100)
    ours = jax.jit(jax.vmap(lambda k: step_noise(k, 17, 5, jnp.float32)))(keys)

    def theirs(key):
        k_client, k_batch, k_noise = jax.random.split(key, 3)
        return (jax.random.uniform(k_client, ()), jax.random.uniform(k_batch, (17,)),
                jax.random.normal(k_noise, (5,), jnp.float32))

    for a, b in zip(ours, jax.jit(jax.vmap(theirs))(keys)):
        assert same(a, b)


def test_64_bit_draws_outside_64_bit_mode_are_jax_randoms_at_float32():
    """With 64-bit mode off, uniform64/exponential64 are jax.random's draws at the width JAX
    gives (float32), and the Zig-Zag's initial velocity is still bernoulli(0.5)'s: the
    64-bit hash words would be truncated there (every velocity came out +1)."""
    from fedmcmc.pdmp.zigzag import ZigZagSpec

    assert not jax.config.jax_enable_x64
    key = jax.random.key(3)
    assert same(rng.uniform64(key, (7,)), jax.random.uniform(key, (7,)))
    assert same(rng.exponential64(key, (7,)), jax.random.exponential(key, (7,)))
    velocity = ZigZagSpec.init_velocity(key, 64, None)
    assert same(velocity, jnp.where(jax.random.bernoulli(key, 0.5, (64,)), 1.0, -1.0))
    assert set(np.asarray(velocity).tolist()) == {-1.0, 1.0}
    with jax.enable_x64(True):  # and in 64-bit mode, jax.random's float64 draws
        assert same(rng.uniform64(key, (7,)), jax.random.uniform(key, (7,), jnp.float64))


def test_the_hash_is_one_primitive_batched_by_broadcasting():
    """The unrolled hash is one equation of a trace (its ~130 operations appear only in the
    lowering), gives jax.random's words eagerly, under jit and under vmap whichever operands are
    batched (key words, counters, or both on different axes), and refuses non-uint32 words."""
    key = jax.random.key(11)
    jaxpr = jax.make_jaxpr(lambda k: jax.random.key_data(rng.fold_in(rng.split_key(k, 3)[1], 5)))(key)
    names = [eqn.primitive.name for eqn in jaxpr.jaxpr.eqns]
    inner = [eqn.primitive.name for eqn in jaxpr.jaxpr.eqns
             for sub in jax.tree_util.tree_leaves(eqn.params, is_leaf=lambda p: hasattr(p, "eqns"))
             if hasattr(sub, "eqns") for eqn in getattr(sub, "jaxpr", sub).eqns]
    hashes = names + inner
    assert hashes.count(rng.threefry2x32_unrolled_p.name) == 2
    assert "shift_left" not in hashes and "shift_right_logical" not in hashes

    from jax.extend.random import threefry_2x32  # jax.random's hash: one key pair, counters
    # (x1, x2) concatenated; returns the two output words concatenated

    data = jax.random.key_data(jax.random.split(key, 4))  # (4, 2): one key pair per row
    k1, k2 = data[:, 0], data[:, 1]
    x1 = jnp.arange(4 * 6, dtype=jnp.uint32).reshape(4, 6)
    x2 = x1 * np.uint32(7919) + np.uint32(3)
    expected = np.stack([np.asarray(threefry_2x32(data[i], jnp.concatenate([x1[i], x2[i]])))
                         .reshape(2, 6) for i in range(4)], axis=1)  # (word, row, column)

    def ours(a, b, c, d):
        return jnp.stack(rng._threefry2x32(a, b, c, d))

    assert same(ours(k1[:, None], k2[:, None], x1, x2), expected)  # eager
    assert same(jax.jit(ours)(k1[:, None], k2[:, None], x1, x2), expected)
    # vmapped over rows (every operand batched), over columns (key words unbatched, counters
    # batched on axis 1), and over rows with one counter word unbatched
    assert same(jax.vmap(ours, out_axes=1)(k1, k2, x1, x2), expected)
    assert same(jax.vmap(ours, in_axes=(None, None, 1, 1), out_axes=2)(k1, k2, x1, x2), expected)
    x2_row = jnp.broadcast_to(x2[0], x2.shape)
    expected_row = np.stack([np.asarray(threefry_2x32(data[i], jnp.concatenate([x1[i], x2[0]])))
                             .reshape(2, 6) for i in range(4)], axis=1)
    assert same(jax.jit(jax.vmap(ours, in_axes=(0, 0, 0, None), out_axes=1))(k1, k2, x1, x2[0]),
                expected_row)
    assert same(ours(k1[:, None], k2[:, None], x1, x2_row), expected_row)
    with np.testing.assert_raises(TypeError):
        jax.make_jaxpr(lambda x: rng.threefry2x32_unrolled_p.bind(x, x, x, x))(jnp.zeros(3))
