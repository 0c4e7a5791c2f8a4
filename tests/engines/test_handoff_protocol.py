"""The hand-off engine (``fedmcmc.engines.handoff``) on the in-process transport: a carry that
travels between clients, set-up phases, no Ray import in-process, clear errors, run options,
and client failures (crash, drop, hang, divergence) through fault injection.

A sampler written outside the package (SGHMC, momentum travelling with the chain) and its
statistical checks are in test_user_protocol.py.
"""

import sys

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc.engines.handoff import sample_protocol
from fedmcmc.protocols import HandoffProtocol

from chunks import DrawsReceived

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


class Counting(HandoffProtocol):
    """A deterministic carry (position, counter): the counter advances by one per update on
    whichever client the chain is."""

    name, local_steps = "counting", 3

    def init_carry(self, position):
        return (position, np.zeros((), np.float32))

    def build_update(self, context, parameters):
        def update(step, carry):
            count = carry[1] + 1.0
            return (jnp.full_like(carry[0], count), count)
        return update


def test_the_carry_travels_between_clients():
    """The counter advances by one per update on whichever client the chain is, so each
    draw's position is its iteration count."""
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
    result = sample_protocol(Counting(), MODEL, equal_mean_federation(),
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
        sample_protocol(Counting(), MODEL, federation, engine="gpu",
                        init=jnp.zeros(DIM), num_samples=2, burn_in=0, thin=1, chains=1, seed=0)
    with pytest.raises(ValueError, match="ray_address is a Ray option"):
        sample_protocol(Counting(), MODEL, federation, engine="local",
                        init=jnp.zeros(DIM), num_samples=2, burn_in=0, thin=1, chains=1, seed=0,
                        ray_address="127.0.0.1:1")


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
