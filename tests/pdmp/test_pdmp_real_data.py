"""Fed-PDMC on real data with a natural grouping and many unequal clients: MASS's Cars93 by
manufacturer (32 workers of 1 to 8 rows, tests/toy_problems.py), Bayesian linear regression
with known noise sd, whose posterior is exact. Every worker proposes from its own rows
(Algorithm 2/3, the server takes the earliest); the exact trajectory averages must match the
posterior within ESS-based tolerances, and a run with the likelihood scaled wrong (noise sd
1.0 instead of 0.5: posterior variances 4x) must fail the same check."""

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm

from stats import trajectory_check
from toy_problems import cars93_federation

NOISE_SD = 0.5


def _check(algorithm, noise_sd):
    federation = cars93_federation()
    assert federation.num_clients == 32
    assert federation.sizes.min() == 1 and federation.sizes.max() == 8
    exact = fm.models.linear_regression(3, noise_std=NOISE_SD)
    mean, cov = exact.attributes["exact_posterior"](federation)
    model = fm.models.linear_regression(3, noise_std=noise_sd)
    result = fm.sample(model, federation, algorithm, init=jnp.zeros(3), num_samples=1000,
                       burn_in=100, chains=4, seed=0, progress=False)
    assert np.isfinite(result.flat_samples()).all()
    assert result.info["gradient_layout"] == "unpadded"
    return trajectory_check(result.info, mean, cov, result.flat_samples())


# The exact event times of a quadratic potential, and Poisson thinning (estimated bounds; the
# Boomerang always thins), where the in-process engine sums the workers' gradients over their
# rows without padding (32 workers of 1-8 rows: padding would make 256 rows of 93)
ALGORITHMS = [
    lambda: fm.FedZigZag(sample_interval=0.5),
    lambda: fm.FedBPS(sample_interval=0.5, refresh_rate=1.0),
    lambda: fm.FedZigZag(sample_interval=0.5, bound="estimate"),
    lambda: fm.FedBoomerang(sample_interval=0.5, refresh_rate=0.5),
]
IDS = ["FedZigZag", "FedBPS", "FedZigZag-thinning", "FedBoomerang"]


@pytest.mark.parametrize("make", ALGORITHMS, ids=IDS)
def test_cars93_by_manufacturer_matches_the_exact_posterior(make):
    ok, figures = _check(make(), NOISE_SD)
    assert ok, figures


# the broken variant of every sampler; the default suite keeps Zig-Zag's and the Boomerang's
BROKEN = [make if name in ("FedZigZag", "FedBoomerang") else pytest.param(make, marks=pytest.mark.slow)
          for make, name in zip(ALGORITHMS, IDS)]


@pytest.mark.parametrize("make", BROKEN, ids=IDS)
def test_cars93_with_the_likelihood_scaled_wrong_is_rejected(make):
    ok, figures = _check(make(), 2 * NOISE_SD)
    assert not ok, figures


def test_unpadded_gradients_give_the_workers_own_proposals():
    """The in-process engine takes all workers' gradients at once from their unpadded rows
    (thinning passes; in exact mode the gradients and Hessian-vector products at the start);
    its proposals must be those of each worker's own padded sums (what a distributed worker
    computes): same channels and kinds, times and gradients to rounding. With the
    Boomerang's share of the reference potential, with control variates, and exact."""
    import jax

    from fedmcmc.rng import split_key

    federation = cars93_federation()
    model = fm.models.linear_regression(3, noise_std=NOISE_SD)
    M, states = federation.num_clients, 64
    rng = np.random.default_rng(0)
    for algorithm, exact in ((fm.FedBoomerang(0.5, refresh_rate=0.5, prior="server"), False),
                             (fm.FedZigZag(0.5, bound="estimate", control_variates=True), False),
                             (fm.FedZigZag(0.5), True), (fm.FedBPS(0.5), True)):
        with jax.enable_x64(True):
            built = algorithm.build(model, federation, np.zeros(3, np.float32),
                                    with_protocol=True)
            assert built.info["gradient_layout"] == "unpadded"
            assert built.config.exact == exact
            # prior on the server: the Boomerang's data workers hold -n_m / N of the reference
            # potential
            assert built.config.prior_worker or exact
            workers = built.workers
            x = rng.normal(0.0, 0.5, (states, 3))
            v = rng.normal(0.0, 1.0, (states, 3)) if algorithm.name != "FedZigZag" else \
                rng.choice([-1.0, 1.0], (states, 3))
            keys = jax.vmap(lambda k: split_key(k, M))(split_key(jax.random.key(2), states))
            alpha = np.broadcast_to(np.asarray(workers.cv_weight), (states, M))

            def both(keys, x, v, alpha):
                return tuple(built.protocol.propose_all(keys, x, v, np.inf, workers, alpha,
                                                        np.ones(M), False, all_workers=flag)
                             for flag in (True, False))

            unpadded, padded = jax.tree_util.tree_map(
                np.asarray, jax.jit(jax.vmap(both))(keys, x, v, alpha))
        np.testing.assert_array_equal(unpadded.channel, padded.channel)
        np.testing.assert_array_equal(unpadded.kind, padded.kind)
        np.testing.assert_array_equal(unpadded.proposals, padded.proposals)
        np.testing.assert_allclose(unpadded.tau, padded.tau, rtol=1e-9)
        np.testing.assert_allclose(unpadded.gradient_at_event, padded.gradient_at_event,
                                   rtol=1e-9, atol=1e-9)
        assert np.isfinite(padded.tau).mean() > 0.9
