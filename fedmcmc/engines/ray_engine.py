"""``engine="ray"``: one Ray actor per client.

:func:`ray_session` joins the Ray instance the user started
(``ray.init(address=...)`` before calling ``fm.sample``, or the option
``ray_address``), or starts a local one bound to loopback
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` is set before Ray is imported; without
it Ray replaces 127.0.0.1 by the machine's external address) and shuts down
what it started. Authentication (:mod:`fedmcmc.engines.ray_security`): the
local instance runs with Ray's token authentication and a token generated for
it (in a 0700 temporary directory, removed at shutdown); a cluster that is
joined must have token authentication on every node, else the run is refused
with :class:`~fedmcmc.engines.ray_security.UnauthenticatedClusterError` unless
``allow_unauthenticated_cluster=True``. ``info["ray_authentication"]`` records
which.

:class:`RayTransport` implements :class:`~fedmcmc.engines.comm.Transport` with
one actor per client; the protocols (``handoff.py`` for DSGLD/FSGLD) are the
same as with the in-process transport.

Options of ``fm.sample(..., engine="ray", **options)``:

``ray_address``
    Address of an existing cluster (``"auto"``, ``"ray://host:10001"``,
    ``"127.0.0.1:6379"``); default: the running instance if
    ``ray.is_initialized()``, else a new local instance on loopback.
``visit_timeout``
    Seconds a client may take to answer one message (a visit), counted from
    when it was sent (so it includes waiting behind another chain on the same
    client). Default ``None``: wait for ever (a dead actor is still detected).
``on_client_failure``
    ``"stop"`` (default): raise :class:`~fedmcmc.engines.comm.ClientFailureError`
    carrying a ``Result`` with every draw received; ``"drop"``: continue
    without the client (f_s renormalised; ``info["target_changed"]``).
``client_resources``
    One dict of Ray custom resources per client, e.g.
    ``[{"client_0": 1}, {"client_1": 1}]``, to pin client actors to nodes.
``client_num_cpus``
    CPUs reserved per client actor (default 0: actors share the machine).
``audit_messages``
    Keep the shape and dtype of every array a client sends in
    ``info["client_message_audit"]``.
``ray_init_options``
    Extra keyword arguments of ``ray.init`` when a local instance is started
    (``num_cpus``, ``_temp_dir``, ...).
``allow_unauthenticated_cluster``
    ``False`` (default): refuse a cluster (joined, or ``RAY_AUTH_MODE=disabled``
    for the local one) that runs without token authentication. ``True``: run on
    it anyway; ``info["ray_authentication"]`` then says
    ``"disabled (allowed by user)"``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from .comm import ClientFailure, Pending, Transport
from .ray_security import (  # noqa: F401 - ray_session, LOOPBACK are this module's API
    LOOPBACK,
    UnauthenticatedClusterError,
    import_ray as _import_ray,
    ray_session,
)

__all__ = ["ray_session", "ray_transports", "RayTransport", "UnauthenticatedClusterError"]


class RayTransport(Transport):
    """One Ray actor per client; messages are actor method calls."""

    def __init__(self, specs: Sequence[tuple], *, resources: Optional[Sequence[dict]] = None,
                 num_cpus: float = 0, audit: bool = False):
        super().__init__(len(specs), audit)
        ray = _import_ray()
        self._ray = ray
        if resources is not None and len(resources) != len(specs):
            raise ValueError(
                f"client_resources must have one dict per client ({len(specs)}), got {len(resources)}"
            )
        self.actors = []
        for index, (cls, args) in enumerate(specs):
            options: Dict[str, Any] = {"num_cpus": num_cpus, "max_restarts": 0,
                                       "name": None}
            options.pop("name")
            if resources is not None and resources[index]:
                options["resources"] = dict(resources[index])
            actor_class = ray.remote(cls)
            # the client's data goes to the actor once, at creation (in a real deployment the
            # data would already be there); it is not a protocol message and is not counted
            self.actors.append(actor_class.options(**options).remote(*args))
        self._dead = set()

    def call(self, client: int, method: str, *args, tag: Any = None) -> Pending:
        self.record("to_clients", client, method, args)
        if client in self._dead:
            handle = None
        else:
            handle = getattr(self.actors[client], method).remote(*args)
        return Pending(client, method, handle, tag)

    def relay(self, client: int, method: str, *args, tag: Any = None) -> Pending:
        if client in self._dead:
            return Pending(client, method, None, tag)
        # a Pending argument travels as its object reference: Ray hands the value to this
        # actor from the actor that computed it
        refs = [a.handle if isinstance(a, Pending) else a for a in args]
        return Pending(client, method, getattr(self.actors[client], method).remote(*refs), tag)

    def wait(self, pendings, timeout):
        pendings = list(pendings)
        dead = [p for p in pendings if p.handle is None]
        live = [p for p in pendings if p.handle is not None]
        if dead or not live:
            return dead, live
        by_ref = {p.handle: p for p in live}
        refs = list(by_ref)
        ready, _ = self._ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=0)
        ready_set = set(ready)
        return [by_ref[r] for r in ready], [by_ref[r] for r in refs if r not in ready_set]

    def result(self, pending: Pending) -> Any:
        ray = self._ray
        if pending.handle is None:
            raise ClientFailure(pending.client, "actor already dead")
        try:
            value = ray.get(pending.handle, timeout=60)
        except ray.exceptions.RayActorError as error:
            raise ClientFailure(pending.client, f"actor died ({type(error).__name__})") from None
        except ray.exceptions.RayError as error:
            raise ClientFailure(pending.client, f"{type(error).__name__}: {error}") from None
        self.record("from_clients", pending.client, pending.method, value)
        return value

    def alive(self, client: int) -> bool:
        return client not in self._dead

    def kill(self, client: int) -> None:
        self._dead.add(client)
        try:
            self._ray.kill(self.actors[client], no_restart=True)
        except Exception:  # already gone
            pass

    def close(self) -> None:
        for client in range(len(self.actors)):
            if client not in self._dead:
                self.kill(client)
        self.actors = []


@contextlib.contextmanager
def ray_transports(options: Dict[str, Any]) -> Iterator[Callable[[Sequence[tuple]], RayTransport]]:
    """The Ray session of one run (:func:`ray_session` with the engine options
    ``ray_address``, ``ray_init_options``, ``allow_unauthenticated_cluster``) and, inside it,
    the ``make_transport(specs)`` a pattern's driver takes: a :class:`RayTransport` with one
    actor per client, placed by ``client_resources``, reserving ``client_num_cpus`` each."""
    with ray_session(options.get("ray_address"), options.get("ray_init_options"),
                     options.get("allow_unauthenticated_cluster", False)):
        yield lambda specs: RayTransport(specs, resources=options.get("client_resources"),
                                         num_cpus=options.get("client_num_cpus", 0))
