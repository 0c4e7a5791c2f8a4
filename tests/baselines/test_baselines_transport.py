"""FA-LD, QLSD and consensus Monte Carlo through the engine layer, on the in-process transport.

``algorithm.sample_distributed`` runs each baseline with one endpoint per client (the engine's
generic ``BroadcastClient`` running ``fedmcmc.baselines.distributed``'s client-side functions
on the client's own rows), message for message as on ``engine="ray"``, without starting Ray.
The draws are ``engine="local"``'s: exactly for consensus MC, to float rounding for FA-LD and
QLSD (the in-process kernel computes every client in one compiled program; a client computes
its own row of it: about 1e-7 apart). A client failure stops the run with the draws made
before it; a federation built from loaders runs with the driver holding no rows.
"""

import functools

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc.engines.comm import ClientFailureError
from fedmcmc.engines.engine import InProcessEngine

from chunks import DrawsReceived

DIM = 2
SIZES = (15, 25, 4, 40)  # very unequal, one client smaller than the batch
MODEL = fm.models.gaussian_mean(DIM)  # x ~ N(mu, I), mu ~ N(0, I)
RUN = dict(init=jnp.zeros(DIM), num_samples=30, burn_in=5, thin=3, chains=2, seed=2,
           progress=False)
H = 0.2 / (sum(SIZES) + 1)


def client_rows():
    rng = np.random.default_rng(0)
    means = rng.uniform(-1.5, 1.5, size=(len(SIZES), DIM))
    return [rng.normal(m, 1.0, size=(n, DIM)).astype(np.float32) for m, n in zip(means, SIZES)]


ENGINE_OPTIONS = ("visit_timeout", "on_client_failure", "audit_messages", "fault_injection")


def over_transport(algorithm, federation=None, run=RUN, **options):
    """The algorithm's distributed run with in-process endpoints (what engine='ray' runs with
    Ray actors); ``options``: the engine's and the run's."""
    federation = federation if federation is not None else fm.Federation(client_rows())
    engine = InProcessEngine(**{k: options.pop(k) for k in ENGINE_OPTIONS if k in options})
    return algorithm.sample_distributed(MODEL, federation, engine, **run, **options)


CASES = {
    # two local steps and a draw every three iterations: draws inside rounds too
    "FALD": (fm.FALD(step_size=H, batch_size=10, local_steps=2), 1e-5),
    "FALD-partial": (fm.FALD(step_size=H, batch_size=10, local_steps=2, participation=0.5),
                     1e-5),
    "VR-FALD*": (fm.FALD(step_size=H, batch_size=10, local_steps=2, variance_reduction=True,
                         reference_point=jnp.array([0.1, -0.2])), 1e-5),
    "QLSD": (fm.QLSD(step_size=H, batch_size=10, bits=4), 1e-5),
    "QLSD++": (fm.QLSD(step_size=H, batch_size=10, bits=4, variance_reduction=True), 1e-5),
    "ConsensusMC": (fm.ConsensusMC(num_warmup=40), 0.0),
}


#: with slow (CI time): the variance-reduced variants send the same messages as FALD and QLSD,
#: whose cases the default suite keeps; Consensus MC's NUTS runs
SLOW_CASES = {"ConsensusMC", "VR-FALD*", "QLSD++"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name in SLOW_CASES
                                  else name for name in CASES])
def test_the_in_process_transport_gives_the_local_draws(name):
    algorithm, tolerance = CASES[name]
    # the run options both engines honour: chunk_size, and on_draws (each chain's draws;
    # consensus MC refuses on_draws on both, as it combines the draws after sampling)
    chunked = {} if name == "ConsensusMC" else {"chunk_size": 8}
    local_chunks, chunks = DrawsReceived(), DrawsReceived()
    local = fm.sample(MODEL, fm.Federation(client_rows()), algorithm, **RUN, **chunked,
                      **({"on_draws": local_chunks} if chunked else {}))
    distributed = over_transport(algorithm, audit_messages=True, **chunked,
                                 **({"on_draws": chunks} if chunked else {}))
    if chunked:
        local_chunks.check(local, RUN["burn_in"], 8)
        chunks.check(distributed, RUN["burn_in"], 8)
    if tolerance == 0.0:
        np.testing.assert_array_equal(distributed.flat_samples(), local.flat_samples())
    else:
        np.testing.assert_allclose(distributed.flat_samples(), local.flat_samples(), rtol=0,
                                   atol=tolerance)
    info = distributed.info
    assert info["engine"] == "local" and info["messages"] > 0
    assert len(info["client_locations"]) == len(SIZES)
    for key in ("rounds", "rounds_per_chain", "clients_per_round", "quantization_levels",
                "reference_every", "memory_rate", "warmup_steps", "step_size_per_client",
                "acceptance_per_client", "divergent_transitions_per_client"):
        if key in local.info:
            assert info[key] == local.info[key], key
    # every array a client sends is per chain and coordinate (FA-LD's chains, QLSD's
    # compressed gradients), or its draws of one chunk (consensus MC); never its rows
    # (one client holds 40 of them)
    for _, method, arrays in info["client_message_audit"]:
        for shape, _dtype in arrays:
            assert shape[-1:] in ([], [DIM], [RUN["chains"]]), (method, shape)
            draws = RUN["burn_in"] + RUN["num_samples"]
            assert int(np.prod(shape)) <= draws * RUN["chains"] * DIM


def load(rows):
    """A client's loader (a real one would read the client's own files)."""
    return rows


# consensus MC's NUTS compiles for ~20 s per run: its identity case stays in the default suite
SLOW_NUTS = pytest.mark.slow


@pytest.mark.parametrize("name", ["FALD", "QLSD", pytest.param("ConsensusMC", marks=SLOW_NUTS)])
def test_a_federation_of_loaders_runs_with_no_rows_in_the_driver(name):
    algorithm, tolerance = CASES[name]
    federation = fm.Federation.from_loaders([functools.partial(load, r) for r in client_rows()])
    run = dict(RUN, num_samples=10)
    with federation.kept_on_clients():  # any access to the rows in the driver raises
        distributed = over_transport(algorithm, federation, run)
    local = fm.sample(MODEL, fm.Federation(client_rows()), algorithm, **run)
    np.testing.assert_allclose(distributed.flat_samples(), local.flat_samples(), rtol=0,
                               atol=max(tolerance, 1e-7))


@pytest.mark.parametrize("name, after", [("FALD", 12), ("QLSD", 40),
                                         pytest.param("ConsensusMC", 3, marks=SLOW_NUTS)])
def test_a_crashed_client_stops_the_run_and_keeps_the_draws(name, after):
    algorithm, tolerance = CASES[name]
    run = dict(RUN, burn_in=0, num_samples=40)
    with pytest.raises(ClientFailureError) as caught:
        over_transport(algorithm, run=run,
                       fault_injection={"client": 2, "after_visits": after, "kind": "exit"},
                       chunk_size=8)
    error = caught.value
    assert error.client == 2 and "died" in error.reason and "client 2" in str(error)
    kept = error.result.flat_samples()
    assert 0 < kept.shape[1] < 40 and np.isfinite(kept).all()
    local = fm.sample(MODEL, fm.Federation(client_rows()), algorithm, **run)
    if name == "ConsensusMC":
        # the clients' draws received before the failure are the local run's; their
        # combination is the server's, from those draws only
        sent = np.asarray(error.result.info["client_samples"])
        np.testing.assert_array_equal(sent, np.asarray(
            local.info["client_samples"])[:, :sent.shape[1]])
    else:
        np.testing.assert_allclose(kept, local.flat_samples()[:, :kept.shape[1]], rtol=0,
                                   atol=tolerance)


def test_settings_this_engine_cannot_honour_are_refused():
    with pytest.raises(ValueError, match="reference_point"):
        over_transport(fm.FALD(step_size=H, batch_size=10, local_steps=2,
                               variance_reduction=True))
    with pytest.raises(ValueError, match="on_client_failure"):
        over_transport(fm.QLSD(step_size=H, batch_size=10), on_client_failure="drop")
    with pytest.raises(ValueError, match="start_draw"):
        fm.sample(MODEL, fm.Federation(client_rows()), fm.FALD(step_size=H, batch_size=10,
                  local_steps=2), engine="ray", start_draw=3, **RUN)
