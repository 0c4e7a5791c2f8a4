"""Fed-PDMC through the broadcast-and-gather engine on the in-process transport (issue 14):
the engine's generic client endpoint runs the family's client-side functions
(``fedmcmc.pdmp.distributed.WorkerFunctions``) message for message as on Ray, so its draws
equal the in-process engine's, and its failure handling (a crashed worker: stop with the
draws so far, or drop it) is tested without starting Ray."""

import contextlib

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc.engines.comm import ClientFailureError, InProcessTransport
from fedmcmc.engines.engine import InProcessEngine
from fedmcmc.results import SamplingDivergedError

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


def in_process_transport(specs):
    return InProcessTransport([cls(*args) for cls, args in specs])


class TransportEngine(InProcessEngine):
    """The in-process engine with a transport of the test's making."""

    def __init__(self, make_transport, **options):
        super().__init__(**options)
        self.make_transport = make_transport

    @contextlib.contextmanager
    def transports(self):
        yield self.make_transport


def over_transport(algorithm, num_samples=40, chains=2, rate_diagnostics=True, chunk_size=None,
                   make_transport=in_process_transport, **options):
    """The algorithm's distributed run with in-process endpoints (what engine='ray' runs with
    Ray actors); ``chunk_size``: draws per call of the server's ``advance``."""
    run = {} if chunk_size is None else {"chunk_size": chunk_size}
    return algorithm.sample_distributed(
        MODEL, federation(), TransportEngine(make_transport, **options),
        init=np.zeros(DIM, np.float32), num_samples=num_samples, burn_in=5, thin=1,
        chains=chains, seed=3, progress=False, rate_diagnostics=rate_diagnostics, **run)


# thinning="per_worker" (Algorithm 3) on both engines: the broadcast engine's workers thin
# their own rates; in-process, thinning="auto" would take superposition thinning (same law,
# other draws: tests/pdmp/test_pdmp_superposition.py)
CASES = [
    fm.FedZigZag(sample_interval=0.3, thinning="per_worker"),
    pytest.param(fm.FedBoomerang(sample_interval=0.5, refresh_rate=0.2, thinning="per_worker"),
                 marks=pytest.mark.slow),
    pytest.param(fm.FedZigZag(sample_interval=0.3, thinning="per_worker", control_variates=True,
                              redistribution_rate=0.5, prior="split"), marks=pytest.mark.slow),
]


@pytest.mark.parametrize("algorithm", CASES, ids=["zigzag", "boomerang", "zigzag-cv-redistribution"])
def test_the_broadcast_engine_gives_the_in_process_draws(algorithm):
    local = fm.sample(MODEL, federation(), algorithm, init=np.zeros(DIM, np.float32),
                      num_samples=40, burn_in=5, chains=2, seed=3)
    distributed = over_transport(algorithm, audit_messages=True)
    np.testing.assert_array_equal(distributed.flat_samples(), local.flat_samples())
    # the rate diagnostics of every draw too, though the workers send their gradients at a
    # draw's end with the next round's proposals (a gradient broadcast of its own only for
    # the draws that end a call, not for every draw)
    assert set(distributed.sample_stats) == set(local.sample_stats) >= {"rate_federated"}
    for name, values in local.sample_stats.items():
        # (atol: the Boomerang's canonical rate is the positive part of a sum of the workers'
        # gradients that nearly cancel, about 1e-8 here, summed in another order)
        np.testing.assert_allclose(distributed.sample_stats[name], values, rtol=1e-9,
                                   atol=1e-12, err_msg=name)
    assert distributed.info["mean_rate_federated"] == pytest.approx(
        local.info["mean_rate_federated"], rel=1e-9)
    assert 0 < distributed.info["gradient_rounds_broadcast"] < 45 // 2
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
    algorithm = fm.FedZigZag(sample_interval=0.3, thinning="per_worker", bound="estimate")
    local = fm.sample(MODEL, federation(), algorithm, init=np.zeros(DIM, np.float32),
                      num_samples=40, burn_in=5, chains=2, seed=3)
    assert local.info["gradient_layout"] == "unpadded"
    distributed = over_transport(algorithm)
    np.testing.assert_allclose(distributed.flat_samples(), local.flat_samples(), rtol=1e-9,
                               atol=1e-9)
    assert distributed.info["events_per_worker"] == local.info["events_per_worker"]
    # the losers' searches are shorter in-process
    assert distributed.info["thinning_proposals"] > local.info["thinning_proposals"]


@pytest.fixture(scope="module")
def uninterrupted():
    """The draws of the Fed Zig-Zag run the stopped runs below are compared with."""
    return over_transport(fm.FedZigZag(sample_interval=0.3, thinning="per_worker",
                                         control_variates=False)).flat_samples()


def check_each_chain_kept_its_draws(result, uninterrupted):
    """A stopped run's chains each keep their first draws (at least one), the uninterrupted
    run's bit for bit, NaN after them, and ``info["draws_per_chain"]`` counts them (absent
    when the chains stopped at the same draw). Returns the counts."""
    kept = result.flat_samples()
    made = np.isfinite(kept).all(axis=-1)  # (chains, draws)
    per_chain = result.info.get("draws_per_chain", [kept.shape[1]] * kept.shape[0])
    assert per_chain == made.sum(axis=1).tolist() and min(per_chain) > 0
    for chain, count in enumerate(per_chain):  # a chain's draws are its first ones
        assert made[chain, :count].all() and np.isnan(kept[chain, count:]).all()
    np.testing.assert_array_equal(kept[made], uninterrupted[:, :kept.shape[1]][made])
    return per_chain


def test_a_crashed_worker_stops_the_run_or_is_dropped(uninterrupted):
    """The chains are not held in step, so a stopped run's chains end at different draws:
    each keeps every draw it made (the uninterrupted run's, bit for bit), NaN after them, and
    ``info["draws_per_chain"]`` says how many."""
    # control_variates=False: the stop points below are those of this trajectory
    algorithm = fm.FedZigZag(sample_interval=0.3, thinning="per_worker",
                             control_variates=False)
    fault = {"client": 2, "after_visits": 150, "kind": "exit"}
    with pytest.raises(ClientFailureError) as caught:
        over_transport(algorithm, fault_injection=fault)
    error = caught.value
    assert error.client == 2 and "died" in error.reason
    assert 0 < error.result.flat_samples().shape[1] < 40
    per_chain = check_each_chain_kept_its_draws(error.result, uninterrupted)
    assert len(set(per_chain)) > 1  # this seed stops them apart: the case being tested
    dropped = over_transport(algorithm, fault_injection=fault, on_client_failure="drop")
    assert dropped.info["dropped_clients"] == [2] and dropped.info["target_changed"]
    assert dropped.flat_samples().shape == (2, 40, DIM)
    assert np.isfinite(dropped.flat_samples()).all()


def test_the_chains_are_not_held_in_step():
    """Each chain starts its next draw as soon as it has ended the last: a call of every draw
    at once takes as many broadcast rounds as its busiest chain has event iterations (held
    in step, every draw would wait for its slowest chain), and the draws are still the
    in-process engine's."""
    # control_variates=False: the stop points below are those of this trajectory
    algorithm = fm.FedZigZag(sample_interval=0.3, thinning="per_worker",
                             control_variates=False)
    # (the shapes and options of the module's other runs: their compiled programs serve)
    local = fm.sample(MODEL, federation(), algorithm, init=np.zeros(DIM, np.float32),
                      num_samples=40, burn_in=5, chains=2, seed=3)
    one_call = over_transport(algorithm, chunk_size=45)
    np.testing.assert_array_equal(one_call.flat_samples(), local.flat_samples())
    per_chain = one_call.info["event_iterations_per_chain"]
    assert per_chain == local.info["event_iterations_per_chain"]
    assert len(set(per_chain)) > 1  # chains of different lengths: the case being tested
    assert one_call.info["event_rounds_broadcast"] == max(per_chain)


def test_a_diverged_chain_makes_no_more_rounds():
    """A chain whose draw crosses the divergence threshold stops drawing at once (its later
    draws are NaN and the run stops after the chunk, as on the in-process engine), so the
    workers spend no more rounds on it; the draws and the error are the in-process engine's."""
    # control_variates=False: the stop points below are those of this trajectory
    algorithm = fm.FedZigZag(sample_interval=0.3, thinning="per_worker",
                             control_variates=False)
    algorithm.divergence_threshold = 0.35  # chain 1 of this seed crosses it at draw 7
    with pytest.raises(SamplingDivergedError) as in_process:
        fm.sample(MODEL, federation(), algorithm, init=np.zeros(DIM, np.float32),
                  num_samples=40, burn_in=5, chains=2, seed=3)
    with pytest.raises(SamplingDivergedError) as distributed:
        over_transport(algorithm)
    local, remote = in_process.value, distributed.value
    assert remote.chains == local.chains == [1]
    assert [d["draw"] for d in remote.details] == [d["draw"] for d in local.details] == [7]
    np.testing.assert_array_equal(remote.result.flat_samples(), local.result.flat_samples())
    remote_iterations = remote.result.info["event_iterations_per_chain"]
    local_iterations = local.result.info["event_iterations_per_chain"]
    assert remote_iterations[0] == local_iterations[0]
    assert remote_iterations[1] < local_iterations[1]  # in process it ran to the chunk's end


def test_ctrl_c_keeps_the_draws_of_the_interrupted_chunk(uninterrupted):
    """Ctrl-C in the middle of a chunk (all 45 draws in one call here) keeps every draw each
    chain has made, the uninterrupted run's, and reports the run as interrupted."""

    def interrupted_after(rounds):
        def make_transport(specs):
            transport = in_process_transport(specs)
            call_each, sent = transport.call_each, []

            def call_each_or_interrupt(clients, method, args_of):
                if method == "respond":
                    sent.append(method)
                    if len(sent) > rounds:
                        raise KeyboardInterrupt  # what Ctrl-C raises in the server's wait
                return call_each(clients, method, args_of)

            transport.call_each = call_each_or_interrupt
            return transport

        return make_transport

    # control_variates=False: the stop points below are those of this trajectory
    algorithm = fm.FedZigZag(sample_interval=0.3, thinning="per_worker",
                             control_variates=False)
    result = over_transport(algorithm, chunk_size=45, make_transport=interrupted_after(300))
    assert result.info["interrupted"]
    assert result.flat_samples().shape[1] < uninterrupted.shape[1]
    check_each_chain_kept_its_draws(result, uninterrupted)
