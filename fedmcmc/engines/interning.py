"""Run-wide objects sent to client processes once per content, not once per run.

A client endpoint is built in its own process from the arguments the driver sends: its
data, and objects every client of the run shares (the model, the initial parameters, the
protocol or the family's client functions). JAX caches a traced program by the identity
(or the equality) of the Python objects it closes over or takes as static arguments, and
an object unpickled again is a new object: an actor that hosts the next run's clients
(``reuse_actors``) would trace every program again, although the model and the protocol
are the same as the last run's.

:class:`Interned` wraps such an argument on the driver. It pickles as the object's own
pickled bytes; a process that unpickles bytes it has already unpickled gets back the
object it built then (:func:`resolve`), so the programs traced for it are found in JAX's
caches. Equal bytes are the only test: an object whose pickle differs (another step size,
another model function, other initial values) is a new object, traced anew.

Sharing an object between runs is safe for the same reason that sharing it between the
clients of one actor is (``clients_per_actor``): the client-side objects hold no state of
a client or a run; what a client keeps between messages lives in its own
``ClientContext.store``. An endpoint class names the constructor arguments that are
run-wide in :attr:`~fedmcmc.engines.comm.ClientEndpoint.RUN_WIDE_ARGUMENTS`.
"""

from __future__ import annotations

import hashlib
import pickle
import sys
import threading
from collections import OrderedDict
from typing import Any, Dict, Sequence, Tuple

__all__ = ["Interned", "resolve", "intern_arguments", "interned_count", "MAX_INTERNED"]

#: how many objects a process keeps (the most recently received ones): a reused actor
#: serves one run at a time, and a run sends a handful
MAX_INTERNED = 16

_INTERNED: "OrderedDict[str, Any]" = OrderedDict()
_LOCK = threading.Lock()


def _dumps(value: Any) -> bytes:
    """``value`` pickled as Ray would pickle it: with Ray's own cloudpickle when Ray is
    loaded (what a user registers with ``ray.cloudpickle.register_pickle_by_value`` is then
    pickled by value here too), else cloudpickle, else pickle."""
    if "ray" in sys.modules:
        from ray import cloudpickle
    else:
        try:
            import cloudpickle
        except ImportError:  # pragma: no cover - cloudpickle comes with ray
            return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


class Interned:
    """``value``, pickled as its own bytes and unpickled by :func:`resolve`.

    The bytes are made once per wrapper (the first time it is pickled), so one run's clients
    share the driver's pickling work as they share the object. ``Interned(x)`` unpickles to
    ``x``'s copy itself, not to a wrapper: the endpoint receives the object as before.
    """

    __slots__ = ("value", "_payload")

    def __init__(self, value: Any):
        self.value = value
        self._payload: Tuple[str, bytes] | None = None

    def payload(self) -> Tuple[str, bytes]:
        """``(digest, bytes)`` of the value (SHA-256 of its pickle)."""
        if self._payload is None:
            data = _dumps(self.value)
            self._payload = (hashlib.sha256(data).hexdigest(), data)
        return self._payload

    def __reduce__(self):
        return resolve, self.payload()


def resolve(digest: str, data: bytes) -> Any:
    """The object ``data`` pickles: the one this process built from the same bytes before,
    if it still keeps it (the last :data:`MAX_INTERNED`), else a new one, then kept."""
    with _LOCK:
        if digest in _INTERNED:
            _INTERNED.move_to_end(digest)
            return _INTERNED[digest]
    if hashlib.sha256(data).hexdigest() != digest:  # a corrupted message is no cache key
        raise ValueError("interned object: the digest does not match its bytes")
    value = pickle.loads(data)
    with _LOCK:
        value = _INTERNED.setdefault(digest, value)  # another thread may have built it
        _INTERNED.move_to_end(digest)
        while len(_INTERNED) > MAX_INTERNED:
            _INTERNED.popitem(last=False)
    return value


def interned_count() -> int:
    """How many objects this process keeps (tests)."""
    with _LOCK:
        return len(_INTERNED)


def intern_arguments(specs: Sequence[tuple]) -> list:
    """``specs`` (``(endpoint_class, args)`` per client) with each class's
    ``RUN_WIDE_ARGUMENTS`` wrapped in :class:`Interned`; an object given to several clients
    gets one wrapper, so it is pickled once. An object cloudpickle cannot pickle (one that
    only a serializer registered with Ray handles) is left as it is, for Ray to send."""
    wrappers: Dict[int, Any] = {}
    out = []
    for cls, args in specs:
        positions = getattr(cls, "RUN_WIDE_ARGUMENTS", ())
        if not positions:
            out.append((cls, args))
            continue
        args = list(args)
        for position in positions:
            if position < len(args) and args[position] is not None:
                value = args[position]
                if id(value) not in wrappers:
                    wrapper = Interned(value)
                    try:
                        wrapper.payload()
                    except Exception:  # noqa: BLE001 - Ray's own serialization decides
                        wrapper = value
                    wrappers[id(value)] = wrapper
                args[position] = wrappers[id(value)]
        out.append((cls, tuple(args)))
    return out
