"""fm.reference_posterior: exact for Gaussian posteriors, NUTS otherwise, cached on disk."""

import numpy as np
import jax.numpy as jnp
import pytest

import fedmcmc as fm


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDMCMC_CACHE_DIR", str(tmp_path / "cache"))


def _linear_regression(n=300, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5]) + rng.standard_normal(n)).astype(np.float32)
    federation = fm.Federation([{"x": x[:100], "y": y[:100]}, {"x": x[100:], "y": y[100:]}])
    model = fm.Model(
        lambda p: -0.5 * jnp.sum(p["w"] ** 2) / 4.0,
        lambda p, e: -0.5 * (e["y"] - e["x"] @ p["w"]) ** 2,
        name="test_linreg",
    )
    precision = x.astype(np.float64).T @ x + np.eye(3) / 4.0
    mean = np.linalg.solve(precision, x.astype(np.float64).T @ y)
    return model, federation, {"w": jnp.zeros(3)}, mean, np.linalg.inv(precision)


def test_exact_for_conjugate_linear_regression():
    model, federation, init, mean, cov = _linear_regression()
    reference = fm.reference_posterior(model, federation, init, num_samples=4000)
    assert reference.method == "exact"
    np.testing.assert_allclose(reference.mean, mean, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(reference.cov, cov, rtol=1e-6, atol=1e-9)
    # the draws follow N(mean, cov)
    z = (reference.draws.mean(axis=0) - mean) / np.sqrt(np.diag(cov) / reference.draws.shape[0])
    assert np.all(np.abs(z) < 4)
    with pytest.raises(ValueError, match="init"):
        fm.reference_posterior(model, federation)  # no structure known


def test_cache_hit_and_key_changes_with_model_and_data():
    model, federation, init, _, _ = _linear_regression()
    first = fm.reference_posterior(model, federation, init)
    second = fm.reference_posterior(model, federation, init)
    assert not first.from_cache and second.from_cache
    np.testing.assert_array_equal(first.draws, second.draws)
    # same name, different prior: a different entry, not a stale one
    other = fm.Model(lambda p: -0.5 * jnp.sum(p["w"] ** 2), model.log_likelihood, name=model.name)
    third = fm.reference_posterior(other, federation, init)
    assert not third.from_cache
    assert not np.allclose(third.mean, first.mean)
    # different data, same model: a different entry
    _, federation2, _, _, _ = _linear_regression(seed=1)
    assert not fm.reference_posterior(model, federation2, init).from_cache


def test_nuts_for_logistic_regression():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 2)).astype(np.float32)
    y = (rng.uniform(size=200) < 1 / (1 + np.exp(-(x @ np.array([1.5, -1.0]))))).astype(np.float32)
    federation = fm.Federation([{"x": x[:120], "y": y[:120]}, {"x": x[120:], "y": y[120:]}])
    model = fm.Model(
        lambda w: -0.5 * jnp.sum(w**2),
        lambda w, e: e["y"] * (e["x"] @ w) - jnp.logaddexp(0.0, e["x"] @ w),
        name="test_logreg",
    )
    init = jnp.zeros(2)
    with pytest.raises(ValueError, match="quadratic"):
        fm.reference_posterior(model, federation, init, method="exact", cache=False)
    reference = fm.reference_posterior(model, federation, init, num_samples=400, num_warmup=200)
    assert reference.method == "nuts"
    assert reference.info["divergences"] == 0
    assert reference.info["max_rhat"] < 1.05
    # compare with a Laplace approximation at the mode (accurate at N = 200, d = 2)
    import scipy.optimize

    def negative(w):
        z = x @ w
        return 0.5 * w @ w - np.sum(y * z - np.logaddexp(0.0, z))

    mode = scipy.optimize.minimize(negative, np.zeros(2)).x
    p = 1 / (1 + np.exp(-(x @ mode)))
    cov = np.linalg.inv(np.eye(2) + (x.T * (p * (1 - p))) @ x)
    sd = np.sqrt(np.diag(cov))
    ess = reference.info["min_ess"]
    assert np.all(np.abs(reference.mean - mode) < 0.1 * sd + 4 * sd / np.sqrt(ess))
    np.testing.assert_allclose(reference.sd, sd, rtol=0.15)


def test_uses_a_models_closed_form_posterior():
    model, federation, init, mean, cov = _linear_regression()
    carrying = fm.Model(model.log_prior, model.log_likelihood, name="carrying",
                        exact_posterior=lambda data: (mean, cov), init=init)
    reference = fm.reference_posterior(carrying, federation, cache=False)
    assert reference.method == "exact" and reference.info.get("source")
    np.testing.assert_allclose(reference.mean, mean)
