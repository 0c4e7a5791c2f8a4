"""pSGLD's diagonal preconditioning (Li, Chen, Carlson & Carin 2016;
``langevin/preconditioning.py``) in the Langevin family, against the exact posterior of a
conjugate Gaussian federation.

The problem: the mean of 2-dimensional rows with per-row precision diag(1, 100) (a posterior of
condition number 100), a N(0, I) prior, 4 non-IID clients of 6 to 280 rows, minibatches of 10
(the smallest client uses its whole data), DSGLD with one update per visit. The estimator's
noise (within and between clients) is independent of theta and dominates V (about 60 and 100
times the posterior precision), the regime where G hardly depends on theta and the dropped
Gamma term is of order (1 - decay) times the mean gradient's share of V (here 1-2%; module
docstring). For a fixed G the chain is a linear recursion whose stationary variance is exactly

    (1 + h G C / 4) / (p (1 - h G p / 4))                        per coordinate,

and V's stationary value is E[v^2] / N^2 = (p^2 var + C) / N^2, so the test solves the two for
G and the variance (:func:`target`), independently of the library, and compares the draws'
mean and variance with them (tolerances from the bulk ESS). Measured at the test's h with 8
chains x 1,000 draws (bulk ESS 3,400 and 7,800), the library's draws had mean z-scores 0.09 and
-0.43 and variance ratios 1.025 and 1.025 against that target: the bias left by what the target
ignores (G's fluctuations, the Gamma term), about 2.5 % in variance, is well inside the default
test's tolerance (4 chains x 200 draws: about +-0.3 in variance, 0.2 sd in mean). The same
check rejects a preconditioner whose noise is not scaled by G (N(0, h I)).
"""

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc.engines.handoff import sample_protocol

from stats import check_gaussian_moments

ROW_PRECISION = np.array([1.0, 100.0])
SIZES = (6, 24, 90, 280)
BATCH = 10
MODEL = fm.Model(
    log_prior=lambda theta: -0.5 * jnp.sum(theta**2),
    log_likelihood=lambda theta, x: -0.5 * jnp.sum(
        jnp.asarray(ROW_PRECISION, jnp.float32) * (x - theta) ** 2),
    name="ill_conditioned_gaussian_mean",
)


def ill_conditioned_federation(seed=0):
    """Clients of very unequal sizes, each shifted by up to one row sd (non-IID)."""
    rng = np.random.default_rng(seed)
    clients = []
    for size in SIZES:
        shift = rng.uniform(-1, 1, size=2) / np.sqrt(ROW_PRECISION)
        rows = shift + rng.normal(size=(size, 2)) / np.sqrt(ROW_PRECISION)
        clients.append(rows.astype(np.float32))
    return fm.Federation(clients)


def target(federation, step_size, batch_size=BATCH, epsilon=1e-5, pooled=False):
    """(posterior mean, stationary variance of preconditioned DSGLD with one update per visit,
    G, posterior precision, gradient noise variance C), per coordinate (module docstring);
    ``pooled``: of SGLD on the pooled rows."""
    clients = [np.asarray(c, np.float64) for c in federation.clients]
    total = sum(len(c) for c in clients)
    shares = np.array([len(c) for c in clients]) / total  # f_s = N_s / N
    precision = 1.0 + total * ROW_PRECISION
    mean = ROW_PRECISION * sum(c.sum(axis=0) for c in clients) / precision
    # the estimator's noise around -p (theta - m): a minibatch of m of a client's rows (none
    # for a client of at most m rows, used whole), scaled by N_s / f_s = N ...
    within = sum(f * total**2 * ROW_PRECISION**2 * c.var(axis=0) / batch_size
                 * (len(c) > batch_size) for f, c in zip(shares, clients))
    # ... and the client drawn with probability f_s: N Lambda (xbar_s - xbar)
    means = np.stack([c.mean(axis=0) for c in clients])
    between = total**2 * ROW_PRECISION**2 * (shares @ means**2 - (shares @ means) ** 2)
    noise = within + between
    if pooled:
        rows = np.concatenate(clients)
        noise = total**2 * ROW_PRECISION**2 * rows.var(axis=0) / batch_size
    variance = 1.0 / precision
    for _ in range(100):  # the fixed point of V and the variance
        scale = 1.0 / (epsilon + np.sqrt((precision**2 * variance + noise) / total**2))
        variance = (1 + step_size * scale * noise / 4) / (
            precision * (1 - step_size * scale * precision / 4))
    return mean, variance, scale, precision, noise


def settings(federation, inflation=0.25, pooled=False):
    """h at which the noise inflates the stiffer coordinate's variance by ``inflation`` (the
    target includes it exactly), and ``thin`` about one relaxation time of the slower one."""
    _, _, scale, precision, noise = target(federation, 1e-9, pooled=pooled)
    step_size = float(4 * inflation / (scale * noise).max())
    _, _, scale, precision, _ = target(federation, step_size, pooled=pooled)
    thin = int(np.ceil(1.0 / (step_size * (scale * precision).min())))
    return step_size, thin


class NoiseNotScaled(fm.RMSPropPreconditioner):
    """A deliberately broken pSGLD: the drift is scaled by G, the noise is N(0, h I)."""

    def move(self, position, gradient, step_size, normal, square_average, rows, first,
             noise=True):
        updated = self.update(square_average, gradient, rows, first)
        scale = self.diagonal(jnp.where(first, updated, square_average))
        position = position + 0.5 * step_size * scale * gradient + jnp.sqrt(step_size) * normal
        return position, updated


def run_dsgld(preconditioner, num_samples=200, chains=4, seed=1):
    federation = ill_conditioned_federation()
    mean, _, _, _, _ = target(federation, 1e-9)
    step_size, thin = settings(federation)
    algorithm = fm.DSGLD(step_size=step_size, batch_size=BATCH, local_steps=1,
                         preconditioner=preconditioner)
    # started at the mean: the test is about the stationary law, not the transient
    return fm.sample(MODEL, federation, algorithm, init=jnp.asarray(mean, jnp.float32),
                     num_samples=num_samples, burn_in=20, thin=thin, chains=chains, seed=seed,
                     convergence=False)


def check(result):
    federation = ill_conditioned_federation()
    step_size, _ = settings(federation)
    mean, variance, scale, precision, noise = target(federation, step_size)
    # the regime of the module docstring: noise-dominated V, G far from 1 in both directions
    assert np.all(noise / precision > 30) and scale[0] > 2 and scale[1] < 0.3
    return check_gaussian_moments(result.flat_samples(), mean, np.diag(variance))


def test_preconditioned_dsgld_samples_the_ill_conditioned_posterior():
    result = run_dsgld("rmsprop")
    figures = check(result)
    assert figures["ok"], figures
    assert result.info["preconditioner"] == {"kind": "rmsprop", "decay": 0.99,
                                             "epsilon": 1e-5}
    # the carry is (theta, V): 2 d floats per hand-off
    dim, handoffs = 2, 2 * sum(result.info["rounds_per_chain"])
    draws = result.flat_samples().shape[1] + 20
    assert result.info["floats_communicated"] == handoffs * 2 * dim + draws * 4 * dim


def test_the_same_check_rejects_noise_not_scaled_by_the_preconditioner():
    figures = check(run_dsgld(NoiseNotScaled(), num_samples=100))
    assert not figures["ok"], figures
    # G is about 2.5 and 0.2: N(0, h I) noise gives about 1/G of the variance
    assert figures["var_ratio"][0] < 0.6 and figures["var_ratio"][1] > 2.0, figures


def equal_clients(seed=2, clients=3, size=20):
    """Clients of one size (their hand-off visits share one compiled program), non-IID."""
    rng = np.random.default_rng(seed)
    return fm.Federation([
        (rng.uniform(-1, 1, size=2) + rng.normal(size=(size, 2)) / np.sqrt(ROW_PRECISION)
         ).astype(np.float32) for _ in range(clients)])


@pytest.mark.parametrize("make", [
    lambda: fm.DSGLD(step_size=1e-4, batch_size=BATCH, local_steps=7,
                     preconditioner=fm.RMSPropPreconditioner(0.9, 1e-4)),
    # the trust radius widened for the preconditioned chain, alike on both
    pytest.param(lambda: fm.FSGLD(step_size=1e-4, batch_size=BATCH, local_steps=7,
                                  surrogate="exact", preconditioner="rmsprop"),
                 marks=pytest.mark.slow),
], ids=["DSGLD", "FSGLD"])
def test_the_chain_carries_the_average_from_client_to_client(make):
    """The hand-off protocol on the in-process transport (message for message as on Ray)
    gives the in-process kernel's draws: V travels with the chain between the clients."""
    federation = equal_clients()
    kw = dict(init=jnp.zeros(2), num_samples=20, burn_in=5, thin=10, chains=2, seed=3)
    algorithm = make()
    local = fm.sample(MODEL, federation, algorithm, convergence=False, **kw)
    handed = sample_protocol(algorithm.handoff_protocol(), MODEL, federation, engine="local",
                             **kw)
    np.testing.assert_allclose(handed.flat_samples(), local.flat_samples(), rtol=0, atol=1e-4)
    np.testing.assert_array_equal(handed.sample_stats["client"], local.sample_stats["client"])
    if "trust_radius" in local.info:
        assert handed.info["trust_radius"] == pytest.approx(local.info["trust_radius"],
                                                            rel=1e-4)


@pytest.mark.slow
def test_preconditioned_sgld_samples_the_ill_conditioned_posterior():
    federation = ill_conditioned_federation()
    step_size, thin = settings(federation, pooled=True)
    mean, variance, scale, _, _ = target(federation, step_size, pooled=True)
    algorithm = fm.SGLD(step_size=step_size, batch_size=BATCH, preconditioner="rmsprop")
    result = fm.sample(MODEL, federation, algorithm, init=jnp.asarray(mean, jnp.float32),
                       num_samples=400, burn_in=20, thin=thin, chains=4, seed=1,
                       convergence=False)
    figures = check_gaussian_moments(result.flat_samples(), mean, np.diag(variance))
    assert figures["ok"], figures


@pytest.mark.parametrize("make, argument", [
    (lambda: fm.DSGLD(1e-4, 10, 5, preconditioner="adam"), "preconditioner"),
    (lambda: fm.SGLD(1e-4, 10, preconditioner=3), "preconditioner"),
    (lambda: fm.RMSPropPreconditioner(decay=1.0), "decay"),
    (lambda: fm.RMSPropPreconditioner(decay=0.0), "decay"),
    (lambda: fm.RMSPropPreconditioner(epsilon=0.0), "epsilon"),
    (lambda: fm.RMSPropPreconditioner(epsilon=float("nan")), "epsilon"),
    (lambda: fm.FSGLD("auto", 10, 5, preconditioner="rmsprop"), "step_size"),
    (lambda: fm.SGLD("auto", 10, preconditioner="rmsprop"), "step_size"),
    (lambda: fm.DSGLD(1e-4, 10, 5, privacy=(1.0, 1e-5), preconditioner="rmsprop"), "privacy"),
    (lambda: fm.DSGLD(1e-4, 10, 5, control_variates="global", preconditioner="rmsprop"),
     "control_variates"),
    (lambda: fm.DSGLD(1e-4, 10, 5, client_selection="variance", preconditioner="rmsprop"),
     "client_selection"),
], ids=["unknown-kind", "not-a-preconditioner", "decay-1", "decay-0", "epsilon-0",
        "epsilon-nan", "auto-h-fsgld", "auto-h-sgld", "privacy", "control-variates",
        "variance-selection"])
def test_bad_settings_name_the_argument(make, argument):
    with pytest.raises(ValueError, match=argument):
        make()


@pytest.mark.parametrize("engine", ["local", pytest.param("ray", marks=pytest.mark.slow)])
def test_auto_run_lengths_are_refused(engine, request):
    if engine == "ray":
        request.getfixturevalue("local_ray")
    algorithm = fm.DSGLD(1e-6, BATCH, 5, preconditioner="rmsprop")
    with pytest.raises(ValueError, match="thin"):
        fm.sample(MODEL, ill_conditioned_federation(), algorithm, init=jnp.zeros(2),
                  num_samples=10, thin="auto", engine=engine)


@pytest.mark.slow
def test_ray_gives_the_in_process_draws(local_ray):
    """engine="ray": V travels in the messages between the client actors, the draws are the
    in-process engine's."""
    federation = ill_conditioned_federation()
    step_size, _ = settings(federation)
    kw = dict(init=jnp.zeros(2), num_samples=20, burn_in=5, thin=10, chains=2, seed=3)
    for algorithm in (fm.DSGLD(step_size=step_size, batch_size=BATCH, local_steps=7,
                               preconditioner="rmsprop"),
                      fm.FSGLD(step_size=step_size, batch_size=BATCH, local_steps=7,
                               surrogate="exact", preconditioner="rmsprop")):
        local = fm.sample(MODEL, federation, algorithm, convergence=False, **kw)
        on_ray = fm.sample(MODEL, federation, algorithm, engine="ray", visit_timeout=120.0,
                           convergence=False, **kw)
        np.testing.assert_allclose(on_ray.flat_samples(), local.flat_samples(), rtol=0,
                                   atol=1e-4)
        np.testing.assert_array_equal(on_ray.sample_stats["client"],
                                      local.sample_stats["client"])
        assert on_ray.info["preconditioner"] == local.info["preconditioner"]
