"""``engine="ray"``: client endpoints in Ray actors (one per client on a cluster).

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
    CPUs reserved per client (default 0: actors share the machine); an actor
    hosting k clients reserves k times this.
``clients_per_actor``
    How many client endpoints one actor hosts. Default ``None``: one actor per
    client. ``"auto"``: as many actors as the cluster has CPUs
    (``ray.cluster_resources()["CPU"]``), clients spread over them in contiguous
    blocks (with ``client_resources``: one per client): on one machine, 30
    clients in 30 processes each import JAX and compile the same programs while
    contending for the same cores. An integer k: at most k per actor. With
    ``client_resources``, only clients whose resource dicts are equal share an
    actor. ``info["ray_actors"]`` lists the clients of each actor. Left at its
    default, with more than 4 actors per CPU and no ``client_resources``, the run
    warns (:class:`PlacementWarning`); ``clients_per_actor=1`` keeps one actor per
    client without the warning.
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

Of the run options (``fedmcmc.checkpoint``), ``chunk_size`` and ``on_draws`` are honoured
by every family, the draws laid out as on the local engine; ``on_chunk`` is accepted and not
called, and ``start_draw``/``resume_state`` are refused: a Ray run is not resumed
(``engines.options.PROTOCOL_RUN_OPTIONS``).
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import pickle
import secrets
import threading
import time
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from ..callsite import user_stacklevel
from . import channel as channel_module
from .channel import SECRET_BYTES, ChannelClient, ChannelError, ChannelServer, wait_for_frames
from .channel import dumps as channel_dumps
from .channel import loads as channel_loads
from .comm import ClientFailure, Pending, Transport
from .interning import intern_arguments
from .ray_security import (  # noqa: F401 - ray_session, LOOPBACK are this module's API
    LOOPBACK,
    UnauthenticatedClusterError,
    import_ray as _import_ray,
    ray_session,
)

__all__ = ["ray_session", "ray_transports", "RayTransport", "ClientHost", "LOOPBACK",
           "actor_groups", "UnauthenticatedClusterError", "release_idle_actors", "idle_actors",
           "PlacementWarning", "placement_hint", "ChannelWarning", "direct_channel_wanted"]


class ClientHost:
    """A Ray actor's body: the client endpoints it hosts, by client index.

    ``specs`` holds ``(client, endpoint_class, args)`` per hosted client; each endpoint is
    built here, in the actor's process, so each loads and keeps its own data. A client
    whose construction fails does not take the others down: its error is kept and raised
    by every message to it (the driver sees that client fail, as with an actor of its own).
    """

    def __init__(self, specs: Sequence[tuple]):
        # messages arrive as actor calls (Ray's thread) and through the direct channel (its
        # thread): one at a time, in the order each path delivers them
        self._lock = threading.RLock()
        self._channel: Optional[ChannelServer] = None
        self.load(specs)

    def load(self, specs: Sequence[tuple]) -> int:
        """Host the endpoints ``specs`` describes (a reused actor's next run), dropping any
        it hosted before; returns how many were built."""
        with self._lock:
            self.clients: Dict[int, Any] = {}
            self.failed: Dict[int, BaseException] = {}
            for client, cls, args in specs:
                try:
                    self.clients[int(client)] = cls(*args)
                except Exception as error:  # noqa: BLE001 - reported on the client's messages
                    self.failed[int(client)] = error
            return len(self.clients)

    def open_channel(self, secret: bytes, ports: Optional[tuple] = None,
                     tls: bool = False) -> tuple:
        """Listen for the driver's direct channel (:mod:`.channel`), authenticated by
        ``secret``, on the address Ray knows this node by (on the first free port of
        ``ports``, if given), with ``tls`` in TLS with this node's Ray TLS files; returns
        ``(host, port)``. A channel of an earlier run is closed first."""
        self._close_channel()
        host = _import_ray().util.get_node_ip_address()
        context = channel_module.tls_context(server_side=True) if tls else None
        self._channel = ChannelServer(host, secret, self._channel_request, ports=ports,
                                      tls=context)
        return self._channel.address

    def _close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _channel_request(self, payload: bytes) -> bytes:
        """A request of the direct channel: ``(method, [(client, args), ...])`` as
        :meth:`dispatch_each` takes it; the replies likewise."""
        method, calls = channel_loads(payload)
        replies = self._dispatch_calls(method, calls)
        try:
            return channel_dumps(replies)
        except Exception as error:  # noqa: BLE001 - each client's reply fails, not the actor
            reason = f"its reply could not be pickled ({type(error).__name__}: {error})"
            return channel_dumps([("error", reason)] * len(calls))

    def alive(self) -> bool:
        """An idle actor's answer to the next run that takes it from the pool."""
        return True

    def unload(self) -> bool:
        """Drop every hosted endpoint and its data (the actor goes back to the idle pool);
        answered after every message sent before it, so an answer means the actor is alive
        and not busy."""
        self._close_channel()
        self.load(())
        gc.collect()
        return True

    def dispatch(self, client: int, method: str, *args):
        """Deliver one message: ``method(*args)`` of client ``client``'s endpoint."""
        with self._lock:
            endpoint = self.clients.get(client)
            if endpoint is None:
                error = self.failed.get(client)
                if error is not None:
                    raise RuntimeError(f"client {client} failed to start: "
                                       f"{type(error).__name__}: {error}") from error
                raise RuntimeError(f"client {client} is not hosted here "
                                   "(stopped or never started)")
            return getattr(endpoint, method)(*args)

    def deliver(self, message: Any) -> Any:
        """:meth:`dispatch` of ``message``, ``(client, method, args)`` packed by :func:`packed`,
        and the reply packed likewise: one byte string each way, which Ray moves as it is,
        rather than a tuple whose every small array it serializes on its own (an event round
        of Fed-PDMC sends six arrays to every worker and gets nine back)."""
        client, method, args = unpacked(message)
        return packed(self.dispatch(client, method, *args))

    def relayed(self, client: int, method: str, packed_positions: Sequence[int], *args) -> Any:
        """:meth:`dispatch` of a relayed message: the arguments at ``packed_positions`` are other
        calls' packed replies (Ray hands them over from the actors that computed them)."""
        args = [unpacked(arg) if position in packed_positions else arg
                for position, arg in enumerate(args)]
        return packed(self.dispatch(client, method, *args))

    def dispatch_each(self, method: str, calls: Any) -> Any:
        """Deliver ``method`` to several hosted clients, ``calls`` (packed by :func:`packed`)
        holding ``(client, args)`` each: one actor call for what are several messages.
        Replies, packed likewise, ``("ok", value)`` or ``("error", reason)`` per client, in
        order: one client's failure is its own."""
        return packed(self._dispatch_calls(method, unpacked(calls)))

    def _dispatch_calls(self, method: str, calls: Sequence[tuple]) -> List[tuple]:
        replies = []
        for client, args in calls:
            try:
                replies.append(("ok", self.dispatch(client, method, *args)))
            except Exception as error:  # noqa: BLE001 - reported as that client's failure
                replies.append(("error", f"{type(error).__name__}: {error}"))
        return replies

    def stop(self, client: int) -> None:
        """Drop client ``client``'s endpoint (and its data) from this actor."""
        with self._lock:
            self.clients.pop(client, None)


class _IdleActors:
    """:class:`ClientHost` actors kept alive between runs on a Ray instance that outlives them
    (the engine option ``reuse_actors``), by what they reserve.

    Starting an actor is a new Python process importing JAX and fedmcmc and compiling (or
    loading) its client's programs; a reused one has all of that done, and its programs of
    the same shapes in memory (``benchmarks/bench_startup.py --ray`` times a second run).
    Actors are reused only for clients that reserve exactly the same resources
    (``client_num_cpus``, ``client_resources``): with ``client_resources`` pinning each client
    to its own node, a client's next run lands on the same node. Entries of another Ray
    instance (after ``ray.shutdown()`` and a new ``ray.init``) are forgotten."""

    def __init__(self):
        self._lock = threading.Lock()
        self._cluster: Optional[tuple] = None
        self._hosts: Dict[tuple, List[Any]] = {}

    def _hosts_here(self, ray) -> Dict[tuple, List[Any]]:
        """The idle actors of the Ray instance this process is connected to (call with the
        lock held): entries of an instance since shut down are forgotten."""
        if not ray.is_initialized():
            self._cluster, self._hosts = None, {}
            return self._hosts
        context = ray.get_runtime_context()
        cluster = (context.get_job_id(), context.get_node_id())
        if self._cluster != cluster:
            self._cluster, self._hosts = cluster, {}
        return self._hosts

    def take(self, ray, reserved: tuple) -> Optional[Any]:
        with self._lock:
            hosts = self._hosts_here(ray).get(reserved)
            return hosts.pop() if hosts else None

    def put(self, ray, reserved: tuple, actor: Any) -> None:
        with self._lock:
            self._hosts_here(ray).setdefault(reserved, []).append(actor)

    def release(self, reserving_only: bool = False) -> int:
        """Kill every idle actor (``reserving_only``: those that reserve CPUs or custom
        resources); returns how many it killed."""
        ray = _import_ray()
        with self._lock:
            pool = self._hosts_here(ray)
            keys = [key for key in pool if not reserving_only or key != _reservation({})]
            hosts = [actor for key in keys for actor in pool.pop(key)]
        for actor in hosts:
            _end_actor(ray, actor)
        return len(hosts)

    def count(self) -> int:
        with self._lock:
            return sum(len(group) for group in self._hosts_here(_import_ray()).values())


_IDLE_ACTORS = _IdleActors()

#: seconds an actor has to answer ``unload`` at the end of a run to be kept for the next
#: (an actor still busy with a message of the run, or dead, is killed instead)
UNLOAD_TIMEOUT = 5.0


def _reservation(options: Dict[str, Any]) -> tuple:
    """The idle pool's key of an actor started with ``options``: what it reserves (CPUs,
    custom resources); ``_reservation({})`` is an actor that reserves nothing."""
    return (float(options.get("num_cpus", 0)),
            tuple(sorted(options.get("resources", {}).items())))


def _end_actor(ray, actor) -> None:
    """Kill ``actor`` (no restart); one already gone is left alone."""
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone, or Ray shut down
        pass


def _answered(ray, refs: List[Any]) -> List[bool]:
    """Whether each actor call of ``refs`` returned a true value within
    :data:`UNLOAD_TIMEOUT` (False for one still running, or whose actor died)."""
    if not refs:
        return []
    try:
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=UNLOAD_TIMEOUT)[0])
    except Exception:  # noqa: BLE001 - Ray stopped
        return [False] * len(refs)
    answers = []
    for ref in refs:
        try:
            answers.append(ref in ready and bool(ray.get(ref, timeout=0)))
        except Exception:  # noqa: BLE001 - its actor died
            answers.append(False)
    return answers


def _root_cause(error: BaseException) -> str:
    """``type: message`` of the exception an actor call raised in the actor (Ray wraps it)."""
    cause = getattr(error, "cause", None) or error
    return f"{type(cause).__name__}: {cause}"


def _died(ray, actor) -> bool:
    """Whether ``actor`` has died (an actor still busy after :data:`UNLOAD_TIMEOUT` has not)."""
    ref = actor.alive.remote()
    try:
        if not ray.wait([ref], timeout=UNLOAD_TIMEOUT)[0]:
            return False
        ray.get(ref, timeout=0)
    except Exception:  # noqa: BLE001 - its actor died (or Ray stopped)
        return True
    return False


def release_idle_actors() -> int:
    """Kill the client actors ``engine="ray"`` keeps between runs (option ``reuse_actors``)
    on the Ray instance this process is connected to; returns how many it killed. They also
    end with the driver process or ``ray.shutdown()``."""
    return _IDLE_ACTORS.release()


def idle_actors() -> int:
    """How many client actors are idle, kept for the next ``engine="ray"`` run."""
    return _IDLE_ACTORS.count()


class _Batch:
    """The reply of one :meth:`ClientHost.dispatch_each` call, fetched by the first of its
    clients' results and read from here by the others (it lives as long as their pendings)."""

    __slots__ = ("ref", "values")

    def __init__(self, ref):
        self.ref, self.values = ref, None


class _DirectBatch:
    """The reply of one request on an actor's direct channel (:mod:`.channel`): read by
    whichever wait receives it, ``values`` (a ``(status, value)`` per client) or the
    ``failure`` of the channel."""

    __slots__ = ("actor", "values", "failure")

    def __init__(self, actor: int):
        self.actor, self.values, self.failure = actor, None, None

    @property
    def done(self) -> bool:
        return self.values is not None or self.failure is not None


class _Part:
    """A :class:`~fedmcmc.engines.comm.Pending`'s handle: one client's place in a batch (a
    :class:`_Batch` of an actor call or a :class:`_DirectBatch`)."""

    __slots__ = ("batch", "position")

    def __init__(self, batch: _Batch, position: int):
        self.batch, self.position = batch, position


class Unpacked:
    """A message or reply that :func:`packed` could not pickle (one holding a function, such
    as a set-up message with the model): Ray serializes it (with cloudpickle) instead."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


def packed(value: Any) -> Any:
    """``value`` (a message or a reply) as one pickled byte string, or :class:`Unpacked` if the
    standard pickle cannot take it. Messages are parameter-sized (a position, a few per-chain
    scalars, a proposal): pickled in band, they cost less than Ray's serialization of each
    array on its own (a Fed-PDMC event round of four workers sends six arrays to each and gets
    nine back)."""
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        return Unpacked(value)


def unpacked(message: Any) -> Any:
    """What :func:`packed` packed."""
    return message.value if isinstance(message, Unpacked) else pickle.loads(message)


def _object_ref(handle):
    return handle.batch.ref if isinstance(handle, _Part) else handle


def _is_direct(handle) -> bool:
    return isinstance(handle, _Part) and isinstance(handle.batch, _DirectBatch)


class ChannelWarning(UserWarning):
    """A direct channel to a client actor could not be opened: that actor's messages go as
    Ray actor calls (the same messages and draws, more time per round)."""


def actor_groups(num_clients: int, clients_per_actor, resources: Optional[Sequence[dict]],
                 cluster_cpus: float) -> List[List[int]]:
    """The clients each actor hosts (see the option ``clients_per_actor``): contiguous blocks
    of at most ``clients_per_actor`` clients, among clients with equal ``resources``; ``None``
    one client per actor; ``"auto"`` one client per actor with ``resources``, else
    ``ceil(num_clients / cluster_cpus)`` per actor, that is one actor per CPU of the cluster."""
    if clients_per_actor is None:
        clients_per_actor = 1
    elif clients_per_actor == "auto":
        if resources is not None:
            clients_per_actor = 1
        else:
            actors = max(1, min(num_clients, int(cluster_cpus)))
            clients_per_actor = math.ceil(num_clients / actors)
    # balanced blocks: 30 clients on 4 actors are 8, 8, 7, 7 rather than 8, 8, 8, 6
    keys: Dict[tuple, List[int]] = {}
    for client in range(num_clients):
        key = () if resources is None else tuple(sorted(dict(resources[client]).items()))
        keys.setdefault(key, []).append(client)
    groups: List[List[int]] = []
    for members in keys.values():
        count = math.ceil(len(members) / clients_per_actor)
        base, extra = divmod(len(members), count)
        start = 0
        for block in range(count):
            size = base + (1 if block < extra else 0)
            groups.append(members[start:start + size])
            start += size
    return sorted(groups)


class PlacementWarning(UserWarning):
    """``engine="ray"`` is about to start many more client actors than the Ray instance has
    CPUs, each a process that imports JAX and compiles its client's programs (see
    :func:`placement_hint`)."""


#: actors per CPU of the Ray instance beyond which the default placement (one actor per client)
#: gets a :class:`PlacementWarning`
ACTORS_PER_CPU_HINT = 4


def placement_hint(num_actors: int, cluster_cpus: float, clients_per_actor,
                   resources: Optional[Sequence[dict]]) -> Optional[str]:
    """The text of a :class:`PlacementWarning`, or None: only for the default placement (the
    user did not choose ``clients_per_actor`` nor pin clients with ``client_resources``) and
    more than :data:`ACTORS_PER_CPU_HINT` actors per CPU. FSGLD's Table 1, 30 clients on a
    2-CPU machine, a whole run with a warm compilation cache: 57-76 s in 30 actors against
    18-22 s in 2 (``clients_per_actor="auto"``), the same draws (docs/reference/speed.md)."""
    if clients_per_actor is not None or resources is not None:
        return None
    cpus = max(float(cluster_cpus), 1.0)
    if num_actors <= ACTORS_PER_CPU_HINT * cpus:
        return None
    return (f"engine='ray' starts one actor per client: {num_actors} processes, each importing "
            f"JAX and compiling its client's programs, on a Ray instance with {cpus:g} CPUs. "
            f"clients_per_actor='auto' hosts the clients in one actor per CPU (the same messages "
            f"and draws, much less set-up time); pass clients_per_actor=1 to keep one process "
            f"per client and silence this warning")


def ray_uses_tls() -> bool:
    """Whether this process runs Ray with TLS (``RAY_USE_TLS``, read as Ray reads it)."""
    return os.environ.get("RAY_USE_TLS", "0").strip().lower() in ("1", "true")


def direct_channel_wanted(option: Optional[bool]) -> bool:
    """The engine option ``direct_channel``: ``None`` (default) and ``True`` are on (in TLS
    with Ray's certificates when Ray runs with TLS), ``False`` off."""
    return True if option is None else bool(option)


class RayTransport(Transport):
    """Client endpoints in Ray actors (:class:`ClientHost`); messages are actor calls, and
    broadcasts go through direct channels.

    ``specs``: one ``(endpoint_class, args)`` per client; ``groups``: the clients of each
    actor (:func:`actor_groups`; default one actor per client); ``resources``: one dict of
    Ray resources per client; ``num_cpus``: CPUs reserved per client.

    ``direct_channel`` (default True): the messages of :meth:`call_each` and :meth:`call` (a
    broadcast to every client: a Fed-PDMC or baseline round, set-up questions; a hand-off
    visit) go through one authenticated socket per actor (:mod:`.channel`) once the actor
    has opened it (asked for with the first message to it), rather than as actor calls;
    relays between actors (DULA's neighbour messages) stay actor calls. Each actor answers
    the driver's messages in the order they were sent: one with an actor call still running
    gets the message as an actor call too, and an actor call waits for the actor's direct
    requests to be answered before it is sent. A channel that cannot be opened (a
    firewall between nodes) leaves that actor on actor calls, with a :class:`ChannelWarning`
    and ``info["ray_channel_failures"]``.
    """

    def __init__(self, specs: Sequence[tuple], *, resources: Optional[Sequence[dict]] = None,
                 num_cpus: float = 0, audit: bool = False,
                 groups: Optional[Sequence[Sequence[int]]] = None, reuse: bool = False,
                 direct_channel: bool = True, channel_ports: Optional[tuple] = None):
        super().__init__(len(specs), audit)
        ray = _import_ray()
        self._ray = ray
        if resources is not None and len(resources) != len(specs):
            raise ValueError(
                f"client_resources must have one dict per client ({len(specs)}), got {len(resources)}"
            )
        groups = [[c] for c in range(len(specs))] if groups is None else [list(g) for g in groups]
        if sorted(c for g in groups for c in g) != list(range(len(specs))):
            raise ValueError(f"groups must hold every client 0..{len(specs) - 1} exactly once, "
                             f"got {groups}")
        self.groups = groups
        self.actor_of = {client: a for a, group in enumerate(groups) for client in group}
        self._reuse = bool(reuse)
        self.actors, self._reserved, reused, new = [], [], [], []
        # the objects every client shares go as Interned: an actor hosting a later run's
        # clients gets back the objects it built from the same bytes, with their traced
        # programs (the model, the protocol: interning.py)
        shipped = intern_arguments(specs)
        for index, group in enumerate(groups):
            options: Dict[str, Any] = {"num_cpus": num_cpus * len(group), "max_restarts": 0}
            if resources is not None and resources[group[0]]:
                options["resources"] = dict(resources[group[0]])
            reserved = _reservation(options)
            # the clients' data go to the actor once, at creation (in a real deployment the
            # data would already be there); it is not a protocol message and is not counted
            hosted = [(client, shipped[client][0], shipped[client][1]) for client in group]
            actor = _IDLE_ACTORS.take(ray, reserved) if self._reuse else None
            (new if actor is None else reused).append((index, actor, options, hosted))
            self.actors.append(actor)
            self._reserved.append(reserved)
        if new:
            # idle actors this run did not take must not hold the CPUs or resources its new
            # actors need (they would wait for ever)
            _IDLE_ACTORS.release(reserving_only=True)
        for index, _, options, hosted in new:
            self.actors[index] = ray.remote(ClientHost).options(**options).remote(hosted)
        self.reused_actors = self._host_on_idle_actors(reused)
        self._dead = set()
        # direct channels, by actor: asked for with the first broadcast to the actor (a run
        # that only relays, DULA's, opens none); the open_channel call's reference until the
        # driver connects, then the ChannelClient; None: actor calls only
        self._direct_channel = bool(direct_channel)
        self._channel_ports = None if channel_ports is None else tuple(channel_ports)
        self._secret = secrets.token_bytes(SECRET_BYTES) if direct_channel else b""
        # under Ray's TLS the channels are TLS too, with Ray's certificates (channel.py)
        self._tls = bool(direct_channel) and ray_uses_tls()
        self._tls_client = None
        self._direct: Dict[int, Any] = {}
        self._direct_waiting: Dict[int, Dict[int, _DirectBatch]] = {}  # by sequence number
        self._last_ray_call: Dict[int, Any] = {}  # actor -> its last actor call's reference
        self.channel_failures: List[Dict[str, Any]] = []
        self._unreachable_hosts: set = set()

    def _host_on_idle_actors(self, reused: List[tuple]) -> int:
        """Load the clients of ``reused`` (``(index, actor, options, hosted)``) into the idle
        actors taken for them; an actor that does not answer within :data:`UNLOAD_TIMEOUT`
        (it died while idle) is replaced by a new one. The loading itself is not waited for:
        the run's first message to a client is answered after it, as after a new actor's
        construction. Returns how many actors were reused."""
        ray = self._ray
        if not reused:
            return 0
        answers = _answered(ray, [actor.alive.remote() for _, actor, _, _ in reused])
        count = 0
        for (index, actor, options, hosted), alive in zip(reused, answers):
            if alive:
                actor.load.remote(hosted)
                count += 1
                continue
            _end_actor(ray, actor)
            self.actors[index] = ray.remote(ClientHost).options(**options).remote(hosted)
        return count

    @classmethod
    def from_options(cls, specs: Sequence[tuple], options: Dict[str, Any]) -> "RayTransport":
        """The transport the engine options ask for (``client_resources``,
        ``client_num_cpus``, ``clients_per_actor``); call inside the Ray session."""
        resources = options.get("client_resources")
        cluster_cpus = _import_ray().cluster_resources().get("CPU", 1)
        groups = actor_groups(len(specs), options.get("clients_per_actor"), resources,
                              cluster_cpus)
        hint = placement_hint(len(groups), cluster_cpus, options.get("clients_per_actor"),
                              resources)
        if hint is not None:
            warnings.warn(hint, PlacementWarning, stacklevel=user_stacklevel())
        return cls(specs, resources=resources, num_cpus=options.get("client_num_cpus", 0),
                   groups=groups, reuse=options.get("reuse_actors", False),
                   direct_channel=direct_channel_wanted(options.get("direct_channel")),
                   channel_ports=options.get("channel_ports"))

    def placement(self) -> Dict[str, Any]:
        """``ray_actors``: the clients each actor hosts; ``ray_actors_reused``: how many of
        those actors an earlier run had started (``reuse_actors``); ``ray_direct_channels``:
        how many actors the driver reached by a direct channel, and ``ray_channel_tls``
        whether those channels are TLS; ``ray_channel_failures`` (only if any): the actors
        whose channel could not be opened, and why."""
        out = {"ray_actors": [list(group) for group in self.groups],
               "ray_actors_reused": self.reused_actors}
        if self._direct or self.channel_failures:
            out["ray_direct_channels"] = sum(isinstance(c, ChannelClient)
                                             for c in self._direct.values())
            out["ray_channel_tls"] = self._tls
        if self.channel_failures:
            out["ray_channel_failures"] = list(self.channel_failures)
        return out

    # -- direct channels
    def _channel_of(self, actor: int) -> Optional[ChannelClient]:
        """Actor ``actor``'s open direct channel, connecting to it once the actor has
        answered ``open_channel``; None while it has not (the first call asks it to), or
        without a channel."""
        if actor not in self._direct:
            # answered after the actor's construction and before this broadcast, which goes
            # as an actor call: the next finds the channel open
            self._direct[actor] = self.actors[actor].open_channel.remote(
                self._secret, self._channel_ports, self._tls)
            return None
        state = self._direct.get(actor)
        if state is None or isinstance(state, ChannelClient):
            return state if state is not None and state.closed is None else None
        ray = self._ray
        if not ray.wait([state], timeout=0)[0]:
            return None
        try:
            address = ray.get(state, timeout=60)
        except ray.exceptions.RayActorError:  # it died: its messages fail as actor calls
            self._direct[actor] = None
            return None
        except Exception as error:  # noqa: BLE001 - the actor could not listen
            self._direct[actor] = None
            self._channel_failed(actor, None, _root_cause(error))
            return None
        if address[0] in self._unreachable_hosts:
            # one failed connection per host, not one wait of HANDSHAKE_TIMEOUT per actor
            self._direct[actor] = None
            self._channel_failed(actor, address, "not tried: another actor's channel on this "
                                 "host could not be opened", warn=False)
            return None
        try:
            channel = ChannelClient(address, self._secret, tls=self._tls_context())
        except (OSError, ChannelError) as error:
            self._direct[actor] = None
            if _died(ray, self.actors[actor]):
                return None  # not the channel's fault: its messages fail as actor calls
            self._unreachable_hosts.add(address[0])
            self._channel_failed(actor, address, f"{type(error).__name__}: {error}")
            return None
        self._direct[actor] = channel
        return channel

    def _tls_context(self):
        """The driver's TLS context for the channels (None without TLS), made once."""
        if not self._tls:
            return None
        if self._tls_client is None:
            self._tls_client = channel_module.tls_context(server_side=False)
        return self._tls_client

    def _channel_failed(self, actor: int, address: Optional[Sequence], reason: str,
                        warn: bool = True) -> None:
        """Record (``info["ray_channel_failures"]``) and, with ``warn``, warn that actor
        ``actor``'s channel could not be opened."""
        self.channel_failures.append({"actor": actor,
                                      "address": None if address is None else list(address),
                                      "reason": reason})
        if not warn:
            return
        where = "" if address is None else f" at {address[0]}:{address[1]}"
        warnings.warn(f"engine='ray': the direct channel to the actor of clients "
                      f"{self.groups[actor]}{where} could not be opened ({reason}); its "
                      f"messages go as Ray actor calls (the same draws, more time per "
                      f"round). Pass direct_channel=False to use actor calls only",
                      ChannelWarning, stacklevel=user_stacklevel())

    def _ray_quiet(self, actor: int) -> bool:
        """Whether every actor call sent to ``actor`` has ended (Ray runs one caller's calls
        to an actor in order: the last one's end is all of theirs)."""
        ref = self._last_ray_call.get(actor)
        if ref is None:
            return True
        if self._ray.wait([ref], timeout=0)[0]:
            del self._last_ray_call[actor]
            return True
        return False

    def _send_direct(self, actor: int, method: str, calls: List[tuple]) -> Optional[_DirectBatch]:
        """Send ``calls`` to ``actor`` through its channel, or None if it has no open channel,
        an actor call to it is still running, or the message cannot be pickled."""
        channel = self._channel_of(actor) if self._direct_channel else None
        if channel is None or not self._ray_quiet(actor):
            return None
        try:
            payload = channel_dumps((method, calls))
        except Exception:  # noqa: BLE001 - Ray serializes it (an actor call)
            return None
        try:
            sequence = channel.send(payload)
        except ChannelError as error:
            self._fail_direct(actor, error)
            return None  # the actor call that replaces it reports what happened to the actor
        batch = _DirectBatch(actor)
        self._direct_waiting.setdefault(actor, {})[sequence] = batch
        return batch

    def _fail_direct(self, actor: int, error: BaseException) -> None:
        """Actor ``actor``'s channel closed: its unanswered requests fail."""
        reason = f"actor died (its channel closed: {error})"
        for batch in self._direct_waiting.pop(actor, {}).values():
            batch.failure = reason
        channel = self._direct.get(actor)
        if isinstance(channel, ChannelClient):
            channel.close()

    def _receive_direct(self, actors: List[int], timeout: Optional[float]) -> None:
        """Wait up to ``timeout`` seconds for replies on the channels of ``actors`` and hand
        each to its batch (a reply whose waiter gave up is dropped)."""
        channels = [self._direct[actor] for actor in actors]
        for position, frames in wait_for_frames(channels, timeout).items():
            actor = actors[position]
            if isinstance(frames, ChannelError):
                self._fail_direct(actor, frames)
                continue
            waiting = self._direct_waiting.get(actor, {})
            for sequence, payload in frames:
                batch = waiting.pop(sequence, None)
                if batch is not None:
                    batch.values = channel_loads(payload)

    def _await_direct(self, batches: Sequence[_DirectBatch], timeout: Optional[float],
                      every: bool) -> None:
        """Receive replies until every batch of ``batches`` is done (``every``) or one is, or
        ``timeout`` seconds (None: no limit) have passed."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        batches = list({id(b): b for b in batches}.values())
        while True:
            waiting = [b for b in batches if not b.done]
            if not waiting or (not every and len(waiting) < len(batches)):
                return
            left = None if deadline is None else max(0.0, deadline - time.perf_counter())
            self._receive_direct(sorted({b.actor for b in waiting}), left)
            if deadline is not None and time.perf_counter() >= deadline:
                return

    def _wait_direct(self, pendings: List[Pending], timeout: Optional[float], every: bool):
        self._await_direct([p.handle.batch for p in pendings], timeout, every)
        ready = [p for p in pendings if p.handle.batch.done]
        return ready, [p for p in pendings if not p.handle.batch.done]

    def _channel_quiet(self, actor: int) -> None:
        """Before an actor call to ``actor``: wait until its direct requests are answered, so
        that it sees the driver's messages in the order they were sent (DULA's gradient
        terms, asked between two draws' relays). An actor that does not answer them within
        :data:`~.channel.SEND_TIMEOUT` has its channel closed as failed."""
        waiting = list(self._direct_waiting.get(actor, {}).values())
        if not waiting:
            return
        self._await_direct(waiting, channel_module.SEND_TIMEOUT, every=True)
        if not all(batch.done for batch in waiting):
            self._fail_direct(actor, ChannelError(
                f"no answer within {channel_module.SEND_TIMEOUT:g} s before an actor call"))

    def _send(self, client: int, method: str, args) -> Any:
        actor = self.actor_of[client]
        self._channel_quiet(actor)
        ref = self._last_ray_call[actor] = self.actors[actor].deliver.remote(
            packed((client, method, tuple(args))))
        return ref

    def call(self, client: int, method: str, *args, tag: Any = None) -> Pending:
        """One message: through the client's actor's direct channel when it has one open
        and no actor call to it is running (a hand-off visit, a set-up question), else an
        actor call."""
        self.record("to_clients", client, method, args)
        if client in self._dead:
            return Pending(client, method, None, tag)
        direct = self._send_direct(self.actor_of[client], method, [(client, tuple(args))])
        if direct is not None:
            return Pending(client, method, _Part(direct, 0), tag)
        return Pending(client, method, self._send(client, method, args), tag)

    def call_each(self, clients, method, args_of):
        """One message per client, counted as such; the messages to clients of the same
        actor travel in one actor call (:meth:`ClientHost.dispatch_each`)."""
        clients = list(clients)
        pendings: Dict[int, Pending] = {}
        by_actor: Dict[int, List[tuple]] = {}
        for client in clients:
            args = tuple(args_of(client))
            self.record("to_clients", client, method, args)
            if client in self._dead:
                pendings[client] = Pending(client, method, None)
            else:
                by_actor.setdefault(self.actor_of[client], []).append((client, args))
        for actor, calls in by_actor.items():
            direct = self._send_direct(actor, method, calls)
            if direct is not None:
                for position, (client, _) in enumerate(calls):
                    pendings[client] = Pending(client, method, _Part(direct, position))
                continue
            if len(calls) == 1:
                client, args = calls[0]
                pendings[client] = Pending(client, method, self._send(client, method, args))
                continue
            self._channel_quiet(actor)
            batch = _Batch(self.actors[actor].dispatch_each.remote(method, packed(calls)))
            self._last_ray_call[actor] = batch.ref
            for position, (client, _) in enumerate(calls):
                pendings[client] = Pending(client, method, _Part(batch, position))
        return [pendings[client] for client in clients]

    def relay(self, client: int, method: str, *args, tag: Any = None) -> Pending:
        if client in self._dead:
            return Pending(client, method, None, tag)
        # a reply that came through a direct channel is here already: it goes as a value (a
        # failed one fails this call too, naming its cause)
        args = list(args)
        for position, arg in enumerate(args):
            if isinstance(arg, Pending) and _is_direct(arg.handle):
                try:
                    args[position] = self._part(arg.handle, arg.client)
                except ClientFailure as failure:
                    failed = _DirectBatch(self.actor_of[client])
                    failed.failure = (f"its argument from client {failure.client} failed: "
                                      f"{failure.reason}")
                    return Pending(client, method, _Part(failed, 0), tag)
        # a Pending argument travels as its object reference: Ray hands the value to this
        # actor from the actor that computed it
        refs = [a.handle if isinstance(a, Pending) else a for a in args]
        replies = tuple(i for i, a in enumerate(args) if isinstance(a, Pending))  # packed
        # top-level arguments: Ray resolves an object reference only there
        actor = self.actor_of[client]
        self._channel_quiet(actor)
        ref = self._last_ray_call[actor] = self.actors[actor].relayed.remote(
            client, method, replies, *refs)
        return Pending(client, method, ref, tag)

    def wait(self, pendings, timeout):
        return self._wait(pendings, timeout, every=False)

    def wait_every(self, pendings, timeout):
        # one wait for all (a failed actor's reference is ready too, with its error): waking
        # up per reply cost a Fed-PDMC event round about a millisecond per worker
        return self._wait(pendings, timeout, every=True)

    def _wait(self, pendings, timeout, every):
        pendings = list(pendings)
        dead = [p for p in pendings if p.handle is None]
        live = [p for p in pendings if p.handle is not None]
        if dead or not live:
            return dead, live
        direct = [p for p in live if _is_direct(p.handle)]
        if not direct:
            return self._wait_ray(live, timeout, every)
        calls = [p for p in live if not _is_direct(p.handle)]
        if not calls:
            return self._wait_direct(direct, timeout, every)
        # both kinds (an actor without a channel, or with an actor call running): poll both
        deadline = None if timeout is None else time.perf_counter() + timeout
        while True:
            ready = self._wait_direct(direct, 0.0, False)[0] + self._wait_ray(calls, 0.0, False)[0]
            now = time.perf_counter()
            if ready or (deadline is not None and now >= deadline):
                chosen = {id(p) for p in ready}
                return ready, [p for p in live if id(p) not in chosen]
            pause = 0.002 if deadline is None else min(0.002, deadline - now)
            self._wait_direct(direct, pause, False)

    def _wait_ray(self, live, timeout, every):
        by_ref: Dict[Any, List[Pending]] = {}
        for pending in live:  # the clients of one batch share its object reference
            by_ref.setdefault(_object_ref(pending.handle), []).append(pending)
        refs = list(by_ref)
        if every:
            ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=timeout)
        else:
            ready, _ = self._ray.wait(refs, num_returns=1, timeout=timeout)
            if ready:
                ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=0)
        ready_set = set(ready)
        return ([p for r in ready for p in by_ref[r]],
                [p for r in refs if r not in ready_set for p in by_ref[r]])

    def result(self, pending: Pending) -> Any:
        ray = self._ray
        handle = pending.handle
        if handle is None:
            raise ClientFailure(pending.client, "actor already dead")
        try:
            if isinstance(handle, _Part):
                value = self._part(handle, pending.client)
            else:
                value = unpacked(ray.get(handle, timeout=60))
                self._forget_ray_call(pending.client, handle)
        except ray.exceptions.RayActorError as error:
            raise ClientFailure(pending.client, f"actor died ({type(error).__name__})") from None
        except ray.exceptions.RayError as error:
            raise ClientFailure(pending.client, f"{type(error).__name__}: {error}") from None
        self.record("from_clients", pending.client, pending.method, value)
        return value

    def _forget_ray_call(self, client: int, ref) -> None:
        """An actor call that has ended, read: no need to ask Ray whether it has."""
        actor = self.actor_of[client]
        if self._last_ray_call.get(actor) is ref:
            del self._last_ray_call[actor]

    def _part(self, part: _Part, client: int) -> Any:
        batch = part.batch
        if isinstance(batch, _DirectBatch):
            if not batch.done:  # a reply read without waiting: wait as ray.get does
                self._await_direct([batch], 60.0, every=True)
            if batch.failure is not None or not batch.done:
                raise ClientFailure(client, batch.failure or "no answer within 60 s")
        elif batch.values is None:
            batch.values = unpacked(self._ray.get(batch.ref, timeout=60))
            self._forget_ray_call(client, batch.ref)
        status, value = batch.values[part.position]
        if status == "error":
            raise ClientFailure(client, value)
        return value

    def alive(self, client: int) -> bool:
        return client not in self._dead

    def kill(self, client: int) -> None:
        """Stop client ``client``: its actor ends when it was the actor's last live client
        (as in a crash), else the actor drops that endpoint and goes on serving the others."""
        self._dead.add(client)
        actor = self.actors[self.actor_of[client]]
        if all(c in self._dead for c in self.groups[self.actor_of[client]]):
            self._fail_direct(self.actor_of[client], ChannelError("the actor was ended"))
            _end_actor(self._ray, actor)
            return
        try:
            actor.stop.remote(client)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def close(self) -> None:
        """End the run's actors, or with ``reuse`` keep for the next run those whose clients
        all lived and that answer :meth:`ClientHost.unload` within :data:`UNLOAD_TIMEOUT`."""
        for actor in list(self._direct):
            self._fail_direct(actor, ChannelError("the run ended"))
        self._last_ray_call.clear()
        kept = set()
        if self._reuse:
            candidates = [a for a in range(len(self.actors))
                          if not any(c in self._dead for c in self.groups[a])]
            answers = _answered(self._ray, [self.actors[a].unload.remote() for a in candidates])
            kept = {a for a, answered in zip(candidates, answers) if answered}
        for a, actor in enumerate(self.actors):
            if a in kept:
                _IDLE_ACTORS.put(self._ray, self._reserved[a], actor)
            else:
                _end_actor(self._ray, actor)
        self._dead.update(range(self.num_clients))
        self.actors = []


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
