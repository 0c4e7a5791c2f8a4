"""The neighbour-exchange engine (DULA/GT-DULA's pattern) over a :class:`~.comm.Transport`.

No server: every iteration each agent updates from its neighbours' messages of the
previous iteration. The engine's part is the generic agent endpoint below (a Ray actor
on the Ray engine, an object on the in-process transport), which holds the agent's
data and runs the family's client-side functions on it, and ``Transport.relay``,
which hands an agent's reply to its neighbours agent to agent (on Ray as object
references: the driver never relays the states). The family composes them
(``fedmcmc.decentralised.distributed``). This module knows no family.
"""

from __future__ import annotations

from typing import Any

from ..protocols import NeighbourProtocol, client_context, client_function
from .comm import ClientEndpoint

__all__ = ["NeighbourClient"]


class NeighbourClient(ClientEndpoint):
    """One agent of a neighbour-exchange protocol: its data and the family's functions.

    ``functions`` is a :class:`~fedmcmc.protocols.NeighbourProtocol`, whose client-side
    methods run here on a :class:`~fedmcmc.protocols.ClientContext` holding only this
    agent's rows: ``client_start(context, *start)`` once at construction (``start``: the
    agent's place in the graph). Messages: ``message()`` (its outgoing message), ``step(k,
    *neighbour_messages)`` (iteration k from its neighbours' messages; returns the new
    outgoing message) and ``setup(name, *args)`` (other questions, e.g. gradient terms:
    ``client_<name>``, looked up by name)."""

    RUN_WIDE_ARGUMENTS = (2, 3, 4)  # model, init, functions: the same for every client

    def __init__(self, index: int, source: Any, model, init: Any, functions: Any,
                 num_clients: int, seed: int, start: tuple = ()):
        if not isinstance(functions, NeighbourProtocol):
            raise ValueError(f"functions must be a fedmcmc.protocols.NeighbourProtocol, got "
                             f"{functions!r}")
        super().__init__(index, source)
        self.functions = functions
        self.context = client_context(self.index, self.data, self.size, model, init,
                                      num_clients, seed)
        functions.client_start(self.context, *start)

    def message(self):
        return self.functions.client_message(self.context)

    def step(self, k: int, *neighbour_messages):
        return self.functions.client_step(self.context, k, *neighbour_messages)

    def setup(self, name: str, *args):
        return client_function(self.functions, name)(self.context, *args)
