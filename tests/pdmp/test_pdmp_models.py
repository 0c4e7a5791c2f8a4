"""Appendix F / E.1 models and the optional features (control variates, redistribution, privacy,
skeleton). Long runs: all marked slow."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc.pdmp import models

pytestmark = pytest.mark.slow


def _nuts(logdensity, dim, n=3000):
    import blackjax

    with jax.enable_x64(True):
        (state, params), _ = blackjax.window_adaptation(blackjax.nuts, logdensity).run(
            jax.random.key(0), jnp.zeros(dim), num_steps=400)
        kernel = blackjax.nuts(logdensity, **params).step

        def body(s, k):
            s, _ = kernel(k, s)
            return s, s.position

        return np.asarray(jax.jit(lambda s: jax.lax.scan(body, s, jax.random.split(jax.random.key(1), n))[1])(state))


def _close(info, reference, z=4.0):
    ess = np.asarray(info["ess_batch_means"])
    m = np.asarray(info["trajectory_mean"])
    sd = reference.std(axis=0)
    se = sd * np.sqrt(1 / ess + 1 / 300)  # both estimates are noisy
    return np.all(np.abs(m - reference.mean(axis=0)) < z * se)


def test_lgcp_four_spatial_blocks_matches_nuts():
    side = 4
    model = models.lgcp_model(side)
    clients, _ = models.lgcp_data(0, side, num_workers=4)
    fed = fm.Federation(clients)
    result = fm.sample(model, fed, fm.FedZigZag(0.05), init=np.zeros(side * side, np.float32),
                       num_samples=2000, burn_in=100, chains=2, progress=False)
    assert result.info["bound"] == "custom"
    assert result.info["coordinates_per_worker"] == [4, 4, 4, 4]  # Remark 3.1
    assert result.info["bound_violations"] == 0
    pooled = fed.pooled()
    ref = _nuts(lambda x: model.log_prior(x)
                + jnp.sum(jax.vmap(model.log_likelihood, (None, 0))(x, pooled)), side * side)
    assert _close(result.info, ref)


def test_ar1_student_t_matches_nuts():
    model = models.ar1_model(nu=3.0)
    fed = fm.Federation(models.ar1_data(0, 20, 25, num_workers=4))
    result = fm.sample(model, fed, fm.FedZigZag(0.05), init={"x": np.float32(0), "c": np.float32(0)},
                       num_samples=1500, burn_in=100, chains=2, progress=False)
    assert result.info["bound_violations"] == 0
    pooled = fed.pooled()
    ref = _nuts(lambda p: jnp.sum(jax.vmap(model.log_likelihood, (None, 0))(
        {"c": p[0], "x": p[1]}, pooled)), 2)
    assert _close(result.info, ref)


def test_control_variates_cut_the_rate_and_keep_the_posterior():
    clients, _ = models.logistic_data(0, 1000, 4, num_workers=8, non_iid=True)
    fed = fm.Federation(clients)
    plain = fm.sample(models.logistic_model(), fed, fm.FedZigZag(0.05, control_variates=False),
                      init=np.zeros(4, np.float32),
                      num_samples=1000, burn_in=100, chains=2, progress=False)
    cv = fm.sample(models.logistic_model(), fed, fm.FedZigZag(0.05, control_variates=True),
                   init=np.zeros(4, np.float32), num_samples=1000, burn_in=100, chains=2,
                   progress=False)
    assert cv.info["rate_reduction_control_variates"] > 1.3
    assert cv.info["effective_switching_rate"] < plain.info["effective_switching_rate"]
    m1, m2 = np.array(plain.info["trajectory_mean"]), np.array(cv.info["trajectory_mean"])
    sd = np.sqrt(plain.info["trajectory_var"])
    assert np.all(np.abs(m1 - m2) < 0.3 * sd)


def test_redistribution_privacy_and_skeleton_run():
    clients, _ = models.logistic_data(0, 500, 3, num_workers=4)
    fed = fm.Federation(clients)
    result = fm.sample(models.logistic_model(), fed,
                       fm.FedZigZag(0.05, prior="split", redistribution_rate=1.0,
                                    privacy=(5.0, 0.1), sensitivity=2.0),
                       init=np.zeros(3, np.float32), num_samples=500, chains=2, progress=False,
                       skeleton=200)
    info = result.info
    assert info["redistributions"] > 0 and info["excess_events"] > 0
    assert len(info["skeleton_times"]) == 2 and len(info["skeleton_times"][0]) == 200
    assert np.all(np.diff(info["skeleton_times"][0]) > 0)
