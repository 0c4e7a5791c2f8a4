"""A hand-off sampler defined outside the package runs on both engines with no edit of fedmcmc
(issue 14): stochastic-gradient Hamiltonian Monte Carlo (Chen, Fox and Guestrin, 2014), whose
momentum travels with the chain from client to client.

The federation has clients of very unequal size (4 to 61 rows) whose sample means are made
equal, and the batch is the largest client, so every client's estimator (4),
grad log p(theta) + (1/f_s) grad log p(x_s | theta), is the full posterior gradient: the only
errors left are SGHMC's discretisation, O(h). The test compares the draws with the exact
Gaussian posterior (tolerances from the effective sample size) and rejects two broken
variants with the same check: half the friction noise, and a momentum that does not travel
(reset to zero at every visit, which drains kinetic energy at each hand-off).
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc.algorithm import Algorithm
from fedmcmc.engines.handoff import sample_protocol
from fedmcmc.langevin.estimators import draw_minibatch, dsgld_gradient
from fedmcmc.protocols import HandoffProtocol

from chunks import DrawsReceived
from stats import check_gaussian_moments

DIM = 2
SIZES = (4, 9, 17, 30, 61)
MODEL = fm.Model(
    log_prior=lambda mu: -0.5 * jnp.sum(mu**2),
    log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2),
    name="gaussian_mean",
)


def equal_mean_federation(seed=0, common_mean=(0.7, -0.4)):
    rng = np.random.default_rng(seed)
    clients = []
    for size in SIZES:
        rows = rng.normal(0.0, 1.0, size=(size, DIM))
        clients.append((rows - rows.mean(axis=0) + np.asarray(common_mean)).astype(np.float32))
    return fm.Federation(clients)


def posterior(federation):
    precision = federation.total_size + 1.0
    return federation.pooled().sum(axis=0) / precision, precision


class SGHMCProtocol(HandoffProtocol):
    """SGHMC (Chen et al., 2014, equation (15), unit mass, no noise estimate B_hat):
    theta' = theta + h v;  v' = v + h g(theta') - h C v + N(0, 2 C h), with g the client's
    estimator (4). The carry is (position, momentum)."""

    name = "SGHMC"

    def __init__(self, step_size, friction, batch_size, local_steps, noise_factor=2.0,
                 carry_momentum=True):
        self.step_size, self.friction = float(step_size), float(friction)
        self.batch_size, self.local_steps = int(batch_size), int(local_steps)
        self.noise_factor = float(noise_factor)  # 2 is SGHMC; 1 is a broken variant
        self.carry_momentum = bool(carry_momentum)  # False: a broken variant

    def init_carry(self, position):
        return (position, np.zeros_like(position))

    def build_update(self, context, parameters):
        h, friction, batch_size = self.step_size, self.friction, self.batch_size
        noise_sd = float(np.sqrt(self.noise_factor * friction * h))
        local_steps, carry_momentum = self.local_steps, self.carry_momentum

        def update(key, carry, iteration):
            position, momentum = carry
            if not carry_momentum:
                momentum = jnp.where(iteration % local_steps == 0, 0.0, momentum)
            # split(key, 3)[0] is the engine's client draw: use the other two
            _, key_batch, key_noise = jax.random.split(key, 3)
            position = position + h * momentum
            minibatch = draw_minibatch(key_batch, context.data, 0, batch_size)
            gradient = dsgld_gradient(context.flat_model, position, minibatch,
                                      parameters["weight"])
            momentum = (momentum + h * gradient - h * friction * momentum
                        + noise_sd * jax.random.normal(key_noise, position.shape, position.dtype))
            return (position, momentum)

        return update


class SGHMC(Algorithm):
    """The public face of the protocol: what a user would write."""

    name = "SGHMC"
    message_passing = True

    def __init__(self, step_size, friction, batch_size, local_steps, **variant):
        self.protocol = SGHMCProtocol(step_size, friction, batch_size, local_steps, **variant)

    def sample_local(self, model, federation, **arguments):
        return sample_protocol(self.protocol, model, federation, engine="local", **arguments)

    def sample_distributed(self, model, federation, engine, **arguments):
        return sample_protocol(self.protocol, model, federation, engine=engine, **arguments)


# h sqrt(precision) = 0.02; friction = sqrt(precision) (critical damping): the autocorrelation
# time is about 1 / (h C) = 50 updates, two visits
STEP, FRICTION, LOCAL_STEPS, THIN = 0.002, 10.0, 25, 50


def run(num_samples=800, chains=4, seed=2, **variant):
    federation = equal_mean_federation()
    algorithm = SGHMC(STEP, FRICTION, batch_size=max(SIZES), local_steps=LOCAL_STEPS, **variant)
    return fm.sample(MODEL, federation, algorithm, init=jnp.zeros(DIM), num_samples=num_samples,
                     burn_in=100, thin=THIN, chains=chains, seed=seed)


def check(result):
    mean, precision = posterior(equal_mean_federation())
    assert precision == pytest.approx(sum(SIZES) + 1.0)
    # Euler SGHMC's O(h) bias on the variance is about 1% here: a 5% allowance
    return check_gaussian_moments(result.flat_samples(), mean, np.eye(DIM) / precision,
                                  extra_var_rtol=0.05)


@pytest.fixture(scope="module")
def sghmc_local():
    return run()


def test_sghmc_defined_outside_the_package_samples_the_posterior(sghmc_local):
    figures = check(sghmc_local)
    assert figures["ok"], figures
    info = sghmc_local.info
    assert info["algorithm"] == "SGHMC" and info["engine"] == "local"
    assert info["local_steps"] == LOCAL_STEPS and info["num_clients"] == len(SIZES)
    # every client was visited, in proportion to its size
    visits = np.asarray(info["visits_per_client"], float)
    assert np.all(visits > 0)
    np.testing.assert_allclose(visits / visits.sum(), np.asarray(SIZES) / sum(SIZES), atol=0.03)
    assert set(np.unique(sghmc_local.sample_stats["client"])) == set(range(len(SIZES)))


@pytest.mark.parametrize("variant", [{"noise_factor": 1.0}, {"carry_momentum": False}],
                         ids=["half-friction-noise", "momentum-not-carried"])
def test_the_same_check_rejects_broken_variants(variant):
    figures = check(run(**variant))
    assert not figures["ok"], figures


def test_the_carry_travels_between_clients():
    """A deterministic carry (position, counter): the counter advances by one per update on
    whichever client the chain is, so each draw's position is its iteration count."""

    class Counting(HandoffProtocol):
        name, local_steps = "counting", 3

        def init_carry(self, position):
            return (position, np.zeros((), np.float32))

        def build_update(self, context, parameters):
            def update(key, carry, iteration):
                count = carry[1] + 1.0
                return (jnp.full_like(carry[0], count), count)
            return update

    result = sample_protocol(Counting(), MODEL, equal_mean_federation(), engine="local",
                             init=jnp.zeros(DIM), num_samples=10, burn_in=0, thin=2, chains=2,
                             seed=0)
    expected = 2.0 * np.arange(1, 11)
    np.testing.assert_array_equal(result.flat_samples()[..., 0], np.stack([expected] * 2))
    assert len(set(result.sample_stats["client"].ravel().tolist())) > 1
    # the set-up's phases are reported (issue 18)
    assert set(result.info["setup_phases"]) == {"clients_started", "prepare", "configure"}


class _RefuseRay:
    """A meta-path finder that fails the test if anything imports Ray."""

    def find_spec(self, name, path=None, target=None):
        if name == "ray":
            raise AssertionError("the in-process run imported Ray")
        return None


def test_the_in_process_engine_does_not_import_ray(monkeypatch):
    """Recording where the clients run (``info["client_locations"]``) looks for Ray's node id
    only in a process that has imported Ray: importing it cost every in-process hand-off run
    about 0.4 s (issue 18)."""
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_RefuseRay()] + sys.meta_path)
    result = sample_protocol(SGHMCProtocol(STEP, FRICTION, 5, 5), MODEL, equal_mean_federation(),
                             engine="local", init=jnp.zeros(DIM), num_samples=2, burn_in=0,
                             thin=1, chains=1, seed=0)
    assert [where["client"] for where in result.info["client_locations"]] == list(range(5))
    assert not any("node_id" in where for where in result.info["client_locations"])


def test_protocol_errors_are_clear():
    federation = equal_mean_federation()
    with pytest.raises(ValueError, match="protocol must be"):
        sample_protocol(object(), MODEL, federation, engine="local", init=jnp.zeros(DIM),
                        num_samples=2, burn_in=0, thin=1, chains=1, seed=0)
    with pytest.raises(ValueError, match="engine must be"):
        sample_protocol(SGHMCProtocol(STEP, FRICTION, 5, 5), MODEL, federation, engine="gpu",
                        init=jnp.zeros(DIM), num_samples=2, burn_in=0, thin=1, chains=1, seed=0)
    with pytest.raises(ValueError, match="ray_address is a Ray option"):
        sample_protocol(SGHMCProtocol(STEP, FRICTION, 5, 5), MODEL, federation, engine="local",
                        init=jnp.zeros(DIM), num_samples=2, burn_in=0, thin=1, chains=1, seed=0,
                        ray_address="127.0.0.1:1")


def test_sghmc_on_ray_equals_the_in_process_run(sghmc_local, tmp_path_factory):
    """The same protocol on Ray (one actor per client; the test module's classes are pickled
    by value, as a user's script's would be): the same draws as in-process."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # keep Ray on loopback
    ray = pytest.importorskip("ray")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    federation = equal_mean_federation()
    algorithm = SGHMC(STEP, FRICTION, batch_size=max(SIZES), local_steps=LOCAL_STEPS)
    on_ray = fm.sample(MODEL, federation, algorithm, init=jnp.zeros(DIM), num_samples=60,
                       burn_in=100, thin=THIN, chains=4, seed=2, engine="ray",
                       visit_timeout=120.0,
                       ray_init_options={"num_cpus": 2,
                                         "_temp_dir": str(tmp_path_factory.mktemp("ray"))})
    assert not ray.is_initialized()  # fedmcmc shut down the instance it started
    assert on_ray.info["engine"] == "ray" and on_ray.info["ray_authentication"] == "token"
    np.testing.assert_allclose(on_ray.flat_samples(), sghmc_local.flat_samples()[:, :60],
                               rtol=0, atol=1e-5)
    np.testing.assert_array_equal(on_ray.sample_stats["client"],
                                  sghmc_local.sample_stats["client"][:, :60])


# --------------------------------------------------------------------- failures, in-process

def _dsgld_protocol_run(**options):
    algorithm = fm.DSGLD(step_size=2e-3, batch_size=5, local_steps=10)
    return sample_protocol(algorithm.handoff_protocol(), MODEL, equal_mean_federation(),
                           engine="local", init=jnp.zeros(DIM), num_samples=60, burn_in=0,
                           thin=5, chains=3, seed=7, **options)


@pytest.fixture(scope="module")
def uninterrupted():
    return _dsgld_protocol_run()


def test_chunk_size_and_on_draws_are_honoured(uninterrupted):
    """The hand-off engine passes each chunk's kept draws to on_draws (flat positions, as
    in-process), ending the chunks where chunk_size says; the draws do not change."""
    received = DrawsReceived()
    result = _dsgld_protocol_run(chunk_size=16, on_draws=received)
    received.check(result, burn_in=0, chunk_size=16)
    np.testing.assert_array_equal(result.flat_samples(), uninterrupted.flat_samples())
    with pytest.raises(ValueError, match="chunk_size"):
        _dsgld_protocol_run(chunk_size=0)


def test_a_crashed_client_stops_the_run_and_keeps_the_draws(uninterrupted):
    """Fault injection is a transport wrapper (engines.comm.FaultInjectingTransport), so the
    failure handling of the protocol engine is tested without Ray."""
    from fedmcmc.engines.comm import ClientFailureError

    with pytest.raises(ClientFailureError) as caught:
        _dsgld_protocol_run(fault_injection={"client": 3, "after_visits": 4, "kind": "exit"})
    error = caught.value
    assert error.client == 3 and "died" in error.reason
    kept = error.result.flat_samples()
    made = np.isfinite(kept).all(axis=-1)
    assert 0 < made.sum() < 3 * 60
    # the result ends at the last draw any chain received; the others are NaN-padded
    assert error.result.info["draws_per_chain"] == made.sum(axis=1).tolist()
    np.testing.assert_array_equal(kept[made], uninterrupted.flat_samples()[:, :kept.shape[1]][made])


def test_a_dropped_client_renormalises_the_weights(uninterrupted):
    result = _dsgld_protocol_run(on_client_failure="drop",
                                 fault_injection={"client": 3, "after_visits": 4, "kind": "exit"})
    info = result.info
    assert info["dropped_clients"] == [3] and info["target_changed"] is True
    weights = np.asarray(info["weights_after_drop"])
    expected = np.asarray(SIZES, float)
    expected[3] = 0.0
    np.testing.assert_allclose(weights, expected / expected.sum(), rtol=1e-6)
    assert np.isfinite(result.flat_samples()).all()
    # the client served its 4 visits (2 draws each) and no more
    assert (result.sample_stats["client"] == 3).sum() <= 4 * 2


def test_a_hung_client_times_out():
    result = _dsgld_protocol_run(on_client_failure="drop", visit_timeout=0.5,
                                 fault_injection={"client": 1, "after_visits": 2, "kind": "hang",
                                                  "seconds": 600})
    assert result.info["dropped_clients"] == [1]
    assert "visit_timeout" in result.info["client_failures"][0]["reason"]


def test_a_diverging_chain_is_reported_alike_by_both_engines():
    """The one driver and result assembly: the same details (chain, draw, iteration, client,
    round) and the same partial draws whether the chain is simulated in one compiled program
    or handed from client to client over a transport."""
    algorithm = fm.DSGLD(step_size=5.0, batch_size=5, local_steps=10)  # far past stability
    run = dict(init=jnp.zeros(DIM), num_samples=60, burn_in=0, thin=5, chains=2, seed=7)
    with pytest.raises(fm.SamplingDivergedError) as in_process:
        fm.sample(MODEL, equal_mean_federation(), algorithm, progress=False, **run)
    with pytest.raises(fm.SamplingDivergedError) as handed:
        sample_protocol(algorithm.handoff_protocol(), MODEL, equal_mean_federation(),
                        engine="local", **run)
    assert in_process.value.details == handed.value.details
    assert set(in_process.value.details[0]) == {"chain", "draw", "iteration", "client", "round"}
    a, b = in_process.value.result.flat_samples(), handed.value.result.flat_samples()
    made = min(a.shape[1], b.shape[1])
    np.testing.assert_allclose(a[:, :made], b[:, :made], rtol=1e-5, atol=1e-5)
