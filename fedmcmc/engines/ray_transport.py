"""The transport of ``engine="ray"``: :class:`RayTransport` implements
:class:`~fedmcmc.engines.comm.Transport` with client endpoints hosted by Ray actors
(:class:`~fedmcmc.engines.ray_actors.ClientHost`), messages sent as actor calls or through
the actors' direct channels (:class:`~fedmcmc.engines.ray_direct.DirectChannels`). The
engine's options are described in :mod:`fedmcmc.engines.ray_engine`."""

from __future__ import annotations

import time
import warnings
from typing import Any, Dict, List, Optional, Sequence

from ..callsite import user_stacklevel
from .channel import ChannelClient, ChannelError
from .comm import ClientFailure, Pending, Transport
from .interning import intern_arguments
from . import ray_actors
from .ray_actors import (IDLE_ACTORS, ClientHost, answered, end_actor, packed, reservation,
                         unpacked)
from .ray_direct import DirectBatch, DirectChannels, direct_channel_wanted
from .ray_placement import PlacementWarning, actor_groups, placement_hint
from .ray_security import import_ray as _import_ray

__all__ = ["RayTransport", "is_direct"]


class _Batch:
    """The reply of one :meth:`ClientHost.dispatch_each` call, fetched by the first of its
    clients' results and read from here by the others (it lives as long as their pendings)."""

    __slots__ = ("ref", "values")

    def __init__(self, ref):
        self.ref, self.values = ref, None


class _Part:
    """A :class:`~fedmcmc.engines.comm.Pending`'s handle: one client's place in a batch (a
    :class:`_Batch` of an actor call or a :class:`DirectBatch`)."""

    __slots__ = ("batch", "position")

    def __init__(self, batch: _Batch, position: int):
        self.batch, self.position = batch, position


def _object_ref(handle):
    return handle.batch.ref if isinstance(handle, _Part) else handle


def is_direct(handle) -> bool:
    """Whether a :class:`~fedmcmc.engines.comm.Pending`'s handle is a direct-channel reply."""
    return isinstance(handle, _Part) and isinstance(handle.batch, DirectBatch)


class RayTransport(DirectChannels, Transport):
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
            reserved = reservation(options)
            # the clients' data go to the actor once, at creation (in a real deployment the
            # data would already be there); it is not a protocol message and is not counted
            hosted = [(client, shipped[client][0], shipped[client][1]) for client in group]
            actor = IDLE_ACTORS.take(ray, reserved) if self._reuse else None
            (new if actor is None else reused).append((index, actor, options, hosted))
            self.actors.append(actor)
            self._reserved.append(reserved)
        if new:
            # idle actors this run did not take must not hold the CPUs or resources its new
            # actors need (they would wait for ever)
            IDLE_ACTORS.release(reserving_only=True)
        for index, _, options, hosted in new:
            self.actors[index] = ray.remote(ClientHost).options(**options).remote(hosted)
        self.reused_actors = self._host_on_idle_actors(reused)
        self._dead = set()
        self._init_direct_channels(direct_channel, channel_ports)

    def _host_on_idle_actors(self, reused: List[tuple]) -> int:
        """Load the clients of ``reused`` (``(index, actor, options, hosted)``) into the idle
        actors taken for them; an actor that does not answer within :data:`UNLOAD_TIMEOUT`
        (it died while idle) is replaced by a new one. The loading itself is not waited for:
        the run's first message to a client is answered after it, as after a new actor's
        construction. Returns how many actors were reused."""
        ray = self._ray
        if not reused:
            return 0
        answers = answered(ray, [actor.alive.remote() for _, actor, _, _ in reused])
        count = 0
        for (index, actor, options, hosted), alive in zip(reused, answers):
            if alive:
                actor.load.remote(hosted)
                count += 1
                continue
            end_actor(ray, actor)
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
            if isinstance(arg, Pending) and is_direct(arg.handle):
                try:
                    args[position] = self._part(arg.handle, arg.client)
                except ClientFailure as failure:
                    failed = DirectBatch(self.actor_of[client])
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
        direct = [p for p in live if is_direct(p.handle)]
        if not direct:
            return self._wait_ray(live, timeout, every)
        calls = [p for p in live if not is_direct(p.handle)]
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
        if isinstance(batch, DirectBatch):
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
            end_actor(self._ray, actor)
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
        unread = dict(self._last_ray_call)
        self._last_ray_call.clear()
        kept = set()
        if self._reuse:
            # an actor whose last call of the run has not ended within UNLOAD_TIMEOUT is busy,
            # whatever its unload says (a threaded actor may answer unload before the call
            # queued ahead of it has taken the lock): it is ended, not kept
            busy = set(unread)
            if unread:
                try:
                    ready = set(self._ray.wait(list(unread.values()), num_returns=len(unread),
                                               timeout=ray_actors.UNLOAD_TIMEOUT)[0])
                except Exception:  # noqa: BLE001 - Ray stopped: keep none
                    ready = set()
                busy = {a for a, ref in unread.items() if ref not in ready}
            candidates = [a for a in range(len(self.actors))
                          if a not in busy and not any(c in self._dead for c in self.groups[a])]
            answers = answered(self._ray, [self.actors[a].unload.remote() for a in candidates])
            kept = {a for a, answered in zip(candidates, answers) if answered}
        for a, actor in enumerate(self.actors):
            if a in kept:
                IDLE_ACTORS.put(self._ray, self._reserved[a], actor)
            else:
                end_actor(self._ray, actor)
        self._dead.update(range(self.num_clients))
        self.actors = []
