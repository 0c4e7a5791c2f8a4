"""The Ray actors of ``engine="ray"``: :class:`ClientHost` (an actor's body, hosting one or
more client endpoints), the packing of messages and replies into one byte string each
(:func:`packed`), and the pool of idle actors kept between runs (the engine option
``reuse_actors``; :func:`release_idle_actors`). The engine's options are described in
:mod:`fedmcmc.engines.ray_engine`."""

from __future__ import annotations

import gc
import pickle
import threading
from typing import Any, Dict, List, Optional, Sequence

from . import channel as channel_module
from .channel import ChannelServer
from .channel import dumps as channel_dumps
from .channel import loads as channel_loads
from .ray_security import import_ray as _import_ray

__all__ = ["ClientHost", "IdleActors", "IDLE_ACTORS", "UNLOAD_TIMEOUT", "Unpacked", "packed",
           "unpacked", "reservation", "end_actor", "answered", "actor_died",
           "release_idle_actors", "idle_actors"]


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


class IdleActors:
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
            keys = [key for key in pool if not reserving_only or key != reservation({})]
            hosts = [actor for key in keys for actor in pool.pop(key)]
        for actor in hosts:
            end_actor(ray, actor)
        return len(hosts)

    def count(self) -> int:
        with self._lock:
            return sum(len(group) for group in self._hosts_here(_import_ray()).values())


IDLE_ACTORS = IdleActors()

#: seconds an actor has to answer ``unload`` at the end of a run to be kept for the next
#: (an actor still busy with a message of the run, or dead, is killed instead)
UNLOAD_TIMEOUT = 5.0


def reservation(options: Dict[str, Any]) -> tuple:
    """The idle pool's key of an actor started with ``options``: what it reserves (CPUs,
    custom resources); ``reservation({})`` is an actor that reserves nothing."""
    return (float(options.get("num_cpus", 0)),
            tuple(sorted(options.get("resources", {}).items())))


def end_actor(ray, actor) -> None:
    """Kill ``actor`` (no restart); one already gone is left alone."""
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone, or Ray shut down
        pass


def answered(ray, refs: List[Any]) -> List[bool]:
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



def actor_died(ray, actor) -> bool:
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
    return IDLE_ACTORS.release()


def idle_actors() -> int:
    """How many client actors are idle, kept for the next ``engine="ray"`` run."""
    return IDLE_ACTORS.count()

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
