"""Differential privacy of a whole run (issue 47; fedmcmc.privacy, fedmcmc.clipping)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc import clipping, privacy

dp_accounting = pytest.importorskip("dp_accounting")
pytestmark = pytest.mark.filterwarnings("ignore::fedmcmc.ConvergenceWarning")
from dp_accounting import rdp  # noqa: E402
from dp_accounting.rdp import rdp_privacy_accountant  # noqa: E402


def _regression(num_clients=3, rows=60, seed=0):
    rng = np.random.default_rng(seed)
    clients = []
    for _ in range(num_clients):
        x = rng.normal(size=(rows, 2)).astype(np.float32)
        y = (x @ np.array([1.0, -1.0]) + rng.normal(size=rows)).astype(np.float32)
        clients.append({"x": x, "y": y})
    model = fm.Model(log_prior=lambda p: -0.5 * jnp.sum(p ** 2),
                     log_likelihood=lambda p, e: -0.5 * (e["y"] - e["x"] @ p) ** 2)
    return model, fm.Federation(clients)


def test_one_gaussian_mechanism_matches_the_closed_form():
    """Full batch, T steps of noise multiplier z: RDP T alpha / (2 z^2) at every order, and
    epsilon its conversion; also below the classic bound min_a RDP + log(1/delta)/(a-1)."""
    z, delta = 1.7, 1e-5
    for steps in (1, 50):
        reported = privacy.epsilon_of_steps(z, 100, 100, steps, delta)
        orders = np.asarray(privacy.RDP_ORDERS)
        closed = steps * orders / (2 * z ** 2)
        expected = rdp_privacy_accountant.compute_epsilon(list(orders), closed, delta)[0]
        assert reported == pytest.approx(expected, rel=1e-9)
        classic = np.min(closed + math.log(1 / delta) / (orders - 1))
        assert reported <= classic
    # a larger noise spends less, more steps spend more
    assert privacy.epsilon_of_steps(2 * z, 100, 100, 50, delta) < reported
    assert privacy.epsilon_of_steps(z, 100, 100, 100, delta) > reported


def test_a_private_dsgld_run_reports_dp_accountings_epsilon_for_its_events():
    model, fed = _regression(num_clients=3, rows=60)
    h, m, local_steps, clip, z = 1e-3, 10, 5, 2.0, 1.3
    algorithm = fm.DSGLD(step_size=h, batch_size=m, local_steps=local_steps,
                         privacy=fm.Privacy(noise_multiplier=z, clip_norm=clip, delta=1e-5))
    result = fm.sample(model, fed, algorithm=algorithm, init=jnp.zeros(2), num_samples=40,
                       burn_in=10, thin=2, chains=2, seed=3)
    info = result.info["privacy"]
    weights = np.asarray(fed.weights, np.float64)
    assert info["steps"] == [v * local_steps for v in result.info["visits_per_client"]]
    assert sum(info["steps"]) >= 2 * 50 * 2  # every update of both chains counted
    for s, (rows, f) in enumerate(zip(np.asarray(fed.sizes), weights)):
        floor = f * m / (rows * clip * math.sqrt(h))  # z_L = w_s m_s / (N_s C sqrt(h))
        assert info["langevin_noise_multiplier"][s] == pytest.approx(floor, rel=1e-9)
        assert info["noise_multiplier"][s] == pytest.approx(max(z, floor))
        accountant = rdp.RdpAccountant(list(privacy.RDP_ORDERS),
                                       dp_accounting.NeighboringRelation.REPLACE_ONE)
        accountant.compose(dp_accounting.SelfComposedDpEvent(
            dp_accounting.SampledWithoutReplacementDpEvent(
                int(rows), m, dp_accounting.GaussianDpEvent(info["noise_multiplier"][s])),
            info["steps"][s]))
        assert info["epsilon"][s] == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-9)
    assert info["delta"] == 1e-5 and info["clip_norm"] == clip


def test_a_calibrated_run_meets_its_budget_and_no_less_noise_would():
    model, fed = _regression(num_clients=2, rows=50)
    target, delta = 0.3, 1e-5
    algorithm = fm.SGLD(step_size=1e-3, batch_size=10, privacy=(target, delta))
    result = fm.sample(model, fed, algorithm=algorithm, init=jnp.zeros(2), num_samples=60,
                       burn_in=20, thin=1, chains=2, seed=0)
    info = result.info["privacy"]
    assert len(info["epsilon"]) == fed.num_clients
    assert max(info["epsilon"]) <= target
    assert info["steps"] == [2 * 80] * 2 and info["noise_chosen_by"] == "calibrated"
    z = info["noise_multiplier"][0]
    assert z > info["langevin_noise_multiplier"][0]  # the budget needed more noise
    assert info["noise_inflation"][0] == pytest.approx(z / info["langevin_noise_multiplier"][0])
    # within the bisection's 1% of the least noise that meets the budget
    less = privacy.epsilon_of_steps(z / 1.011, 100, 10, 160, delta)
    assert less > target


def test_the_budget_stop_keeps_the_draws_within_it():
    model, fed = _regression(num_clients=2, rows=50)
    z, num_samples, burn_in = 5.0, 200, 10  # above the Langevin floor 3.16 of h = 1e-3
    full = privacy.epsilon_of_steps(z, 100, 10, 2 * (burn_in + num_samples), 1e-5)
    budget = 0.6 * full
    algorithm = fm.SGLD(step_size=1e-3, batch_size=10, privacy=fm.Privacy(
        epsilon=budget, noise_multiplier=z, clip_norm=1.0))
    with pytest.raises(fm.PrivacyBudgetExceeded, match="error.result") as caught:
        fm.sample(model, fed, algorithm=algorithm, init=jnp.zeros(2), num_samples=num_samples,
                  burn_in=burn_in, thin=1, chains=2, seed=0)
    kept = caught.value.result
    draws = kept.info["privacy"]["draws_within_budget"]
    assert 0 < draws < num_samples
    assert np.shape(kept.samples)[:2] == (2, draws)
    assert max(kept.info["privacy"]["epsilon"]) <= budget
    # one more draw would have overspent
    assert privacy.epsilon_of_steps(z, 100, 10, 2 * (burn_in + draws + 1), 1e-5) > budget


def test_clipping_bounds_one_rows_influence_and_switching_it_off_is_refused():
    model, _ = _regression()
    flat = model.flatten(jnp.zeros(2))
    clip = 1.5
    rng = np.random.default_rng(1)
    batch = {"x": rng.normal(size=(8, 2)).astype(np.float32),
             "y": rng.normal(size=8).astype(np.float32)}
    outlier = {"x": batch["x"].copy(), "y": batch["y"].copy()}
    outlier["x"][3], outlier["y"][3] = 40.0, -500.0  # one row replaced by an extreme one
    theta = jnp.asarray([0.3, -0.2])

    def influence(flat_model):
        return float(jnp.linalg.norm(flat_model.grad_log_likelihood_sum(theta, batch)
                                     - flat_model.grad_log_likelihood_sum(theta, outlier)))

    assert influence(clipping.clipped(flat, clip)) <= 2 * clip * (1 + 1e-5)
    assert influence(flat) > 2 * clip  # the broken variant (no clipping) fails the same check
    with pytest.raises(ValueError, match="clipping switched off"):
        privacy.langevin_noise_multiplier(1e-2, 1e-4, 10.0, math.inf)
    model, fed = _regression(num_clients=2, rows=20)
    with pytest.raises(ValueError, match="unbounded"):
        fm.sample(model, fed, algorithm=fm.SGLD(1e-3, 10, privacy=(1.0, 1e-5),
                                                clip_norm=math.inf),
                  init=jnp.zeros(2), num_samples=5, chains=1)


def test_distinct_rows_are_a_uniform_subset():
    m, size, trials = 2, 5, 20000
    uniforms = jax.random.uniform(jax.random.PRNGKey(0), (trials, m))
    spread = jax.vmap(lambda u: clipping.distinct_row_uniforms(u, size))(uniforms)
    rows = np.sort(np.floor(np.asarray(spread) * size).astype(int), axis=1)
    assert np.all(rows[:, 0] < rows[:, 1])
    codes = rows[:, 0] * size + rows[:, 1]
    _, counts = np.unique(codes, return_counts=True)
    assert counts.size == math.comb(size, m)
    expected = trials / counts.size
    chi2 = np.sum((counts - expected) ** 2 / expected)
    assert chi2 < 27.9  # chi-square with 9 degrees of freedom, p = 0.001
    # a client with no more rows than the batch keeps the rule's uniforms (every row once)
    u = jnp.asarray([0.1, 0.7, 0.3])
    assert np.array_equal(np.asarray(clipping.distinct_row_uniforms(u, 3)), np.asarray(u))


@pytest.mark.parametrize("make, match", [
    (lambda: fm.SGLD(1e-3, 10, privacy="strong"), "privacy"),
    (lambda: fm.DSGLD(1e-3, 10, 5, privacy=(1.0, 1.5)), "privacy: delta"),
    (lambda: fm.FALD(1e-3, 10, 5, privacy=(-1.0, 1e-5)), "privacy: epsilon"),
    (lambda: fm.QLSD(1e-3, 10, privacy=fm.Privacy(epsilon=1.0, clip_norm=0.0)), "clip_norm"),
    (lambda: fm.SGLD(1e-3, 10, clip_norm=1.0), "privacy"),
])
def test_bad_privacy_arguments_raise_value_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("algorithm, options", [
    (lambda: fm.FSGLD(1e-3, 10, 5, privacy=(1.0, 1e-5)), {}),  # surrogates fitted from rows
    (lambda: fm.DSGLD("auto", 10, 5, privacy=(1.0, 1e-5)), {}),
    (lambda: fm.DSGLD(1e-3, 10, 5, control_variates="global", privacy=(1.0, 1e-5)), {}),
    (lambda: fm.FALD(1e-3, 10, 5, participation=0.5, privacy=(1.0, 1e-5)), {}),
    (lambda: fm.QLSD(1e-3, 10, variance_reduction=True, privacy=(1.0, 1e-5)), {}),
    # FA-LD on a message-passing engine (the baselines' private runs are in process only)
    (lambda: fm.FALD(1e-3, 10, 5, privacy=(1.0, 1e-5)), {"engine": "ray"}),
])
def test_what_cannot_be_accounted_is_refused_naming_privacy(algorithm, options):
    model, fed = _regression(num_clients=2, rows=20)
    with pytest.raises(ValueError, match="privacy= cannot account"):
        fm.sample(model, fed, algorithm=algorithm(), init=jnp.zeros(2), num_samples=5,
                  chains=1, **options)


def test_fed_pdmc_per_event_guarantee_composes_over_the_events():
    from fedmcmc.pdmp import privacy as pdmc

    eps, delta = 0.1, 1e-8
    assert pdmc.composed_privacy(eps, delta, 0) == (0.0, 0.0, "none")
    assert pdmc.composed_privacy(eps, delta, 3) == pytest.approx((0.3, 3e-8, "basic"))
    k = 10_000
    total, total_delta, rule = pdmc.composed_privacy(eps, delta, k)
    advanced = eps * math.sqrt(2 * k * math.log(1 / delta)) + k * eps * math.expm1(eps)
    assert rule == "advanced" and total == pytest.approx(advanced)
    assert total < k * eps and total_delta == pytest.approx((k + 1) * delta)
    report = pdmc.composed_report(eps, delta, 2.0, 5.0, [k, k])
    assert report["epsilon"] == [total, total] and report["events"] == [k, k]
    assert report["guarantee"]


def _gaussian_means(num_clients=4, rows=10, seed=2):
    """A conjugate Gaussian: rows y ~ N(theta, I_2), prior N(0, 10^2 I): posterior precision
    N + 1/100 on each coordinate, mean sum(y) / precision."""
    rng = np.random.default_rng(seed)
    clients = [{"y": (rng.normal(size=(rows, 2)) + np.array([0.5, -1.0])).astype(np.float32)}
               for _ in range(num_clients)]
    model = fm.Model(log_prior=lambda p: -0.5 * jnp.sum(p ** 2) / 100.0,
                     log_likelihood=lambda p, e: -0.5 * jnp.sum((e["y"] - p) ** 2))
    total = np.concatenate([c["y"] for c in clients]).astype(np.float64)
    precision = total.shape[0] + 1.0 / 100.0
    return model, fm.Federation(clients), total.sum(axis=0) / precision, precision


def test_a_private_fald_run_reports_dp_accountings_epsilon_for_its_events():
    """FA-LD updates every client at every iteration of every chain: T_s = chains (burn_in +
    n) thin events SampledWithoutReplacement(N_s, m, Gaussian(z_s)) (a plain Gaussian for the
    client with fewer rows than m), z_s at least z_L = m_s sqrt(f_s) / (N_s C sqrt(h))."""
    rng = np.random.default_rng(4)
    sizes = (60, 30, 8)  # the last client has fewer rows than the batch: full batch
    clients = []
    for rows in sizes:
        x = rng.normal(size=(rows, 2)).astype(np.float32)
        clients.append({"x": x, "y": (x @ np.array([1.0, -1.0])
                                      + rng.normal(size=rows)).astype(np.float32)})
    model, _ = _regression()
    fed = fm.Federation(clients)
    h, m, local_steps, clip, z, delta = 1e-3, 10, 4, 2.0, 3.0, 1e-6
    chains, burn_in, num_samples, thin = 2, 6, 20, 3
    algorithm = fm.FALD(h, m, local_steps, privacy=fm.Privacy(
        noise_multiplier=z, clip_norm=clip, delta=delta))
    result = fm.sample(model, fed, algorithm=algorithm, init=jnp.zeros(2),
                       num_samples=num_samples, burn_in=burn_in, thin=thin, chains=chains,
                       seed=5)
    info = result.info["privacy"]
    iterations = (burn_in + num_samples) * thin  # per chain
    # the steps counted are those the run made: its rounds start every local_steps iterations
    assert result.info["rounds_per_chain"] == [-(-iterations // local_steps)] * chains
    assert info["steps"] == [chains * iterations] * len(sizes)
    weights = np.asarray(fed.weights, np.float64)
    for s, (rows, f) in enumerate(zip(sizes, weights)):
        batch = min(m, rows)
        floor = batch * math.sqrt(f) / (rows * clip * math.sqrt(h))
        assert info["langevin_noise_multiplier"][s] == pytest.approx(floor, rel=1e-6)
        assert info["noise_multiplier"][s] == pytest.approx(max(z, floor), rel=1e-9)
        gaussian = dp_accounting.GaussianDpEvent(info["noise_multiplier"][s])
        event = gaussian if batch == rows else dp_accounting.SampledWithoutReplacementDpEvent(
            rows, batch, gaussian)
        accountant = rdp.RdpAccountant(list(privacy.RDP_ORDERS),
                                       dp_accounting.NeighboringRelation.REPLACE_ONE)
        accountant.compose(dp_accounting.SelfComposedDpEvent(event, chains * iterations))
        assert info["epsilon"][s] == pytest.approx(accountant.get_epsilon(delta), rel=1e-9)
    # the given noise is above the largest client's floor, the smallest client's floor above it
    assert info["noise_inflation"][0] > 1.0 and info["noise_inflation"][2] == 1.0


def test_fald_clips_each_rows_influence_on_a_local_step():
    """One FA-LD local step on client 0 (full batch, no noise) moves by (h/2) g_0 with g_0 =
    grad log p + (1/f_0) S: replacing one row moves the step by at most (h/2) (1/f_0) 2C.
    The broken variant (the kernel without clipping) exceeds the same bound."""
    from fedmcmc import rng as fm_rng
    from fedmcmc.baselines import fald

    model, _ = _regression()
    rng = np.random.default_rng(7)
    clients = [{"x": rng.normal(size=(6, 2)).astype(np.float32),
                "y": rng.normal(size=6).astype(np.float32)} for _ in range(2)]
    changed = [{k: v.copy() for k, v in c.items()} for c in clients]
    changed[0]["x"][2], changed[0]["y"][2] = 30.0, -400.0  # one row replaced by an extreme one
    h, clip, batch = 1e-2, 1.5, 8
    theta0 = jnp.asarray([0.4, -0.3])
    flat = model.flatten(theta0)

    def local_chains(data_clients, private):
        fed = fm.Federation(data_clients)
        weights = jnp.asarray(fed.weights, jnp.float32)
        step = fald.build_kernel(flat, fed.concatenated(), weights, batch, 3, h, None, None,
                                 False, private)
        state = jax.jit(step)(fm_rng.seed_key(0), fald.init(theta0, weights))
        return np.asarray(state.local, np.float64), float(weights[0])

    private = clipping.PrivateSteps(clip_norm=clip, noise_inflation=jnp.ones(2))
    (before, f0), (after, _) = local_chains(clients, private), local_chains(changed, private)
    bound = 0.5 * h * (1.0 / f0) * 2 * clip
    assert np.linalg.norm(after[0] - before[0]) <= bound * (1 + 1e-5)
    assert np.linalg.norm(after[0] - before[0]) > 0.1 * bound  # the replaced row was used
    np.testing.assert_allclose(after[1], before[1])  # the other client's chain is untouched
    (plain, _), (plain_changed, _) = local_chains(clients, None), local_chains(changed, None)
    assert np.linalg.norm(plain_changed[0] - plain[0]) > bound


def test_qlsd_clients_noise_variances_sum_to_the_servers():
    from fedmcmc.baselines import qlsd

    weights = jnp.asarray([0.5, 0.3, 0.15, 0.05])
    h = 1e-3
    scales = np.asarray(qlsd.client_noise_scales(weights, h, jnp.ones(4)), np.float64)
    # the server adds (h/2) sum_s of what the clients send: its noise variance
    assert np.sum((0.5 * h * scales) ** 2) == pytest.approx(h, rel=1e-6)
    inflation = jnp.asarray([1.0, 2.0, 1.5, 3.0])
    inflated = np.asarray(qlsd.client_noise_scales(weights, h, inflation), np.float64)
    assert np.sum((0.5 * h * inflated) ** 2) == pytest.approx(
        h * float(jnp.sum(weights * inflation ** 2)), rel=1e-6)


def _qlsd_law(private):
    """4 chains of 1000 draws of QLSD without quantisation, full batches, on the conjugate Gaussian."""
    model, fed, _, _ = _gaussian_means()
    algorithm = fm.QLSD(1e-2, 10, bits=None, privacy=fm.Privacy(
        noise_multiplier=1e-3, clip_norm=1e3) if private else None)  # the floor: a_s = 1
    result = fm.sample(model, fed, algorithm=algorithm, init=jnp.zeros(2), num_samples=1000,
                       burn_in=100, thin=1, chains=4, seed=11)
    return np.asarray(result.samples, np.float64), result.info.get("privacy")


def test_private_qlsd_with_no_extra_noise_samples_the_non_private_law(monkeypatch):
    """With every a_s = 1 and no clipping in effect, moving the Langevin noise to the clients
    changes nothing in law: private and non-private QLSD (no quantisation, full batches: both
    are ULA on the posterior) sample ULA's stationary N(mu, 1 / (lambda (1 - h lambda / 4)))
    within ESS tolerances. The broken variant (each client adding the server's whole noise,
    so the step's noise variance is S h) is rejected by the same check."""
    from fedmcmc.baselines import qlsd
    from stats import check_gaussian_moments, ess_of_variance

    _, _, mean, precision = _gaussian_means()
    h = 1e-2
    stationary = np.eye(2) / (precision * (1.0 - h * precision / 4.0))
    for private in (False, True):
        draws, info = _qlsd_law(private)
        if private:
            assert info["noise_inflation"] == pytest.approx([1.0] * 4)
        check = check_gaussian_moments(draws, mean, stationary, var_ess=ess_of_variance(draws))
        assert check["ok"], (private, check)
    monkeypatch.setattr(qlsd, "client_noise_scales",
                        lambda weights, step_size, inflation: 2.0 * jnp.sqrt(
                            1.0 / step_size) * inflation * jnp.ones_like(weights))
    draws, _ = _qlsd_law(True)
    broken = check_gaussian_moments(draws, mean, stationary, var_ess=ess_of_variance(draws))
    assert not broken["ok"], broken


def test_a_scheduled_run_that_visits_a_client_more_than_planned_never_reports_above_budget(
        monkeypatch):
    """DSGLD plans each client's visits at a quantile of their Binomial law; planned at the
    median instead (SCHEDULE_TAIL = 0.5), a client is visited more often than planned and its
    epsilon, as made, would exceed the budget. The run then stops at its last draw within the
    budget: the draws kept are the first draws of the full run, their epsilon within it."""
    monkeypatch.setattr(privacy, "SCHEDULE_TAIL", 0.5)
    model, fed = _regression(num_clients=3, rows=60)
    target, num_samples = 0.5, 8
    algorithm = fm.DSGLD(step_size=1e-3, batch_size=10, local_steps=3,
                         privacy=fm.Privacy(epsilon=target, delta=1e-5, clip_norm=2.0))
    run = dict(init=jnp.zeros(2), burn_in=4, thin=1, chains=2, seed=0)
    with pytest.raises(fm.PrivacyBudgetExceeded, match="more often than planned") as caught:
        fm.sample(model, fed, algorithm=algorithm, num_samples=num_samples, **run)
    kept = caught.value.result
    info = kept.info["privacy"]
    draws = info["draws_within_budget"]
    assert 0 < draws < num_samples and np.shape(kept.samples)[:2] == (2, draws)
    assert max(info["epsilon"]) <= target
    assert info["steps"] == [v * 3 for v in kept.info["visits_per_client"]]
    # the kept draws are the full run's first ones (with the schedule's noise, not the
    # schedule's quantile, the full run would overspend)
    monkeypatch.setattr(privacy, "SCHEDULE_TAIL", 1e-6)
    plain = fm.DSGLD(step_size=1e-3, batch_size=10, local_steps=3, privacy=fm.Privacy(
        noise_multiplier=info["noise_multiplier"][0], clip_norm=2.0, delta=1e-5))
    longer = fm.sample(model, fed, algorithm=plain, num_samples=draws + 1, **run)
    assert info["noise_multiplier"] == [info["noise_multiplier"][0]] * 3  # equal clients
    np.testing.assert_array_equal(np.asarray(longer.samples)[:, :draws],
                                  np.asarray(kept.samples))
    assert max(privacy.epsilon_of_steps(z, 60, 10, t, 1e-5) for z, t in zip(
        info["noise_multiplier"], longer.info["privacy"]["steps"])) > target
