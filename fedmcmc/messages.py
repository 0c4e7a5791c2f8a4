"""``result.info["messages"]``: the messages of an algorithm's communication pattern, counted
the same way on every engine.

One message is one transfer, between a client and the server or between two agents, of one
chain's state or of one client's reply for one chain. The count is made from the run's own
figures (rounds per chain, client rounds, iterations, event rounds per chain, graph edges),
never from what a transport sent, so the same run gives the same ``info["messages"]`` on
``engine="local"`` and on the message-passing engines (Ray, Flower,
:class:`~fedmcmc.engines.engine.InProcessEngine`). There is one function per pattern of
:data:`fedmcmc.engines.engine.PATTERNS`, and :func:`setup` for the algorithm's own set-up
rounds (FSGLD's surrogates, FALD's and QLSD's Laplace fit and reference gradient), which are
part of ``info["messages"]`` and also reported alone in ``info["setup_messages"]``.

What a message-passing engine really sent is ``info["transport_messages"]`` (the transport's
count, :meth:`fedmcmc.engines.comm.Transport.info`): it batches the chains of a client into one
message and adds the control traffic of the session (describing the federation, the client
locations, configuring the clients, the driver reading the draws, set-up questions such as the
PDMP's Newton rounds), so it differs from ``info["messages"]`` by construction.
"""

from __future__ import annotations

from typing import Dict, Sequence

import numpy as np

__all__ = ["handoff", "broadcast", "event_rounds", "neighbour_exchange", "setup", "figures"]


def handoff(rounds_per_chain: Sequence[int]) -> int:
    """The hand-off pattern (DSGLD, FSGLD): every round of a chain hands its state to one
    client and the client hands it back (with the draws taken during the visit), two messages
    per round per chain: ``2 * sum(rounds_per_chain)``."""
    return int(2 * np.sum(np.asarray(rounds_per_chain, np.int64)))


def broadcast(client_rounds: int, uploads_inside_rounds: int = 0) -> int:
    """The broadcast pattern (FALD, QLSD, consensus Monte Carlo): every round the server sends
    each chain's shared state to each client taking part and each client sends its reply back,
    two messages per client and chain a round. ``client_rounds``: the sum over chains and
    rounds of the clients taking part; ``uploads_inside_rounds``: the extra one-way uploads a
    round may hold (FALD's draws that fall inside a round of local steps)."""
    return int(2 * client_rounds + uploads_inside_rounds)


def event_rounds(rounds_per_chain: Sequence[int], workers: int) -> int:
    """The event-round pattern (the federated PDMPs, Algorithm 2): every event round of a chain
    asks each of its ``workers`` for a proposed event time and gets it back, two messages per
    worker per round of each chain: ``2 * workers * sum(rounds_per_chain)``.

    ``rounds_per_chain``: the event rounds each chain took part in
    (``info["event_iterations_per_chain"]``). A message-passing engine asks the workers for
    every chain still within its draw in one round, so its rounds (``event_rounds_broadcast``)
    are shared across chains; counting the rounds each chain takes part in makes the count the
    same on both engines."""
    return int(2 * int(workers) * np.sum(np.asarray(rounds_per_chain, np.int64)))


def neighbour_exchange(iterations: int, directed_edges: int, chains: int) -> int:
    """The neighbour exchange (DULA, GT-DULA): every iteration each agent sends each chain's
    state to each neighbour, one message per directed edge, iteration and chain:
    ``iterations * directed_edges * chains``."""
    return int(iterations) * int(directed_edges) * int(chains)


def setup(clients: int, rounds: int) -> int:
    """The algorithm's own set-up rounds with every client (a question down, the answer back):
    ``2 * clients * rounds``."""
    return int(2 * int(clients) * int(rounds))


def figures(pattern_messages: int, setup_messages: int = 0) -> Dict[str, int]:
    """The ``info`` keys of a run's messages: ``messages`` (the pattern's and the set-up's)
    and ``setup_messages``."""
    return {"messages": int(pattern_messages + setup_messages),
            "setup_messages": int(setup_messages)}
