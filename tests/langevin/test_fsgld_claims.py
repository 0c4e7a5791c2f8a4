"""The FSGLD paper's claims: Lemma 1 (unbiased, lower variance) and Figure 3b (delayed communication)."""

import jax
import jax.numpy as jnp
import numpy as np

import fedmcmc as fm
from fedmcmc import surrogates as surrogate_module
from fedmcmc.langevin.estimators import conducive_gradient, draw_minibatch, dsgld_gradient

from stats import check_gaussian_moments


# ------------------------------------------------------------------------- Lemma 1


def bernoulli_problem(seed=0, size=100):
    """Figure 1's setting: three clients of coin flips with success rates 0.1, 0.5, 0.9; theta is the logit."""
    rng = np.random.default_rng(seed)
    clients = [(rng.random((size, 1)) < p).astype(np.float32) for p in (0.1, 0.5, 0.9)]
    model = fm.Model(
        log_prior=lambda theta: -0.5 * jnp.sum(theta**2) / 10.0,
        log_likelihood=lambda theta, y: jnp.sum(y * theta - jnp.logaddexp(0.0, theta)),
    )
    return model, fm.Federation(clients)


def make_sampler(model, federation, batch_size, draws=40000):
    """Compiled ``(theta, conducive, seed) -> draws of the estimator`` over client and minibatch draws."""
    flat = model.flatten(jnp.zeros(1))
    surrogates = surrogate_module.fit_surrogates("laplace", flat, federation, jnp.zeros(1))
    global_surrogate = surrogate_module.product(surrogates)
    data = federation.concatenated()
    weights = jnp.asarray(federation.weights, jnp.float32)
    cumulative = jnp.cumsum(weights)

    def one(key, theta, conducive):
        key_client, key_batch = jax.random.split(key)
        client = jnp.searchsorted(cumulative, jax.random.uniform(key_client) * cumulative[-1], side="right")
        client = jnp.minimum(client, federation.num_clients - 1)
        minibatch = draw_minibatch(key_batch, data, client, batch_size)
        value = dsgld_gradient(flat, theta, minibatch, weights[client])
        extra = conducive_gradient(theta, client, weights[client], surrogates, global_surrogate)
        return value + conducive * extra

    @jax.jit
    def sample(theta, conducive, seed):
        keys = jax.random.split(jax.random.key(seed), draws)
        return jax.vmap(one, in_axes=(0, None, None))(keys, theta, conducive)[:, 0]

    return lambda theta, conducive, seed=0: np.asarray(sample(theta, float(conducive), seed))


def full_gradient(model, federation, theta):
    pooled = federation.pooled()
    flat = model.flatten(jnp.zeros(1))
    return float(flat.grad_log_prior(theta)[0] + flat.grad_log_likelihood_sum(theta, jnp.asarray(pooled))[0])


def test_estimators_are_unbiased_and_conducive_gradients_cut_variance():
    model, federation = bernoulli_problem()
    sampler = make_sampler(model, federation, batch_size=10)
    for value in (-1.0, 0.0, 0.7):
        theta = jnp.array([value])
        exact = full_gradient(model, federation, theta)
        plain = sampler(theta, conducive=False)
        conducive = sampler(theta, conducive=True)
        for draws in (plain, conducive):
            standard_error = draws.std() / np.sqrt(draws.size)
            assert abs(draws.mean() - exact) < 5 * standard_error, (value, draws.mean(), exact)
        # Figure 1: the conducive gradient removes most of the between-client variance
        assert conducive.var() < 0.5 * plain.var(), (value, conducive.var(), plain.var())


def test_a_biased_estimator_is_detected():
    """The unbiasedness check can fail: dropping 1/f_s biases the estimate."""
    model, federation = bernoulli_problem()
    theta = jnp.array([0.3])
    exact = full_gradient(model, federation, theta)
    draws = make_sampler(model, federation, batch_size=10)(theta, conducive=False)
    # undo the 1/f_s factor on the likelihood part: f_s = 1/3 for equal clients
    flat = model.flatten(jnp.zeros(1))
    prior_part = float(flat.grad_log_prior(theta)[0])
    biased = prior_part + (draws - prior_part) / 3.0
    standard_error = biased.std() / np.sqrt(biased.size)
    assert abs(biased.mean() - exact) > 5 * standard_error


# ----------------------------------------------------------------------- Figure 3b


def delayed_communication_problem(seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-6, 6, size=(10, 2))
    clients = [rng.normal(c, 1.0, size=(200, 2)).astype(np.float32) for c in centres]
    model = fm.Model(
        log_prior=lambda mu: -0.5 * jnp.sum(mu**2),
        log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2),
    )
    return model, fm.Federation(clients)


def test_delayed_communication_dsgld_drifts_fsgld_does_not():
    """Section 5.1 with the paper's h = 1e-4, m = 10 and 200 local steps."""
    model, federation = delayed_communication_problem()
    h, m = 1e-4, 10
    precision = federation.total_size + 1.0
    mean = federation.pooled().sum(axis=0) / precision
    # FSGLD with exact surrogates: the gradient noise is (N_s/f_s)(xbar_batch - xbar_s), independent
    # of theta, so the discretised chain's variance is known exactly (see test_langevin_posterior).
    client_vars = np.stack([c.var(axis=0) for c in federation.clients])
    sigma2 = np.mean(federation.total_size**2 * client_vars / m, axis=0)
    variance = (1 + h * sigma2 / 4) / (precision * (1 - h * precision / 4))
    settings = dict(init=jnp.zeros(2), num_samples=600, burn_in=100, thin=100, chains=4, seed=0)

    fsgld = fm.sample(model, federation, fm.FSGLD(step_size=h, batch_size=m, local_steps=200, surrogate="exact"), **settings)
    dsgld = fm.sample(model, federation, fm.DSGLD(step_size=h, batch_size=m, local_steps=200), **settings)
    fsgld_draws, dsgld_draws = fsgld.flat_samples(), dsgld.flat_samples()

    assert check_gaussian_moments(fsgld_draws, mean, np.diag(variance))["ok"]
    assert not check_gaussian_moments(dsgld_draws, mean, np.diag(variance))["ok"]

    def error(draws):  # squared error of the mean plus of the marginal sds
        flat = draws.reshape(-1, 2)
        return np.sum((flat.mean(0) - mean) ** 2) + np.sum((flat.std(0) - np.sqrt(variance)) ** 2)

    assert error(dsgld_draws) > 100 * error(fsgld_draws)
