"""QLSD and QLSD++ (fm.QLSD) against exact laws, and the cost of compression.

* The quantiser: unbiased, with E||C(v) - v||^2 <= omega ||v||^2 (QSGD's bound).
* Without compression and with full batches QLSD is ULA on the global posterior: its
  stationary law on a Gaussian target is N(mean, (A (I - h A / 4))^-1) (the papers'
  convention theta + h/2 grad + N(0, h)); with minibatches the gradient noise adds the
  closed-form factor (1 + h sigma^2 / 4).
* The paper's claims: quantisation adds variance that decreases with the number of bits
  (2 bits: rejected by the exact check; 3 > 4 bits; 8 bits passes), and QLSD++'s control
  variates and memory terms remove it (2 bits passes).
* A deliberately broken quantiser (deterministic rounding to the nearest level: biased)
  is rejected by the same check.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc import checkpoint
from fedmcmc.baselines import qlsd

from stats import check_gaussian_moments

DIM = 2
GAUSSIAN = fm.models.gaussian_mean(DIM)  # x ~ N(mu, I), mu ~ N(0, I)


def gaussian_federation(seed=0, sizes=(15, 25, 20, 40), spread=1.5):
    rng = np.random.default_rng(seed)
    means = rng.uniform(-spread, spread, size=(len(sizes), DIM))
    clients = [rng.normal(m, 1.0, size=(n, DIM)).astype(np.float32) for m, n in zip(means, sizes)]
    return fm.Federation(clients)


def sample(algorithm, federation, h, num_samples=1000, chains=8, seed=1):
    lam = federation.total_size + 1.0
    result = fm.sample(GAUSSIAN, federation, algorithm, init=jnp.zeros(DIM),
                       num_samples=num_samples, burn_in=200,
                       thin=int(np.ceil(2.0 / (h * lam))), chains=chains, seed=seed,
                       progress=False)
    return result


def ula_law(federation, h, sigma2=0.0):
    """Per-coordinate stationary variance of the unadjusted chain with gradient noise
    variance sigma2: (1 + h sigma2 / 4) / (lambda (1 - h lambda / 4))."""
    lam = federation.total_size + 1.0
    return np.broadcast_to((1 + h * np.asarray(sigma2) / 4) / (lam * (1 - h * lam / 4)), (DIM,))


FULL_BATCH = 50  # larger than every client: exact client gradients


# --------------------------------------------------------------------------- quantiser


@pytest.mark.parametrize("bits", [2, 3, 8])
def test_quantiser_is_unbiased_with_bounded_variance(bits):
    levels = qlsd.levels_for_bits(bits)
    vector = jnp.asarray([1.7, -0.5, 3.4, 0.0, -4.2, 0.01], jnp.float32)
    n = 200_000
    uniforms = jax.random.uniform(jax.random.key(0), (n,) + vector.shape)
    draws = np.asarray(jax.vmap(lambda u: qlsd.quantize(u, vector, levels))(uniforms), np.float64)
    # each coordinate takes two adjacent levels: values on the grid ||v|| k / s
    grid = draws / (np.linalg.norm(vector) / levels)
    np.testing.assert_allclose(grid, np.round(grid), atol=1e-3)
    error = np.abs(draws.mean(0) - np.asarray(vector))
    assert np.all(error < 5 * draws.std(0) / np.sqrt(n) + 1e-6), error
    mse = np.mean(np.sum((draws - np.asarray(vector)) ** 2, axis=1))
    bound = qlsd.variance_bound(levels, vector.size) * float(jnp.sum(vector**2))
    assert mse <= bound * 1.01
    assert float(jnp.abs(qlsd.quantize(uniforms[0], jnp.zeros(6), levels)).sum()) == 0.0


def test_bits_to_levels_and_messages():
    assert qlsd.levels_for_bits(8) == 127 and qlsd.levels_for_bits(2) == 1
    assert qlsd.levels_for_bits(None) is None and qlsd.variance_bound(None, 10) == 0.0
    federation = gaussian_federation()
    result = fm.sample(GAUSSIAN, federation, fm.QLSD(step_size=1e-3, batch_size=5, bits=4),
                       init=jnp.zeros(DIM), num_samples=10, thin=3, chains=2, progress=False)
    info = result.info
    assert info["iterations"] == 30 and info["rounds"] == 30
    assert info["messages"] == 2 * 2 * 30 * 4
    # per client and iteration: theta down (32 d bits), a norm and 4 bits per coordinate up
    assert info["bits_communicated"] == 2 * 30 * 4 * (32 * DIM + 32 + 4 * DIM)
    assert info["floats_communicated"] == info["bits_communicated"] // 32
    assert result.samples.shape == (2, 10, DIM)


# --------------------------------------------------------------------------- exact cases


def test_uncompressed_full_batch_qlsd_is_ula():
    federation = gaussian_federation()
    mean, _ = GAUSSIAN.attributes["exact_posterior"](federation)
    h = 0.5 / (federation.total_size + 1.0)
    draws = sample(fm.QLSD(step_size=h, batch_size=FULL_BATCH, bits=None), federation,
                   h).flat_samples()
    figures = check_gaussian_moments(draws, mean, np.diag(ula_law(federation, h)))
    assert figures["ok"], figures


def test_uncompressed_minibatch_qlsd_matches_the_discretised_law():
    """Minibatches of 5 with the n_s / 5 scaling, and a client of 4 rows (whole client):
    the gradient noise of sum_s H_s is sum_s n_s^2 var_s / m per coordinate."""
    federation = gaussian_federation(sizes=(15, 25, 4, 40))
    mean, _ = GAUSSIAN.attributes["exact_posterior"](federation)
    m = 5
    sigma2 = sum(len(c) ** 2 * c.astype(np.float64).var(axis=0) / m
                 for c in federation.clients if len(c) > m)
    h = float(4 * 0.25 / sigma2.max())
    draws = sample(fm.QLSD(step_size=h, batch_size=m, bits=None), federation, h).flat_samples()
    figures = check_gaussian_moments(draws, mean, np.diag(ula_law(federation, h, sigma2)))
    assert figures["ok"], figures


# --------------------------------------------------------------------------- compression


def test_compression_cost_decreases_with_bits_and_qlsd_plus_plus_removes_it():
    federation = gaussian_federation()
    mean, _ = GAUSSIAN.attributes["exact_posterior"](federation)
    h = 0.5 / (federation.total_size + 1.0)
    law = np.diag(ula_law(federation, h))
    figures = {}
    for bits in (2, 3, 4, 8):
        draws = sample(fm.QLSD(step_size=h, batch_size=FULL_BATCH, bits=bits), federation,
                       h).flat_samples()
        figures[bits] = check_gaussian_moments(draws, mean, law)
    ratio = {bits: figures[bits]["var_ratio"].mean() for bits in figures}
    assert not figures[2]["ok"], figures[2]  # 2 bits: the extra variance is detected
    assert figures[8]["ok"], figures[8]
    assert ratio[2] > ratio[3] > ratio[4], ratio
    assert ratio[2] > 1.3 and ratio[3] > 1.03, ratio
    # QLSD++ at 2 bits: control variates and memory terms remove the compression cost
    draws = sample(fm.QLSD(step_size=h, batch_size=FULL_BATCH, bits=2, variance_reduction=True),
                   federation, h).flat_samples()
    plus_plus = check_gaussian_moments(draws, mean, law)
    assert plus_plus["ok"], plus_plus


def test_biased_quantiser_is_rejected(monkeypatch):
    """Rounding to the nearest level instead of at random biases the gradients: the exact
    check that 8-bit QLSD passes rejects it at 3 bits."""
    federation = gaussian_federation()
    mean, _ = GAUSSIAN.attributes["exact_posterior"](federation)
    h = 0.5 / (federation.total_size + 1.0)

    random_rounding = qlsd.quantize

    def nearest(uniforms, vector, levels):
        return random_rounding(jnp.full_like(uniforms, 0.5), vector, levels)

    monkeypatch.setattr(qlsd, "quantize", nearest)
    draws = sample(fm.QLSD(step_size=h, batch_size=FULL_BATCH, bits=3), federation,
                   h).flat_samples()
    assert not check_gaussian_moments(draws, mean, np.diag(ula_law(federation, h)))["ok"]


# --------------------------------------------------------------------------- API


def test_qlsd_plus_plus_defaults_and_resume():
    federation = gaussian_federation()
    algorithm = fm.QLSD(step_size=1e-3, batch_size=5, bits=3, variance_reduction=True)
    saved = {}

    def on_chunk(states, done):
        if done == 8:
            saved["states"] = checkpoint.states_to_numpy(states)  # what Checkpointer saves

    common = dict(init=jnp.zeros(DIM), num_samples=16, burn_in=0, thin=3, chains=3, seed=2,
                  progress=False)
    full = fm.sample(GAUSSIAN, federation, algorithm, chunk_size=8, on_chunk=on_chunk, **common)
    assert full.algorithm == "QLSD++"
    assert full.info["reference_every"] == 8  # ceil(40 / 5)
    omega = min(DIM / 9, np.sqrt(DIM) / 3)
    assert full.info["memory_rate"] == pytest.approx(1 / (1 + omega))
    resumed = fm.sample(GAUSSIAN, federation, algorithm, start_draw=8,
                        resume_state=saved["states"], **common)
    np.testing.assert_array_equal(full.samples[:, 8:], resumed.samples)


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(step_size=-1.0, batch_size=5), "step_size"),
        (dict(step_size=1e-3, batch_size=2.5), "batch_size"),
        (dict(step_size=1e-3, batch_size=5, bits=1), "bits"),
        (dict(step_size=1e-3, batch_size=5, bits=25), "bits"),
        (dict(step_size=1e-3, batch_size=5, bits=4.0), "bits"),
        (dict(step_size=1e-3, batch_size=5, reference_every=3), "reference_every"),
        (dict(step_size=1e-3, batch_size=5, variance_reduction=True, reference_every=0),
         "reference_every"),
        (dict(step_size=1e-3, batch_size=5, variance_reduction=True, memory_rate=1.5),
         "memory_rate"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        fm.QLSD(**kwargs)


def test_divergence_keeps_the_draws_made_before():
    federation = gaussian_federation()
    with pytest.raises(fm.SamplingDivergedError) as caught:
        fm.sample(GAUSSIAN, federation, fm.QLSD(step_size=0.5, batch_size=5), init=jnp.zeros(DIM),
                  num_samples=200, chains=2, progress=False)
    assert caught.value.result is not None and caught.value.chains
