"""Fed-PDMC event-time machinery: affine inversion, first event law (Rayleigh), privacy (Theorem 5.1)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sps

from fedmcmc.pdmp import privacy, zigzag
from fedmcmc.pdmp.events import affine_first_time, affine_integrated_rate


def test_affine_inversion_inverts_the_integrated_rate():
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        a = rng.normal(size=2000) * 3
        b = rng.normal(size=2000) * 3
        b[:200] = 0.0
        b[200:300] = 1e-12  # tiny slopes: where the textbook formula cancels
        a[200:300] = np.abs(a[200:300])
        e = rng.exponential(size=2000)
        t = np.asarray(affine_first_time(a, b, e))
        finite = np.isfinite(t)
        back = np.asarray(affine_integrated_rate(a[finite], b[finite], t[finite]))
        np.testing.assert_allclose(back, e[finite], rtol=1e-9, atol=1e-12)
        # Infinite times only where the total mass a^2 / (2|b|) (b < 0) or 0 (a <= 0, b <= 0) is below e.
        mass = np.where(b < 0, np.maximum(a, 0) ** 2 / (2 * np.abs(np.where(b < 0, b, 1))),
                        np.where(a > 0, np.inf, np.where(b > 0, np.inf, 0.0)))
        assert np.all(mass[~finite] <= e[~finite] + 1e-12)
        assert np.all(finite[mass > e * (1 + 1e-9)])


def test_stable_form_matches_where_the_naive_form_fails():
    a, b, e = np.float32(1.0), np.float32(1e-7), np.float32(0.5)
    stable = float(affine_first_time(a, b, e))
    naive = float(np.sqrt((a / b) ** 2 + 2 * e / b) - a / b)
    assert abs(stable - 0.5) < 1e-6  # t ~ e / a when b -> 0
    assert abs(naive - 0.5) > 1e-2  # the papers README's warning: float32 cancellation


def _first_event_times(logdensity, n=3000, seed=0):
    with jax.enable_x64(True):
        kernel = zigzag.build_kernel(logdensity, exact=True)

        def first(key):
            k0, k1 = jax.random.split(key)
            state = kernel.init(jnp.zeros(1), k0)
            state = state._replace(v=jnp.ones(1))  # x = 0, v = +1
            return kernel.step(k1, state).t

        return np.asarray(jax.jit(jax.vmap(first))(jax.random.split(jax.random.key(seed), n)))


def test_first_event_of_standard_gaussian_is_rayleigh():
    """From x = 0, v = 1 the rate is (t)_+: P(tau > t) = exp(-t^2/2), the Rayleigh law."""
    times = _first_event_times(lambda x: -0.5 * jnp.sum(x**2))
    assert sps.kstest(times, sps.rayleigh.cdf).pvalue > 1e-3
    # Broken variant: the target N(0, 1/2) (rate 2t) -- the same test rejects it.
    wrong = _first_event_times(lambda x: -jnp.sum(x**2), seed=1)
    assert sps.kstest(wrong, sps.rayleigh.cdf).pvalue < 1e-6


EPS = [0.1, 0.5, 1.0, 2.0, 5.0]
DELTAS = [1e-6, 1e-3, 0.05, 0.3]
KS = [0.5, 1.0, 3.0, 10.0]


def _theorem_delta(rho, eps, k):
    floor = math.log(1 + k / rho)
    return math.exp(-(rho / k) * (eps - floor)) if eps > floor else 1.0


def test_privacy_rate_matches_theorem_5_1_on_a_grid():
    for eps in EPS:
        for delta in DELTAS:
            for k in KS:
                rho = privacy.rho_for_privacy(eps, delta, k)
                assert rho == pytest.approx(k * (1 + math.log(1 / delta)) / eps, rel=1e-12)  # eq. (7)
                achieved = privacy.privacy_delta(rho, eps, k)
                assert achieved == pytest.approx(_theorem_delta(rho, eps, k), rel=1e-12)
                assert eps > math.log(1 + k / rho)  # the theorem's condition holds at rho of (7)
                assert achieved <= delta * (1 + 1e-12)  # and (7) gives (eps, delta)-DP
                rmin = privacy.minimal_rho_for_privacy(eps, delta, k)
                assert rmin <= rho and privacy.privacy_delta(rmin, eps, k) <= delta * (1 + 1e-9)
    e, d = privacy.privacy_of_rate(2.0, 1.0, epsilon=[1.0, 3.0])
    assert d[1] < d[0]


def test_privacy_check_rejects_a_too_small_rate():
    """Broken variant: a quarter of (7)'s rho no longer achieves delta somewhere on the grid."""
    failures = 0
    for eps in EPS:
        for delta in DELTAS:
            for k in KS:
                rho = privacy.rho_for_privacy(eps, delta, k) / 4
                failures += privacy.privacy_delta(rho, eps, k) > delta
    assert failures > len(EPS) * len(DELTAS) * len(KS) // 2


def test_privacy_arguments_are_checked():
    import fedmcmc as fm

    with pytest.raises(ValueError, match="delta"):
        privacy.rho_for_privacy(1.0, 1.5, 1.0)
    with pytest.raises(ValueError, match="sensitivity"):
        fm.FedZigZag(0.1, privacy=(1.0, 0.01))
    alg = fm.FedZigZag(0.1, privacy=(1.0, 0.01), sensitivity=2.0)
    assert alg.rho == pytest.approx(privacy.rho_for_privacy(1.0, 0.01, 2.0))
    for bad in (dict(sample_interval=0.0), dict(sample_interval=1.0, refresh_rate=-1.0),
                dict(sample_interval=1.0, prior="nowhere"), dict(sample_interval=1.0, bound="magic"),
                dict(sample_interval=1.0, redistribution_rate=1.0)):
        name = [k for k in bad if k != "sample_interval"] or ["sample_interval"]
        with pytest.raises(ValueError, match=name[-1].split("_")[0]):
            fm.FedZigZag(**bad)


@pytest.mark.parametrize("excess_rate, sizes", [
    (0.0, (4, 40, 300)),
    # with slow (CI time): the default suite keeps 12 workers with the excess rate
    pytest.param(0.0, (3, 5, 8, 13, 20, 30, 45, 60, 90, 120, 160, 240), marks=pytest.mark.slow),
    (0.3, (4, 40, 300)),
    (0.3, (3, 5, 8, 13, 20, 30, 45, 60, 90, 120, 160, 240)),
], ids=["0.0-3-workers", "0.0-12-workers", "0.3-3-workers", "0.3-12-workers"])
def test_workers_stopping_at_the_earliest_proposal_keep_the_winner(excess_rate, sizes):
    """The in-process engine lets a worker stop its thinning once another worker of the chain
    has accepted an earlier event (``stop_at_earliest``). The server's choice must not move:
    the earliest time, its worker, channel, kind and gradient are bit for bit those of the
    full searches (what each distributed worker computes alone), while the losers' searches
    are shorter. Logistic regression with loose estimated bounds (safety 8: many rejections),
    workers of very unequal size, the privacy clock on or off, 1024 states. Stopping at 0.9 of
    the earliest accepted time instead (a worker could still win in the gap) fails it."""
    import fedmcmc as fm
    from fedmcmc.pdmp import models as pdmp_models
    from fedmcmc.rng import split_key

    sizes = np.array(sizes)
    clients, _ = pdmp_models.logistic_data(3, int(sizes.sum()), 4, non_iid=True)
    rows = np.split(np.arange(sizes.sum()), np.cumsum(sizes)[:-1])
    federation = fm.Federation([{k: v[r] for k, v in clients[0].items()} for r in rows])
    algorithm = fm.FedZigZag(0.5, excess_rate=excess_rate, safety=8.0)
    with jax.enable_x64(True):
        built = algorithm.build(pdmp_models.logistic_model(), federation,
                                np.zeros(4, np.float32), with_protocol=True)
        protocol, workers, M = built.protocol, built.workers, len(sizes)
        assert not built.config.exact and built.config.has_excess == (excess_rate > 0)
        rng = np.random.default_rng(0)
        states = 1024
        x = jnp.asarray(rng.normal(0, 0.7, (states, 4)))
        v = jnp.asarray(rng.choice([-1.0, 1.0], (states, 4)))
        cap = jnp.asarray(rng.choice([1e-3, 1e-2, np.inf], states))
        keys = jax.vmap(lambda k: split_key(k, M))(split_key(jax.random.key(1), states))
        alpha = jnp.broadcast_to(workers.cv_weight, (states, M))
        scale = jnp.ones((states, M))

        def both(keys, x, v, cap, alpha, scale):
            return tuple(protocol.propose_all(keys, x, v, cap, workers, alpha, scale, stop)
                         for stop in (True, False))

        stopped, full = jax.jit(jax.vmap(both))(keys, x, v, cap, alpha, scale)
    stopped, full = jax.tree_util.tree_map(np.asarray, (stopped, full))
    winner = full.tau.argmin(axis=1)
    pick = lambda field: np.take_along_axis(field, winner[:, None], axis=1)[:, 0]  # noqa: E731
    np.testing.assert_array_equal(stopped.tau.argmin(axis=1), winner)
    np.testing.assert_array_equal(stopped.tau.min(axis=1), full.tau.min(axis=1))
    has_event = np.isfinite(full.tau.min(axis=1))
    assert 0.3 < has_event.mean() < 1.0  # some rounds end at the cap, most with an event
    for field in ("channel", "kind"):
        np.testing.assert_array_equal(pick(getattr(stopped, field))[has_event],
                                      pick(getattr(full, field))[has_event])
    np.testing.assert_array_equal(
        np.take_along_axis(stopped.gradient_at_event, winner[:, None, None], 1)[has_event],
        np.take_along_axis(full.gradient_at_event, winner[:, None, None], 1)[has_event])
    if excess_rate > 0:
        assert (pick(full.kind)[has_event] == 1).any()  # some winners are privacy events
    # no losing worker reports an event earlier than the winner, none overflowed
    assert np.all(stopped.tau >= stopped.tau.min(axis=1, keepdims=True))
    assert not stopped.overflow.any() and not full.overflow.any()
    # shorter searches, never longer
    assert np.all(stopped.proposals <= full.proposals)
    assert stopped.proposals.sum() < 0.85 * full.proposals.sum()
