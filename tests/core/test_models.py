"""fm.models: exact posteriors against brute-force numerics, per-example likelihoods,
normalisation, bounds, network shapes, the registry and predictive log-likelihoods."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate

import fedmcmc as fm
from fedmcmc import models
from fedmcmc.federation import Federation
from fedmcmc.models import synthetic


def log_post(model, data):
    return lambda params: model.log_prior(params) + model.log_likelihood_sum(params, data)


def grid_moments(log_density, lo, hi, num=301):
    """Mean and covariance of a 2-D density by quadrature on a grid (brute force)."""
    a = np.linspace(lo[0], hi[0], num)
    b = np.linspace(lo[1], hi[1], num)
    aa, bb = np.meshgrid(a, b, indexing="ij")
    points = jnp.asarray(np.stack([aa.ravel(), bb.ravel()], 1), jnp.float32)
    logp = np.asarray(jax.jit(jax.vmap(log_density))(points), np.float64)
    w = np.exp(logp - logp.max())
    w /= w.sum()
    p = np.asarray(points, np.float64)
    mean = w @ p
    cov = (p - mean).T @ ((p - mean) * w[:, None])
    return mean, cov


# --------------------------------------------------------------------------- conjugate models


def test_gaussian_mean_exact_posterior_matches_quadrature():
    rng = np.random.default_rng(0)
    noise = np.array([[2.0, 0.6], [0.6, 1.0]])
    prior = np.array([[1.5, -0.3], [-0.3, 0.8]])
    x = rng.multivariate_normal([1.0, -2.0], noise, size=6).astype(np.float32)
    model = models.gaussian_mean(2, prior_mean=[0.5, 0.0], prior_cov=prior, noise_cov=noise)
    fed = Federation([x[:2], x[2:]])
    mean, cov = model.attributes["exact_posterior"](fed)
    sd = np.sqrt(np.diag(cov))
    q_mean, q_cov = grid_moments(log_post(model, x), mean - 7 * sd, mean + 7 * sd)
    np.testing.assert_allclose(q_mean, mean, atol=2e-3)
    np.testing.assert_allclose(q_cov, cov, atol=2e-3)
    # A deliberately wrong posterior (prior ignored) is rejected by the same check.
    wrong_mean, _ = models.gaussian_mean_posterior(x, prior_cov=None, noise_cov=noise)
    assert np.abs(q_mean - wrong_mean).max() > 0.05


def test_gaussian_mean_flat_prior_and_section_5_1():
    fed = models.delayed_communication_data(1)
    model = models.gaussian_mean(2)
    mean, cov = model.attributes["exact_posterior"](fed)
    pooled = fed.pooled()
    np.testing.assert_allclose(mean, pooled.sum(0) / (pooled.shape[0] + 1), rtol=1e-5)
    np.testing.assert_allclose(cov, np.eye(2) / (pooled.shape[0] + 1), rtol=1e-6)
    flat = models.gaussian_mean(2, prior_cov=None)
    mean, cov = flat.attributes["exact_posterior"](pooled)
    np.testing.assert_allclose(mean, pooled.mean(0), rtol=1e-5)
    # gradient of the log posterior vanishes at the exact mean
    g = jax.grad(log_post(flat, pooled))(jnp.asarray(mean, jnp.float32))
    assert np.abs(np.asarray(g)).max() < 1e-1


@pytest.mark.parametrize("parametrization", ["logit", "probability"])
def test_bernoulli_exact_posterior_matches_quadrature(parametrization):
    fed = synthetic.bernoulli_clients((0.1, 0.5, 0.9), 10, seed=0)
    x = fed.pooled()
    assert x.sum() == 15 and x.size == 30
    model = models.bernoulli(a=2.0, b=3.0, parametrization=parametrization)
    mean, cov = model.attributes["exact_posterior"](fed)
    lo, hi = (-6.0, 6.0) if parametrization == "logit" else (1e-6, 1 - 1e-6)
    f = log_post(model, x)
    grid = np.linspace(lo, hi, 20001)
    logp = np.asarray(jax.jit(jax.vmap(f))(jnp.asarray(grid, jnp.float32)), np.float64)
    w = np.exp(logp - logp.max())
    z = integrate.trapezoid(w, grid)
    q_mean = integrate.trapezoid(w * grid, grid) / z
    q_var = integrate.trapezoid(w * (grid - q_mean) ** 2, grid) / z
    assert abs(q_mean - mean[0]) < 2e-3
    assert abs(q_var - cov[0, 0]) < 2e-3
    alpha, beta = models.bernoulli_posterior(x, a=2.0, b=3.0)
    assert (alpha, beta) == (17.0, 18.0)


def test_linear_regression_exact_posterior_matches_quadrature_and_curvature():
    data, _ = synthetic.linear_regression_data(40, 2, noise_std=0.7, seed=3)
    model = models.linear_regression(2, prior_precision=0.5, noise_std=0.7)
    mean, cov = model.attributes["exact_posterior"](data)
    sd = np.sqrt(np.diag(cov))
    q_mean, q_cov = grid_moments(log_post(model, data), mean - 7 * sd, mean + 7 * sd)
    np.testing.assert_allclose(q_mean, mean, atol=2e-3)
    np.testing.assert_allclose(q_cov, cov, atol=5e-4)
    # d = 5: the log posterior is quadratic, its Hessian is -cov^{-1} and its mode the mean
    data, _ = synthetic.linear_regression_data(200, 5, seed=4)
    model = models.linear_regression(5, prior_precision=2.0, noise_std=1.3)
    mean, cov = models.linear_regression_posterior(data, prior_precision=2.0, noise_std=1.3)
    target = log_post(model, data)
    hessian = np.asarray(jax.jit(jax.hessian(target))(jnp.asarray(mean, jnp.float32)))
    np.testing.assert_allclose(-hessian, np.linalg.inv(cov), rtol=1e-3, atol=1e-2)
    grad = np.asarray(jax.grad(target)(jnp.asarray(mean, jnp.float32)))
    assert np.abs(grad).max() < 1e-2 * np.abs(np.linalg.inv(cov)).max()


# --------------------------------------------------------------------------- every model


def zoo():
    """(model, data with a leading axis, params) for every registered model."""
    rng = np.random.default_rng(0)
    logistic, _ = synthetic.logistic_regression_data(50, 4, seed=0)
    poisson, _ = synthetic.poisson_regression_data(50, 3, seed=0)
    linear, _ = synthetic.linear_regression_data(50, 3, seed=0)
    inputs = rng.standard_normal((300, 6)).astype(np.float32)
    fed, test, train = models.metric_learning_pairs(
        inputs, np.arange(300) % 6, num_clients=2, pairs_per_client=20, num_test_pairs=10, seed=0
    )
    digits = {"image": rng.random((3, 28, 28)).astype(np.float32), "label": np.array([0, 3, 9])}
    tabular = {"x": rng.standard_normal((7, 5)).astype(np.float32), "y": np.array([0, 1, 2, 0, 1, 2, 0])}
    entries = {
        "gaussian_mean": (models.get("gaussian_mean", dim=3), rng.standard_normal((20, 3)).astype(np.float32)),
        "bernoulli": (models.get("bernoulli"), (rng.random(20) < 0.3).astype(np.float32)),
        "linear_regression": (models.get("linear_regression", dim=3), linear),
        "logistic_regression": (models.get("logistic_regression", dim=4), logistic),
        "poisson_regression": (models.get("poisson_regression", dim=3), poisson),
        "metric_learning": (models.get("metric_learning", inputs=train, num_components=3), test),
        "mlp_classifier": (models.get("mlp_classifier", input_dim=5, num_classes=3), tabular),
        "lenet5": (models.get("lenet5"), digits),
    }
    if PDMP_MODELS:
        ar1_rows = models.ar1_data(0, 6, 10)[0]
        lgcp_rows = models.lgcp_data(0, 4, num_workers=4)[0][0]
        entries["ar1_student_t"] = (models.get("ar1_student_t", nu=4.0), ar1_rows)
        entries["lgcp"] = (models.get("lgcp", side=4), lgcp_rows)
        assert sorted(entries) == models.names()
    return entries


try:  # ar1_student_t and lgcp are the PDMP family's models, re-exported by the zoo
    import fedmcmc.pdmp.models  # noqa: F401

    PDMP_MODELS = True
except ImportError:
    PDMP_MODELS = False

ZOO = zoo()


@pytest.mark.parametrize("name", sorted(ZOO))
def test_per_example_log_likelihood_vectorises_with_finite_gradients(name):
    model, data = ZOO[name]
    assert model.name == name
    params = model.attributes["init"](jax.random.PRNGKey(1))
    n = jax.tree_util.tree_leaves(data)[0].shape[0]
    example = jax.tree_util.tree_map(lambda leaf: leaf[0], data)
    model.check_params(params, example)
    values = jax.jit(model.log_likelihood_per_example)(params, data)
    assert values.shape == (n,)
    assert np.all(np.isfinite(np.asarray(values)))
    one = jax.jit(model.log_likelihood)(params, example)
    np.testing.assert_allclose(float(one), float(values[0]), rtol=1e-5, atol=1e-5)
    grads = jax.jit(jax.grad(log_post(model, data)))(params)
    assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(params)
    for leaf in jax.tree_util.tree_leaves(grads):
        assert np.all(np.isfinite(np.asarray(leaf)))
    assert np.isfinite(float(model.log_prior(params)))


def test_likelihoods_are_normalised():
    """exp(log p(y | ...)) sums (integrates) to one over the outcome."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal(4).astype(np.float32)
    beta = jnp.asarray(0.4 * rng.standard_normal(4), jnp.float32)
    ones, zeros = np.float32(1), np.float32(0)
    logistic = models.logistic_regression(4)
    total = sum(np.exp(float(logistic.log_likelihood(beta, {"x": x, "y": y}))) for y in (ones, zeros))
    assert abs(total - 1) < 1e-5
    poisson = models.poisson_regression(4)
    total = sum(
        np.exp(float(poisson.log_likelihood(beta, {"x": x, "y": np.float32(k)}))) for k in range(60)
    )
    assert abs(total - 1) < 1e-4
    bern = models.bernoulli()
    total = sum(np.exp(float(bern.log_likelihood(jnp.float32(0.3), y))) for y in (ones, zeros))
    assert abs(total - 1) < 1e-5
    metric = models.metric_learning(eigenvectors=np.eye(4)[:, :2])
    params = {"gamma": jnp.array([0.5, 1.0]), "mu": jnp.float32(1.0)}
    total = sum(
        np.exp(float(metric.log_likelihood(params, {"xi": x, "xj": 0 * x, "y": y}))) for y in (ones, zeros)
    )
    assert abs(total - 1) < 1e-5
    linear = models.linear_regression(4, noise_std=0.8)
    mass = integrate.quad(
        lambda y: np.exp(float(linear.log_likelihood(beta, {"x": x, "y": np.float32(y)}))), -20, 20
    )[0]
    assert abs(mass - 1) < 1e-4
    gauss = models.gaussian_mean(1, noise_cov=2.0)
    mass = integrate.quad(lambda y: np.exp(float(gauss.log_likelihood(jnp.zeros(1), jnp.array([y])))), -30, 30)[0]
    assert abs(mass - 1) < 1e-4


def test_metric_learning_convention_close_pairs_are_similar():
    model = models.metric_learning(eigenvectors=np.eye(3))
    params = {"gamma": jnp.ones(3), "mu": jnp.float32(2.0)}
    x = jnp.zeros(3)
    near = {"xi": x, "xj": x + 0.1, "y": jnp.float32(1.0)}
    far = {"xi": x, "xj": x + 3.0, "y": jnp.float32(1.0)}
    assert float(model.log_likelihood(params, near)) > np.log(0.8)
    assert float(model.log_likelihood(params, far)) < np.log(0.01)
    # d_A = sum_k gamma_k ((xi - xj) . v_k)^2 and P(similar) = sigmoid(mu - d_A)
    d = 3 * 0.1**2
    assert abs(np.exp(float(model.log_likelihood(params, near))) - 1 / (1 + np.exp(d - 2.0))) < 1e-5


def test_metric_learning_pairs_share_no_class():
    rng = np.random.default_rng(0)
    labels = np.arange(2600) % 26
    inputs = np.column_stack([labels, rng.standard_normal((2600, 3))]).astype(np.float32)
    fed, test, train = models.metric_learning_pairs(inputs, labels, seed=1)
    assert fed.num_clients == 10 and fed.sizes.tolist() == [1000] * 10
    np.testing.assert_allclose(fed.weights, 0.1)
    seen = []
    for client in fed.clients:
        li, lj = client["xi"][:, 0], client["xj"][:, 0]
        np.testing.assert_array_equal(client["y"], (li == lj).astype(np.float32))
        assert client["y"].sum() == 500
        assert not np.any((li == lj) & np.all(client["xi"] == client["xj"], axis=1))  # i != j
        seen.append(set(np.concatenate([li, lj]).tolist()))
    for i in range(10):
        for j in range(i + 1, 10):
            assert not seen[i] & seen[j]
    assert test["y"].shape == (1000,) and test["y"].sum() == 500
    assert train.shape == (2080, 4)
    vectors = models.top_eigenvectors(train, 2)
    np.testing.assert_allclose(vectors.T @ vectors, np.eye(2), atol=1e-8)


def test_pdmp_bounds_hold():
    """Per-example elementwise Hessian bounds (fedmcmc.pdmp.bounds convention), summed over rows."""
    data, _ = synthetic.logistic_regression_data(30, 3, seed=2)
    model = models.logistic_regression(3, prior_scale=2.0)
    linear_data, _ = synthetic.linear_regression_data(30, 3, seed=2)
    linear = models.linear_regression(3, prior_precision=0.5, noise_std=0.7)
    bounds = {}
    for name, m, d in (("logistic", model, data), ("linear", linear, linear_data)):
        bounds[name] = np.asarray(jax.vmap(m.attributes["hessian_bound"])(d)).sum(0)
    hessians = {
        "logistic": jax.jit(jax.hessian(lambda b: -model.log_likelihood_sum(b, data))),
        "linear": jax.jit(jax.hessian(lambda b: -linear.log_likelihood_sum(b, linear_data))),
    }
    rng = np.random.default_rng(0)
    for _ in range(5):
        beta = jnp.asarray(2 * rng.standard_normal(3), jnp.float32)
        for name in bounds:
            h = np.abs(np.asarray(hessians[name](beta)))
            assert np.all(h <= bounds[name] * (1 + 1e-5) + 1e-5), name
    # the linear bound's diagonal is attained (quadratic potential)
    np.testing.assert_allclose(np.diag(np.asarray(hessians["linear"](beta))), np.diag(bounds["linear"]), rtol=1e-4)
    prior_h = np.abs(np.asarray(jax.hessian(lambda b: -model.log_prior(b))(beta)))
    np.testing.assert_allclose(prior_h, model.attributes["prior_hessian_bound"], rtol=1e-5)
    gauss = models.gaussian_mean(2, noise_cov=[[2.0, 0.5], [0.5, 1.0]])
    assert gauss.attributes["quadratic_potential"]
    bound = np.asarray(gauss.attributes["hessian_bound"](jnp.zeros(2)))
    h = np.asarray(jax.hessian(lambda mu: -gauss.log_likelihood(mu, jnp.ones(2)))(jnp.zeros(2)))
    np.testing.assert_allclose(np.abs(h), bound, rtol=1e-5)


@pytest.mark.skipif(not PDMP_MODELS, reason="fedmcmc.pdmp.models (PDMP family) is not importable")
def test_pdmp_models_are_re_exported():
    import fedmcmc.pdmp.models as pdmp_models

    ar1 = models.get("ar1_student_t", nu=3.0)
    assert ar1.name == "ar1_student_t" and "hessian_bound" in ar1.attributes
    params = ar1.attributes["init"]()
    assert set(params) == {"c", "x"}
    rows = models.ar1_data(0, 3, 5)[0]
    assert np.isfinite(float(ar1.log_likelihood_sum(params, rows)))
    cox = models.get("lgcp", side=4)
    np.testing.assert_allclose(cox.attributes["prior_precision"], pdmp_models.grid_precision(4))
    assert cox.attributes["init"]().shape == (16,)


# --------------------------------------------------------------------------- networks


def test_network_shapes_and_parameter_counts():
    lenet = models.lenet5()
    params = lenet.attributes["init"](0)
    count = sum(leaf.size for leaf in jax.tree_util.tree_leaves(params))
    assert count == 61706
    images = np.zeros((5, 784), np.float32)
    assert lenet.attributes["apply"](params, images).shape == (5, 10)
    probs = lenet.attributes["predict"](params, images.reshape(5, 28, 28))
    np.testing.assert_allclose(np.asarray(probs).sum(1), 1.0, rtol=1e-5)
    mlp = models.mlp_classifier(18, 2)
    params = mlp.attributes["init"](jax.random.PRNGKey(0))
    shapes = [(layer["w"].shape, layer["b"].shape) for layer in params["layers"]]
    assert shapes == [((18, 18), (18,)), ((18, 18), (18,)), ((18, 8), (8,)), ((8, 2), (2,))]
    assert mlp.attributes["apply"](params, np.zeros((7, 18), np.float32)).shape == (7, 2)
    flat = mlp.flatten(params)
    assert flat.dim == 18 * 18 + 18 + 18 * 18 + 18 + 18 * 8 + 8 + 8 * 2 + 2


# --------------------------------------------------------------------------- registry, evaluation


def test_registry():
    assert "logistic_regression" in models.names()
    assert models.get("logistic_regression", dim=6).name == "logistic_regression"
    with pytest.raises(ValueError, match="unknown"):
        models.get("nope")
    with pytest.raises(ValueError, match="bad arguments"):
        models.get("logistic_regression", dimension=6)
    with pytest.raises(ValueError, match="dim"):
        models.get("logistic_regression", dim=0)


def test_predictive_log_likelihood():
    data, _ = synthetic.logistic_regression_data(40, 3, seed=0)
    model = models.logistic_regression(3)
    rng = np.random.default_rng(0)
    draws = rng.standard_normal((2, 5, 3)).astype(np.float32)  # (chains, draws, d)
    matrix = models.log_likelihood_matrix(model, draws, data, batch_size=16)
    assert matrix.shape == (2, 5, 40)
    manual = np.array(
        [[np.asarray(model.log_likelihood_per_example(jnp.asarray(draws[c, d]), data)) for d in range(5)]
         for c in range(2)]
    )
    np.testing.assert_allclose(matrix, manual, rtol=1e-5, atol=1e-5)
    expected = models.predictive_log_likelihood(model, draws, data, method="expected")
    assert abs(expected - manual.mean()) < 1e-5
    predictive = models.predictive_log_likelihood(model, draws, data)
    direct = np.mean(np.log(np.exp(manual).reshape(10, 40).mean(0)))
    assert abs(predictive - direct) < 1e-5
    assert predictive >= expected  # Jensen
    curve = models.predictive_log_likelihood(model, draws, data, cumulative=True)
    assert curve.shape == (5,) and abs(curve[-1] - predictive) < 1e-9
    first = np.mean(np.log(np.exp(manual[:, 0]).mean(0)))
    assert abs(curve[0] - first) < 1e-5
    flat = models.predictive_log_likelihood(model, draws[0], data, sample_axes=1)
    assert np.isfinite(flat)
    with pytest.raises(ValueError, match="method"):
        models.predictive_log_likelihood(model, draws, data, method="median")


def test_zoo_model_samples_with_fm_sample():
    """Integration: a zoo model and a paper generator run through fm.sample as they are."""
    import fedmcmc as fm

    fed = fm.partition.delayed_communication_data(0)
    model = fm.models.get("gaussian_mean", dim=2)
    mean, cov = model.attributes["exact_posterior"](fed)
    result = fm.sample(
        model, fed, algorithm=fm.FSGLD(step_size=1e-4, batch_size=10, local_steps=20, surrogate="exact"),
        init=model.attributes["init"](), num_samples=200, burn_in=50, thin=10, chains=2, seed=0,
        progress=False,
    )
    draws = np.asarray(result.samples)
    assert draws.shape == (2, 200, 2) and np.all(np.isfinite(draws))
    # Only that the chains reach the posterior region from 0 (|mean| ~ 1.8): the statistical
    # checks of FSGLD live with the Langevin family (its minibatch noise here is large).
    assert np.abs(draws.reshape(-1, 2).mean(0) - mean).max() < 1.0


def test_data_generators_match_the_models():
    for name in models.names():
        generate = models.data_generator(name)
        if generate is None:
            continue
        params = {"dim": 3} if name != "bernoulli" else {}
        model = models.get(name, **params)
        data = generate(params, num_examples=20, seed=1)
        values = model.log_likelihood_per_example(model.attributes["init"](), data)
        assert values.shape == (20,) and np.all(np.isfinite(np.asarray(values))), name
    with pytest.raises(ValueError, match="unknown"):
        models.data_generator("nope")
    assert models.data_generator("lenet5") is None


def test_per_client_gradients_from_unpadded_rows_equal_the_padded_sums(monkeypatch):
    """``PaddedData.unpadded`` keeps exactly the real rows (client after client) and
    ``FlatModel.grad_log_likelihood_per_client`` gives each client's own gradient sum at its
    own position, as the padded per-client sums do; the decentralised full-batch gradients
    agree between their two layouts. Cars93 by manufacturer: 32 clients of 1-8 rows."""
    from toy_problems import cars93_federation

    from fedmcmc import federation as federation_module
    from fedmcmc.decentralised import kernels

    federation = cars93_federation()
    padded = federation.padded()
    assert padded.padding_share > 0.5
    rows, owner = padded.unpadded()
    sizes = np.asarray(federation.sizes)
    assert np.asarray(owner).tolist() == np.repeat(np.arange(32), sizes).tolist()
    assert np.asarray(rows["y"]).shape[0] == sizes.sum()
    model = fm.models.linear_regression(3, noise_std=0.5)
    flat = model.flatten(jnp.zeros(3))
    positions = jnp.asarray(np.random.default_rng(1).normal(size=(32, 3)), jnp.float32)
    per_client = flat.grad_log_likelihood_per_client(positions, rows, owner)
    padded_sums = jax.vmap(flat.grad_log_likelihood_sum)(positions, padded.data, padded.mask)
    np.testing.assert_allclose(per_client, padded_sums, rtol=2e-5, atol=1e-4)
    assert padded.mostly_padding
    ragged = kernels.full_gradient_fn(flat, padded)(positions)
    monkeypatch.setattr(federation_module, "UNPADDED_ABOVE_PADDING", 1.0)  # padded layout
    np.testing.assert_allclose(ragged, kernels.full_gradient_fn(flat, padded)(positions),
                               rtol=2e-5, atol=1e-4)
