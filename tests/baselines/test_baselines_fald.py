"""FA-LD and VR-FALD* (fm.FALD) against exact laws.

On a Gaussian target every FALD variant is a linear Gaussian recursion, so the law of
its draws is known in closed form and the tests compare the draws with it
(``check_gaussian_moments``: mean z-scores from the bulk ESS, variance ratios within
z sqrt(2 / ESS)):

* one local step, full participation, full batches: ULA on the global posterior, whose
  stationary covariance is (A (I - h A / 4))^-1 (A = posterior precision; the papers'
  convention theta + h/2 grad + N(0, h));
* one local step with minibatches: the same with the gradient noise's variance;
* partial participation (scheme I): one step's drift has the extra variance of the
  random average of the clients' local modes, computed from the multinomial law;
* many local steps on heterogeneous clients: the round-end states follow
  theta' = M theta + c + eps, M = sum_s f_s A_s^K, whose stationary mean and covariance
  (discrete Lyapunov equation) the test computes; FA-LD's mean is then biased away from
  the posterior mean (Plassier et al.'s heterogeneity bias) and VR-FALD*'s is not.

Each check is shown to reject a deliberately broken variant (noise not scaled by
1/sqrt(f_s); the full-participation law for a partial-participation run; FA-LD where
VR-FALD* is claimed).
"""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.linalg import solve_discrete_lyapunov

import fedmcmc as fm
from fedmcmc import checkpoint
from fedmcmc.baselines import fald

from stats import check_gaussian_moments

DIM = 2


def gaussian_federation(seed=0, sizes=(15, 25, 4, 40), spread=1.5):
    rng = np.random.default_rng(seed)
    means = rng.uniform(-spread, spread, size=(len(sizes), DIM))
    clients = [rng.normal(m, 1.0, size=(n, DIM)).astype(np.float32) for m, n in zip(means, sizes)]
    return fm.Federation(clients)


GAUSSIAN = fm.models.gaussian_mean(DIM)  # x ~ N(mu, I), mu ~ N(0, I)


def regression_federation(seed=0, sizes=(30, 50, 40, 60, 20), dim=3, noise_sd=0.5):
    """Non-IID clients: each client's inputs are shifted and scaled differently."""
    rng = np.random.default_rng(seed)
    beta = rng.normal(size=dim)
    clients = []
    for n in sizes:
        shift = rng.uniform(-2, 2, size=dim)
        scale = rng.uniform(0.3, 1.5, size=dim)
        x = (rng.normal(size=(n, dim)) * scale + shift).astype(np.float32)
        y = (x @ beta + noise_sd * rng.normal(size=n)).astype(np.float32)
        clients.append({"x": x, "y": y})
    return fm.Federation(clients), fm.models.linear_regression(dim, noise_std=noise_sd)


def client_quadratics(federation, model):
    """Each client's -log pi_s = 1/2 theta' H_s theta - b_s' theta (+ const), with the prior
    shared by the weights f_s; model: gaussian_mean (unit noise, N(0, I) prior) or
    linear_regression (prior precision 1)."""
    f = federation.weights
    hessians, shifts = [], []
    for s, client in enumerate(federation.clients):
        if isinstance(client, dict):
            sigma = 0.5 if model.name == "linear_regression" else 1.0
            x, y = client["x"].astype(np.float64), client["y"].astype(np.float64)
            h = x.T @ x / sigma**2
            b = x.T @ y / sigma**2
            dim = x.shape[1]
        else:
            x = client.astype(np.float64)
            dim = x.shape[1]
            h = len(x) * np.eye(dim)
            b = x.sum(axis=0)
        hessians.append(h + f[s] * np.eye(dim))
        shifts.append(b)
    return np.array(hessians), np.array(shifts)


def fald_round_law(federation, model, h, local_steps, variance_reduction=False):
    """Stationary mean and covariance of FALD's round-end states (full participation,
    full batches) on a Gaussian target: theta' = M theta + c + eps."""
    f = federation.weights
    hessians, shifts = client_quadratics(federation, model)
    dim = hessians.shape[1]
    posterior_precision = hessians.sum(0)
    posterior_mean = np.linalg.solve(posterior_precision, shifts.sum(0))
    M = np.zeros((dim, dim))
    c = np.zeros(dim)
    Q = np.zeros((dim, dim))
    for s in range(len(f)):
        B = hessians[s] / f[s]  # g_s(theta) = -B theta + c_s
        c_s = shifts[s] / f[s] if not variance_reduction else B @ posterior_mean
        A = np.eye(dim) - 0.5 * h * B
        power = np.eye(dim)
        drift, noise = np.zeros(dim), np.zeros((dim, dim))
        for _ in range(local_steps):
            drift += power @ (0.5 * h * c_s)
            noise += (h / f[s]) * power @ power.T
            power = A @ power
        M += f[s] * power
        c += f[s] * drift
        Q += f[s] ** 2 * noise
    mean = np.linalg.solve(np.eye(dim) - M, c)
    return mean, solve_discrete_lyapunov(M, Q), posterior_mean, np.linalg.inv(posterior_precision)


def ula_covariance(covariance, h):
    precision = np.linalg.inv(covariance)
    return np.linalg.inv(precision @ (np.eye(len(precision)) - h * precision / 4))


def run(algorithm, federation, model, num_samples=1000, thin=1, chains=8, burn_in=200, seed=1):
    init = jnp.zeros(model.attributes["init"]().shape)
    return fm.sample(model, federation, algorithm, init=init, num_samples=num_samples,
                     burn_in=burn_in, thin=thin, chains=chains, seed=seed, progress=False)


# ------------------------------------------------------------------ one local step = ULA


def test_one_local_step_full_batch_is_ula_on_the_global_posterior():
    federation, model = regression_federation()
    mean, cov = model.attributes["exact_posterior"](federation)
    largest = 1.0 / np.linalg.eigvalsh(cov).min()
    h = 0.5 / largest
    thin = int(np.ceil(2.0 / (h / np.linalg.eigvalsh(cov).max())))
    algorithm = fm.FALD(step_size=h, batch_size=60, local_steps=1)
    draws = run(algorithm, federation, model, thin=thin).flat_samples()
    figures = check_gaussian_moments(draws, mean, ula_covariance(cov, h))
    assert figures["ok"], figures


def test_unscaled_client_noise_is_rejected(monkeypatch):
    """Every client injecting N(0, h) (instead of N(0, h / f_s)) gives the average too little
    noise: the same check rejects it."""
    federation, model = regression_federation()
    mean, cov = model.attributes["exact_posterior"](federation)
    largest = 1.0 / np.linalg.eigvalsh(cov).min()
    h = 0.5 / largest
    thin = int(np.ceil(2.0 / (h / np.linalg.eigvalsh(cov).max())))
    monkeypatch.setattr(fald, "independent_noise_scales",
                        lambda step_size, weights: jnp.sqrt(step_size) * jnp.ones_like(weights))
    algorithm = fm.FALD(step_size=h, batch_size=60, local_steps=1)
    draws = run(algorithm, federation, model, thin=thin).flat_samples()
    assert not check_gaussian_moments(draws, mean, ula_covariance(cov, h))["ok"]


def test_one_local_step_with_minibatches_matches_the_discretised_law():
    """batch_size 5 with a client of 4 rows (it uses all of them: exact gradient). The
    gradient noise of the f-weighted average is sum_s n_s^2 var_s / m per coordinate (f_s
    cancels); the law is (1 + h sigma^2 / 4) / (lambda (1 - h lambda / 4))."""
    federation = gaussian_federation()
    mean, cov = GAUSSIAN.attributes["exact_posterior"](federation)
    m = 5
    sigma2 = sum(len(c) ** 2 * c.astype(np.float64).var(axis=0) / m
                 for c in federation.clients if len(c) > m)
    lam = federation.total_size + 1.0
    h = float(4 * 0.25 / sigma2.max())
    expected = (1 + h * sigma2 / 4) / (lam * (1 - h * lam / 4))
    thin = int(np.ceil(2.0 / (h * lam)))
    draws = run(fm.FALD(step_size=h, batch_size=m, local_steps=1), federation, GAUSSIAN,
                thin=thin).flat_samples()
    figures = check_gaussian_moments(draws, mean, np.diag(expected))
    assert figures["ok"], figures


# ------------------------------------------------------------------ partial participation


def partial_participation_law(federation, h, k):
    """Gaussian mean, f_s = n_s / N: every client's direction is (N + 1)(mu_s - theta), with
    local modes mu_s = N xbar_s / (N + 1), so a round of one step moves theta by
    (h/2)(N + 1)(sum_s a_s mu_s - theta) + N(0, h); a = multinomial(K, f) / K adds the
    variance (1/K) Var_f(mu) to the drift's target."""
    n_total = federation.total_size
    f = federation.weights
    modes = np.stack([n_total * c.astype(np.float64).mean(0) / (n_total + 1)
                      for c in federation.clients])
    spread = (f[:, None] * modes**2).sum(0) - ((f[:, None] * modes).sum(0)) ** 2
    lam = n_total + 1.0
    a = 1 - 0.5 * h * lam
    return (h + (0.5 * h * lam) ** 2 * spread / k) / (1 - a**2)


def test_partial_participation_matches_its_law_and_the_full_law_is_rejected():
    federation = gaussian_federation(sizes=(15, 25, 20, 40, 30, 10), spread=0.4)
    mean, cov = GAUSSIAN.attributes["exact_posterior"](federation)
    lam = federation.total_size + 1.0
    h = 0.2 / lam
    algorithm = fm.FALD(step_size=h, batch_size=40, local_steps=1, participation=0.5)
    assert algorithm.clients_per_round(6) == 3
    result = run(algorithm, federation, GAUSSIAN, thin=int(np.ceil(2.0 / (h * lam))))
    draws = result.flat_samples()
    variance = partial_participation_law(federation, h, k=3)
    figures = check_gaussian_moments(draws, mean, np.diag(variance))
    assert figures["ok"], figures
    # the law without the participation term (ULA's) is rejected by the same check
    assert not check_gaussian_moments(draws, mean, ula_covariance(cov, h))["ok"]
    assert result.info["clients_per_round"] == 3
    assert result.info["rounds"] == result.info["iterations"]


# ------------------------------------------------------------------ heterogeneity bias

HETEROGENEOUS_SIZES = (20, 80, 10, 60, 30)


@pytest.mark.slow
def test_many_local_steps_bias_fald_and_vr_fald_star_removes_it():
    """Plassier et al.'s claim on heterogeneous clients: with 40 local steps, FA-LD's
    round-end states follow the law computed here, whose mean is far from the posterior
    mean (|z| > 4 against the draws' ESS); VR-FALD* follows its own law with the posterior
    mean."""
    federation, model = regression_federation(sizes=HETEROGENEOUS_SIZES)
    _, cov = model.attributes["exact_posterior"](federation)
    h = 0.2 / (1.0 / np.linalg.eigvalsh(cov).min())
    local_steps = 40
    figures = {}
    for vr in (False, True):
        mean, law_cov, posterior_mean, _ = fald_round_law(federation, model, h, local_steps, vr)
        algorithm = fm.FALD(step_size=h, batch_size=100, local_steps=local_steps,
                            variance_reduction=vr)
        draws = run(algorithm, federation, model, num_samples=1500, thin=local_steps,
                    burn_in=100).flat_samples()
        own = check_gaussian_moments(draws, mean, law_cov)
        assert own["ok"], (vr, own)
        against_posterior = check_gaussian_moments(draws, posterior_mean, law_cov)
        figures[vr] = against_posterior
    assert not figures[False]["ok_mean"], figures[False]  # FA-LD: heterogeneity bias
    assert figures[True]["ok_mean"], figures[True]  # VR-FALD*: none


def test_vr_fald_star_mean_is_unbiased_where_fald_is_not_quick():
    """The fast version of the claim: the two laws' means (no sampling; FA-LD's is more
    than an sd from the posterior mean), and a short VR-FALD* run with its mode search."""
    federation, model = regression_federation(sizes=HETEROGENEOUS_SIZES)
    _, cov = model.attributes["exact_posterior"](federation)
    h = 0.2 / (1.0 / np.linalg.eigvalsh(cov).min())
    mean_fald, cov_fald, posterior_mean, _ = fald_round_law(federation, model, h, 40, False)
    mean_vr, _, _, _ = fald_round_law(federation, model, h, 40, True)
    sd = np.sqrt(np.diag(cov_fald))
    assert np.max(np.abs(mean_fald - posterior_mean) / sd) > 1.0
    assert np.max(np.abs(mean_vr - posterior_mean) / sd) < 1e-8
    result = run(fm.FALD(step_size=h, batch_size=100, local_steps=40, variance_reduction=True),
                 federation, model, num_samples=50, thin=40, chains=2, burn_in=10)
    assert result.algorithm == "VR-FALD*"
    assert result.info["reference_point"] == "lbfgs"
    assert result.info["reference_gradient_norm"] < 1e-1
    assert result.info["rounds"] > result.info["iterations"] // 40


@pytest.mark.parametrize("local_steps", [1, 10, 40])
def test_the_predicted_drift_bias_is_the_exact_laws(local_steps):
    """step_size/thin "auto" predict FA-LD's heterogeneity bias from the clients' Laplace
    fits (exact here: a linear-Gaussian model): the offset of the round law's mean from the
    posterior mean, in posterior sds; none with one local step."""
    from fedmcmc.baselines import tuning

    federation, model = regression_federation(sizes=HETEROGENEOUS_SIZES)
    _, cov = model.attributes["exact_posterior"](federation)
    h = 0.2 * np.linalg.eigvalsh(cov).min()
    init = jnp.zeros(model.attributes["init"]().shape)
    flat = model.flatten(init)
    fit = tuning.in_process_laplace(flat, federation, flat.ravel(init))
    mean, _, posterior_mean, posterior_cov = fald_round_law(federation, model, h, local_steps)
    expected = np.max(np.abs(mean - posterior_mean) / np.sqrt(np.diag(posterior_cov)))
    predicted = tuning.drift_bias(flat, fit, federation.weights, h, local_steps)
    assert predicted == pytest.approx(expected, rel=2e-3, abs=1e-5)
    if local_steps == 1:
        assert predicted < 1e-5
    else:
        assert predicted > 0.1


# ------------------------------------------------------------------ API


def test_info_and_communication():
    federation = gaussian_federation()
    algorithm = fm.FALD(step_size=1e-3, batch_size=5, local_steps=4)
    result = run(algorithm, federation, GAUSSIAN, num_samples=10, thin=4, chains=2, burn_in=2)
    info = result.info
    assert info["iterations"] == 48 and info["rounds"] == 12
    # every round: theta to each of the 4 clients and back, per chain; draws at round ends
    assert info["messages"] == 2 * 4 * 12 * 2
    assert info["floats_communicated"] == info["messages"] * DIM
    assert result.samples.shape == (2, 10, DIM)
    assert result.sample_stats["round"].shape == (2, 10)
    # a draw inside a round needs the participants' local chains
    result = run(algorithm, federation, GAUSSIAN, num_samples=10, thin=2, chains=1, burn_in=0)
    assert result.info["draws_inside_rounds_uploads"] == 5 * 4


def test_resume_reproduces_the_draws():
    federation = gaussian_federation()
    algorithm = fm.FALD(step_size=1e-3, batch_size=5, local_steps=3, participation=0.5)
    saved = {}

    def on_chunk(states, done):
        if done == 10:
            saved["states"] = checkpoint.states_to_numpy(states)  # what Checkpointer saves

    common = dict(init=jnp.zeros(DIM), num_samples=20, burn_in=0, thin=2, chains=2, seed=3,
                  progress=False)
    full = fm.sample(GAUSSIAN, federation, algorithm, chunk_size=10, on_chunk=on_chunk, **common)
    resumed = fm.sample(GAUSSIAN, federation, algorithm, start_draw=10,
                        resume_state=saved["states"], **common)
    np.testing.assert_array_equal(full.samples[:, 10:], resumed.samples)


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(step_size=0.0, batch_size=5, local_steps=2), "step_size"),
        (dict(step_size=1e-3, batch_size=0, local_steps=2), "batch_size"),
        (dict(step_size=1e-3, batch_size=5, local_steps=0), "local_steps"),
        (dict(step_size=1e-3, batch_size=5, local_steps=2, participation=1.5), "participation"),
        (dict(step_size=1e-3, batch_size=5, local_steps=2, participation=0), "participation"),
        (dict(step_size=1e-3, batch_size=5, local_steps=2, variance_reduction="yes"),
         "variance_reduction"),
        (dict(step_size=1e-3, batch_size=5, local_steps=2, reference_point=jnp.zeros(2)),
         "reference_point"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        fm.FALD(**kwargs)


def test_bad_reference_point():
    federation = gaussian_federation()
    algorithm = fm.FALD(step_size=1e-3, batch_size=5, local_steps=2, variance_reduction=True,
                        reference_point=jnp.zeros(3))
    with pytest.raises(ValueError, match="reference_point"):
        run(algorithm, federation, GAUSSIAN, num_samples=5)


def test_divergence_keeps_the_draws_made_before():
    federation = gaussian_federation()
    algorithm = fm.FALD(step_size=0.5, batch_size=5, local_steps=2)
    with pytest.raises(fm.SamplingDivergedError) as caught:
        run(algorithm, federation, GAUSSIAN, num_samples=200, chains=2, burn_in=0)
    error = caught.value
    assert error.result is not None and error.chains
    assert "step_size" in str(error)
