"""DULA/GT-DULA through the neighbour-exchange engine on the in-process transport (issue 14):
messages between agents are relayed agent to agent (``Transport.relay``; on Ray, actor to
actor), so the engine runs without Ray, with the in-process engine's draws, and its failure
handling is tested in the default suite."""

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc.engines.comm import ClientFailureError
from fedmcmc.engines.engine import InProcessEngine

from chunks import DrawsReceived

DIM = 2
SIZES = (4, 9, 30, 17, 55)
MODEL = fm.Model(
    log_prior=lambda mu: -0.5 * jnp.sum(mu**2),
    log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2),
)
RUN = dict(init=jnp.zeros(DIM), num_samples=30, burn_in=5, thin=3, chains=2, seed=1)


def federation():
    rng = np.random.default_rng(2)
    return fm.Federation([rng.normal(rng.uniform(-1, 1, DIM), 1.0, size=(n, DIM))
                          .astype(np.float32) for n in SIZES])


ENGINE_OPTIONS = ("visit_timeout", "on_client_failure", "audit_messages", "fault_injection")


def over_transport(algorithm, **options):
    """The agents as in-process endpoints (what engine='ray' runs in actors); ``options``:
    the engine's and the run's."""
    engine = InProcessEngine(**{k: options.pop(k) for k in ENGINE_OPTIONS if k in options})
    return algorithm.sample_distributed(MODEL, federation(), engine, progress=False, **RUN,
                                        **options)


@pytest.mark.parametrize("algorithm", [
    fm.DULA(step_size=1e-3, beta=0.3),
    pytest.param(fm.GTDULA(step_size=1e-3, beta=0.3, gamma=0.3, batch_size=8),
                 marks=pytest.mark.slow),
], ids=["DULA", "GTDULA-minibatch"])
def test_the_neighbour_engine_gives_the_in_process_draws(algorithm):
    local_chunks, chunks = DrawsReceived(), DrawsReceived()
    local = fm.sample(MODEL, federation(), algorithm, chunk_size=8, on_draws=local_chunks, **RUN)
    exchanged = over_transport(algorithm, audit_messages=True, chunk_size=8, on_draws=chunks)
    # the same updates, one agent per endpoint instead of vmapped: float rounding only
    np.testing.assert_allclose(exchanged.flat_samples(), local.flat_samples(), rtol=0, atol=1e-5)
    # on_draws gets the network average chunk by chunk on both engines
    local_chunks.check(local, RUN["burn_in"], 8)
    chunks.check(exchanged, RUN["burn_in"], 8)
    info = exchanged.info
    assert info["engine"] == "local"
    # one message per directed edge per iteration (a ring of 5: 10 directed edges)
    assert info["messages_between_agents"] == 10 * info["iterations"]
    for _, method, arrays in info["client_message_audit"]:  # the driver reads states only
        for shape, _ in arrays:
            assert shape[-1] == DIM and len(shape) <= 2, (method, shape)


def test_a_crashed_agent_stops_the_run_with_its_draws():
    algorithm = fm.DULA(step_size=1e-3, beta=0.3)
    with pytest.raises(ClientFailureError) as caught:
        over_transport(algorithm, fault_injection={"client": 2, "after_visits": 40,
                                                   "kind": "exit"})
    kept = caught.value.result.flat_samples()
    assert caught.value.client == 2
    # 40 iterations at thin 3: 13 draws, of which 5 burn-in
    assert np.isfinite(kept[:, :8]).all()
    with pytest.raises(ValueError, match="dropping an agent changes the graph"):
        over_transport(algorithm, on_client_failure="drop")
