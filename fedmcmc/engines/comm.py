"""The communication interface the distributed protocols are written against.

A protocol (the server side of an algorithm: the hand-off scheduler of
DSGLD/FSGLD, ...) talks to *client endpoints* only through a
:class:`Transport`:

* ``transport.call(client, method, *args) -> Pending`` sends one message (a
  method call with its arguments) to client ``client``;
* ``transport.wait(pendings, timeout) -> (ready, not_ready)`` waits for replies;
* ``transport.result(pending)`` returns the reply (or raises
  :class:`ClientFailure` when the client died or failed).

Every message in both directions goes through :meth:`Transport.record`, which
counts messages and bytes per direction and, with ``audit=True``, keeps the
shape and dtype of every array a client sent (the test of "no raw data leaves
a client" reads that log). Two implementations: :class:`InProcessTransport`
(client objects in this process, calls run synchronously -- the reference the
benchmark compares against) and ``ray_engine.RayTransport`` (client endpoints in Ray
actors).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from .. import cache
from ..federation import ClientDescription, DescribedFederation, Federation, describe_client, load_client
# the error a client's failure stops a run with is the results' (every engine and family
# raises it through fedmcmc.results.finish_run); imported here under its old address
from ..results import ClientFailureError

__all__ = [
    "ClientFailure",
    "ClientFailureError",
    "Pending",
    "Transport",
    "InProcessTransport",
    "payload_arrays",
    "client_location",
    "ClientEndpoint",
    "describe_federation",
    "call_all",
    "collect",
    "gather",
    "gather_before_sampling",
    "FaultInjectingTransport",
    "with_fault_injection",
]


class ClientFailure(Exception):
    """A client endpoint died, raised, or did not answer within the timeout."""

    def __init__(self, client: int, reason: str):
        super().__init__(f"client {client}: {reason}")
        self.client = int(client)
        self.reason = reason


def client_location(index: int) -> Dict[str, Any]:
    """Where a client endpoint runs: host name, process id and, on Ray, the node id."""
    where = {"client": int(index), "host": socket.gethostname(), "pid": os.getpid()}
    # a process that has not imported Ray is not in a Ray instance: importing it here would
    # cost every in-process hand-off run about 0.4 s for nothing
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        where["node_id"] = ray.get_runtime_context().get_node_id()
    return where


def payload_arrays(payload: Any) -> List[np.ndarray]:
    """The arrays of a message (every leaf of the pytree that is an array)."""
    arrays = []
    for leaf in jax.tree_util.tree_leaves(payload):
        if isinstance(leaf, (np.ndarray, jax.Array)) or np.ndim(leaf) > 0:
            arrays.append(np.asarray(leaf))
    return arrays


def payload_size(payload: Any) -> Tuple[int, int]:
    """(bytes, floats) of a message: arrays by their buffers, Python scalars 8 bytes each."""
    nbytes = 0
    floats = 0
    for leaf in jax.tree_util.tree_leaves(payload):
        if isinstance(leaf, (np.ndarray, jax.Array)) or np.ndim(leaf) > 0:
            array = np.asarray(leaf)
            nbytes += array.nbytes
            floats += array.size
        elif isinstance(leaf, (int, float, bool, np.generic)):
            nbytes += 8
            floats += 1
    return nbytes, floats


class Pending:
    """A message sent to a client whose reply has not been read yet."""

    __slots__ = ("client", "method", "handle", "sent_at", "tag")

    def __init__(self, client: int, method: str, handle: Any, tag: Any = None):
        self.client = client
        self.method = method
        self.handle = handle
        self.sent_at = time.perf_counter()
        self.tag = tag


class Transport:
    """Counts and (optionally) audits messages; subclasses deliver them."""

    def __init__(self, num_clients: int, audit: bool = False):
        self.num_clients = int(num_clients)
        self.audit = bool(audit)
        self.counts = {"to_clients": 0, "from_clients": 0}
        self.bytes = {"to_clients": 0, "from_clients": 0}
        self.floats = {"to_clients": 0, "from_clients": 0}
        #: with ``audit``: one entry per message a client sent:
        #: ``(client, method, [(shape, dtype), ...])``
        self.sent_by_clients: List[tuple] = []

    # -- accounting
    def record(self, direction: str, client: int, method: str, payload: Any) -> None:
        nbytes, floats = payload_size(payload)
        self.counts[direction] += 1
        self.bytes[direction] += nbytes
        self.floats[direction] += floats
        if self.audit and direction == "from_clients":
            self.sent_by_clients.append(
                (
                    int(client),
                    method,
                    [(tuple(a.shape), str(a.dtype)) for a in payload_arrays(payload)],
                )
            )

    def info(self) -> Dict[str, Any]:
        out = {
            "messages_to_clients": self.counts["to_clients"],
            "messages_from_clients": self.counts["from_clients"],
            "bytes_to_clients": self.bytes["to_clients"],
            "bytes_from_clients": self.bytes["from_clients"],
            # what was really sent (chains batched, control traffic included); the pattern's
            # count, the same on every engine, is info["messages"] (fedmcmc/messages.py)
            "transport_messages": self.counts["to_clients"] + self.counts["from_clients"],
            "floats_communicated": self.floats["to_clients"] + self.floats["from_clients"],
        }
        if self.audit:
            out["client_message_audit"] = [
                [c, m, [[list(s), d] for s, d in arrays]] for c, m, arrays in self.sent_by_clients
            ]
        out.update(self.placement())
        return out

    def placement(self) -> Dict[str, Any]:
        """Where the client endpoints run, for ``Result.info`` (the Ray transport: the
        clients of each actor); empty here."""
        return {}

    # -- delivery (subclasses)
    def call(self, client: int, method: str, *args, tag: Any = None) -> Pending:
        raise NotImplementedError

    def wait(self, pendings: Sequence[Pending], timeout: Optional[float]) -> Tuple[list, list]:
        raise NotImplementedError

    def result(self, pending: Pending) -> Any:
        raise NotImplementedError

    def wait_every(self, pendings: Sequence[Pending],
                   timeout: Optional[float]) -> Tuple[list, list]:
        """Like :meth:`wait`, for a caller that needs every reply (:func:`collect`): it may
        return only once all are ready or ``timeout`` has passed. The default is
        :meth:`wait` (the caller then waits again for the rest); a transport for which a
        wake-up per reply is costly overrides it (the Ray transport: one ``ray.wait``)."""
        return self.wait(pendings, timeout)

    def call_each(self, clients: Sequence[int], method: str,
                  args_of: Callable[[int], tuple]) -> List[Pending]:
        """:meth:`call` ``method(*args_of(client))`` of every client of ``clients``: one
        message each, counted as such. A transport may deliver the messages of clients that
        share a process together (the Ray transport: one actor call per actor)."""
        return [self.call(client, method, *args_of(client)) for client in clients]

    def relay(self, client: int, method: str, *args, tag: Any = None) -> Pending:
        """Like :meth:`call`, but arguments may be other calls' :class:`Pending` replies,
        which go to ``client`` from the client that computed them (on Ray, actor to actor,
        never through this process). Not counted: what moves between clients is the
        caller's to account (the neighbour exchange of DULA/GT-DULA counts one message per
        directed edge); the reply, once read with :meth:`result`, is."""
        raise NotImplementedError

    def alive(self, client: int) -> bool:
        return True

    def kill(self, client: int) -> None:  # pragma: no cover - optional
        pass

    def close(self) -> None:
        pass


class InProcessTransport(Transport):
    """Client objects living in this process; a call runs synchronously when sent.

    Messages are counted exactly as on Ray, so the two transports can be
    compared message for message; the reply is computed at ``call`` time.
    """

    def __init__(self, clients: Sequence[Any], audit: bool = False):
        super().__init__(len(clients), audit)
        self.clients = list(clients)

    def call(self, client: int, method: str, *args, tag: Any = None) -> Pending:
        self.record("to_clients", client, method, args)
        return self.relay(client, method, *args, tag=tag)

    def relay(self, client: int, method: str, *args, tag: Any = None) -> Pending:
        try:
            values = [self._value(a) if isinstance(a, Pending) else a for a in args]
            handle = ("ok", getattr(self.clients[client], method)(*values))
        except Exception as error:  # a failing client (or a failed argument), as on Ray
            handle = ("error", error)
        return Pending(client, method, handle, tag)

    @staticmethod
    def _value(pending: Pending):
        status, value = pending.handle
        if status == "error":
            raise RuntimeError(f"client {pending.client}'s {pending.method!r} failed: {value}")
        return value

    def wait(self, pendings, timeout):
        return list(pendings), []

    def result(self, pending: Pending) -> Any:
        status, value = pending.handle
        if status == "error":
            raise ClientFailure(pending.client, f"{type(value).__name__}: {value}")
        self.record("from_clients", pending.client, pending.method, value)
        return value


@contextlib.contextmanager
def _first_on_node_in_a_slot(first_on_node):
    """``first_on_node``, then one of the machine's places (:func:`fedmcmc.cache.node_slot`):
    a client waiting for the first to compile holds no place, so the first always gets one."""
    with first_on_node as first, cache.node_slot():
        yield first


class ClientEndpoint:
    """The part every protocol's client endpoint shares: it holds its own data.

    ``source`` is the client's data, or its loader (``Federation.from_loaders``), called
    here, in the client's own process (a Ray actor on the Ray engine), and validated here;
    the server learns only what :meth:`describe` reports (the size and the shapes of one
    example). Subclasses (one per protocol) add the messages of their protocol.
    """

    def __init__(self, index: int, source: Any):
        self.index = int(index)
        self.data = load_client(source, self.index)
        self.size = int(np.shape(jax.tree_util.tree_leaves(self.data)[0])[0])
        self._compiled_once: set = set()

    def compiling_once(self, what: Any, *program_parts: Any):
        """A context for a message that compiles programs (a set-up step, ``configure``):
        the first client of this machine with the same ``program_parts`` (the protocol, the
        model, ...) and the same row shapes runs it alone, the others wait and then read its
        programs from the compilation cache (:func:`fedmcmc.cache.first_on_node`), instead of
        all compiling the same programs at once; and it runs in one of the machine's places
        (:func:`fedmcmc.cache.node_slot`, one per CPU), so that thirty client processes on two
        cores take turns instead of taking the cores from each other. ``what`` names the
        step; once a step has run here, it runs without looking again."""
        if what in self._compiled_once:
            return contextlib.nullcontext(False)
        self._compiled_once.add(what)
        layout = describe_client(self.data)
        return _first_on_node_in_a_slot(
            cache.first_on_node(type(self).__name__, what, layout, *program_parts))

    def ping(self) -> int:
        return self.index

    def location(self) -> Dict[str, Any]:
        """Where this client runs: host name, process id and, on Ray, the node id."""
        return client_location(self.index)

    def describe(self) -> ClientDescription:
        """Its number of rows and the shapes/dtypes of one example (zeros): no data."""
        return describe_client(self.data)


def collect(transport: "Transport", pendings: Sequence[Pending],
            timeout: Optional[float]) -> Tuple[List[Any], List[Tuple[Pending, str]]]:
    """Wait for the replies of ``pendings`` (``timeout`` seconds in all, ``None``: no limit)
    and read each as it arrives. Returns ``(values, failures)``: the replies in the order of
    ``pendings`` (``None`` for a failed one) and ``(pending, reason)`` for every call whose
    client failed or did not answer in time. The one wait loop of the engines: the caller
    decides what a failure means (stop, drop the client, a set-up error)."""
    values: Dict[int, Any] = {}
    failures: List[Tuple[Pending, str]] = []
    waiting = list(pendings)
    deadline = None if timeout is None else time.perf_counter() + timeout
    while waiting:
        left = None if deadline is None else max(0.0, deadline - time.perf_counter())
        ready, waiting = transport.wait_every(waiting, left)
        if not ready:
            failures += [(pending, f"no answer to {pending.method!r} within "
                                   f"visit_timeout={timeout:g} s") for pending in waiting]
            break
        for pending in ready:
            try:
                values[id(pending)] = transport.result(pending)
            except ClientFailure as failure:
                failures.append((pending, failure.reason))
    return [values.get(id(pending)) for pending in pendings], failures


def gather(transport: "Transport", pendings: Sequence[Pending],
           timeout: Optional[float]) -> List[Any]:
    """:func:`collect` where any failure is fatal: the replies in order, or
    :class:`ClientFailure` naming the (first) client that failed or did not answer."""
    values, failures = collect(transport, pendings, timeout)
    if failures:
        pending, reason = failures[0]
        raise ClientFailure(pending.client, reason)
    return values


def gather_before_sampling(transport: "Transport", pendings: Sequence[Pending],
                           timeout: Optional[float]) -> List[Any]:
    """:func:`gather` during set-up: a failure is a :class:`ClientFailureError` without a
    result (nothing was sampled yet) that names the message."""
    try:
        return gather(transport, pendings, timeout)
    except ClientFailure as failure:
        method = next((p.method for p in pendings if p.client == failure.client), "set-up")
        raise ClientFailureError(
            f"client {failure.client} failed during {method!r} before sampling started: "
            f"{failure.reason}", None, failure.client, failure.reason) from None


def call_all(transport: "Transport", method: str, *args, clients: Optional[Sequence[int]] = None,
             timeout: Optional[float] = None) -> List[Any]:
    """Send ``method(*args)`` to every client (or ``clients``) and return the replies in
    order; a client that fails or does not answer within ``timeout`` raises
    :class:`ClientFailureError` (no result: nothing was sampled yet)."""
    clients = list(range(transport.num_clients)) if clients is None else list(clients)
    return gather_before_sampling(
        transport, transport.call_each(clients, method, lambda client: args), timeout)


def describe_federation(transport: "Transport", federation: Federation, model, init):
    """The driver's view of ``federation`` once its endpoints exist: itself when the driver
    holds the data, else (``from_loaders`` on Ray) a :class:`DescribedFederation` built from
    what each client reports, with ``init`` checked against the reported example shapes."""
    if not federation.is_deferred:
        return federation
    described = DescribedFederation(federation, call_all(transport, "describe"))
    model.check_params(init, described.example(), argument="init")
    return described


class FaultInjectingTransport(Transport):
    """A transport that makes one client fail on purpose, for the tests of failure handling.

    Wraps any transport (in-process or Ray) and leaves it untouched except for ``client``'s
    calls of ``method``: the first ``after`` are delivered; from the next one on,
    ``kind="exit"`` kills the client (``transport.kill``: on Ray its process ends, as in a
    crash) and the call fails with "actor died", and ``kind="hang"`` never answers (the call
    is reported not ready for ``seconds``, then fails). The engines' failure handling (stop or
    drop, per-visit timeouts) sees exactly what a crashed or stuck client would give it, and
    the client classes carry no test code.

    ``fault`` is the engine option ``fault_injection``: ``{"client": s, "after_visits": k,
    "kind": "exit" | "hang"[, "seconds": t]}``.
    """

    def __init__(self, inner: Transport, fault: Dict[str, Any], method: str):
        # no Transport.__init__: the accounting is the inner transport's
        self.inner = inner
        self.client = int(fault["client"])
        self.after = int(fault.get("after_visits", 0))
        self.kind = str(fault.get("kind", "exit"))
        if self.kind not in ("exit", "hang"):
            raise ValueError(f"fault_injection kind must be 'exit' or 'hang', got {self.kind!r}")
        self.seconds = float(fault.get("seconds", 3600.0))
        self.method = method
        self.calls = 0

    # accounting and attributes are the inner transport's
    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def audit(self):
        return self.inner.audit

    @audit.setter
    def audit(self, value):
        self.inner.audit = value

    @property
    def num_clients(self):
        return self.inner.num_clients

    def info(self) -> Dict[str, Any]:
        return self.inner.info()

    def placement(self) -> Dict[str, Any]:
        return self.inner.placement()

    def record(self, direction: str, client: int, method: str, payload: Any) -> None:
        self.inner.record(direction, client, method, payload)

    def _fault_of(self, client: int, method: str, tag: Any) -> Optional[Pending]:
        """The failed call that replaces this one, or None to deliver it."""
        if client != self.client or method != self.method:
            return None
        self.calls += 1
        if self.calls <= self.after:
            return None
        if self.kind == "exit":
            self.inner.kill(client)
            return Pending(client, method, _InjectedFault(
                "actor died (fault injection: the client's process ended)"), tag)
        return Pending(client, method, _InjectedFault(
            f"hung for {self.seconds:g} s (fault injection)", self.seconds), tag)

    def call(self, client: int, method: str, *args, tag: Any = None) -> Pending:
        fault = self._fault_of(client, method, tag)
        if fault is not None:
            self.inner.record("to_clients", client, method, args)
            return fault
        return self.inner.call(client, method, *args, tag=tag)

    def call_each(self, clients, method, args_of):
        clients = list(clients)
        if self.client not in clients:
            return self.inner.call_each(clients, method, args_of)
        others = [client for client in clients if client != self.client]
        delivered = dict(zip(others, self.inner.call_each(others, method, args_of)))
        delivered[self.client] = self.call(self.client, method, *args_of(self.client))
        return [delivered[client] for client in clients]

    def wait(self, pendings, timeout):
        pendings = list(pendings)
        injected = [p for p in pendings if isinstance(p.handle, _InjectedFault)]
        others = [p for p in pendings if not isinstance(p.handle, _InjectedFault)]
        now = time.perf_counter()
        due = [p for p in injected if p.handle.ready_at(p.sent_at) <= now]
        hung = [p for p in injected if p not in due]
        if due:
            return due, others + hung
        if others:
            ready, waiting = self.inner.wait(others, timeout)
            return ready, waiting + hung
        # only hung calls: nothing answers before the timeout (or before they fail)
        first = min(p.handle.ready_at(p.sent_at) for p in hung)
        pause = first - now if timeout is None else min(timeout, first - now)
        time.sleep(max(0.0, pause))
        return self.wait(hung, 0.0) if time.perf_counter() >= first else ([], hung)

    def result(self, pending: Pending) -> Any:
        if isinstance(pending.handle, _InjectedFault):
            raise ClientFailure(pending.client, pending.handle.reason)
        return self.inner.result(pending)

    def relay(self, client: int, method: str, *args, tag: Any = None) -> Pending:
        fault = self._fault_of(client, method, tag)
        if fault is not None:
            return fault
        # an argument that is an injected failure fails this call too: it reports the client
        # whose failure it is, as the root cause
        failed = [a for a in args if isinstance(a, Pending) and isinstance(a.handle, _InjectedFault)]
        if failed:
            return Pending(failed[0].client, method, failed[0].handle, tag)
        return self.inner.relay(client, method, *args, tag=tag)

    def alive(self, client: int) -> bool:
        return self.inner.alive(client)

    def kill(self, client: int) -> None:
        self.inner.kill(client)

    def close(self) -> None:
        self.inner.close()


class _InjectedFault:
    """The handle of a call :class:`FaultInjectingTransport` made fail."""

    __slots__ = ("reason", "delay")

    def __init__(self, reason: str, delay: float = 0.0):
        self.reason, self.delay = reason, float(delay)

    def ready_at(self, sent_at: float) -> float:
        return sent_at + self.delay


def with_fault_injection(transport: Transport, fault: Optional[Dict[str, Any]],
                         method: str) -> Transport:
    """``transport`` wrapped in :class:`FaultInjectingTransport` when the engine option
    ``fault_injection`` is set (tests only), else ``transport`` itself."""
    return FaultInjectingTransport(transport, fault, method) if fault else transport
