"""Step-size schedules: values, validation, and use inside the compiled samplers."""

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm


def test_polynomial_decay_values():
    schedule = fm.schedules.polynomial(a=0.1, b=10.0, gamma=0.55)
    for t in (0, 1, 100, 10_000):
        assert float(schedule(jnp.asarray(t))) == pytest.approx(0.1 * (10.0 + t) ** -0.55, rel=1e-5)


def test_piecewise_constant_values():
    schedule = fm.schedules.piecewise_constant([100, 200], [1e-2, 1e-3, 1e-4])
    assert [float(schedule(jnp.asarray(t))) for t in (0, 99, 100, 250)] == pytest.approx([1e-2, 1e-2, 1e-3, 1e-4])


def test_cyclical_values_follow_the_cosine_of_each_cycle():
    # Zhang et al. (2020) eq. (1) with K = 1,000 iterations in M = 4 cycles: L = 250
    schedule = fm.schedules.cyclical(0.1, 1000, 4)
    t = np.arange(1000)
    expected = 0.05 * (np.cos(np.pi * np.mod(t, 250) / 250) + 1.0)
    values = np.asarray(schedule(jnp.asarray(t)))
    np.testing.assert_allclose(values, expected, rtol=1e-4, atol=1e-9)
    assert values[0] == pytest.approx(0.1) and values[250] == pytest.approx(0.1)
    assert values[125] == pytest.approx(0.05, rel=1e-5)
    assert np.all(values > 0) and np.all(np.diff(values[:250]) < 0)
    # L = ceil(K / M): 10 iterations in 3 cycles of 4
    assert float(fm.schedules.cyclical(1.0, 10, 3)(jnp.asarray(4))) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "make, argument",
    [
        (lambda: fm.schedules.cyclical(0.0, 100, 2), "initial"),
        (lambda: fm.schedules.cyclical(0.1, 0, 1), "total_iterations"),
        (lambda: fm.schedules.cyclical(0.1, 100, 0), "cycles"),
        (lambda: fm.schedules.polynomial(a=-1.0), "a"),
        (lambda: fm.schedules.polynomial(a=1.0, gamma=1.5), "gamma"),
        (lambda: fm.schedules.piecewise_constant([10], [1.0]), "values"),
    ],
)
def test_bad_schedules(make, argument):
    with pytest.raises(ValueError, match=argument):
        make()


def test_decaying_step_size_runs_and_shrinks_the_steps():
    rng = np.random.default_rng(0)
    clients = [rng.normal(c, 1.0, size=(40, 1)).astype(np.float32) for c in (-1.0, 1.0)]
    model = fm.Model(
        log_prior=lambda mu: -0.5 * jnp.sum(mu**2),
        log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2),
    )
    schedule = fm.schedules.polynomial(a=1e-2, b=1.0, gamma=1.0)
    result = fm.sample(model, fm.Federation(clients), fm.DSGLD(step_size=schedule, batch_size=10, local_steps=5),
                       init=jnp.zeros(1), num_samples=400, chains=2, seed=0)
    draws = result.flat_samples()[:, :, 0]
    early, late = np.abs(np.diff(draws[:, :50])).mean(), np.abs(np.diff(draws[:, -50:])).mean()
    assert late < early / 2  # h_t ~ 1/t: the moves shrink
