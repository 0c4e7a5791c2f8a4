"""DULA / GT-DULA kernels and the public classes: equations (3)-(8), the tracking
invariant, minibatch estimators, result layout and argument checks."""

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc.decentralised import graphs, kernels
from fedmcmc.schedules import constant, piecewise_constant


def logistic_problem(n_agents=6, dim=3, seed=0):
    """Non-IID logistic regression: each agent's features are shifted differently."""
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=dim)
    clients = []
    for i in range(n_agents):
        size = 15 + 5 * i
        x = rng.normal(loc=0.5 * (i - n_agents / 2), size=(size, dim)).astype(np.float32)
        y = (rng.uniform(size=size) < 1 / (1 + np.exp(-x @ w_true))).astype(np.float32)
        clients.append({"x": x, "y": y})

    def log_likelihood(w, example):
        logit = jnp.dot(example["x"], w["w"]) + w["b"][0]
        return example["y"] * logit - jnp.logaddexp(0.0, logit)

    model = fm.Model(
        log_prior=lambda p: -0.5 * (jnp.sum(p["w"] ** 2) + jnp.sum(p["b"] ** 2)),
        log_likelihood=log_likelihood,
    )
    init = {"w": jnp.zeros(dim), "b": jnp.zeros(1)}
    return model, fm.Federation(clients), init


def setup_kernel(batch_size, n_agents=6):
    model, fed, init = logistic_problem(n_agents)
    flat = model.flatten(init)
    padded = fed.padded()
    topo = graphs.topology("ring", n_agents)
    local = kernels.local_gradient_fn(flat, padded, batch_size)
    return model, fed, init, flat, padded, topo, local


def numpy_full_gradients(fed, positions):
    """grad E_i(w_i) = -grad log p(X_i|w_i) - (1/n) grad log p(w_i), agent by agent in NumPy.

    Flat layout of {"b", "w"}: [b, w_0, w_1, w_2] (ravel_pytree sorts dict keys)."""
    n = fed.num_clients
    out = []
    for i in range(n):
        x, y = fed[i]["x"].astype(np.float64), fed[i]["y"].astype(np.float64)
        theta = np.asarray(positions[i], dtype=np.float64)
        b, w = theta[0], theta[1:]
        residual = y - 1 / (1 + np.exp(-(x @ w + b)))
        grad_loglik = np.concatenate([[residual.sum()], x.T @ residual])
        out.append(-grad_loglik + theta / n)
    return np.stack(out)


def test_deterministic_steps_follow_equations_3_7_8():
    """noise=False: one DULA step is W_beta w - alpha n grad E(w); two GT-DULA steps
    follow (7)-(8) with d_0 = g_0, computed agent by agent in NumPy."""
    model, fed, init, flat, padded, topo, local = setup_kernel(None)
    n, alpha, beta, gamma = fed.num_clients, 1e-3, 0.2, 0.15
    w0 = np.random.default_rng(1).normal(size=(n, flat.dim)).astype(np.float32)
    Wb, Wg = topo.mixing(beta), topo.mixing(gamma)
    key = jax.random.key(0)
    g0 = numpy_full_gradients(fed, w0)

    dula = jax.jit(kernels.dula_kernel(local, topo.mixer(), beta, constant(alpha), n, noise=False))
    state = dula(key, kernels.dula_init(jnp.asarray(w0)))
    np.testing.assert_allclose(state.position, Wb @ w0 - alpha * n * g0, rtol=1e-5, atol=1e-6)

    gt = jax.jit(kernels.gtdula_kernel(local, topo.mixer(), beta, gamma, constant(alpha), n, noise=False))
    state = jax.jit(lambda k, w: kernels.gtdula_init(k, w, local))(key, jnp.asarray(w0))
    np.testing.assert_allclose(state.tracker, g0, rtol=1e-5, atol=1e-6)
    w, d, g = w0.astype(np.float64), g0, g0
    for _ in range(2):
        state = gt(key, state)
        w = Wb @ w - alpha * n * d
        g_new = numpy_full_gradients(fed, w)
        d = Wg @ d + g_new - g
        g = g_new
    np.testing.assert_allclose(state.position, w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.tracker, d, rtol=1e-4, atol=1e-4)


def test_kernel_steps_draw_with_jax_random():
    """One DULA and one minibatch GT-DULA step equal the same equations written with
    jax.random.split / uniform / normal (the streams the Ray engine reproduces)."""
    model, fed, init, flat, padded, topo, local = setup_kernel(5)
    n, alpha, beta, gamma, m = fed.num_clients, 1e-3, 0.2, 0.15, 5
    mix = topo.mixer()
    w0 = jnp.asarray(np.random.default_rng(1).normal(size=(n, flat.dim)), jnp.float32)

    def reference_gradient(key, w):
        def one(k, theta, data, size):
            u = jax.random.uniform(k, (m,))
            rows = jnp.minimum((u * size).astype(jnp.int32), size - 1)
            batch = jax.tree_util.tree_map(lambda leaf: leaf[rows], data)
            return -(size.astype(theta.dtype) / m) * flat.grad_log_likelihood_sum(theta, batch) - (
                flat.grad_log_prior(theta) / n)
        return jax.vmap(one)(jax.random.split(key, n), w, padded.data, padded.sizes)

    def reference_gtdula(key, w, d, g):
        key_grad, key_noise = jax.random.split(key)
        new_w = mix(w, beta) - alpha * n * d + jnp.sqrt(2.0 * alpha * n) * jax.random.normal(
            key_noise, w.shape, w.dtype)
        new_g = reference_gradient(key_grad, new_w)
        return new_w, mix(d, gamma) + new_g - g

    key = jax.random.key(11)
    state = jax.jit(lambda k: kernels.gtdula_init(k, w0, local))(key)
    np.testing.assert_array_equal(state.gradient, jax.jit(reference_gradient)(key, w0))
    step = kernels.gtdula_kernel(local, mix, beta, gamma, constant(alpha), n)
    new = jax.jit(step)(jax.random.key(12), state)
    w_ref, d_ref = jax.jit(reference_gtdula)(jax.random.key(12), state.position, state.tracker,
                                             state.gradient)
    np.testing.assert_allclose(new.position, w_ref, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(new.tracker, d_ref, rtol=1e-6, atol=1e-6)

    full = kernels.local_gradient_fn(flat, padded, None)
    dula = jax.jit(kernels.dula_kernel(full, mix, beta, constant(alpha), n))
    key_noise = jax.random.split(jax.random.key(13))[1]
    expected = mix(w0, beta) - alpha * n * full(None, w0) + jnp.sqrt(2.0 * alpha * n) * (
        jax.random.normal(key_noise, w0.shape))
    np.testing.assert_allclose(dula(jax.random.key(13), kernels.dula_init(w0)).position, expected,
                               rtol=1e-6, atol=1e-6)


def test_noise_has_variance_2_alpha_n():
    """With zero gradients and no mixing effect on the average, w_bar moves by N(0, 2 alpha I)
    and each agent by N(0, 2 alpha n I) (equation (3))."""
    n, dim, alpha = 8, 2, 1e-2
    topo = graphs.topology("complete", n)
    zero_grad = lambda key, w: jnp.zeros_like(w)  # noqa: E731
    step = kernels.dula_kernel(zero_grad, topo.mixer(), 0.0, constant(alpha), n)
    keys = jax.random.split(jax.random.key(3), 4000)
    moves = jax.jit(jax.vmap(lambda k: step(k, kernels.dula_init(jnp.zeros((n, dim)))).position))(keys)
    moves = np.asarray(moves)
    assert moves.var() == pytest.approx(2 * alpha * n, rel=0.05)
    assert moves.mean(axis=1).var() == pytest.approx(2 * alpha, rel=0.08)


def tracking_gaps(step, states, steps=300, seed=0):
    """Per initial state (stacked on a leading axis): max over steps of
    |mean_i d_i - mean_i g_hat_i|, relative to the gradients' size."""
    def gap(state):
        return jnp.max(jnp.abs(state.tracker.mean(0) - state.gradient.mean(0))) / (
            jnp.max(jnp.abs(state.gradient)) + 1.0
        )

    def run(state):
        def body(state, key):
            state = step(key, state)
            return state, gap(state)

        _, gaps = jax.lax.scan(body, state, jax.random.split(jax.random.key(seed), steps))
        return jnp.maximum(gap(state), jnp.max(gaps))

    return np.asarray(jax.jit(jax.vmap(run))(states))


@pytest.mark.parametrize("batch_size", [None, 5])
def test_tracking_invariant_holds_at_every_step(batch_size):
    """Mean of the trackers = mean of the current local gradient estimates (1^T L = 0),
    for full-batch and minibatch gradients and a decaying step size; a tracker that is
    not initialised to the first gradient estimate (d_0 = 0) breaks it and is rejected
    by the same check."""
    model, fed, init, flat, padded, topo, local = setup_kernel(batch_size)
    n = fed.num_clients
    schedule = piecewise_constant([100, 200], [1e-3, 1e-4, 1e-5])
    step = kernels.gtdula_kernel(local, topo.mixer(), 0.3, 0.2, schedule, n)
    w0 = jnp.broadcast_to(flat.ravel(init), (n, flat.dim))
    state = jax.jit(lambda k: kernels.gtdula_init(k, w0, local))(jax.random.key(1))
    broken = state._replace(tracker=jnp.zeros_like(state.tracker))
    both = jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), state, broken)
    good_gap, broken_gap = tracking_gaps(step, both)
    tolerance = 1e-5  # float32 rounding of the mixing sums, relative
    assert good_gap < tolerance, good_gap
    assert broken_gap > 100 * tolerance, broken_gap


def test_minibatch_estimator_is_unbiased():
    model, fed, init, flat, padded, topo, _ = setup_kernel(None)
    n = fed.num_clients
    w = jnp.asarray(np.random.default_rng(2).normal(size=(n, flat.dim)), dtype=jnp.float32)
    full = np.asarray(jax.jit(kernels.full_gradient_fn(flat, padded))(w))
    local = kernels.local_gradient_fn(flat, padded, 4)
    draws = np.asarray(jax.jit(jax.vmap(lambda k: local(k, w)))(jax.random.split(jax.random.key(0), 20000)))
    se = draws.std(axis=0) / np.sqrt(draws.shape[0])
    assert np.all(np.abs(draws.mean(axis=0) - full) < 5 * se + 1e-4)
    # a batch the size of the smallest agent uses all of that agent's rows: exact gradient
    exact = kernels.local_gradient_fn(flat, padded, int(fed.sizes.min()))
    np.testing.assert_allclose(jax.jit(exact)(jax.random.key(5), w)[0], full[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("algorithm", [
    fm.DULA(step_size=1e-3, beta=0.3),
    # breaks Condition 1 (warned, not refused) and its agents drift apart (the spread check
    # is off: this test is about the result's layout)
    fm.GTDULA(step_size=1e-3, beta=0.3, gamma=0.3, batch_size=5, graph="exponential",
              condition="warn", spread_limit=None),
])
def test_result_layout(algorithm):
    model, fed, init = logistic_problem()
    if algorithm.name == "GTDULA":
        # exponential graph on 6 agents: lambda_2 = 4, so gamma = 0.3 > 1/lambda_2 breaks Condition 1
        with pytest.warns(graphs.ConditionWarning, match=r"min\(beta, 1/lambda_2\) = min\(0.3, 1/4\)") as caught:
            result = fm.sample(model, fed, algorithm, init=init, num_samples=30, burn_in=5,
                               thin=3, chains=2, seed=0)
        # reported at this line (the caller of fm.sample), not inside fedmcmc
        assert {w.filename for w in caught if w.category is graphs.ConditionWarning} == {__file__}
        assert result.info["condition_1"]
    else:
        result = fm.sample(model, fed, algorithm, init=init, num_samples=30, burn_in=5, thin=3,
                           chains=2, seed=0)
        assert result.info["condition_1"] == []
    n = fed.num_clients
    assert result.samples["w"].shape == (2, 30, 3) and result.samples["b"].shape == (2, 30, 1)
    agents = result.info["agent_samples"]
    assert agents["w"].shape == (2, 30, n, 3) and agents["b"].shape == (2, 30, n, 1)
    assert isinstance(agents["w"], np.ndarray)
    np.testing.assert_allclose(agents["w"].mean(axis=2), result.samples["w"], atol=1e-5)
    assert set(result.sample_stats) == {"consensus_error", "gradient_error"}
    ce = ((agents["w"] - agents["w"].mean(2, keepdims=True)) ** 2).sum((2, 3))
    ce += ((agents["b"] - agents["b"].mean(2, keepdims=True)) ** 2).sum((2, 3))
    np.testing.assert_allclose(result.sample_stats["consensus_error"], ce / n, rtol=1e-3, atol=1e-8)
    from fedmcmc.decentralised import diagnostics

    flat_agents = np.concatenate([agents["b"], agents["w"]], axis=-1)
    np.testing.assert_allclose(diagnostics.consensus_error(flat_agents), ce / n, rtol=1e-6)
    np.testing.assert_array_equal(diagnostics.agent_draws(result, 2)["w"], agents["w"][:, :, 2])
    info = result.info
    assert info["n_agents"] == n and info["iterations"] == 35 * 3 and info["dim"] == 4
    per_message = 4 * (2 if algorithm.name == "GTDULA" else 1)
    # one message per directed edge, iteration and chain (messages); on Ray one transfer
    # per directed edge and iteration carries both chains' states (messages_between_agents)
    assert info["messages_between_agents"] == 35 * 3 * 2 * info["edges"]
    assert info["messages"] == 2 * info["messages_between_agents"]
    assert info["floats_communicated"] == info["messages"] * per_message
    assert result.to_arviz() is not None


def test_bad_arguments_raise_value_errors_naming_them():
    model, fed, init = logistic_problem()
    for make, name in [
        (lambda: fm.DULA(step_size=0.0, beta=0.3), "step_size"),
        (lambda: fm.DULA(step_size=-1e-3, beta=0.3), "step_size"),
        (lambda: fm.DULA(step_size=float("nan"), beta=0.3), "step_size"),
        (lambda: fm.DULA(step_size=1e-3, beta=0.0), "beta"),
        (lambda: fm.GTDULA(step_size=1e-3, beta=0.3, gamma=-0.1), "gamma"),
        (lambda: fm.DULA(step_size=1e-3, beta=0.3, batch_size=0), "batch_size"),
        (lambda: fm.DULA(step_size=1e-3, beta=0.3, graph=nx.Graph([(0, 1), (2, 3)])), "graph"),
        (lambda: fm.DULA(step_size=1e-3, beta=0.3, graph="hexagon"), "graph"),
        (lambda: fm.DULA(step_size=1e-3, beta=0.3, condition="sometimes"), "condition"),
        (lambda: fm.DULA(step_size=1e-3, beta=0.3, decay_every=0), "decay_every"),
        (lambda: fm.DULA(step_size="automatic", beta=0.3), "step_size"),
        (lambda: fm.DULA(step_size=1e-3, beta="best"), "beta"),
        (lambda: fm.GTDULA(gamma="auto-ish"), "gamma"),
        (lambda: fm.GTDULA(tolerance=0.0), "tolerance"),
        (lambda: fm.GTDULA(spread_limit=-1.0), "spread_limit"),
    ]:
        with pytest.raises(ValueError, match=name):
            make()
    for algorithm, name in [
        (fm.GTDULA(step_size=1e-3, beta=0.3, gamma=0.2, graph=nx.cycle_graph(5)), "graph"),
        (fm.GTDULA(step_size=1e-3, beta=1.5, gamma=0.2, condition="raise"), "beta"),
        (fm.GTDULA(step_size=1e-3, beta=0.3, gamma=0.9, condition="raise"), "gamma"),
        # Condition 1 is refused by default (issue 16)
        (fm.GTDULA(step_size=1e-3, beta=1.5, gamma=0.2), "beta"),
        (fm.GTDULA(step_size=1e-3, beta=0.3, gamma=0.9), "gamma"),
        (fm.DULA(step_size=1e-3, beta=0.6), "beta"),
    ]:
        with pytest.raises(ValueError, match=name):
            fm.sample(model, fed, algorithm, init=init, num_samples=2)
    with pytest.raises(ValueError, match="init"):
        fm.sample(model, fed, fm.DULA(step_size=1e-3, beta=0.3), init=jnp.zeros(4), num_samples=2)


def test_decaying_step_size_and_divergence():
    from fedmcmc.schedules import decaying_schedule

    schedule = decaying_schedule(1e-3, 10, 0.1)
    assert [float(schedule(t)) for t in (0, 9, 10, 25)] == pytest.approx([1e-3, 1e-3, 1e-4, 1e-5])
    model, fed, init = logistic_problem()
    # a diverging agent is caught even when only the network average is kept
    with pytest.raises(fm.SamplingDivergedError) as info:
        fm.sample(model, fed, fm.DULA(step_size=5.0, beta=0.3, keep_agent_samples=False),
                  init=init, num_samples=50, seed=0)
    assert info.value.result is not None and info.value.chains == [0]
    assert "agent_samples" not in info.value.result.info
    shape = info.value.result.samples["w"].shape
    assert shape[0] == 1 and shape[2] == 3 and np.isnan(info.value.result.samples["w"][0, -1]).all()
