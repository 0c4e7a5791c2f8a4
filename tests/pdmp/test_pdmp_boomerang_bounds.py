"""The Boomerang's whitened Hessian bounds from the model's Loewner curvature bounds (issue 48):
``0 <= grad^2 U_m <= B_m`` gives ``||L^T grad^2 (U_m - c_m U_ref) L|| <= max(c_m, u_m - c_m)``
(:func:`fedmcmc.pdmp.bounds.whitened_curvature_bounds`) where the elementwise bound allowed
``|| |L|^T q_m |L| || + c_m``: on correlated covariates tens of times looser.

The bound each worker's thinning uses (its lane's ``lw``, prior share included) must hold at
every point, far from the mode too (where the logistic Hessian vanishes and the reference
term ``-c_m I`` alone is left); a bound a fifth lower must fail somewhere (the check bites).
The thinning of every run also checks it: ``bound="hessian"`` raises on a violation.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from toy_problems import random_orbit_problem  # noqa: E402


def correlated_logistic_federation(seed=0, sizes=(40, 90, 25, 60)):
    """Logistic rows with an intercept and two nearly collinear covariates, four unequal
    clients: a correlated posterior, whose whitening mixes signs."""
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    z = rng.normal(size=(n, 2))
    x = np.column_stack([np.ones(n), z[:, 0], z[:, 0] + 0.2 * z[:, 1]]).astype(np.float32)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(x @ np.array([0.3, 1.0, -0.5]))))).astype(
        np.float32)
    cuts = np.cumsum((0,) + tuple(sizes))
    return fm.Federation([{"x": x[a:b], "y": y[a:b]} for a, b in zip(cuts[:-1], cuts[1:])])


def lanes_and_hessians(prior):
    """Per worker: the whitened bound its thinning uses, and a function of theta giving the
    whitened Hessians of the workers' potentials (prior shares and reference shares held)."""
    model = fm.models.logistic_regression(3)
    fed = correlated_logistic_federation()
    with jax.enable_x64(True):
        built = fm.FedBoomerang(sample_interval=1.0, prior=prior).build(
            model, fed, np.zeros(3, np.float32), chains=1, with_protocol=True)
        ref, part = built.config.reference, built.prior_part
        alpha = np.asarray(built.initial_states.alpha[0])
        lanes = np.maximum(alpha * float(part.lw_floor),
                           np.asarray(built.workers.lw) + alpha * float(part.lw))
        chol, precision = np.asarray(ref.chol), np.asarray(ref.precision)
        sizes = np.asarray(fed.sizes, np.float64)
        ref_share = np.zeros_like(sizes) if prior == "split" else sizes / sizes.sum()
        flat = model.flatten(np.zeros(3, np.float32))
        padded = fed.padded()

        def data_hessian(theta, data_m, mask_m):
            return jax.hessian(lambda t: -flat.log_likelihood_sum(t, data_m, mask_m))(theta)

        prior_hessian = np.asarray(jax.hessian(lambda t: -flat.log_prior(t))(jnp.zeros(3)))
        hessians = jax.jit(jax.vmap(data_hessian, in_axes=(None, 0, 0)))

        def whitened(theta):
            h = np.asarray(hessians(jnp.asarray(theta), padded.data, padded.mask))
            h = h + alpha[:, None, None] * (prior_hessian - precision)[None]
            h = h - ref_share[:, None, None] * precision[None]
            return np.array([np.linalg.norm(chol.T @ hm @ chol, 2) for hm in h])

        # the elementwise bound's whitening (what the lanes were before), for comparison
        q = np.abs(np.asarray(hessians(jnp.asarray(np.asarray(ref.mean)), padded.data,
                                       padded.mask)))
        return lanes, whitened, np.asarray(ref.mean), chol, q


@pytest.mark.parametrize("prior", ["split", "server"])
def test_curvature_bound_dominates_the_whitened_hessian_everywhere_and_bites(prior):
    lanes, whitened, mean, chol, q = lanes_and_hessians(prior)
    rng = np.random.default_rng(1)
    worst = np.zeros_like(lanes)
    for scale in (0.0, 0.5, 1.0, 3.0, 10.0, 100.0):  # whitened radii, the mode to far away
        for _ in range(8):
            theta = mean + scale * chol @ rng.normal(size=3)
            norms = whitened(theta)
            assert np.all(norms <= lanes * (1 + 1e-9) + 1e-12), (scale, norms, lanes)
            worst = np.maximum(worst, norms)
    assert np.any(worst > 0.8 * lanes)  # a bound a fifth lower fails somewhere
    # the elementwise whitening of the Hessians at the mode alone is already far larger
    elementwise = np.array([np.linalg.norm(np.abs(chol).T @ qm @ np.abs(chol), 2) for qm in q])
    assert np.sum(elementwise) > 3 * np.sum(lanes)


def test_bad_curvature_bounds_name_the_attribute():
    model = fm.models.logistic_regression(3)
    fed = correlated_logistic_federation()
    bad = fm.Model(model.log_prior, model.log_likelihood,
                   **{**model.attributes, "curvature_bound": lambda e: -jnp.eye(3)})
    with jax.enable_x64(True), pytest.raises(ValueError, match="curvature_bound"):
        fm.FedBoomerang(sample_interval=1.0).build(bad, fed, np.zeros(3, np.float32))
    bad = fm.Model(model.log_prior, model.log_likelihood,
                   **{**model.attributes, "prior_curvature_bound": np.ones((2, 2))})
    with jax.enable_x64(True), pytest.raises(ValueError, match="prior_curvature_bound"):
        fm.FedBoomerang(sample_interval=1.0).build(bad, fed, np.zeros(3, np.float32))


def test_constant_orbit_bound_with_control_variates_holds_and_bites():
    """BoomerangSpec.anchor with ``centre`` (control variates centred at x*): the bound it
    returns, affine or the orbit's constant ``R |L^T G(x*)| + L_w (R^2 / 2 + R |z*|)``, is above
    the rate ``<v(t), G(x(t))>_+`` over two whole turns of the orbit, for random states around a
    centre near the reference mean and a small gradient there; the constant one is taken for
    most states, and a constant a fifth lower is exceeded somewhere (the check bites)."""
    from fedmcmc.pdmp.boomerang import BoomerangSpec
    from fedmcmc.pdmp.dynamics import elliptic_flow

    rng = np.random.default_rng(5)
    d = 4
    with jax.enable_x64(True):
        # H: a small worker's shifted potential
        ref, chol, H, lw = random_orbit_problem(rng, d, curvature_scale=0.05)
        x_star = np.asarray(ref.mean) + 0.1 * chol @ rng.normal(size=d)
        g_star = 0.01 * rng.normal(size=d)
        zeta = np.linalg.norm(np.linalg.solve(chol, x_star - np.asarray(ref.mean)))
        offset = np.linalg.norm(chol.T @ g_star)
        grad = lambda x: g_star + H @ (x - x_star)  # noqa: E731
        ts = np.linspace(0.0, 4 * np.pi, 800)
        flow = jax.jit(jax.vmap(elliptic_flow, in_axes=(None, None, 0, None)))
        # the bound is attained (up to the small g* and z* terms) on the orbit whose z and w
        # lie along the top eigenvector of L^T H L, of equal lengths: |w| |z| = R^2 / 2 there
        eigenvalues, vectors = np.linalg.eigh(chol.T @ H @ chol)
        top = int(np.argmax(np.abs(eigenvalues)))
        e = vectors[:, top] * np.sqrt(d)
        aligned = [(np.asarray(ref.mean) + chol @ e, np.sign(eigenvalues[top]) * chol @ e)]
        constant_taken = exceeded_below = 0
        for i in range(101):
            x = np.asarray(ref.mean) + chol @ rng.normal(size=d)
            v = chol @ rng.normal(size=d)
            if i == 100:
                x, v = aligned[0]
            a, b = (float(np.asarray(c)[0]) for c in BoomerangSpec.anchor(
                jnp.asarray(x), jnp.asarray(v), jnp.asarray(grad(x)), None, None, None, lw,
                None, ref, False, centre=(offset, zeta, 1.0)))
            xs, vs = flow(jnp.asarray(x), jnp.asarray(v), jnp.asarray(ts), ref.mean)
            rate = np.maximum(np.einsum("td,td->t", np.asarray(vs),
                                        g_star + (np.asarray(xs) - x_star) @ H.T), 0.0)
            bound = np.maximum(a + b * ts, 0.0)
            assert np.all(rate <= bound + 1e-12)
            if b == 0.0:
                constant_taken += 1
                exceeded_below += bool(np.any(rate > 0.8 * a))
        assert constant_taken > 50 and exceeded_below > 0, (constant_taken, exceeded_below)
