"""One protocol session: the message-passing run of every pattern (hand-off, broadcast,
neighbour) opens, sets up, drives and closes its client endpoints here.

:func:`protocol_session` opens the engine's transport for the clients' endpoint specs
(``engine.transports()``: on Ray the authenticated session, the actors), applies the fault
injection of the tests, gives the driver its view of the federation (from_loaders: what the
clients report), switches the message audit on and yields a :class:`Session`. The pattern
then asks its set-up questions (:meth:`Session.ask`), configures the clients
(:meth:`Session.configure`), says the set-up is over (:meth:`Session.ready`: client
locations, set-up time and phases into ``info``) and drives its server
(:meth:`Session.drive`, :func:`fedmcmc.engines.driver.drive`). :meth:`Session.figures` is
what ``result.info`` gets from the session (the transport's message and byte counts, where
the clients ran, the set-up's times, and what the engine's session records: Ray's
authentication, :meth:`~fedmcmc.engines.engine.ProtocolEngine.session_info`). The
transport is closed however the session ends. A client that failed mid-run becomes the one
:class:`~fedmcmc.results.ClientFailureError` of :func:`~fedmcmc.results.client_failure_error`;
:func:`~fedmcmc.results.finish_run` (every engine's) turns a pattern's chain run and info into
its result or its error.

This module knows no family and no pattern: the patterns' servers (``engines/handoff.py``,
``pdmp/broadcast.py``, ``decentralised/distributed.py``, ``baselines/distributed.py``) are
what differs.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from .comm import (Transport, call_all, describe_federation, gather_before_sampling,
                   with_fault_injection)
from .driver import ChainRun, drive
from .options import protocol_run_options
# the one way a run ends, on every engine (here for the patterns' servers)
from ..results import client_failure_error, finish_run

__all__ = ["Session", "protocol_session", "client_failure_error", "finish_run"]


class Session:
    """The endpoints of one message-passing run on their transport (made by
    :func:`protocol_session`).

    Attributes: ``transport``; ``federation`` (the driver's view: with ``from_loaders``
    data, what the clients reported); ``name`` (the algorithm's) and ``label`` (the
    engine's); ``timeout`` (``visit_timeout``) and ``policy`` (``on_client_failure``);
    ``run_options`` (``chunk_size``, ``on_draws``: what :meth:`drive` passes on); ``info``
    (the figures :meth:`figures` adds to the transport's counts)."""

    def __init__(self, transport: Transport, federation, name: str, label: str,
                 options: Dict[str, Any], opened_at: float):
        self.transport = transport
        self.federation = federation
        self.name, self.label = name, label
        self.timeout: Optional[float] = options.get("visit_timeout")
        self.policy: str = options["on_client_failure"]
        self.run_options = protocol_run_options(options)
        self.info: Dict[str, Any] = {"engine": label, "on_client_failure": self.policy,
                                     "visit_timeout": self.timeout}
        self.phases: Dict[str, float] = {"clients_started": time.perf_counter() - opened_at}
        self.setup_started = self._mark = time.perf_counter()

    @property
    def num_clients(self) -> int:
        return self.transport.num_clients

    def phase(self, name: str) -> None:
        """End the set-up phase ``name`` (its seconds since the last phase ended, in
        ``info["setup_phases"]``)."""
        now = time.perf_counter()
        self.phases[name] = now - self._mark
        self._mark = now

    def ask(self, name: str, *args, clients: Optional[Sequence[int]] = None,
            timeout: Any = "visit") -> List[Any]:
        """The clients' (or ``clients``') replies to the set-up question ``name(*args)``, in
        order; a failure is a :class:`ClientFailureError` without a result. ``timeout``:
        seconds, ``None`` (no limit) or ``"visit"`` (default: ``visit_timeout``)."""
        return call_all(self.transport, "setup", name, *args, clients=clients,
                        timeout=self.timeout if timeout == "visit" else timeout)

    def ask_each(self, name: str, args_of: Callable[[int], tuple],
                 clients: Optional[Sequence[int]] = None, timeout: Any = None) -> List[Any]:
        """:meth:`ask` with arguments of their own per client (``args_of(client)``)."""
        clients = list(range(self.num_clients)) if clients is None else list(clients)
        pendings = self.transport.call_each(clients, "setup",
                                            lambda s: (name,) + tuple(args_of(s)))
        return gather_before_sampling(self.transport, pendings,
                                      self.timeout if timeout == "visit" else timeout)

    def configure(self, args_of: Callable[[int], tuple],
                  clients: Optional[Sequence[int]] = None, timeout: Any = None) -> None:
        """Send each client (or each of ``clients``) its configuration ``args_of(client)``
        and wait for every acknowledgement (``timeout`` as for :meth:`ask`; default: no
        limit, the clients compile)."""
        clients = list(range(self.num_clients)) if clients is None else list(clients)
        gather_before_sampling(
            self.transport, self.transport.call_each(clients, "configure", args_of),
            self.timeout if timeout == "visit" else timeout)

    def ready(self) -> None:
        """The set-up is over: where the clients run, how long the set-up took and its
        phases, into :attr:`info`."""
        self.info["client_locations"] = call_all(self.transport, "location")
        self.info["setup_time"] = time.perf_counter() - self.setup_started
        self.info["setup_phases"] = dict(self.phases)

    def drive(self, advance, states, *, chains: int, draw_dim: int, burn_in: int,
              num_samples: int, divergence_threshold: float, progress,
              run_options: Optional[Dict[str, Any]] = None, **keywords) -> ChainRun:
        """:func:`fedmcmc.engines.driver.drive` labelled ``"<name> (<engine>)"``, with the
        session's run options (or ``run_options``)."""
        run_options = self.run_options if run_options is None else run_options
        return drive(advance, states, chains=chains, draw_dim=draw_dim, burn_in=burn_in,
                     num_samples=num_samples, divergence_threshold=divergence_threshold,
                     progress=progress, label=f"{self.name} ({self.label})",
                     **run_options, **keywords)

    def figures(self) -> Dict[str, Any]:
        """What ``result.info`` gets from the session: the transport's message and byte
        counts (``transport_messages``, ``bytes_to_clients``, ...; the audit when on; where
        the clients ran) and :attr:`info`. ``info["messages"]``, the pattern's count on
        every engine, is the pattern's own (:mod:`fedmcmc.messages`)."""
        out = self.transport.info()
        out.update(self.info)
        return out


@contextlib.contextmanager
def protocol_session(engine, specs: Sequence[tuple], federation, model, init, *, name: str,
                     options: Dict[str, Any], fault_point: str) -> Iterator[Session]:
    """Open ``engine``'s transport for ``specs`` (one ``(endpoint class, arguments)`` per
    client) and yield the :class:`Session` on it; close the transport at the end.

    ``options``: the run's checked engine options (``engine.session_options``);
    ``fault_point``: the method the test option ``fault_injection`` makes a client fail in.
    ``engine``: a :class:`~fedmcmc.engines.engine.ProtocolEngine`, whose session
    (``engine.transports()``) stays open while this one is."""
    with engine.transports() as make_transport:
        opened_at = time.perf_counter()
        transport = with_fault_injection(make_transport(specs), options.get("fault_injection"),
                                         fault_point)
        try:
            # from_loaders: each client loaded its rows in its own process; the driver learns
            # their sizes (hence the default f_s) from the clients' descriptions
            described = describe_federation(transport, federation, model, init)
            transport.audit = bool(options.get("audit_messages", False))
            session = Session(transport, described, name, engine.label, options, opened_at)
            session.info.update(engine.session_info())
            yield session
        finally:
            transport.close()
