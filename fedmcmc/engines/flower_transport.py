"""The transport of ``engine="flower"``: :class:`FlowerTransport` implements
:class:`~fedmcmc.engines.comm.Transport` with client endpoints held by the sites' executors
(:mod:`fedmcmc.engines.flower_site`), one Flower :class:`~flwr.app.Message` per protocol
message, sent and received through the run's :class:`~fedmcmc.engines.flower_engine.FlowerLink`.
The engine and its options: :mod:`fedmcmc.engines.flower_engine`."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence

from .comm import ClientFailure, Pending, Transport
from .flower_site import MESSAGE_TYPE, decode_reply, encode_request
from .interning import intern_arguments

__all__ = ["FlowerTransport", "POLL_INTERVAL"]

#: seconds between two pulls of the replies a wait is waiting for (one HTTP request each)
POLL_INTERVAL = 0.05


class FlowerTransport(Transport):
    """Client ``s``'s endpoint on the SuperNode of site ``sites[s]``.

    On creation: waits (``timeout`` seconds) for a SuperNode per site, asks each node its
    site (``hello``), and sends each client its ``create`` message (its endpoint class and
    constructor arguments: its loader runs there); a client whose endpoint fails to build
    fails every message with "failed to start: ...". A SuperNode answers its messages one at
    a time, in the order they were sent. ``local``: the
    :class:`~fedmcmc.engines.flower_engine.LocalFlowerFederation` whose site processes this
    transport may check (a site whose process ended fails its pending messages at once) and
    end (:meth:`kill`).
    """

    def __init__(self, specs: Sequence[tuple], link, *, sites: Sequence[str], timeout: float,
                 local=None, audit: bool = False):
        super().__init__(len(specs), audit)
        self.link = link
        self.local = local
        self.sites = [str(s) for s in sites]
        self._replies: Dict[str, Any] = {}
        self._dead: set = set()
        self.run_key = f"{link.run_id}"
        self.node_of = self._find_sites(timeout)
        shipped = intern_arguments(specs)
        # the endpoints are built on their sites before any protocol message (not counted:
        # as a Ray actor's creation), and awaited: a SuperNode does not take its messages
        # in the order they were sent. A client whose endpoint failed fails its messages.
        self._start_failures: Dict[int, str] = {}
        handles = self._push([(client, ("create", self.run_key, client, shipped[client][0],
                                        tuple(shipped[client][1])))
                              for client in range(self.num_clients)])
        created = [Pending(client, "create", handle) for client, handle in enumerate(handles)]
        ready, waiting = self.wait_every(created, timeout)
        for pending in waiting:
            self._start_failures[pending.client] = f"no answer within {timeout:g} s"
        for pending in ready:
            reply = self._replies.pop(pending.handle, None)
            status, value = ("error", "its site's process ended") if reply is None else \
                decode_reply(reply)
            if status != "ok":
                self._start_failures[pending.client] = str(value)

    # -- set-up
    def _find_sites(self, timeout: float) -> Dict[int, int]:
        deadline = time.monotonic() + timeout
        wanted = set(self.sites)
        while True:
            nodes = self.link.node_ids()
            if len(nodes) >= len(wanted):
                break
            self._check_local_sites()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(nodes)} SuperNode(s) connected to the SuperLink at "
                    f"{self.link.address} within {timeout:g} s; {len(wanted)} sites wanted "
                    f"({sorted(wanted)})")
            time.sleep(0.2)
        ids = self.link.grid.push_messages(
            [self._message(node, ("hello",)) for node in nodes])
        site_of_node: Dict[int, str] = {}
        waiting = dict(zip(ids, nodes))
        while waiting:
            for reply in self.link.grid.pull_messages(list(waiting)):
                node = waiting.pop(reply.metadata.reply_to_message_id, None)
                status, value = decode_reply(reply)
                if node is not None and status == "ok":
                    site_of_node[node] = value["site"]
            if set(site_of_node.values()) >= wanted:
                break  # nodes of other sites (or a misconfigured one) need not answer
            self._check_local_sites()
            if time.monotonic() > deadline:
                missing = sorted(wanted - set(site_of_node.values()))
                raise TimeoutError(
                    f"no site executor answered for sites {missing} within {timeout:g} s "
                    f"(sites that answered: {sorted(site_of_node.values())}); each site runs "
                    "`python -m fedmcmc.engines.flower_site --site NAME ...`")
            time.sleep(POLL_INTERVAL)
        node_of_site: Dict[str, int] = {}
        for node, site in site_of_node.items():
            if site in wanted and site in node_of_site:
                raise ValueError(f"two SuperNodes say they are site {site!r}")
            node_of_site[site] = node
        return {client: node_of_site[site] for client, site in enumerate(self.sites)}

    def _check_local_sites(self) -> None:
        if self.local is None:
            return
        ended = [s for s in range(len(self.local.sites)) if not self.local.site_alive(s)]
        if ended or self.local.superlink.poll() is not None:
            raise RuntimeError(f"the local Flower federation did not start: site processes "
                               f"{ended} ended" + ("" if self.local.superlink.poll() is None
                                                   else "; the SuperLink ended"))

    # -- messages
    def _message(self, node: int, request: tuple):
        from flwr.app import Message

        return Message(encode_request(request), node, MESSAGE_TYPE,
                       group_id=self.run_key)

    def _push(self, calls: List[tuple]) -> List[Optional[str]]:
        """Push one message per ``(client, request)``; the message ids (None for a client
        already dead)."""
        live = [(client, request) for client, request in calls if client not in self._dead]
        ids = iter(self.link.grid.push_messages(
            [self._message(self.node_of[client], request) for client, request in live])
            if live else [])
        return [None if client in self._dead else next(ids) for client, _ in calls]

    def _push_calls(self, calls: List[tuple]) -> List[Any]:
        """:meth:`_push` of protocol calls; a client whose endpoint failed to start gets a
        :class:`_Failed` handle instead of a message."""
        sent = [(c, r) for c, r in calls if c not in self._start_failures]
        handles = iter(self._push(sent))
        return [_Failed(self._start_failures[c]) if c in self._start_failures
                else next(handles) for c, _ in calls]

    def call(self, client: int, method: str, *args, tag: Any = None) -> Pending:
        self.record("to_clients", client, method, args)
        [handle] = self._push_calls([(client, ("call", self.run_key, client, method, args))])
        return Pending(client, method, handle, tag)

    def call_each(self, clients, method, args_of):
        clients = list(clients)
        calls = []
        for client in clients:
            args = tuple(args_of(client))
            self.record("to_clients", client, method, args)
            calls.append((client, ("call", self.run_key, client, method, args)))
        return [Pending(client, method, handle)
                for (client, _), handle in zip(calls, self._push_calls(calls))]

    def relay(self, client: int, method: str, *args, tag: Any = None) -> Pending:
        raise NotImplementedError(
            "engine='flower' relays no message between sites (the decentralised algorithms "
            "are refused on it)")

    def _pull(self, handles: List[str]) -> None:
        wanted = [h for h in handles
                  if isinstance(h, str) and h not in self._replies]
        if not wanted:
            return
        for reply in self.link.grid.pull_messages(wanted):
            self._replies[reply.metadata.reply_to_message_id] = reply

    def _answered(self, pending: Pending) -> bool:
        return (not isinstance(pending.handle, str) or pending.handle in self._replies
                or not self.alive(pending.client))

    def wait(self, pendings, timeout):
        pendings = list(pendings)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._pull([p.handle for p in pendings])
            ready = [p for p in pendings if self._answered(p)]
            if ready:
                chosen = {id(p) for p in ready}
                return ready, [p for p in pendings if id(p) not in chosen]
            if deadline is not None and time.monotonic() >= deadline:
                return [], pendings
            time.sleep(POLL_INTERVAL if deadline is None
                       else max(0.0, min(POLL_INTERVAL, deadline - time.monotonic())))

    def wait_every(self, pendings, timeout):
        pendings = list(pendings)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._pull([p.handle for p in pendings])
            if all(self._answered(p) for p in pendings) or (
                    deadline is not None and time.monotonic() >= deadline):
                ready = [p for p in pendings if self._answered(p)]
                chosen = {id(p) for p in ready}
                return ready, [p for p in pendings if id(p) not in chosen]
            time.sleep(POLL_INTERVAL)

    def result(self, pending: Pending) -> Any:
        handle = pending.handle
        site = self.sites[pending.client]
        if handle is None:
            raise ClientFailure(pending.client, f"site {site!r} is dead (its process ended)")
        if isinstance(handle, _Failed):
            raise ClientFailure(pending.client, f"failed to start: {handle.reason}")
        if handle not in self._replies:
            ready, _ = self.wait([pending], 60.0)
            if not ready:
                raise ClientFailure(pending.client, "no answer within 60 s")
        reply = self._replies.pop(handle, None)
        if reply is None:
            node = self.node_of[pending.client]
            raise ClientFailure(pending.client, f"site {site!r}'s process ended (node {node})")
        status, value = decode_reply(reply)
        if status != "ok":
            raise ClientFailure(pending.client, value)
        self.record("from_clients", pending.client, pending.method, value)
        return value

    def alive(self, client: int) -> bool:
        if client in self._dead:
            return False
        if self.local is not None and not self.local.site_alive(int(self.sites[client])):
            self._dead.add(client)
            return False
        return True

    def kill(self, client: int) -> None:
        """End client ``client``'s site: on the local federation its processes are killed
        (as in a crash); on a running SuperLink the client is only no longer sent to."""
        self._dead.add(client)
        if self.local is not None:
            self.local.kill_site(int(self.sites[client]))

    def placement(self) -> Dict[str, Any]:
        return {"flower_run_id": self.link.run_id, "flower_address": self.link.address,
                "flower_sites": list(self.sites),
                "flower_nodes": [int(self.node_of[c]) for c in range(self.num_clients)]}

    def close(self) -> None:
        """The run's end: nothing more is sent (a message after the run's end would never
        be answered, and its SuperNode would wait for the reply for ever); the sites drop a
        run's endpoints a few runs later (``flower_site.KEPT_RUNS``)."""
        self._dead.update(range(self.num_clients))


class _Failed:
    """The handle of a message not sent: its client's endpoint failed to start."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason
