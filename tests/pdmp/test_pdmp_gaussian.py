"""Fed-PDMC on exact Gaussian posteriors: trajectory mean and covariance, single machine and federated.

Tolerances come from the effective sample size (batch means over process time,
``info["ess_batch_means"]``, or ArviZ's ESS of draws): |z| < 4 for means, the
2/ESS law for variances, (1 - r^2)/sqrt(ESS) for correlations. Variances and
correlations use the ESS of the variance estimates (``stats.ess_of_variance`` of
the draws) when it is smaller than the mean's: the Boomerang's elliptical orbits
give the mean a far larger ESS than the second moments (issue 3). Each check is
also run on a deliberately broken sampler (the likelihood tempered by 1/2, as a
worker that under-reports its rate would do), which it must reject.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc.pdmp import boomerang, bps, zigzag
from fedmcmc.pdmp.dynamics import elliptic_flow
from stats import check_gaussian_moments, ess_of_variance, trajectory_check
from toy_problems import D, S, pdmp_gaussian_problem



def moments_check(draws, mean, cov):
    """:func:`stats.check_gaussian_moments` with the variance band from the variance's ESS."""
    return check_gaussian_moments(draws, mean, cov, var_ess=ess_of_variance(draws))


# ------------------------------------------------------------ single machine
def _single_draws(spec_name, logdensity, n_events, seed, dt):
    """Run a single-machine kernel for ``n_events`` skeleton points and read positions every ``dt``."""
    with jax.enable_x64(True):
        prec = np.linalg.inv(S)
        if spec_name == "zigzag":
            kernel = zigzag.build_kernel(logdensity, exact=True)
        elif spec_name == "bps":
            kernel = bps.build_kernel(logdensity, exact=True, refresh_rate=0.5)
        else:
            kernel = boomerang.build_kernel(logdensity, (np.zeros(D), 1.5 * S),
                                            hessian_bound=2 * np.abs(prec), refresh_rate=0.3)
        state = kernel.init(jnp.zeros(D), jax.random.key(seed))

        @jax.jit
        def run(state):
            def body(s, key):
                s = kernel.step(key, s)
                return s, (s.t, s.x, s.v)

            return jax.lax.scan(body, state, jax.random.split(jax.random.key(seed + 1), n_events))[1]

        t, x, v = (np.asarray(a) for a in run(state))
    grid = np.arange(dt, t[-1], dt)
    k = np.searchsorted(t, grid, side="right") - 1
    ok = k >= 0
    grid, k = grid[ok], k[ok]
    if spec_name == "boomerang":
        draws = np.asarray(jax.vmap(lambda x0, v0, s: elliptic_flow(x0, v0, s, jnp.zeros(D))[0])(
            x[k], v[k], grid - t[k]))
    else:
        draws = x[k] + v[k] * (grid - t[k])[:, None]
    draws = draws[len(draws) // 10:]
    n = len(draws) // 4
    return draws[: 4 * n].reshape(4, n, D)  # four pseudo-chains for the ESS estimate  # four pseudo-chains for the ESS estimate


@pytest.mark.parametrize("name", ["zigzag", "bps", "boomerang"])
def test_single_machine_kernels_sample_correlated_gaussian(name):
    mean = np.array([1.0, -1.0, 0.5])
    prec = np.linalg.inv(S)
    good = _single_draws(name, lambda x: -0.5 * (x - mean) @ prec @ (x - mean), 40_000, 0, 0.5)
    out = moments_check(good, mean, S)
    assert out["ok"], out
    # Broken: a sampler whose rate is half the right one samples N(mean, 2 S).
    bad = _single_draws(name, lambda x: -0.25 * (x - mean) @ prec @ (x - mean), 40_000, 0, 0.5)
    assert not moments_check(bad, mean, S)["ok"]


# ----------------------------------------------------------------- federated
ALGORITHMS = {
    "zigzag": lambda: fm.FedZigZag(sample_interval=0.2),
    "bps": lambda: fm.FedBPS(sample_interval=0.2, refresh_rate=1.0),
    "boomerang": lambda: fm.FedBoomerang(sample_interval=0.5, refresh_rate=0.3),
}


def _run(name, num_workers, tempered=False, draws=1500):
    model, fed, mean, cov = pdmp_gaussian_problem(num_workers, tempered)
    result = fm.sample(model, fed, ALGORITHMS[name](), init=np.zeros(D, np.float32),
                       num_samples=draws, burn_in=100, chains=2, seed=num_workers, progress=False,
                       rate_diagnostics=False)
    return result, mean, cov


def _check_federated(name, num_workers):
    result, mean, cov = _run(name, num_workers)
    ok, figures = trajectory_check(result.info, mean, cov, result.flat_samples())
    assert ok, figures
    assert moments_check(result.flat_samples(), mean, cov)["ok"]
    assert result.info["bound_violations"] == 0
    assert len(result.info["events_per_worker"]) == num_workers
    assert result.samples.shape == (2, 1500, D)


@pytest.mark.parametrize("name", ["zigzag", "bps", "boomerang"])
def test_federated_gaussian_four_non_iid_workers(name):
    _check_federated(name, 4)


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [1, 16])
@pytest.mark.parametrize("name", ["zigzag", "bps", "boomerang"])
def test_federated_gaussian_one_and_sixteen_workers(name, num_workers):
    _check_federated(name, num_workers)


def test_federated_check_rejects_a_broken_sampler():
    result, mean, cov = _run("zigzag", 4, tempered=True)
    ok, figures = trajectory_check(result.info, mean, cov, result.flat_samples())
    assert not ok, figures


# ------------------------------------------- Boomerang: where the prior sits (Remark 3.2)
@pytest.mark.parametrize("prior", ["server", "worker"])
def test_federated_boomerang_prior_on_its_own_proposer(prior):
    """Issue 3: FedBoomerang with U_0 simulated by the server or by an extra worker."""
    model, fed, mean, cov = pdmp_gaussian_problem(4)
    algorithm = fm.FedBoomerang(sample_interval=0.5, refresh_rate=0.3, prior=prior)
    result = fm.sample(model, fed, algorithm, init=np.zeros(D, np.float32), num_samples=1500,
                       burn_in=100, chains=2, seed=5, progress=False, rate_diagnostics=False)
    ok, figures = trajectory_check(result.info, mean, cov, result.flat_samples())
    assert ok, figures
    assert moments_check(result.flat_samples(), mean, cov)["ok"]
    assert result.info["prior_placement"] == prior
    assert result.info["prior_events"] > 0  # U_0 (N(0, 4 I)) has events of its own
    assert result.info["bound_violations"] == 0


@pytest.mark.parametrize("prior", ["server", "worker", "split"])
def test_boomerang_reference_correction_is_held_once(prior):
    """The workers' and the prior proposer's gradients add up to grad(U - U_ref) in every
    placement; with the prior on its own proposer that proposer holds grad U_0 alone and data
    worker m holds n_m/N of -grad U_ref (held whole by the prior's proposer, the correction
    made the trajectory sd ~3x too large on non-Gaussian posteriors: see the slow test)."""
    model, fed, mean, cov = pdmp_gaussian_problem(4)
    with jax.enable_x64(True):
        cfg = fm.FedBoomerang(0.5, prior=prior).build(model, fed, np.zeros(D, np.float32))[0]
        ref = cfg.reference
        padded = fed.padded()
        x = jnp.asarray([0.3, -2.0, 1.7])
        flat = model.flatten(jnp.zeros(D))
        data = [cfg.data_grad(x, jax.tree_util.tree_map(lambda a: a[m], padded.data),
                              jnp.asarray(padded.mask[m], jnp.float64)) for m in range(4)]
        lik = [-jax.grad(lambda th: flat.log_likelihood_sum(
            th, jax.tree_util.tree_map(lambda a: a[m], padded.data), padded.mask[m]))(x)
            for m in range(4)]
        prior_only = -jax.grad(flat.log_prior)(x)
        correction = ref.precision @ (x - ref.mean)
        total = sum(data) + cfg.prior_grad(x)
        np.testing.assert_allclose(total, sum(lik) + prior_only - correction, rtol=1e-9, atol=1e-9)
        shares = np.asarray(fed.sizes, np.float64) / np.sum(fed.sizes)
        if prior == "split":
            np.testing.assert_allclose(cfg.prior_grad(x), prior_only - correction, rtol=1e-9)
            np.testing.assert_allclose(data[1], lik[1], rtol=1e-9)
        else:
            assert cfg.prior_worker
            np.testing.assert_allclose(cfg.prior_grad(x), prior_only, rtol=1e-9)
            np.testing.assert_allclose(data[1], lik[1] - shares[1] * correction, rtol=1e-9)
