"""The direct channels of :class:`~fedmcmc.engines.ray_transport.RayTransport` (the engine
option ``direct_channel``): one authenticated socket per actor (:mod:`.channel`) that
carries the driver's messages instead of Ray actor calls. :class:`DirectChannels` is the
transport's half that opens the channels, sends on them, waits for their replies and keeps
each actor's messages in the order they were sent."""

from __future__ import annotations

import os
import secrets
import time
import warnings
from typing import Any, Dict, List, Optional, Sequence

from ..callsite import user_stacklevel
from . import channel as channel_module
from .channel import SECRET_BYTES, ChannelClient, ChannelError, wait_for_frames
from .channel import dumps as channel_dumps
from .channel import loads as channel_loads
from .comm import Pending
from .ray_actors import actor_died

__all__ = ["DirectChannels", "DirectBatch", "ChannelWarning", "ray_uses_tls",
           "direct_channel_wanted", "root_cause"]


class DirectBatch:
    """The reply of one request on an actor's direct channel (:mod:`.channel`): read by
    whichever wait receives it, ``values`` (a ``(status, value)`` per client) or the
    ``failure`` of the channel."""

    __slots__ = ("actor", "values", "failure")

    def __init__(self, actor: int):
        self.actor, self.values, self.failure = actor, None, None

    @property
    def done(self) -> bool:
        return self.values is not None or self.failure is not None


class ChannelWarning(UserWarning):
    """A direct channel to a client actor could not be opened: that actor's messages go as
    Ray actor calls (the same messages and draws, more time per round)."""


def root_cause(error: BaseException) -> str:
    """``type: message`` of the exception an actor call raised in the actor (Ray wraps it)."""
    cause = getattr(error, "cause", None) or error
    return f"{type(cause).__name__}: {cause}"


def ray_uses_tls() -> bool:
    """Whether this process runs Ray with TLS (``RAY_USE_TLS``, read as Ray reads it)."""
    return os.environ.get("RAY_USE_TLS", "0").strip().lower() in ("1", "true")


def direct_channel_wanted(option: Optional[bool]) -> bool:
    """The engine option ``direct_channel``: ``None`` (default) and ``True`` are on (in TLS
    with Ray's certificates when Ray runs with TLS), ``False`` off."""
    return True if option is None else bool(option)


class DirectChannels:
    """The direct-channel half of :class:`~fedmcmc.engines.ray_transport.RayTransport` (a
    base class of it): the transport has ``actors`` (Ray actor handles, by actor), ``groups``
    (the clients of each) and ``_ray``, and calls :meth:`_init_direct_channels` in its
    constructor (which also starts ``_last_ray_call``, each actor's last actor call, that
    the transport's actor calls update)."""

    def _init_direct_channels(self, direct_channel: bool, channel_ports: Optional[tuple]) -> None:
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
        self._direct_waiting: Dict[int, Dict[int, DirectBatch]] = {}  # by sequence number
        self._last_ray_call: Dict[int, Any] = {}  # actor -> its last actor call's reference
        self.channel_failures: List[Dict[str, Any]] = []
        self._unreachable_hosts: set = set()

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
            self._channel_failed(actor, None, root_cause(error))
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
            if actor_died(ray, self.actors[actor]):
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

    def _send_direct(self, actor: int, method: str, calls: List[tuple]) -> Optional[DirectBatch]:
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
        batch = DirectBatch(actor)
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

    def _await_direct(self, batches: Sequence[DirectBatch], timeout: Optional[float],
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
