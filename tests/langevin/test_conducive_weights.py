"""FSGLD's per-client conducive weights under ``step_size="auto"`` (issues 44 and 45).

A surrogate that predicts its client's gradient at draws of the posterior's Laplace fit worse
than predicting nothing is damped to its least-squares weight (``step_size.conducive_weights``);
one that predicts at least as well keeps the paper's weight 1. Checked on a Gaussian-mean
federation whose exact surrogates are replaced, client by client, by wrong ones: the
statistics each client measures (``setup.InProcessClients.noise``) must keep the exact
surrogates, switch off a sign-flipped one and damp a three-times-too-steep one to about 1/3.
A plausible broken rule (keep every surrogate whose prediction points the right way, X > 0)
keeps the too-steep one and is rejected by the same check.
"""

import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc import surrogates as surrogate_module
from fedmcmc.langevin import setup, step_size

SIZES = (40, 60, 50, 30)
#: what each client's surrogate is made of its exact one: kept, flipped, three times too steep
KINDS = ("exact", "flipped", "steep", "exact")
MODEL = fm.Model(log_prior=lambda mu: -0.5 * jnp.sum(mu ** 2) / 10.0,
                 log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2))


def _federation():
    rng = np.random.default_rng(3)
    return fm.Federation([rng.normal(rng.uniform(-2, 2, 2), 1.0, size=(n, 2)).astype(np.float32)
                          for n in SIZES])


def _wrong_surrogates(exact):
    factor = np.array([{"exact": 1.0, "flipped": -1.0, "steep": 3.0}[k] for k in KINDS])
    return surrogate_module.GaussianSurrogates(
        precision=exact.precision * factor[:, None, None],
        shift=exact.shift * factor[:, None])


def _measured_prediction():
    """The clients' prediction statistics of the wrong surrogates, as the set-up measures them."""
    federation = _federation()
    flat = MODEL.flatten(jnp.zeros(2))
    theta0 = jnp.zeros(2)
    exact = surrogate_module.fit_surrogates("exact", flat, federation, theta0)
    center, precision = surrogate_module.laplace_of_product(flat, exact, theta0)
    clients = setup.InProcessClients(flat, federation, federation.concatenated(), theta0,
                                     setup.setup_key(0), 10, {})
    noise = clients.noise(None, center, precision, _wrong_surrogates(exact), 1.0)
    return noise.prediction


def _check_rule(rule, prediction):
    weights, errors = rule(prediction)
    weights = np.asarray(weights)
    assert weights[0] == 1.0 and weights[3] == 1.0, weights  # exact surrogates kept
    assert weights[1] == 0.0, weights  # pointing the wrong way: switched off
    assert 0.25 < weights[2] < 0.45, weights  # too steep: damped to about 1/3
    # relative errors: about 0 (exact), 4 (flipped: |2g|^2), 4 (steep: |2g|^2)
    assert np.all(np.asarray(errors)[[0, 3]] < 0.2), errors
    assert np.all(np.asarray(errors)[[1, 2]] > 2.0), errors


def _sign_rule(prediction):
    """Broken: keep a surrogate whenever it points the right way on average (X > 0)."""
    prediction = np.asarray(prediction, np.float64)
    squared, cross, surrogate, _ = prediction.T
    return np.where(cross > 0, 1.0, 0.0), (squared - 2 * cross + surrogate) / squared


def test_poor_surrogates_are_damped_and_good_ones_kept():
    prediction = _measured_prediction()
    _check_rule(step_size.conducive_weights, prediction)
    with pytest.raises(AssertionError):
        _check_rule(_sign_rule, prediction)


def test_conducive_weights_edge_cases():
    # no surrogate gradient at all: nothing to weigh (1); non-finite statistics: off (0)
    weights, _ = step_size.conducive_weights(np.array([[1.0, 0.0, 0.0, 0.0],
                                                       [1.0, np.nan, 1.0, 1.0]]))
    np.testing.assert_array_equal(weights, [1.0, 0.0])
    # worse than zero by a margin within the noise of the points (16 draws whose excess
    # errors Q - 2X spread with sd 10 around a mean of 1: sum 16, standard error 40): kept;
    # the same excess with no spread: damped to X / Q
    kept = [1.0, -6.0, 4.0, 16 * (1.0 + 100.0)]
    damped = [1.0, -6.0, 4.0, 16 * 1.0]
    weights, _ = step_size.conducive_weights(np.array([kept, damped]), points=16)
    np.testing.assert_array_equal(weights, [1.0, 0.0])


@pytest.mark.slow  # 8 s on 2 loaded cores; the rule itself is checked above
def test_auto_applies_the_weights_to_the_run():
    """FSGLD "auto" with the wrong surrogates given: info records the weights, the warning
    names the damped clients; with the
    exact surrogates (the default on this federation) nothing is weighted and nothing warned."""
    federation = _federation()
    flat = MODEL.flatten(jnp.zeros(2))
    exact = surrogate_module.fit_surrogates("exact", flat, federation, jnp.zeros(2))
    wrong = _wrong_surrogates(exact)
    run = dict(init=jnp.zeros(2), num_samples=20, burn_in=5, thin=2, chains=1, seed=0,
               progress=False)
    with pytest.warns(surrogate_module.SurrogatePredictionWarning, match="client 1"):
        warnings.simplefilter("ignore", fm.ConvergenceWarning)  # a run too short to converge
        result = fm.sample(MODEL, federation, fm.FSGLD(
            step_size="auto", batch_size=10, local_steps=5,
            surrogate=(wrong.precision, wrong.shift)), **run)
    weights = np.asarray(result.info["conducive_weights"])
    assert weights[0] == weights[3] == 1.0 and weights[1] == 0.0 and 0 < weights[2] < 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("error", surrogate_module.SurrogatePredictionWarning)
        warnings.simplefilter("ignore", fm.ConvergenceWarning)
        result = fm.sample(MODEL, federation, fm.FSGLD(
            step_size="auto", batch_size=10, local_steps=5, surrogate="exact"), **run)
    assert result.info["conducive_weights"] == [1.0] * len(SIZES)
