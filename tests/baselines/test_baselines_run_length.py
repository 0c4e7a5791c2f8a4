"""``thin="auto"``, ``burn_in="auto"`` and ``step_size="auto"`` of the baselines (issue 44):
what they resolve to, that it is recorded in ``info``, that given values are kept, that bad
input names the argument, the budget rule, and the same choices with the data on the
clients (the engine layer on the in-process transport, what ``engine="ray"`` runs).

The toy federation is a Gaussian mean with unequal clients, whose posterior is N(., (N+1)^-1 I)
exactly (x ~ N(mu, I), mu ~ N(0, I)): the Laplace fit is exact, lambda_min = lambda_max = N + 1,
and the relaxation time of a step h is 2 / (h (N + 1)) iterations.
"""

import math
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc import run_length
from fedmcmc.baselines import tuning
from fedmcmc.engines.engine import InProcessEngine

DIM = 2
SIZES = (15, 25, 4, 40)  # very unequal, one client smaller than the batch
N = sum(SIZES)
MODEL = fm.models.gaussian_mean(DIM)
H = 0.2 / (N + 1)
BATCH = 10


def federation():
    rng = np.random.default_rng(0)
    means = rng.uniform(-1.5, 1.5, size=(len(SIZES), DIM))
    return fm.Federation([rng.normal(m, 1.0, size=(n, DIM)).astype(np.float32)
                          for m, n in zip(means, SIZES)])


def run(algorithm, **kwargs):
    arguments = dict(init=jnp.zeros(DIM), num_samples=40, chains=2, seed=3, progress=False,
                     thin="auto", burn_in="auto")
    arguments.update(kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fm.ConvergenceWarning)  # short runs
        return fm.sample(MODEL, federation(), algorithm, **arguments)


ALGORITHMS = {
    "FALD": lambda h: fm.FALD(step_size=h, batch_size=BATCH, local_steps=2),
    "QLSD": lambda h: fm.QLSD(step_size=h, batch_size=BATCH, bits=4),
}


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_auto_run_lengths_come_from_the_relaxation_time_and_are_recorded(name):
    result = run(ALGORITHMS[name](H))
    info = result.info
    relaxation = 2.0 / (H * (N + 1))  # = 10 iterations
    assert info["laplace_lambda_min"] == pytest.approx(N + 1, rel=1e-4)
    assert info["relaxation_time"] == pytest.approx(relaxation, rel=1e-4)
    assert info["thin"] == math.ceil(info["relaxation_time"])
    assert info["thin_auto"] and info["burn_in_auto"]
    # burn-in: max(5, 2 ln(z0 / 0.05)) relaxation times, at least a tenth of num_samples
    offset = info["initial_offset_sd"]
    relaxations = max(5.0, 2.0 * math.log(max(offset, 1.0) / 0.05))
    assert info["burn_in"] == max(math.ceil(relaxations * info["relaxation_time"] / info["thin"]),
                                  4)
    assert info["predicted_ess"] == pytest.approx(
        run_length.predicted_ess(info["relaxation_time"], info["thin"], 40, 2))
    assert info["iterations"] == (info["burn_in"] + 40) * info["thin"]
    assert result.samples.shape == (2, 40, DIM)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_given_run_lengths_and_step_size_are_kept_and_nothing_is_fitted(name):
    algorithm = ALGORITHMS[name](H)
    result = run(algorithm, thin=3, burn_in=5)
    info = result.info
    assert (info["thin"], info["burn_in"], info["step_size"]) == (3, 5, H)
    assert not info["thin_auto"] and not info["burn_in_auto"]
    assert "relaxation_time" not in info and "laplace_lambda_min" not in info
    assert info["iterations"] == 45 * 3
    # the draws of a run that asks nothing of the library: fm.sample's request changes nothing
    direct = algorithm.sample_local(MODEL, federation(), init=jnp.zeros(DIM), num_samples=40,
                                    burn_in=5, thin=3, chains=2, seed=3, progress=False)
    np.testing.assert_array_equal(result.flat_samples(), direct.flat_samples())


def test_only_burn_in_auto_keeps_the_given_thin():
    result = run(ALGORITHMS["QLSD"](H), thin=4)
    assert result.info["thin"] == 4 and not result.info["thin_auto"]
    assert result.info["burn_in_auto"] and result.info["burn_in"] >= 4


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_auto_step_size_meets_the_tolerance(name):
    info = run(ALGORITHMS[name]("auto")).info
    # minibatch noise by the information identity: C = sum_{n_s > m} (n_s / m) P_s, P_s = n_s I
    noise = sum(n * n / BATCH for n in SIZES if n > BATCH)
    assert info["minibatch_noise_ratio"] == pytest.approx(0.05, rel=1e-3)
    assert info["step_size"] == info["step_size_exact"]
    assert info["step_size_budget_reason"] is None
    if name == "FALD":  # no quantiser: exactly 4 tol / lambda_max(C)
        assert info["step_size"] == pytest.approx(0.2 / noise, rel=1e-4)
        # every client's local curvature is prior + P_s / f_s = (N + 1) I here
        assert info["local_discretisation_ratio"] == pytest.approx(
            info["step_size"] * (N + 1) / 4, rel=1e-4)
    else:  # the quantiser's variance adds to the noise: a smaller step
        assert info["step_size"] < 0.2 / noise
    assert info["discretisation_ratio"] == pytest.approx(info["step_size"] * (N + 1) / 4,
                                                         rel=1e-4)
    assert info["relaxation_time"] == pytest.approx(2 / (info["step_size"] * (N + 1)), rel=1e-4)
    assert info["thin"] == math.ceil(info["relaxation_time"])


def test_auto_step_size_with_given_run_lengths_is_recorded():
    info = run(ALGORITHMS["FALD"]("auto"), thin=7, burn_in=2).info
    assert isinstance(info["step_size"], float) and info["step_size_auto"]
    assert (info["thin"], info["burn_in"]) == (7, 2)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_the_budget_never_leaves_a_run_without_one_relaxation_time(name):
    """max_iterations below the relaxation time of the accurate step: the step is raised
    (RunLengthWarning, the reason in info) until max_iterations make a relaxation time."""
    exact = run(ALGORITHMS[name]("auto")).info
    budget = int(exact["relaxation_time"] / 3)
    with pytest.warns(fm.RunLengthWarning):
        info = run(ALGORITHMS[name]("auto"), max_iterations=budget, num_samples=20).info
    assert info["step_size"] > info["step_size_exact"]
    assert info["step_size_exact"] == pytest.approx(exact["step_size"])
    assert "max_iterations" in info["step_size_budget_reason"]
    assert info["relaxation_time"] <= budget * (1 + 1e-6)
    assert info["predicted_variance_inflation"] > exact["predicted_variance_inflation"]


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_bad_input_names_the_argument(name):
    make = {"FALD": lambda **k: fm.FALD(batch_size=BATCH, local_steps=2, **k),
            "QLSD": lambda **k: fm.QLSD(batch_size=BATCH, **k)}[name]
    for bad in ("automatic", -1.0, 0.0, float("nan")):
        with pytest.raises(ValueError, match="step_size"):
            make(step_size=bad)
    for bad in (0.0, 1.5, "auto"):
        with pytest.raises(ValueError, match="step_size_tolerance"):
            make(step_size="auto", step_size_tolerance=bad)
    with pytest.raises(ValueError, match="thin"):
        run(make(step_size=H), thin="sometimes")
    with pytest.raises(ValueError, match="burn_in"):
        run(make(step_size=H), burn_in=-1)


def test_the_tolerance_is_the_langevin_familys():
    from fedmcmc.langevin import step_size

    assert tuning.DEFAULT_TOLERANCE == step_size.DEFAULT_TOLERANCE
    assert fm.FALD(step_size="auto", batch_size=1, local_steps=1).step_size_tolerance == 0.05


@pytest.mark.parametrize("name", list(ALGORITHMS))
@pytest.mark.parametrize("step", [H, "auto"], ids=["given-step", "auto-step"])
def test_the_clients_own_fits_give_the_same_choices(name, step):
    """On the engine layer (what engine="ray" runs, here on the in-process transport) each
    client fits its own rows; the choices and the draws are the in-process engine's."""
    algorithm = ALGORITHMS[name](step)
    local = run(algorithm)
    request = run_length.RunRequest(num_samples=40, burn_in="auto", thin="auto", chains=2)
    distributed = algorithm.sample_distributed(
        MODEL, federation(), InProcessEngine(), init=jnp.zeros(DIM), num_samples=40,
        burn_in="auto", thin="auto", chains=2, seed=3,
        progress=False, run_request=request)
    for key in ("thin", "burn_in", "step_size", "rounds"):
        assert distributed.info[key] == pytest.approx(local.info[key], rel=1e-5), key
    np.testing.assert_allclose(distributed.flat_samples(), local.flat_samples(), rtol=0,
                               atol=1e-5)


def test_consensus_auto_is_one_transition_per_draw_and_the_warmup_default():
    info = {}
    algorithm = fm.ConsensusMC()
    assert algorithm.run_lengths("auto", "auto", info) == (1, algorithm.default_warmup)
    assert info == {"thin": 1, "burn_in": 200, "thin_auto": True, "burn_in_auto": True}
    assert algorithm.run_lengths(4, "auto", {}) == (4, 50)  # 50 draws x 4 = the warm-up
    assert algorithm.run_lengths(3, 7, {}) == (3, 7)
    # with num_warmup given, burn_in discards draws after it: "auto" discards none
    assert fm.ConsensusMC(num_warmup=40).run_lengths("auto", "auto", {}) == (1, 0)


def test_consensus_auto_runs_and_records_what_it_used():
    result = run(fm.ConsensusMC(num_warmup=30), num_samples=20)
    info = result.info
    assert (info["thin"], info["burn_in"], info["warmup_steps"]) == (1, 0, 30)
    assert info["thin_auto"] and info["burn_in_auto"]
    assert result.samples.shape == (2, 20, DIM)
