"""Bad input raises ValueError naming the argument (CONTRACT.md), and good input is kept as given."""

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm


def gaussian_model():
    return fm.Model(
        log_prior=lambda mu: -0.5 * jnp.sum(mu**2),
        log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2),
    )


def clients(sizes=(20, 30, 25), dim=2, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(i, 1.0, size=(n, dim)).astype(np.float32) for i, n in enumerate(sizes)]


def test_federation_defaults_to_size_proportional_weights():
    fed = fm.Federation(clients())
    np.testing.assert_allclose(fed.weights, np.array([20, 30, 25]) / 75)
    assert fed.num_clients == 3 and fed.total_size == 75


def test_federation_keeps_given_weights():
    fed = fm.Federation(clients(), weights=[0.2, 0.3, 0.5])
    np.testing.assert_allclose(fed.weights, [0.2, 0.3, 0.5])


@pytest.mark.parametrize(
    "make, argument",
    [
        (lambda: fm.Federation([np.array([[1.0, np.nan]])]), "clients[0]"),
        (lambda: fm.Federation([np.ones((3, 2)), np.array([[np.inf, 0.0]])]), "clients[1]"),
        (lambda: fm.Federation([np.ones((3, 2)), np.zeros((0, 2))]), "clients[1]"),
        (lambda: fm.Federation([{"x": np.ones((3, 2)), "y": np.ones(4)}]), "clients[0]"),
        (lambda: fm.Federation([np.ones((3, 2)), np.ones((3, 3))]), "clients[1]"),
        (lambda: fm.Federation([]), "clients"),
        (lambda: fm.Federation(clients(), weights=[0.5, 0.6, -0.1]), "weights"),
        (lambda: fm.Federation(clients(), weights=[0.2, 0.2, 0.2]), "weights"),
        (lambda: fm.Federation(clients(), weights=[0.5, 0.5]), "weights"),
    ],
)
def test_bad_federations(make, argument):
    with pytest.raises(ValueError, match=argument.replace("[", r"\[").replace("]", r"\]")):
        make()


@pytest.mark.parametrize(
    "make, argument",
    [
        (lambda: fm.SGLD(step_size=0.0, batch_size=5), "step_size"),
        (lambda: fm.SGLD(step_size=-1e-3, batch_size=5), "step_size"),
        (lambda: fm.DSGLD(step_size=1e-3, batch_size=0, local_steps=5), "batch_size"),
        (lambda: fm.DSGLD(step_size=1e-3, batch_size=5, local_steps=0), "local_steps"),
        (lambda: fm.FSGLD(step_size=1e-3, batch_size=5, local_steps=5, surrogate="vi"), "surrogate"),
        (lambda: fm.FSGLD(step_size=1e-3, batch_size=5, local_steps=5, alpha=-1), "alpha"),
        (lambda: fm.FSGLD(step_size=float("nan"), batch_size=5, local_steps=5), "step_size"),
    ],
)
def test_bad_hyperparameters(make, argument):
    with pytest.raises(ValueError, match=argument):
        make()


def run(algorithm, init=None, **kwargs):
    settings = dict(num_samples=5, chains=2, seed=0)
    settings.update(kwargs)
    return fm.sample(
        gaussian_model(),
        fm.Federation(clients()),
        algorithm,
        init=jnp.zeros(2) if init is None else init,
        **settings,
    )


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(num_samples=0), "num_samples"),
        (dict(burn_in=-1), "burn_in"),
        (dict(thin=0), "thin"),
        (dict(chains=0), "chains"),
        (dict(engine="mpi"), "engine"),
        (dict(init=jnp.zeros(3)), "init"),
        (dict(init={"mu": jnp.zeros(2)}), "init"),
        (dict(init=jnp.array([0.0, jnp.nan])), "init"),
    ],
)
def test_bad_sample_arguments(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        run(fm.DSGLD(step_size=1e-3, batch_size=5, local_steps=2), **kwargs)


def test_exact_surrogate_refuses_non_gaussian_likelihood():
    model = fm.Model(
        log_prior=lambda w: -0.5 * jnp.sum(w**2),
        log_likelihood=lambda w, x: -jnp.logaddexp(0.0, -jnp.dot(w, x)),
    )
    with pytest.raises(ValueError, match="surrogate='exact'"):
        fm.sample(
            model,
            fm.Federation(clients()),
            fm.FSGLD(step_size=1e-3, batch_size=5, local_steps=2, surrogate="exact"),
            init=jnp.zeros(2),
            num_samples=2,
        )


def test_sgld_surrogate_warns_when_its_local_chains_did_not_mix():
    """A surrogate fitted from an unmixed SGLD chain measures the chain's length, not the
    likelihood (FSGLD Table 1 diagnosis): flagged; a well-mixed fit is not."""
    import warnings

    from fedmcmc.surrogates import SurrogateMixingWarning

    fed = fm.Federation(clients(sizes=(200, 200, 200)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", SurrogateMixingWarning)
        fm.FSGLD(step_size=1e-3, batch_size=10, local_steps=2, surrogate="sgld").fit_surrogates(
            gaussian_model(), fed, jnp.zeros(2))  # h K curvature = 600: mixed
    with pytest.warns(SurrogateMixingWarning, match="mixed poorly") as caught:
        fm.FSGLD(step_size=1e-5, batch_size=10, local_steps=2, surrogate="sgld").fit_surrogates(
            gaussian_model(), fed, jnp.zeros(2))  # h K curvature = 6: a few relaxation times
    # the warning points at the caller's line, not inside fedmcmc (fedmcmc.callsite)
    assert [w.filename for w in caught] == [__file__]


def test_warnings_from_inside_sample_point_at_the_callers_line():
    """A warning raised deep in fm.sample (here the step-size check of the set-up) is reported
    at the line that called fm.sample, so a user's filters and tracebacks name their code."""
    from fedmcmc.langevin.step_size import StepSizeWarning

    with pytest.warns(StepSizeWarning, match="minibatch noise") as caught:
        run(fm.FSGLD(step_size=0.005, batch_size=2, local_steps=5), num_samples=5)
    assert {w.filename for w in caught if issubclass(w.category, StepSizeWarning)} == {
        __file__}


def test_sgld_surrogate_fit_that_diverges_is_refused_by_name():
    """Local SGLD chains past their stability limit give non-finite surrogates (a mean of
    inf makes the shift nan even where the precision comes out 0): a ValueError naming
    surrogate_step_size, not a failure deep in the set-up's eigenvalue solver."""
    fed = fm.Federation(clients(sizes=(200, 200, 200)))
    with pytest.raises(ValueError, match="surrogate_step_size"):
        fm.FSGLD(step_size=1e-3, batch_size=10, local_steps=2, surrogate="sgld",
                 surrogate_step_size=10.0).fit_surrogates(gaussian_model(), fed, jnp.zeros(2))


def test_shapes_of_samples_and_info():
    result = run(fm.FSGLD(step_size=1e-3, batch_size=5, local_steps=3), num_samples=7, thin=2, burn_in=4, chains=3)
    assert result.samples.shape == (3, 7, 2)
    assert result.info["iterations"] == (7 + 4) * 2
    assert sum(result.info["visits_per_client"]) == sum(result.info["rounds_per_chain"])
    assert result.info["floats_communicated"] > 0
    assert result.info["bytes_communicated"] == 4 * result.info["floats_communicated"]
    idata = result.to_arviz()
    assert idata.posterior["theta"].shape == (3, 7, 2)


def test_pytree_parameters_round_trip():
    model = fm.Model(
        log_prior=lambda p: -0.5 * (jnp.sum(p["a"] ** 2) + p["b"] ** 2),
        log_likelihood=lambda p, x: -0.5 * jnp.sum((x - p["a"] - p["b"]) ** 2),
    )
    init = {"a": jnp.zeros(2), "b": jnp.asarray(0.0)}
    result = fm.sample(
        model, fm.Federation(clients()), fm.SGLD(step_size=1e-3, batch_size=5), init=init,
        num_samples=4, chains=2,
    )
    assert result.samples["a"].shape == (2, 4, 2)
    assert result.samples["b"].shape == (2, 4)
    assert set(result.to_arviz().posterior.data_vars) == {"a", "b"}


def test_diverging_chain_stops_with_error_and_keeps_earlier_draws():
    # A step size far beyond 4/N makes the Gaussian recursion explode geometrically.
    with pytest.raises(fm.SamplingDivergedError) as caught:
        run(fm.DSGLD(step_size=0.5, batch_size=5, local_steps=3), num_samples=400, chains=2)
    error = caught.value
    assert "chain" in str(error) and "client" in str(error) and "round" in str(error)
    assert error.result is not None
    draws = error.result.flat_samples()
    assert draws.shape[0] == 2 and draws.shape[1] >= 1
    assert np.isfinite(draws[:, 0]).all()
    assert error.chains
