"""Superposition thinning (issue 48): one thinning of the sum of the workers' bounds, the
proposing worker the one whose bound has the earliest point (probability Lambda_m / sum_s
Lambda_s), one acceptance test by that worker. The law of the process must be that of
per-worker thinning (Algorithm 3) and of exact inversion (F.1, quadratic potentials).

* One server round, many times from one state: the event time (two-sample Kolmogorov-Smirnov)
  and which worker and channel fired (chi-square) against exact inversion (Zig-Zag, BPS) or
  per-worker thinning (Boomerang, which always thins). Independent rounds: exact p-values.
* Whole runs on the exact Gaussian posterior, tolerances from the ESS (``stats.py``).

The one-round check is also run on a deliberately broken variant -- the proposing worker drawn
uniformly instead of in proportion to its bound (``federated.proposing_worker`` replaced) --
which it must reject; the whole-run check on a tempered likelihood.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as scipy_stats

import fedmcmc as fm
from fedmcmc.pdmp import federated
from stats import check_gaussian_moments, ess_of_variance, trajectory_check
from toy_problems import D, pdmp_gaussian_problem
from toy_problems import random_orbit_problem  # noqa: E402

ROUNDS = 3000
P_VALUE = 1e-3  # same law: p above this; the broken variant: p below


def uniform_proposer(key, next_time):
    """Broken: the proposing worker uniform over the workers, whatever their bounds."""
    worker = jax.random.randint(key, (), 0, next_time.shape[0]).astype(jnp.int32)
    return worker, next_time[worker]


SAMPLERS = {
    # (algorithm with thinned rates, its reference: exact inversion or per-worker thinning)
    "zigzag": (lambda **k: fm.FedZigZag(0.2, bound="hessian", **k),
               lambda: fm.FedZigZag(0.2, bound="exact")),
    "bps": (lambda **k: fm.FedBPS(0.2, refresh_rate=1.0, bound="hessian", **k),
            lambda: fm.FedBPS(0.2, refresh_rate=1.0, bound="exact")),
    # control_variates=False: with them (the default "auto") the workers' shifted gradients on
    # this Gaussian (Hessians proportional to their sizes, the Laplace reference exact) are
    # constants near zero, no event fires in any round and no law can be compared
    "boomerang": (lambda **k: fm.FedBoomerang(0.5, refresh_rate=0.3, control_variates=False,
                                              **k),
                  lambda: fm.FedBoomerang(0.5, refresh_rate=0.3, control_variates=False,
                                          thinning="per_worker")),
}


def _rounds(algorithm, seed, thinning=None):
    """``ROUNDS`` independent server rounds from one state (x away from the mode, no server
    clock before t = 20): the event time, the proposer that fired and the new velocity."""
    model, fed, _, _ = pdmp_gaussian_problem(4)
    with jax.enable_x64(True):
        built = algorithm.build(model, fed, np.zeros(D, np.float32), with_protocol=True)
        cfg = built.config
        if thinning is not None:
            cfg = dataclasses.replace(cfg, thinning=thinning)
        init, event_step, _ = federated.build(cfg, built.workers, built.prior_part)
        state = init(jax.random.key(0), jnp.zeros(D))
        v0 = state.v if algorithm.name == "FedZigZag" else 0.8 * state.v
        state = state._replace(x=jnp.array([2.0, -2.5, 1.0]), v=v0, next_refresh=jnp.inf)
        keys = jax.random.split(jax.random.key(seed), ROUNDS)
        after = jax.jit(jax.vmap(lambda k: event_step(k, state, 20.0, True)))(keys)
        after = jax.tree_util.tree_map(np.asarray, after)
    assert after.violations.sum() == 0
    fired = np.where(after.events.sum(axis=1) > 0, after.events.argmax(axis=1), -1)
    return after.t, fired, after.v, cfg


def _same_law(reference, candidate):
    """p-values: event times (KS) and proposer x velocity change (chi-square)."""
    t_ref, fired_ref, v_ref, _ = reference
    t, fired, v, _ = candidate
    p_time = scipy_stats.ks_2samp(t_ref, t).pvalue
    # the category of an event: which proposer fired and the sign pattern of its new velocity
    # (Zig-Zag: the flipped coordinate; BPS and Boomerang: the reflection's direction)
    def category(fired_, v_):
        return [f"{f}:{''.join('+' if s > 0 else '-' for s in row)}"
                for f, row in zip(fired_, v_)]

    a, b = category(fired_ref, v_ref), category(fired, v)
    labels = sorted(set(a) | set(b))
    table = np.array([[a.count(c) for c in labels], [b.count(c) for c in labels]])
    table = table[:, table.sum(axis=0) >= 10]  # chi-square needs expected counts
    p_category = scipy_stats.chi2_contingency(table).pvalue
    return min(p_time, p_category)


# Zig-Zag in the default suite; BPS and the Boomerang (whose whole runs in
# test_pdmp_gaussian.py and test_pdmp_real_data.py use superposition by default) are slow
@pytest.mark.parametrize("name", ["zigzag", pytest.param("bps", marks=pytest.mark.slow),
                                  pytest.param("boomerang", marks=pytest.mark.slow)])
def test_one_round_has_the_law_of_exact_inversion_or_per_worker_thinning(name, monkeypatch):
    make, make_reference = SAMPLERS[name]
    reference = _rounds(make_reference(), seed=1)
    good = _rounds(make(), seed=2, thinning="superposition")
    assert good[3].thinning == "superposition" and not good[3].exact
    assert _same_law(reference, good) > P_VALUE
    monkeypatch.setattr(federated, "proposing_worker", uniform_proposer)
    broken = _rounds(make(), seed=2, thinning="superposition")
    assert _same_law(reference, broken) < P_VALUE


def test_per_worker_thinning_is_kept_and_auto_picks_superposition_in_process():
    model, fed, _, _ = pdmp_gaussian_problem(4)
    with jax.enable_x64(True):
        for thinning, expected in (("auto", "superposition"), ("per_worker", "per_worker"),
                                   ("superposition", "superposition")):
            built = fm.FedZigZag(0.2, bound="hessian", thinning=thinning).build(
                model, fed, np.zeros(D, np.float32))
            assert built.config.thinning == expected and built.info["thinning"] == expected
        built = fm.FedZigZag(0.2).build(model, fed, np.zeros(D, np.float32))
        assert built.info["thinning"] == "exact"  # quadratic: no thinning at all
    with pytest.raises(ValueError, match="thinning"):
        fm.FedBPS(0.2, thinning="sum")


def _run(name, seed, tempered=False):
    model, fed, _, _ = pdmp_gaussian_problem(4, tempered)
    _, _, mean, cov = pdmp_gaussian_problem(4)
    algorithm = SAMPLERS[name][0](thinning="superposition")
    result = fm.sample(model, fed, algorithm, init=np.zeros(D, np.float32), num_samples=1500,
                       burn_in=100, chains=2, seed=seed, progress=False, rate_diagnostics=False)
    ok, figures = trajectory_check(result.info, mean, cov, result.flat_samples())
    draws = result.flat_samples()
    ok = ok and check_gaussian_moments(draws, mean, cov, var_ess=ess_of_variance(draws))["ok"]
    return ok, figures, result.info


@pytest.mark.slow
@pytest.mark.parametrize("name", ["zigzag", "bps", "boomerang"])
def test_whole_runs_match_the_exact_gaussian_posterior(name):
    """Whole runs, ESS tolerances; the broken variant is the likelihood tempered by 1/2 (as in
    test_pdmp_gaussian.py): the uniform proposer, which the one-round test rejects, is not
    always visible in the moments of a 4-worker run (seen: the Boomerang's passed)."""
    ok, figures, info = _run(name, seed=4)
    assert ok, figures
    assert info["thinning"] == "superposition" and info["bound_violations"] == 0
    ok, figures, _ = _run(name, seed=4, tempered=True)
    assert not ok, figures


def test_boomerang_bound_holds_along_the_orbit_and_is_never_looser():
    """BoomerangSpec.anchor's affine bound (issue 48: the amplitude of <v(t), g>, or p + A t)
    is above the true rate <v(t), grad U(x(t))>_+ on the whole orbit, for random states of a
    quadratic U - U_ref with ||L^T H L|| = L_w, and never above the bound it replaced,
    ``R |L^T g| + L_w R^2 t`` at t = 0 (and often far below it later); a bound 20 % below
    it is exceeded somewhere (the check bites)."""
    from fedmcmc.pdmp.boomerang import BoomerangSpec
    from fedmcmc.pdmp.dynamics import elliptic_flow

    rng = np.random.default_rng(3)
    d = 4
    with jax.enable_x64(True):
        ref, chol, H, lw = random_orbit_problem(rng, d)  # H of U - U_ref: indefinite
        centre = rng.normal(size=d)
        grad = lambda x: H @ (x - centre)  # noqa: E731
        ts = np.linspace(0.0, 2 * np.pi, 400)
        tight_somewhere = exceeded_below = False
        flow = jax.jit(jax.vmap(elliptic_flow, in_axes=(None, None, 0, None)))
        for _ in range(100):
            x = np.asarray(ref.mean) + chol @ rng.normal(size=d)
            v = chol @ rng.normal(size=d)
            a, b = (float(np.asarray(c)[0]) for c in BoomerangSpec.anchor(
                jnp.asarray(x), jnp.asarray(v), jnp.asarray(grad(x)), None, None, None, lw,
                None, ref, False))
            xs, vs = flow(jnp.asarray(x), jnp.asarray(v), jnp.asarray(ts), ref.mean)
            rate = np.maximum(np.einsum("td,td->t", np.asarray(vs),
                                        np.asarray(xs - centre) @ H.T), 0.0)
            bound = np.maximum(a + b * ts, 0.0)
            assert np.all(rate <= bound + 1e-9)
            z = np.linalg.solve(chol, x - np.asarray(ref.mean))
            w = np.linalg.solve(chol, v)
            radius2 = z @ z + w @ w
            old = np.sqrt(radius2) * np.linalg.norm(chol.T @ grad(x)) + lw * radius2 * ts
            assert a <= old[0] + 1e-9  # p <= A <= R |L^T g|: a never above the old one
            tight_somewhere |= bool(np.any(bound < 0.8 * old))
            exceeded_below |= bool(np.any(rate > 0.8 * bound + 1e-9))
        assert tight_somewhere and exceeded_below
