"""``engine="ray"``: client endpoints in Ray actors (packed when clients outnumber CPUs).

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
client endpoints hosted by Ray actors (:class:`ClientHost`); the protocols
(``handoff.py`` for DSGLD/FSGLD) are the same as with the in-process transport.
Each client endpoint holds its own data and answers its own messages; an actor
may host several endpoints (``clients_per_actor``), which then share its process:
its JAX import, its compiled programs (clients of the same shapes compile once)
and its fate (a crashed actor fails all of its clients; its clients' messages
are answered one after the other).

The engine is :class:`RayEngine` (``fm.RayEngine``); ``fm.sample(..., engine="ray",
**options)`` builds one from the options below (``ray_address`` is its ``address``,
``ray_init_options`` its ``init_options``, the others keep their names):

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
    CPUs reserved per client (default 0: actors share the machine); an actor
    hosting k clients reserves k times this.
``clients_per_actor``
    How many client endpoints one actor hosts. Default (unset, the same as ``"auto"``): as
    many actors as the cluster has CPUs (``ray.cluster_resources()["CPU"]``), clients spread
    over them in contiguous blocks, so one actor per client when there are no more clients
    than CPUs, and clients packed when there are more (on one machine, 30 clients in 30
    processes would each import JAX and compile the same programs while contending for the
    same cores); with ``client_resources``, one actor per client. An integer k: at most k per
    actor (``clients_per_actor=1``: one actor per client). With ``client_resources``, only
    clients whose resource dicts are equal share an actor. ``info["ray_actors"]`` lists the
    clients of each actor. Left at its default, with more than 4 actors per CPU (only
    possible with ``client_resources``), the run warns (:class:`PlacementWarning`);
    ``clients_per_actor=1`` keeps one actor per client without the warning.
``reuse_actors``
    ``True`` (default): on a Ray instance that was running before the run (and so
    outlives it), the run's actors are kept idle at its end, their clients' data
    dropped, and the next run's clients with the same reservations
    (``client_num_cpus``, ``client_resources``) are hosted by them: no new process
    importing JAX and compiling (``info["ray_actors_reused"]`` counts them). An actor
    whose client failed or that is still busy is ended; a run that starts new actors
    first ends the idle ones it did not take that reserve CPUs or resources. Idle actors
    keep what they reserve; :func:`release_idle_actors` ends them, as do
    ``ray.shutdown()`` and the end of the driver process. A local instance the run
    starts ends with it: nothing is kept. ``False``: every run starts and ends its own
    actors.
``direct_channel``
    Default (unset): on. On: the driver's
    messages to the clients (a Fed-PDMC event round, a baseline's round, a hand-off visit,
    set-up questions) travel through one TCP connection per actor
    (:mod:`fedmcmc.engines.channel`) instead of Ray actor calls, which cost Ray about a
    millisecond of CPU each (docs/reference/speed.md); messages relayed between actors
    (DULA's) stay actor calls. The actor listens on the address
    Ray knows its node by (loopback for the local instance), on a port the system picks;
    both ends authenticate with a secret of the run sent over Ray, and every frame carries
    an HMAC-SHA256 tag. An actor whose channel cannot be opened (a firewall between nodes)
    stays on actor calls with a :class:`ChannelWarning`. When Ray runs with TLS
    (``RAY_USE_TLS``) the channels are TLS too, with Ray's certificates and CA (each node's
    ``RAY_TLS_*`` files). ``False``: actor calls only.
    ``info["ray_direct_channels"]`` counts the actors reached directly.
``channel_ports``
    ``(first, last)``: the actors' channels listen on the first free port of that range
    (both included) instead of one the system picks, so that a firewall rule can name them.
    Default None.
``audit_messages``
    Keep the shape and dtype of every array a client sends in
    ``info["client_message_audit"]``.
``ray_init_options``
    Extra keyword arguments of ``ray.init`` when a local instance is started
    (``num_cpus``, ``_temp_dir``, ...). Without ``_temp_dir`` the instance's session
    files (logs, sockets) go to a temporary folder removed at shutdown; with it they
    stay where it says.
``allow_unauthenticated_cluster``
    ``False`` (default): refuse a cluster (joined, or ``RAY_AUTH_MODE=disabled``
    for the local one) that runs without token authentication. ``True``: run on
    it anyway; ``info["ray_authentication"]`` then says
    ``"disabled (allowed by user)"``.

The engine's parts, each in its module (this one re-exports their public names):
:mod:`~fedmcmc.engines.ray_placement` (which clients each actor hosts, the
:class:`PlacementWarning`), :mod:`~fedmcmc.engines.ray_actors` (the actor's body
:class:`ClientHost`, the packing of messages, the pool of idle actors; its
``UNLOAD_TIMEOUT``), :mod:`~fedmcmc.engines.ray_transport` (:class:`RayTransport`),
:mod:`~fedmcmc.engines.ray_direct` (the transport's direct channels, over
:mod:`~fedmcmc.engines.channel`) and :mod:`~fedmcmc.engines.ray_security` (the session).

Of the run options (``fedmcmc.checkpoint``), ``chunk_size`` and ``on_draws`` are honoured
by every family, the draws laid out as on the local engine; ``on_chunk`` is accepted and not
called, and ``start_draw``/``resume_state`` are refused: a Ray run is not resumed
(``engines.options.PROTOCOL_RUN_OPTIONS``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, Optional, Sequence

import numpy as np

from ..algorithm import check_positive_int
from .engine import ProtocolEngine
from .options import check_channel_ports

from .ray_actors import (  # noqa: F401 - re-exported: this module is the engine's public entry
    ClientHost,
    Unpacked,
    idle_actors,
    packed,
    release_idle_actors,
    unpacked,
)
from .ray_direct import ChannelWarning, direct_channel_wanted, ray_uses_tls  # noqa: F401
from .ray_placement import (  # noqa: F401
    ACTORS_PER_CPU_HINT,
    PlacementWarning,
    actor_groups,
    placement_hint,
)
from .ray_security import (  # noqa: F401 - ray_session, LOOPBACK are this module's API
    LOOPBACK,
    UnauthenticatedClusterError,
    check_allow_unauthenticated,
    import_ray as _import_ray,
    ray_session,
    session_authentication,
)
from .ray_transport import RayTransport, is_direct

#: the name tests imported before the split (``is_direct``)
_is_direct = is_direct

__all__ = ["RayEngine", "ray_session", "ray_transports", "RayTransport", "ClientHost", "LOOPBACK",
           "actor_groups", "UnauthenticatedClusterError", "release_idle_actors", "idle_actors",
           "PlacementWarning", "placement_hint", "ChannelWarning", "direct_channel_wanted",
           "Unpacked", "packed", "unpacked", "is_direct"]


@contextlib.contextmanager
def ray_transports(options: Dict[str, Any]) -> Iterator[Callable[[Sequence[tuple]], RayTransport]]:
    """The Ray session of one run (:func:`ray_session` with the engine options
    ``ray_address``, ``ray_init_options``, ``allow_unauthenticated_cluster``) and, inside it,
    the ``make_transport(specs)`` a pattern's driver takes: a :class:`RayTransport` as the
    options ``client_resources``, ``client_num_cpus`` and ``clients_per_actor`` ask
    (:meth:`RayTransport.from_options`)."""
    # actors outlive the run only on an instance that does (one the run starts, it stops)
    reuse = options.get("reuse_actors", True) and _import_ray().is_initialized()
    options = dict(options, reuse_actors=reuse)
    with ray_session(options.get("ray_address"), options.get("ray_init_options"),
                     options.get("allow_unauthenticated_cluster", False)):
        yield lambda specs: RayTransport.from_options(specs, options)


#: ``fm.sample``'s keyword options of the Ray engine, by the :class:`RayEngine` argument each
#: sets (the others keep their names)
RENAMED_OPTIONS = {"ray_address": "address", "ray_init_options": "init_options"}


def _check_switch(value, argument: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{argument} must be True or False, got {value!r}")
    return bool(value)


class RayEngine(ProtocolEngine):
    """Client endpoints in Ray actors (this module's docstring: what each option does).

    Parameters
    ----------
    clients_per_actor:
        Client endpoints per actor: ``None`` (default) or ``"auto"``: as many actors as the
        cluster has CPUs (one actor per client when the clients are no more than the CPUs;
        with ``client_resources``, one per client); a positive integer k: at most k.
    address:
        Ray address to join (``"auto"``, ``"ray://host:10001"``, ``"127.0.0.1:6379"``);
        ``None``: the running instance, else a new local one on loopback.
    visit_timeout, on_client_failure, audit_messages, fault_injection:
        As for every message-passing engine (:class:`~fedmcmc.engines.engine.ProtocolEngine`).
    client_resources:
        One dict of Ray custom resources per client (pins clients to nodes).
    client_num_cpus:
        CPUs reserved per client (default 0).
    reuse_actors:
        Keep the actors idle for the next run on an instance that outlives this one
        (default True).
    direct_channel:
        The driver's messages through an authenticated socket per actor (default ``None``:
        on; ``False``: Ray actor calls only).
    channel_ports:
        ``(first, last)``: the ports the actors' channels listen on.
    init_options:
        Extra keyword arguments of ``ray.init`` for a local instance the run starts.
    allow_unauthenticated_cluster:
        Run on a cluster without token authentication (default False: refused).

    Every bad value raises ``ValueError`` naming its argument.
    """

    label = "ray"
    renamed_options = RENAMED_OPTIONS
    loads_on_clients = True

    def __init__(self, clients_per_actor=None, address: Optional[str] = None, *,
                 visit_timeout: Optional[float] = None, on_client_failure: str = "stop",
                 audit_messages: bool = False, fault_injection: Optional[dict] = None,
                 client_resources: Optional[Sequence[dict]] = None,
                 client_num_cpus: Optional[float] = None, reuse_actors: bool = True,
                 direct_channel: Optional[bool] = None,
                 channel_ports: Optional[tuple] = None,
                 init_options: Optional[Dict[str, Any]] = None,
                 allow_unauthenticated_cluster: bool = False):
        super().__init__(visit_timeout=visit_timeout, on_client_failure=on_client_failure,
                         audit_messages=audit_messages, fault_injection=fault_injection)
        if clients_per_actor is not None and not (
                isinstance(clients_per_actor, str) and clients_per_actor == "auto"):
            try:
                clients_per_actor = check_positive_int(clients_per_actor, "clients_per_actor")
            except ValueError:
                raise ValueError("clients_per_actor must be a positive integer or 'auto', "
                                 f"got {clients_per_actor!r}") from None
        self.clients_per_actor = clients_per_actor
        if address is not None and not isinstance(address, str):
            raise ValueError(f"address must be a Ray address string, got {address!r}")
        self.address = address
        if client_resources is not None:
            if isinstance(client_resources, dict) or not all(
                    isinstance(r, dict) for r in client_resources):
                raise ValueError("client_resources must be a list of one dict of Ray "
                                 f"resources per client, got {client_resources!r}")
            client_resources = [dict(r) for r in client_resources]
        self.client_resources = client_resources
        if client_num_cpus is not None:
            try:
                number = float(client_num_cpus)
            except (TypeError, ValueError):
                number = -1.0
            if not number >= 0:
                raise ValueError("client_num_cpus must be a non-negative number, got "
                                 f"{client_num_cpus!r}")
        self.client_num_cpus = client_num_cpus
        self.reuse_actors = _check_switch(reuse_actors, "reuse_actors")
        self.direct_channel = (None if direct_channel is None
                               else _check_switch(direct_channel, "direct_channel"))
        self.channel_ports = (None if channel_ports is None
                              else check_channel_ports(channel_ports))
        if init_options is not None and not isinstance(init_options, dict):
            raise ValueError(f"init_options must be a dict of ray.init arguments, got "
                             f"{init_options!r}")
        self.init_options = init_options
        self.allow_unauthenticated_cluster = check_allow_unauthenticated(
            allow_unauthenticated_cluster)

    @classmethod
    def from_options(cls, options: Dict[str, Any]) -> "RayEngine":
        """The engine of ``fm.sample(..., engine="ray", **options)``: ``options`` holds the
        keyword options of this module's docstring (``ray_address``, ``visit_timeout``,
        ...)."""
        return cls(**{RENAMED_OPTIONS.get(k, k): v for k, v in options.items()})

    def engine_options(self) -> Dict[str, Any]:
        out = super().engine_options()
        for name, value in (("clients_per_actor", self.clients_per_actor),
                            ("ray_address", self.address),
                            ("client_resources", self.client_resources),
                            ("client_num_cpus", self.client_num_cpus),
                            ("direct_channel", self.direct_channel),
                            ("channel_ports", self.channel_ports),
                            ("ray_init_options", self.init_options)):
            if value is not None:
                out[name] = value
        out["reuse_actors"] = self.reuse_actors
        if self.allow_unauthenticated_cluster:
            out["allow_unauthenticated_cluster"] = True
        return out

    @contextlib.contextmanager
    def transports(self):
        with ray_transports(self.engine_options()) as make_transport:
            yield make_transport

    def session_info(self) -> Dict[str, Any]:
        return session_authentication()  # ray_authentication, ray_instance
