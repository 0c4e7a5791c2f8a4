"""Run lengths the Langevin family chooses (issue 44): ``thin="auto"``, ``burn_in="auto"`` and
the budget of ``step_size="auto"`` (``fedmcmc.run_length``, ``langevin/step_size.py``).

Fast tests: "auto" resolves from the relaxation time ``2 / (h lambda_min(P))`` of the Laplace
precision P the set-up builds and is recorded in ``info``; given values are kept; bad input
is named; the budget rule raises an ``"auto"`` h too slow for the run (never past the accuracy
ceiling unless the run would not make one relaxation time, never past the stability ceiling),
records and warns; on Ray with data that stay on the clients the protocol's set-up resolves
the same run lengths as the in-process engine.

Slow tests, on the real federations of ``tests/real_federations.py`` against their exact or
NUTS references, with ``thin="auto"``, ``burn_in="auto"`` and ``step_size="auto"``: FSGLD on
all three, DSGLD and SGLD on one each, within 0.15 posterior sd with sd ratios in
[0.85, 1.15]; the same runs with ``thin=1`` (too short) raise ``ConvergenceWarning``; a
broken variant (no injected noise) is flagged by the convergence check or the accuracy check.
"""

import math
import time
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc import run_length
from fedmcmc.langevin import step_size as step_size_module

DIM = 2
MODEL = fm.Model(
    log_prior=lambda mu: -0.5 * jnp.sum(mu**2),
    log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2),
)
SIZES = (4, 30, 200, 700)


def gaussian_clients(spread=2.0):
    rng = np.random.default_rng(3)
    return [rng.normal(rng.uniform(-spread, spread, DIM), 1.0, size=(n, DIM)).astype(np.float32)
            for n in SIZES]


def gaussian_federation(spread=2.0):
    return fm.Federation(gaussian_clients(spread))


#: the Gaussian model's posterior precision: (1 + N) I exactly (the Laplace fit is exact)
PRECISION = 1.0 + sum(SIZES)


def _sample(algorithm, federation=None, **kw):
    arguments = dict(init=jnp.zeros(DIM), num_samples=20, burn_in="auto", thin="auto",
                     chains=2, seed=4, progress=False)
    arguments.update(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fm.ConvergenceWarning)
        return fm.sample(MODEL, federation or gaussian_federation(), algorithm, **arguments)


def _expected_burn_in(info, num_samples):
    relaxations = run_length.burn_in_relaxations(info["initial_offset_sd"])
    return max(math.ceil(relaxations * info["relaxation_time"] / info["thin"]),
               math.ceil(0.1 * num_samples))


@pytest.mark.parametrize("make", [
    lambda: fm.FSGLD(step_size="auto", batch_size=10, local_steps=5),
    # a given h: the Laplace fit of the "auto" path is made for the relaxation time
    lambda: fm.DSGLD(step_size=2e-4, batch_size=10, local_steps=5),
    pytest.param(lambda: fm.SGLD(step_size=2e-4, batch_size=10), marks=pytest.mark.slow),
    pytest.param(lambda: fm.SGLD(step_size="auto", batch_size=10), marks=pytest.mark.slow),
], ids=["FSGLD-auto", "DSGLD-given-h", "SGLD-given-h", "SGLD-auto"])
def test_auto_run_length_is_resolved_and_recorded(make):
    result = _sample(make())
    info = result.info
    h = info["step_size"]
    assert isinstance(h, float)
    # R = 2 / (h lambda_min(P)); the Gaussian posterior's precision is (1 + N) I
    assert info["relaxation_time"] == pytest.approx(2.0 / (h * PRECISION), rel=2e-3)
    assert info["thin_auto"] is True and info["burn_in_auto"] is True
    assert info["thin"] == math.ceil(info["relaxation_time"])
    assert info["burn_in"] == _expected_burn_in(info, 20)
    assert info["predicted_ess"] > 0 and info["max_iterations"] == run_length.DEFAULT_MAX_ITERATIONS
    assert info["initial_offset_sd"] > 1  # the chains start at 0, the posterior elsewhere
    assert result.samples.shape == (2, 20, DIM)
    assert make().step_size in ("auto", 2e-4)  # the user's value is not changed


def test_given_run_length_is_kept():
    result = _sample(fm.FSGLD(step_size="auto", batch_size=10, local_steps=5), thin=3,
                     burn_in=2)
    info = result.info
    assert (info["thin"], info["burn_in"]) == (3, 2)
    assert info["thin_auto"] is False and info["burn_in_auto"] is False
    # FSGLD's set-up knows its relaxation time anyway: what the convergence advice reads
    assert info["relaxation_time"] == pytest.approx(2.0 / (info["step_size"] * PRECISION),
                                                    rel=2e-3)
    # one "auto", one given
    info = _sample(fm.DSGLD(step_size=2e-4, batch_size=10, local_steps=5), thin=7).info
    assert info["thin"] == 7 and info["burn_in_auto"] is True
    assert info["burn_in"] == _expected_burn_in(info, 20)
    # a given h and given run lengths: no Laplace fit, the values as given
    info = _sample(fm.DSGLD(step_size=2e-4, batch_size=10, local_steps=5), thin=2,
                   burn_in=1).info
    assert (info["thin"], info["burn_in"]) == (2, 1) and "relaxation_time" not in info


def test_bad_run_length_arguments_are_named():
    algorithm = fm.FSGLD(step_size="auto", batch_size=10, local_steps=5)
    for argument, value in (("thin", "fast"), ("thin", 0), ("burn_in", -1), ("burn_in", 1.5)):
        with pytest.raises(ValueError, match=argument):
            _sample(algorithm, **{argument: value})
    with pytest.raises(ValueError, match="max_iterations"):
        _sample(algorithm, max_iterations=0)
    # a schedule's h changes during the run: no relaxation time to take thin from
    schedule = fm.schedules.polynomial(1e-3, 1.0, 0.55)
    with pytest.raises(ValueError, match="thin='auto'"):
        _sample(fm.DSGLD(step_size=schedule, batch_size=10, local_steps=5))
    with pytest.raises(ValueError, match="burn_in='auto'"):
        _sample(fm.DSGLD(step_size=schedule, batch_size=10, local_steps=5), thin=2)
    # FSGLD's alpha ramp must end within the burn-in "auto" chose
    with pytest.raises(ValueError, match="alpha_warmup"):
        _sample(fm.FSGLD(step_size="auto", batch_size=10, local_steps=5,
                         alpha_warmup=10**9))


# ----------------------------------------------------------------------------- the budget rule

def _budget(precision, covariance, request, offset=10.0):
    info = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        h = step_size_module.resolve_step_size("auto", 0.05, np.asarray(precision),
                                               np.asarray(covariance), "TEST", info,
                                               request=request, offset=offset)
    warned = [w for w in caught if issubclass(w.category, run_length.RunLengthWarning)]
    return h, info, warned


def _relaxation(h, precision):
    return 2.0 / (h * min(precision))


def test_budget_keeps_an_affordable_step():
    precision, covariance = [100.0, 1000.0], [[2000.0, 0.0], [0.0, 10.0]]
    request = run_length.RunRequest(num_samples=100, burn_in="auto", thin="auto", chains=4)
    h, info, warned = _budget(precision, covariance, request)
    exact = step_size_module.choose_step_size(np.asarray(precision), np.asarray(covariance))
    assert h == info["step_size"] == info["step_size_exact"] == exact.step_size
    assert info["step_size_budget_reason"] is None and not warned
    assert info["predicted_variance_inflation"] == pytest.approx(
        exact.minibatch_noise_ratio + exact.discretisation_ratio)
    # without a request (a caller outside fm.sample) no budget either
    assert _budget(precision, covariance, None)[0] == exact.step_size


def test_budget_raises_a_slow_step_within_the_accuracy_ceiling():
    # minibatch noise forces h small: R at the exact h is 8e4 iterations, the run affords
    # 1e6 / (burn-in relaxations + 1000) ~ 1e3
    precision, covariance = [0.1, 10.0], [[8e2, 0.0], [0.0, 1.0]]
    request = run_length.RunRequest(num_samples=1000, burn_in="auto", thin="auto", chains=4)
    h, info, warned = _budget(precision, covariance, request)
    exact = info["step_size_exact"]
    assert h > exact and h == info["step_size"]
    assert "more than the run affords" in info["step_size_budget_reason"]
    assert len(warned) == 1 and "max_iterations" in str(warned[0].message)
    # the accuracy ceiling binds: predicted variance inflation at the h used = 25 %
    assert info["predicted_variance_inflation"] == pytest.approx(run_length.BUDGET_TOLERANCE)
    assert info["minibatch_noise_ratio"] + info["discretisation_ratio"] == pytest.approx(0.25)
    assert info["iterations_per_effective_draw"] == pytest.approx(2 * _relaxation(h, precision))
    # a default-length run makes more than one relaxation time
    assert _relaxation(h, precision) < request.max_iterations


def test_budget_never_leaves_less_than_one_relaxation_time():
    # the DSGLD: h ~ 2e-9 exact on a posterior whose slowest direction needs
    # 2 / (h lambda_min) = 1e9 iterations; even 25 % inflation leaves it at 2e8
    precision, covariance = [1.0, 200.0], [[1e8, 0.0], [0.0, 1.0]]
    for thin in ("auto", 10):
        request = run_length.RunRequest(num_samples=1000, burn_in="auto", thin=thin, chains=4)
        h, info, warned = _budget(precision, covariance, request)
        accuracy, stability = step_size_module.budget_ceilings(precision, covariance)
        assert info["step_size_exact"] < accuracy < h <= stability
        assert _relaxation(h, precision) <= request.max_iterations * (1 + 1e-9)
        assert info["predicted_variance_inflation"] > run_length.BUDGET_TOLERANCE
        assert warned and info["step_size_budget_reason"]
        # resolve then fits the run in max_iterations
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", run_length.RunLengthWarning)
            length = run_length.resolve(request, _relaxation(h, precision), 10.0)
        assert (length.burn_in + request.num_samples) * length.thin <= request.max_iterations \
            or thin != "auto"


def test_budget_stops_at_the_stability_ceiling():
    # a stiff posterior (condition number 1e7): one relaxation time in max_iterations would
    # need h lambda_max = 20, past stability; the ceiling h lambda_max = 2 holds
    precision, covariance = [1e-3, 1e4], [[1e7, 0.0], [0.0, 1.0]]
    request = run_length.RunRequest(num_samples=1000, burn_in="auto", thin="auto", chains=4)
    h, info, _ = _budget(precision, covariance, request)
    assert h * max(precision) == pytest.approx(4 * step_size_module.STABILITY_DISCRETISATION_RATIO)
    assert info["discretisation_ratio"] == pytest.approx(0.5)


def test_budget_on_a_run_warns_and_records():
    # DSGLD on far-apart clients with one-row minibatches: "auto" h is tiny; a small
    # max_iterations makes the run unable to afford it
    federation = gaussian_federation(spread=6.0)
    with pytest.warns(run_length.RunLengthWarning, match="step_size='auto'"):
        result = _sample(fm.DSGLD(step_size="auto", batch_size=1, local_steps=20),
                         federation=federation, max_iterations=4000)
    info = result.info
    assert info["step_size"] > info["step_size_exact"]
    assert info["step_size_budget_reason"]
    assert 0 < info["predicted_variance_inflation"]
    assert info["relaxation_time"] == pytest.approx(2.0 / (info["step_size"] * PRECISION),
                                                    rel=2e-3)
    # the run stays within the budget and makes at least one relaxation time
    iterations = (info["burn_in"] + 20) * info["thin"]
    assert iterations <= 4000
    assert info["relaxation_time"] <= 4000 * (1 + 1e-9)


# ----------------------------------------------------------------------------- Ray

@pytest.mark.parametrize("make", [
    lambda: fm.DSGLD(step_size=2e-4, batch_size=5, local_steps=10),
    pytest.param(lambda: fm.FSGLD(step_size="auto", batch_size=5, local_steps=10),
                 marks=pytest.mark.slow),
], ids=["DSGLD-given-h", "FSGLD-auto"])
def test_auto_run_length_with_data_on_the_clients_on_ray(local_ray, make):
    """Federation.from_loaders on Ray: the protocol's set-up resolves thin / burn_in "auto"
    from the clients' replies (DSGLD: their Laplace fits; FSGLD: the surrogates), the clients
    get the resolved thin with their configuration, and run and draws are the in-process
    ones."""
    clients = gaussian_clients()
    federation = fm.Federation.from_loaders([lambda rows=rows: rows for rows in clients])
    kw = dict(init=jnp.zeros(DIM), num_samples=15, burn_in="auto", thin="auto", chains=2,
              seed=5, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fm.ConvergenceWarning)
        on_ray = fm.sample(MODEL, federation, make(), engine="ray", visit_timeout=120.0, **kw)
        local = fm.sample(MODEL, fm.Federation(clients), make(), **kw)
    assert federation.is_deferred
    for key in ("thin", "burn_in", "thin_auto", "burn_in_auto"):
        assert on_ray.info[key] == local.info[key], key
    for key in ("relaxation_time", "initial_offset_sd", "predicted_ess", "step_size"):
        assert on_ray.info[key] == pytest.approx(local.info[key], rel=1e-4), key
    assert on_ray.info["thin"] > 1 and on_ray.samples.shape == (2, 15, DIM)
    np.testing.assert_array_equal(on_ray.sample_stats["client"], local.sample_stats["client"])
    np.testing.assert_allclose(on_ray.flat_samples(), local.flat_samples(), rtol=0, atol=1e-4)


@pytest.mark.slow
def test_auto_run_length_resolved_by_the_driver_on_ray(local_ray):
    """Data the driver holds, on Ray: the driver's set-up resolves thin / burn_in "auto" as
    the in-process engine does (the same draws). A given h: its Laplace fit is made for the
    run lengths alone (DSGLD "auto" on these clients would need a million iterations)."""
    kw = dict(init=jnp.zeros(DIM), num_samples=15, burn_in="auto", thin="auto", chains=2,
              seed=5, progress=False)
    make = lambda: fm.DSGLD(step_size=2e-4, batch_size=5, local_steps=10)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fm.ConvergenceWarning)
        on_ray = fm.sample(MODEL, gaussian_federation(), make(), engine="ray",
                           visit_timeout=120.0, **kw)
        local = fm.sample(MODEL, gaussian_federation(), make(), **kw)
    assert on_ray.info["setup_by"] == "driver"
    assert (on_ray.info["thin"], on_ray.info["burn_in"]) == (local.info["thin"],
                                                             local.info["burn_in"])
    np.testing.assert_allclose(on_ray.flat_samples(), local.flat_samples(), rtol=0, atol=1e-4)


# ----------------------------------------------------------------------------- real federations

def _real(name, algorithm, **kw):
    from real_federations import run_against_reference

    started = time.perf_counter()
    outcome = run_against_reference(name, algorithm, **kw)
    outcome["seconds"] = time.perf_counter() - started
    return outcome


def _check_auto_run(name, make, num_samples, broken=None, **options):
    """The "auto" run is accurate and not flagged; thin=1 is flagged; a broken sampler
    (default ``make(noise=False)``; ``broken``: ``(algorithm, run keywords)``) is flagged by
    the convergence check or fails the accuracy check."""
    from real_federations import describe

    good = _real(name, make(), num_samples=num_samples, **options)
    info = good["info"]
    assert good["ok"], describe(good)
    assert info["thin_auto"] and info["burn_in_auto"]
    # one relaxation time per draw (up to the rounding of run_length.resolve when the budget
    # binds), and the whole run many of them
    assert info["thin"] >= 0.9 * info["relaxation_time"], describe(good)
    assert (info["burn_in"] + num_samples) * info["thin"] >= 10 * info["relaxation_time"]
    assert not good["convergence_warnings"], describe(good)
    short = _real(name, make(), num_samples=num_samples, thin=1, burn_in="auto", **options)
    assert short["convergence_warnings"], describe(short)
    assert "thin='auto'" in short["convergence_warnings"][0]
    algorithm, keywords = broken or (make(noise=False), {})
    keywords = {"num_samples": num_samples, **options, **keywords}
    bad = _real(name, algorithm, **keywords)
    assert bad["convergence_warnings"] or not bad["ok"], describe(bad)
    for label, outcome in (("auto", good), ("thin=1", short), ("broken", bad)):
        print(f"{name} {label} ({outcome['seconds']:.0f} s): {describe(outcome)}")  # pytest -s
    return good, short, bad


@pytest.mark.slow
@pytest.mark.parametrize("name", ["exam-schools", "contraception", "grouseticks"])
def test_fsgld_auto_run_length_on_real_federations(name):
    _check_auto_run(name, lambda **kw: fm.FSGLD(step_size="auto", batch_size=20,
                                                local_steps=20, **kw), num_samples=500)


@pytest.mark.slow
def test_sgld_auto_run_length_on_a_real_federation():
    # every row in each minibatch of grouseticks (403 rows): "auto" h is the
    # discretisation's, which the run affords
    _check_auto_run("grouseticks", lambda **kw: fm.SGLD(step_size="auto", batch_size=403, **kw),
                    num_samples=500)


@pytest.mark.slow
def test_dsgld_auto_run_length_on_a_real_federation():
    # one update per visit and whole clients as minibatches: DSGLD's noise is the spread of
    # the clients' scaled gradients; with max_iterations=4e6 the budget raises "auto"'s h
    # within the 25 % variance inflation to one relaxation time per draw
    # the broken variant: a chain that never moves (a tiny given h)
    _check_auto_run("contraception", lambda **kw: fm.DSGLD(step_size="auto", batch_size=200,
                                                           local_steps=1, **kw),
                    num_samples=200, max_iterations=4_000_000,
                    broken=(fm.DSGLD(step_size=1e-12, batch_size=200, local_steps=1),
                            {"thin": 10, "burn_in": 10, "max_iterations": None}))
