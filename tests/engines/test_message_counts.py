"""``info["messages"]`` is the same quantity on every engine (``fedmcmc/messages.py``): the
messages of the algorithm's communication pattern, counted from the run's own figures. One
algorithm per pattern runs on ``engine="local"`` and on the in-process message-passing engine
(which counts its transport exactly as Ray does); the counts must be equal, and the
message-passing run also reports what its transport really sent (``transport_messages``),
which batches chains and adds control traffic, so it differs."""

import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc import messages as message_counts
from fedmcmc.engines.engine import InProcessEngine

DIM = 2
SIZES = (8, 12, 10)
MODEL = fm.Model(log_prior=lambda mu: -0.5 * jnp.sum(mu**2) / 10.0,
                 log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2))
LANGEVIN = dict(num_samples=6, burn_in=2, thin=2, chains=2)
PDMP = dict(num_samples=6, burn_in=2, chains=2)


def federation():
    rng = np.random.default_rng(5)
    return fm.Federation([rng.normal(0.5, 1.0, size=(n, DIM)).astype(np.float32)
                          for n in SIZES])


def run(algorithm, engine, keywords):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fm.sample(MODEL, federation(), algorithm, init=np.zeros(DIM, np.float32), seed=1,
                         engine=engine, progress=False, **keywords)


CASES = {
    "handoff": (lambda: fm.DSGLD(step_size=1e-3, batch_size=4, local_steps=3), LANGEVIN),
    "broadcast": (lambda: fm.QLSD(step_size=1e-3, batch_size=4, bits=4), LANGEVIN),
    "event_rounds": (lambda: fm.FedZigZag(sample_interval=0.3, thinning="per_worker"), PDMP),
    "neighbour_exchange": (lambda: fm.DULA(step_size=1e-3, beta=0.3), LANGEVIN),
}


@pytest.mark.slow  # 5 to 35 s each on 2 busy cores (FedZigZag's compilations)
@pytest.mark.parametrize("pattern", sorted(CASES))
def test_messages_equal_on_local_and_message_passing_engines(pattern):
    make, keywords = CASES[pattern]
    local = run(make(), "local", keywords)
    passed = run(make(), InProcessEngine(), keywords)
    assert make().message_pattern == pattern
    assert local.info["messages"] == passed.info["messages"] > 0
    assert local.info["setup_messages"] == passed.info["setup_messages"]
    assert "transport_messages" not in local.info
    assert passed.info["transport_messages"] == (
        passed.info["messages_to_clients"] + passed.info["messages_from_clients"]
        + passed.info.get("messages_between_agents", 0))
    if pattern == "handoff":  # two messages per round of each chain
        assert local.info["messages"] == 2 * sum(local.info["rounds_per_chain"])
        # the transport also carried the set-up and the driver's messages
        assert passed.info["transport_messages"] != passed.info["messages"]


def test_pattern_counts():
    assert message_counts.handoff([3, 4]) == 14
    assert message_counts.broadcast(10, 3) == 23
    assert message_counts.event_rounds([5, 7], workers=3) == 72
    assert message_counts.neighbour_exchange(10, directed_edges=6, chains=2) == 120
    assert message_counts.figures(14, message_counts.setup(4, 1)) == {
        "messages": 22, "setup_messages": 8}
