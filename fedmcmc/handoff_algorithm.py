"""``fm.HandoffAlgorithm(protocol)``: a hand-off protocol of one's own through ``fm.sample``.

A sampler whose chain travels from client to client is written once, as a
:class:`~fedmcmc.protocols.HandoffProtocol` (what travels with the chain, one update on one
client); this wrapper makes it an :class:`~fedmcmc.algorithm.Algorithm`, so it runs through
:func:`fedmcmc.sample` on every engine that runs the hand-off pattern (``engine="local"``:
its clients as objects in this process, message for message as on Ray; ``engine="ray"``:
client endpoints in Ray actors), with the convergence checks, ``Result`` and errors of
every other algorithm. ``docs/development/writing-a-sampler.md`` walks through one (SGHMC).

A YAML config (``fedmcmc run``) names a protocol class by its import path,
``algorithms: [{name: "package.module:MyProtocol", params: {...}}]``: the config builds
``HandoffAlgorithm(MyProtocol(**params))``.
"""

from __future__ import annotations

from typing import Optional

from .algorithm import Algorithm
from .engines.handoff import sample_protocol
from .protocols import HandoffProtocol

__all__ = ["HandoffAlgorithm"]


class HandoffAlgorithm(Algorithm):
    """A hand-off protocol as an algorithm of :func:`fedmcmc.sample`.

    Parameters
    ----------
    protocol:
        A :class:`~fedmcmc.protocols.HandoffProtocol` instance (its hyper-parameters set in
        its constructor). It is pickled to the clients on Ray: keep its configuration in
        plain attributes.

    Examples
    --------
    >>> result = fm.sample(model, fed, fm.HandoffAlgorithm(MyProtocol(step_size=1e-3)),
    ...                    init=params0, num_samples=1000, engine="ray")  # doctest: +SKIP

    Run options (``fm.sample(..., **options)``): the hand-off engine's ``visit_timeout``,
    ``on_client_failure`` (``"stop"`` or ``"drop"``), ``audit_messages``, ``chunk_size``,
    ``on_draws``, and on Ray the engine's Ray options (``ray_address``, ...).
    """

    #: runs on the in-process engine and on every message-passing engine
    message_passing = True
    #: one message per visit of a chain to a client (``fedmcmc.engines.engine.PATTERNS``)
    message_pattern = "handoff"

    def __init__(self, protocol: HandoffProtocol):
        if not isinstance(protocol, HandoffProtocol):
            raise ValueError(f"protocol must be a fedmcmc.protocols.HandoffProtocol instance, "
                             f"got {protocol!r}")
        self.protocol = protocol

    @property
    def name(self) -> str:
        """The protocol's name (``Result.info["algorithm"]``)."""
        return self.protocol.name

    def handoff_protocol(self) -> HandoffProtocol:
        """The protocol the hand-off engine runs (as ``fm.DSGLD``'s)."""
        return self.protocol

    def hyperparameters(self) -> dict:
        return {"protocol": self.protocol}

    def run_info(self) -> Optional[dict]:
        """Entries to start ``Result.info`` with (a subclass's hyper-parameters); none here."""
        return None

    def sample(self, model, federation, *, engine, **arguments):
        return self.sample_distributed(model, federation, engine, **arguments)

    def sample_local(self, model, federation, **arguments):
        """In this process: the protocol's clients as objects here, message for message as on
        Ray (a hand-off protocol has no separate in-process kernel)."""
        return self.sample_distributed(model, federation, "local", **arguments)

    def sample_distributed(self, model, federation, engine, **arguments):
        """On ``engine``'s client endpoints (``fedmcmc.engines.handoff.sample_protocol``)."""
        return sample_protocol(self.handoff_protocol(), model, federation, engine=engine,
                               info=self.run_info(), **arguments)
