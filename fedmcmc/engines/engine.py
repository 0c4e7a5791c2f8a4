"""The engine objects :func:`fedmcmc.sample` runs an algorithm on.

``fm.sample`` picks the engine; the algorithm never sees an engine's name. An algorithm
exports what each kind of engine needs:

* ``sample_local(model, federation, **run)``: its in-process run (every client simulated in
  this process, the chains in one compiled program). :class:`LocalEngine` calls it.
* ``sample_distributed(model, federation, engine, **run)`` (only algorithms whose
  ``message_passing`` is true): its client endpoints and its server, run by a
  :class:`ProtocolEngine`, which supplies the transport the endpoints live on
  (:meth:`ProtocolEngine.transports`: ``make_transport(specs) -> Transport``), the options
  every message-passing run honours (failures, time limits, message audit) and the label
  ``info["engine"]`` shows.

A new engine is one object: a :class:`ProtocolEngine` subclass whose
:meth:`~ProtocolEngine.transports` opens its session (starts or joins its processes) and
yields ``make_transport(specs)``, each spec ``(endpoint class, constructor arguments)`` of one
client (:class:`fedmcmc.engines.ray_engine.RayEngine` is one; :class:`InProcessEngine` keeps
the endpoints as objects in this process, message for message as on Ray).

The strings ``engine="local"`` and ``engine="ray"`` are shorthands for ``LocalEngine()`` and
``RayEngine(...)`` (``fedmcmc.api.resolve_engine``, which maps the keyword options
``fm.sample`` accepted before the engine objects onto the engine's constructor).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, Optional, Sequence

from ..algorithm import check_positive_float
from .comm import InProcessTransport, Transport
from .options import ENGINE_OPTIONS, check_engine_options

__all__ = ["Engine", "LocalEngine", "ProtocolEngine", "InProcessEngine", "PATTERNS"]


#: The communication patterns of the message-passing runs, by the name an algorithm declares
#: (``Algorithm.message_pattern``), each with the messages it needs: what an engine that does
#: not carry the pattern (``ProtocolEngine.patterns``) quotes when it refuses the algorithm.
PATTERNS = {
    "handoff": "one message per visit of a chain to a client (local_steps iterations each)",
    "broadcast": "a broadcast-and-gather round with the clients per round of local steps",
    "event_rounds": "a broadcast-and-gather round with every worker per event",
    "neighbour_exchange": "a neighbour exchange between agents every iteration",
}


class Engine:
    """Where the clients of a run live. ``label``: what ``result.info["engine"]`` and the
    messages call it."""

    label: str = "engine"
    #: whether a :meth:`fedmcmc.Federation.from_loaders` federation's loaders run in the
    #: clients' processes (else ``fm.sample`` calls them here first)
    loads_on_clients: bool = False
    #: ``fm.sample``'s keyword engine options whose constructor argument has another name
    #: (``ray_address`` is :class:`RayEngine`'s ``address``); the others keep their names
    renamed_options: Dict[str, str] = {}

    def offered_by(self, algorithm) -> bool:
        """Whether ``algorithm`` exports what this engine runs."""
        raise NotImplementedError

    def refusal(self, algorithm) -> Optional[ValueError]:
        """The error ``fm.sample`` raises before anything starts when this engine could run
        ``algorithm`` but will not (a message pattern it does not carry); ``None``: none."""
        return None

    def sample(self, algorithm, model, federation, **run):
        """Run ``algorithm`` (``run``: ``init``, ``num_samples``, ``burn_in``, ``thin``,
        ``chains``, ``seed``, ``progress`` and the algorithm's options)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class LocalEngine(Engine):
    """Every client simulated in this process (the default engine): the algorithm's
    ``sample_local``, its chains in one compiled program."""

    label = "local"

    def offered_by(self, algorithm) -> bool:
        return callable(getattr(algorithm, "sample_local", None))

    def sample(self, algorithm, model, federation, **run):
        return algorithm.sample_local(model, federation, **run)


class ProtocolEngine(Engine):
    """An engine whose clients are endpoints that answer messages (the algorithm's
    ``sample_distributed``). Subclasses provide :meth:`transports`.

    Parameters
    ----------
    visit_timeout:
        Seconds a client may take to answer one message, counted from when it was sent;
        ``None`` (default): no limit (a dead client is still detected).
    on_client_failure:
        ``"stop"`` (default): raise :class:`~fedmcmc.engines.comm.ClientFailureError`
        carrying a ``Result`` with every draw received; ``"drop"``: continue without the
        client where the algorithm can (``info["target_changed"]``).
    audit_messages:
        Keep the shape and dtype of every array a client sends in
        ``info["client_message_audit"]``.
    fault_injection:
        Testing only: ``{"client": s, "after_visits": k, "kind": "exit" | "hang"[,
        "seconds": t]}`` makes client s fail during its (k+1)-th message.
    """

    def __init__(self, *, visit_timeout: Optional[float] = None,
                 on_client_failure: str = "stop", audit_messages: bool = False,
                 fault_injection: Optional[Dict[str, Any]] = None):
        if on_client_failure not in ("stop", "drop"):
            raise ValueError(
                f"on_client_failure must be 'stop' or 'drop', got {on_client_failure!r}")
        self.visit_timeout = (None if visit_timeout is None
                              else check_positive_float(visit_timeout, "visit_timeout"))
        self.on_client_failure = on_client_failure
        self.audit_messages = bool(audit_messages)
        if fault_injection is not None and not isinstance(fault_injection, dict):
            raise ValueError(f"fault_injection must be a dict, got {fault_injection!r}")
        self.fault_injection = fault_injection

    #: the communication patterns (:data:`PATTERNS`) this engine carries; ``None``: every
    #: one. An algorithm whose ``message_pattern`` is not among them is refused
    #: (:meth:`refusal`); one that declares none runs.
    patterns: Optional[frozenset] = None

    def carries(self, algorithm) -> bool:
        """Whether this engine carries ``algorithm``'s ``message_pattern``."""
        pattern = getattr(algorithm, "message_pattern", None)
        return self.patterns is None or pattern is None or pattern in self.patterns

    def offered_by(self, algorithm) -> bool:
        return bool(getattr(algorithm, "message_passing", False)) and self.carries(algorithm)

    def refusal(self, algorithm) -> Optional[ValueError]:
        if not getattr(algorithm, "message_passing", False) or self.carries(algorithm):
            return None
        return self.pattern_refusal(type(algorithm).__name__,
                                    PATTERNS.get(algorithm.message_pattern,
                                                 algorithm.message_pattern))

    def pattern_refusal(self, name: str, needs: str) -> ValueError:
        """The error refusing algorithm ``name``, which needs ``needs`` (a
        :data:`PATTERNS` description) that this engine does not carry."""
        return ValueError(f"engine={self.label!r} is not available for {name}: it needs "
                          f"{needs}, which this engine does not carry")

    def sample(self, algorithm, model, federation, **run):
        return algorithm.sample_distributed(model, federation, self, **run)

    def engine_options(self) -> Dict[str, Any]:
        """This engine's settings as the option dict of ``fedmcmc.engines.options`` (only
        those set: an unset one keeps the pattern's default)."""
        out = {"on_client_failure": self.on_client_failure}
        if self.visit_timeout is not None:
            out["visit_timeout"] = self.visit_timeout
        if self.audit_messages:
            out["audit_messages"] = True
        if self.fault_injection is not None:
            out["fault_injection"] = self.fault_injection
        return out

    def session_options(self, run_options: Dict[str, Any], name: str) -> Dict[str, Any]:
        """The checked options of one run: this engine's (:meth:`engine_options`) and the run
        options a message-passing run honours (``chunk_size``, ``on_draws``; ``ValueError``
        naming any other option of ``run_options``, or a resume option)."""
        given = sorted(set(run_options) & set(ENGINE_OPTIONS))
        if given:
            raise ValueError(
                f"{given[0]} is an engine option: give it to the engine object "
                f"({type(self).__name__}(...)), not to the algorithm's run")
        return check_engine_options(dict(run_options, **self.engine_options()), name,
                                    self.label)

    @contextlib.contextmanager
    def transports(self) -> Iterator[Callable[[Sequence[tuple]], Transport]]:
        """The session of one run: yields ``make_transport(specs)`` (one spec
        ``(endpoint class, constructor arguments)`` per client), valid until the session
        closes."""
        raise NotImplementedError
        yield  # pragma: no cover

    def session_info(self) -> Dict[str, Any]:
        """What the open session adds to ``result.info`` (Ray: its authentication);
        called inside :meth:`transports`."""
        return {}

    def __repr__(self) -> str:
        set_ = {k: v for k, v in vars(self).items() if v not in (None, False)
                and not k.startswith("_")}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in set_.items())})"


class InProcessEngine(ProtocolEngine):
    """A message-passing run with the client endpoints as objects in this process
    (:class:`~fedmcmc.engines.comm.InProcessTransport`), message for message as on a
    distributed engine: what tests and a protocol's first run use (no processes to start).
    ``info["engine"]`` is ``"local"``."""

    label = "local"

    @contextlib.contextmanager
    def transports(self):
        yield lambda specs: InProcessTransport([cls(*args) for cls, args in specs])
