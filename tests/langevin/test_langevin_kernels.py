"""Exactness of the federated Langevin kernels' building blocks (no sampling statistics).

The scheduler vectorised over a block of updates (``dsgld.assign_clients``, used by
``LangevinStep.prepare``) must make the same client sequence and visit counts as drawing the
client inside every update, whatever the block boundaries; the precomputed conducive
gradients must equal section 3's formula; and running a kernel's updates in blocks must give
the same chain as running them one at a time.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc import surrogates
from fedmcmc.engines import local
from fedmcmc.langevin import dsgld, estimators, fsgld, sgld
from fedmcmc.schedules import constant

from probes import modules_loaded_by


def sequential_scheduler(uniforms, iteration, client, visits, cumulative_weights, local_steps):
    """The scheduler one update at a time, as equation (3) reads."""
    clients, visits = [], np.array(visits)
    total = cumulative_weights[-1]
    for t, u in enumerate(uniforms):
        if (iteration + t) % local_steps == 0:
            client = min(int(np.searchsorted(cumulative_weights, u * total, side="right")),
                         len(cumulative_weights) - 1)
            visits[client] += 1
        clients.append(client)
    return np.array(clients), client, visits


@pytest.mark.parametrize("num_clients", [5, 100])  # one-hot and scatter visit counting
@pytest.mark.parametrize("iteration,local_steps,block", [(0, 7, 30), (5, 7, 30), (13, 4, 3),
                                                         (2, 10, 5), (0, 1, 6), (9, 50, 1)])
def test_block_scheduler_matches_one_update_at_a_time(num_clients, iteration, local_steps, block):
    rs = np.random.default_rng(iteration + 31 * local_steps + block)
    weights = rs.random(num_clients) + 0.1
    weights /= weights.sum()
    cumulative = np.cumsum(weights).astype(np.float32)
    uniforms = rs.random(block).astype(np.float32)
    visits = rs.integers(0, 5, num_clients).astype(np.int32)
    current = 3
    clients, after, counts = dsgld.assign_clients(
        jnp.asarray(uniforms), jnp.int32(iteration), jnp.int32(current), jnp.asarray(visits),
        jnp.asarray(cumulative), local_steps)
    want_clients, want_after, want_counts = sequential_scheduler(
        uniforms, iteration, current, visits, cumulative, local_steps)
    np.testing.assert_array_equal(np.asarray(clients), want_clients)
    assert int(after) == want_after
    np.testing.assert_array_equal(np.asarray(counts), want_counts)


def gaussian_problem(dim, num_clients=4, diagonal=False, seed=0):
    rs = np.random.default_rng(seed)
    clients = [rs.normal(rs.uniform(-2, 2, dim), 1.0, size=(20 + 5 * s, dim)).astype(np.float32)
               for s in range(num_clients)]
    federation = fm.Federation(clients)
    model = fm.Model(log_prior=lambda mu: -0.5 * jnp.sum(mu**2) / 10.0,
                     log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2))
    flat = model.flatten(jnp.zeros(dim))
    fitted = surrogates.fit_surrogates("exact", flat, federation, jnp.zeros(dim))
    if diagonal:
        fitted = surrogates.GaussianSurrogates(
            jax.vmap(jnp.diag)(fitted.precision), fitted.shift)
    return federation, flat, fitted


@pytest.mark.parametrize("dim,diagonal", [(3, False), (40, False), (3, True)])
def test_precomputed_conducive_gradient_is_section_3s(dim, diagonal):
    federation, _, fitted = gaussian_problem(dim, diagonal=diagonal)
    weights = jnp.asarray(federation.weights, jnp.float32)
    product = surrogates.product(fitted)
    terms = estimators.conducive_terms(fitted, product, weights)
    theta = jnp.asarray(np.random.default_rng(1).normal(size=dim), jnp.float32)
    for client in range(federation.num_clients):
        want = estimators.conducive_gradient(theta, client, weights[client], fitted, product)
        got = estimators.conducive_gradient_from_terms(theta, client, terms)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-3)


def test_blocks_of_updates_make_the_chain_of_single_updates():
    federation, flat, fitted = gaussian_problem(2)
    weights = jnp.asarray(federation.weights, jnp.float32)
    step = fsgld.build_kernel(
        flat, federation.concatenated(), weights, 5, 7, constant(1e-3), fitted,
        surrogates.product(fitted), fsgld.alpha_schedule(1.0, 0))
    state = dsgld.init(jnp.zeros(2), federation.num_clients)
    keys = jax.random.split(jax.random.key(3), 40)
    one_at_a_time = jax.jit(lambda s, ks: jax.lax.scan(lambda s, k: (step(k, s), None), s, ks)[0])
    in_blocks = jax.jit(lambda s, ks: sgld.run_updates(step, jax.vmap(step.noise)(ks), s))
    first = one_at_a_time(state, keys)
    # two blocks of unequal length, the boundary inside a visit
    second = in_blocks(in_blocks(state, keys[:17]), keys[17:])
    for a, b in zip(jax.tree_util.tree_leaves(first), jax.tree_util.tree_leaves(second)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
    assert int(second.rounds) == int(np.ceil(40 / 7))
    assert int(second.iteration) == 40


def test_compiler_options_split_loops_only_for_many_chains():
    if jax.default_backend() != "cpu":
        pytest.skip("the option concerns XLA's CPU compiler")
    assert local.compiler_options(1) == {"xla_disable_hlo_passes": "cpu-parallel-task-assigner"}
    assert local.compiler_options(local.SPLIT_LOOPS_MIN_CHAINS) == {}


def test_the_option_reaches_xla():
    """The pass named in compiler_options exists: without it a minibatch gather from a large
    array is split over the thread pool on a multi-core machine (the option would silently
    do nothing if XLA renamed the pass)."""
    if jax.default_backend() != "cpu":
        pytest.skip("the option concerns XLA's CPU compiler")
    data = jnp.asarray(np.random.default_rng(0).normal(size=(20_000, 20)), jnp.float32)

    def run(theta, uniforms):
        def step(theta, u):
            rows = jnp.minimum((u * 20_000).astype(jnp.int32), 19_999)
            return theta + jnp.sum(data[rows], axis=0), None
        return jax.lax.scan(step, theta, uniforms)[0]

    args = (jnp.zeros(20), jnp.zeros((10, 50)))
    compiled = {chains: jax.jit(run, compiler_options=local.compiler_options(chains))
                .lower(*args).compile().as_text()
                for chains in (1, local.SPLIT_LOOPS_MIN_CHAINS)}
    assert "outer_dimension_partitions" not in compiled[1]
    if (os.cpu_count() or 1) > 1:
        assert "outer_dimension_partitions" in compiled[local.SPLIT_LOOPS_MIN_CHAINS]


@pytest.mark.parametrize("dim", [1, 2, 5, 30, 710])
@pytest.mark.parametrize("noise_trace", [0.0, 3.5, 1e4])
def test_auto_trust_radius_is_the_widened_chi_square_quantile(dim, noise_trace):
    """trust_radius='auto' (fsgld.auto_trust_radius, from scipy.special) is bit for bit
    sqrt(chi2.ppf(1 - 1e-4, d) (1 + h tr C / (4 d))) of scipy.stats."""
    from scipy.stats import chi2

    h = 1e-3
    widening = 1.0 + h * noise_trace / (4.0 * dim)
    expected = float(np.sqrt(chi2.ppf(1 - 1e-4, df=dim) * widening))
    assert fsgld.auto_trust_radius(dim, h, noise_trace) == expected
    # a negative tr C (rounding) does not shrink the radius below the posterior's quantile
    assert fsgld.auto_trust_radius(dim, h, -1.0) == float(np.sqrt(chi2.ppf(1 - 1e-4, df=dim)))


def test_an_fsgld_run_does_not_import_scipy_stats():
    """scipy.stats takes about 0.6 s to import: the default FSGLD run (trust_radius='auto')
    must not need it (checked in a fresh process)."""
    probe = """
import numpy as np
import fedmcmc as fm
rs = np.random.default_rng(0)
clients = [{"x": rs.normal(size=(n, 2)).astype(np.float32)} for n in (30, 50)]
model = fm.Model(log_prior=lambda p: -0.5 * (p ** 2).sum(),
                 log_likelihood=lambda p, ex: -0.5 * ((ex["x"] - p) ** 2).sum())
result = fm.sample(model, fm.Federation(clients), fm.FSGLD(step_size=1e-3, batch_size=10,
                   local_steps=5), init=np.zeros(2, np.float32), num_samples=5, burn_in=0,
                   chains=1, seed=0, progress=False)
assert result.info["trust_radius"] > 0
"""
    assert modules_loaded_by(probe, ["scipy.stats"]) == []


@pytest.mark.parametrize("total", [1, 19, 20, 21, 999, 1001, 12345])
def test_default_chunks_are_nearly_equal(total):
    size = local.default_chunk_size(total)
    chunks = -(-total // size)
    assert chunks <= 20 and chunks * size - total < chunks


def test_last_chunk_shorter_than_the_others_keeps_the_draws():
    """A run whose length is not a multiple of the chunk: the same draws as one chunk, with
    one chain (not vmapped) and with two; info reports the steady-state speed."""
    federation, _, _ = gaussian_problem(2)
    model = fm.Model(log_prior=lambda mu: -0.5 * jnp.sum(mu**2) / 10.0,
                     log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2))
    algorithm = fm.DSGLD(step_size=1e-3, batch_size=5, local_steps=3)
    runs = [fm.sample(model, federation, algorithm, jnp.zeros(2), num_samples=23, thin=2,
                      chains=chains, seed=4, progress=False, chunk_size=chunk)
            for chains, chunk in ((1, 5), (1, 23), (2, 5), (2, 23))]
    np.testing.assert_array_equal(np.asarray(runs[0].samples), np.asarray(runs[1].samples))
    np.testing.assert_array_equal(np.asarray(runs[2].samples), np.asarray(runs[3].samples))
    assert np.asarray(runs[0].samples).shape == (1, 23, 2)
    assert runs[0].info["rounds"] == runs[1].info["rounds"] == int(np.ceil(46 / 3))
    assert runs[0].info["seconds_per_iteration"] > 0
    assert "seconds_per_iteration" not in runs[1].info  # one chunk: nothing after compilation
