"""Fed-PDMC through the broadcast-and-gather engine on the in-process transport (issue 14):
the engine's generic client endpoint runs the family's client-side functions
(``fedmcmc.pdmp.distributed.WorkerFunctions``) message for message as on Ray, so its draws
equal the in-process engine's, and its failure handling (a crashed worker: stop with the
draws so far, or drop it) is tested without starting Ray."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc.engines.comm import ClientFailureError, InProcessTransport
from fedmcmc.engines.options import check_engine_options

DIM = 2
SIZES = (3, 11, 26, 60)
MODEL = fm.Model(
    log_prior=lambda mu: -0.5 * jnp.sum(mu**2),
    log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2),
)


def federation():
    rng = np.random.default_rng(4)
    return fm.Federation([rng.normal(rng.uniform(-1, 1, DIM), 1.0, size=(n, DIM))
                          .astype(np.float32) for n in SIZES])


def over_transport(algorithm, num_samples=40, **options):
    """The algorithm's distributed run with in-process endpoints (what engine='ray' runs with
    Ray actors)."""
    with jax.enable_x64(True):
        return algorithm._sample_distributed(
            MODEL, federation(), np.zeros(DIM, np.float32), num_samples, 5, 2, 3, False, 0,
            0.0, True, lambda specs: InProcessTransport([cls(*args) for cls, args in specs]),
            "local", check_engine_options(options, algorithm.name))


CASES = [
    fm.FedZigZag(sample_interval=0.3),
    pytest.param(fm.FedBoomerang(sample_interval=0.5, refresh_rate=0.2), marks=pytest.mark.slow),
    pytest.param(fm.FedZigZag(sample_interval=0.3, control_variates=True,
                              redistribution_rate=0.5, prior="split"), marks=pytest.mark.slow),
]


@pytest.mark.parametrize("algorithm", CASES, ids=["zigzag", "boomerang", "zigzag-cv-redistribution"])
def test_the_broadcast_engine_gives_the_in_process_draws(algorithm):
    local = fm.sample(MODEL, federation(), algorithm, init=np.zeros(DIM, np.float32),
                      num_samples=40, burn_in=5, chains=2, seed=3)
    distributed = over_transport(algorithm, audit_messages=True)
    np.testing.assert_array_equal(distributed.flat_samples(), local.flat_samples())
    audit = distributed.info["client_message_audit"]
    assert {method for _, method, _ in audit} >= {"setup", "respond"}
    assert set(distributed.info["setup_phases"]) == {"clients_started", "prepare", "configure"}
    # every array a worker sends is per chain (2), per coordinate (2) or a 2 x 2 Hessian,
    # never its rows (every worker holds at least 3)
    for _, method, arrays in audit:
        for shape, _ in arrays:
            assert max(shape, default=0) <= 2, (method, shape)


def test_the_broadcast_engine_follows_the_in_process_thinning_of_unequal_workers():
    """Thinning (estimated bounds) on workers of 3 to 60 rows: the in-process engine sums the
    gradients over the unpadded rows of all workers at once and stops a worker once another
    has an earlier event; each broadcast worker sums its own rows and searches to the cap.
    Same events, same draws up to rounding."""
    algorithm = fm.FedZigZag(sample_interval=0.3, bound="estimate")
    local = fm.sample(MODEL, federation(), algorithm, init=np.zeros(DIM, np.float32),
                      num_samples=40, burn_in=5, chains=2, seed=3)
    assert local.info["gradient_layout"] == "unpadded"
    distributed = over_transport(algorithm)
    np.testing.assert_allclose(distributed.flat_samples(), local.flat_samples(), rtol=1e-9,
                               atol=1e-9)
    assert distributed.info["events_per_worker"] == local.info["events_per_worker"]
    # the losers' searches are shorter in-process
    assert distributed.info["thinning_proposals"] > local.info["thinning_proposals"]


def test_a_crashed_worker_stops_the_run_or_is_dropped():
    algorithm = fm.FedZigZag(sample_interval=0.3)
    fault = {"client": 2, "after_visits": 150, "kind": "exit"}
    with pytest.raises(ClientFailureError) as caught:
        over_transport(algorithm, fault_injection=fault)
    error = caught.value
    assert error.client == 2 and "died" in error.reason
    kept = error.result.flat_samples()
    assert 0 < kept.shape[1] < 40 and np.isfinite(kept).all()
    dropped = over_transport(algorithm, fault_injection=fault, on_client_failure="drop")
    assert dropped.info["dropped_clients"] == [2] and dropped.info["target_changed"]
    assert dropped.flat_samples().shape == (2, 40, DIM)
    assert np.isfinite(dropped.flat_samples()).all()
