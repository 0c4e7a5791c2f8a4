"""``batch_size`` is an upper bound (``fedmcmc.minibatch``, issue 15).

A client with at most ``batch_size`` rows contributes its exact gradient; larger clients a
with-replacement minibatch scaled by N_s / m. The estimator stays unbiased, and DSGLD on a
federation with clients smaller than the batch samples the exact posterior. A broken rule
(padding slots counted as rows) is rejected by the same checks.
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc import minibatch as minibatch_module
from fedmcmc.langevin.estimators import draw_minibatch, dsgld_gradient

from stats import check_gaussian_moments

DIM = 2
SIZES = (3, 5, 40, 60)  # two clients smaller than the batch
BATCH = 10
MODEL = fm.Model(
    log_prior=lambda mu: -0.5 * jnp.sum(mu**2),
    log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2),
)


def federation():
    rng = np.random.default_rng(5)
    means = rng.uniform(-1.5, 1.5, size=(len(SIZES), DIM))
    return fm.Federation([rng.normal(m, 1.0, size=(n, DIM)).astype(np.float32)
                          for m, n in zip(means, SIZES)])


def ignore_padding_weights(uniforms, size, may_be_smaller=True):
    """The deliberately broken rule: a small client's padding slots counted as rows."""
    rows, _, _ = ORIGINAL_RULE(uniforms, size, may_be_smaller)
    return rows, None, uniforms.shape[0]


ORIGINAL_RULE = minibatch_module.minibatch_rows


def test_small_client_gives_its_exact_gradient():
    fed = federation()
    flat = MODEL.flatten(jnp.zeros(DIM))
    layout = fed.concatenated()
    theta = jnp.array([0.3, -0.2])
    for client in (0, 1):
        minibatch = draw_minibatch(jax.random.key(client), layout, client, BATCH)
        exact = np.sum(fed[client] - np.asarray(theta), axis=0)
        np.testing.assert_allclose(
            minibatch_module.likelihood_gradient(flat, theta, minibatch), exact, rtol=1e-5)


def _estimator_draws(draws=100_000):
    fed = federation()
    flat = MODEL.flatten(jnp.zeros(DIM))
    layout = fed.concatenated()
    weights = jnp.asarray(fed.weights, jnp.float32)
    theta = jnp.array([0.3, -0.2])

    def one(key):
        key_client, key_batch = jax.random.split(key)
        client = jax.random.choice(key_client, len(SIZES), p=weights)
        minibatch = draw_minibatch(key_batch, layout, client, BATCH)
        return dsgld_gradient(flat, theta, minibatch, weights[client])

    values = np.asarray(jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(0), draws)))
    full = -np.asarray(theta) + np.sum(fed.pooled() - np.asarray(theta), axis=0)
    z = (values.mean(axis=0) - full) / (values.std(axis=0) / np.sqrt(draws))
    return z


def test_estimator_unbiased_with_clients_smaller_than_the_batch(monkeypatch):
    assert np.all(np.abs(_estimator_draws()) < 4)
    monkeypatch.setattr(minibatch_module, "minibatch_rows", ignore_padding_weights)
    assert np.any(np.abs(_estimator_draws()) > 4)


def _dsgld_draws(step_size=2e-3, thin=10):
    result = fm.sample(MODEL, federation(), fm.DSGLD(step_size=step_size, batch_size=BATCH,
                                                      local_steps=1),
                       init=jnp.zeros(DIM), num_samples=1000, burn_in=100, thin=thin,
                       chains=8, seed=2, progress=False)
    return result.flat_samples()


def _expected_moments(fed, step_size):
    """Stationary mean and variance of DSGLD (one step per visit) on the Gaussian-mean model:
    the exact posterior's mean, and its variance inflated by the estimator's noise (within a
    client with m_s = min(m, N_s) rows; zero for a client used whole; plus the spread of the
    scaled client terms) and shrunk by the discretisation, as in test_langevin_posterior."""
    f, n = fed.weights, fed.sizes
    precision = fed.total_size + 1.0
    mean = fed.pooled().sum(axis=0) / precision
    client_means = np.stack([c.mean(axis=0) for c in fed.clients])
    client_vars = np.stack([c.var(axis=0) for c in fed.clients])
    used = np.minimum(BATCH, n)
    within_client = np.where((n > BATCH)[:, None], client_vars / used[:, None], 0.0)
    within = np.sum(f[:, None] * (n[:, None] / f[:, None]) ** 2 * within_client, axis=0)
    centred = (n[:, None] / f[:, None]) * client_means
    between = np.sum(f[:, None] * centred**2, axis=0) - np.sum(f[:, None] * centred, axis=0) ** 2
    noise = within + between
    variance = (1 + step_size * noise / 4) / (precision * (1 - step_size * precision / 4))
    return mean, variance


def test_dsgld_posterior_with_clients_smaller_than_the_batch(monkeypatch):
    fed = federation()
    mean, variance = _expected_moments(fed, 2e-3)
    figures = check_gaussian_moments(_dsgld_draws(), mean, np.diag(variance))
    assert figures["ok"], figures
    monkeypatch.setattr(minibatch_module, "minibatch_rows", ignore_padding_weights)
    broken = check_gaussian_moments(_dsgld_draws(), mean, np.diag(variance))
    assert not broken["ok_mean"], broken


@pytest.mark.parametrize("make", [
    lambda: fm.SGLD(step_size=1e-3, batch_size=500),
    lambda: fm.FSGLD(step_size=1e-3, batch_size=50, local_steps=3),
], ids=["SGLD-batch-above-N", "FSGLD-batch-above-every-client"])
def test_batch_above_client_sizes_runs(make):
    result = fm.sample(MODEL, federation(), make(), init=jnp.zeros(DIM), num_samples=20,
                       chains=2, seed=0, progress=False)
    assert np.all(np.isfinite(result.flat_samples()))
    assert result.info["batch_size"] == make().batch_size  # the user's value, reported as given
