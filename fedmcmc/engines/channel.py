"""Direct channels between the driver and its Ray client actors: one authenticated TCP
connection per actor, for the driver's messages to the actor's clients.

An actor call costs Ray about 0.8 ms of the actor's CPU and 0.45 ms of the driver's here
(docs/reference/speed.md), whatever the message: a Fed-PDMC event round (one message per
worker, a few hundred bytes each way) is mostly that, and a run has thousands of rounds. A
socket round trip of the same bytes costs tens of microseconds. So the Ray engine opens,
per actor, a :class:`ChannelServer` in the actor (a thread serving one connection) and a
:class:`ChannelClient` in the driver, and sends its messages (``Transport.call_each`` and
``Transport.call``: broadcast rounds, hand-off visits, set-up questions) through them;
relays between actors and the actor's life cycle (creating it, loading and unloading its
clients) stay Ray calls (``ray_engine.RayTransport``).

Security. The actor listens on the address Ray knows its node by (loopback for the local
instance the engine starts), on a port the system picks, for one connection. A per-run
secret of 32 random bytes, sent to the actor in a Ray call (token-authenticated, see
``ray_security``), authenticates both ends: each proves it holds the secret by an
HMAC-SHA256 of both sides' random nonces (:func:`_prove`), and every frame after that
carries an HMAC-SHA256 tag, under a key derived from the secret and the nonces, of its
direction, its sequence number and its bytes. A frame that fails the check, comes out of
order, or replays an earlier one ends the connection before its bytes are unpickled.
Without TLS the bytes are not encrypted: they are what Ray's own calls carry (positions,
per-chain scalars, proposals; never a client's rows). When Ray runs with TLS
(``RAY_USE_TLS``) the channel is TLS too, with Ray's own certificates
(:func:`tls_context`): each end presents the certificate of ``RAY_TLS_SERVER_CERT`` and
accepts only a peer whose certificate the CA of ``RAY_TLS_CA_CERT`` signed, and the secret's
handshake and tags run inside the encrypted connection.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import select
import socket
import ssl
import struct
import threading
from typing import Callable, Dict, List, Optional, Sequence, Tuple

__all__ = ["ChannelError", "ChannelServer", "ChannelClient", "wait_for_frames",
           "SECRET_BYTES", "tls_context", "TLS_ENVIRONMENT"]

#: bytes of the per-run secret, of each side's nonce and of each tag
SECRET_BYTES = 32
_TAG_BYTES = 32
#: a frame's header: its sequence number and its payload's length
_HEADER = struct.Struct("!QQ")
#: frames larger than this are refused before being read (a message is parameter-sized)
MAX_FRAME_BYTES = 1 << 30
_TO_ACTOR, _TO_DRIVER = b"to actor", b"to driver"
#: seconds each side gives the other to complete the handshake
HANDSHAKE_TIMEOUT = 10.0
#: seconds the driver waits for an actor to take a request's bytes (an actor reads its next
#: request once it has answered the last): beyond it the channel is closed as failed
SEND_TIMEOUT = 120.0


#: the environment variables Ray reads its TLS files from (certificate, key, CA), read here too
TLS_ENVIRONMENT = ("RAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_KEY", "RAY_TLS_CA_CERT")


def tls_context(server_side: bool, environ: Optional[Dict[str, str]] = None
                ) -> ssl.SSLContext:
    """The TLS context of a channel's end, from Ray's TLS files (:data:`TLS_ENVIRONMENT` in
    ``environ``, default ``os.environ``): this end presents the certificate and key, and
    requires the peer's certificate to be signed by the CA (TLS 1.2 or later). The peer's
    host name is not checked (a node's certificate need not name the address it listens
    on); the CA and then the run's secret say who it is. ``ChannelError`` if a variable is
    unset or a file cannot be read."""
    environ = os.environ if environ is None else environ
    missing = [name for name in TLS_ENVIRONMENT if not environ.get(name)]
    if missing:
        raise ChannelError(f"TLS for the direct channel needs {', '.join(missing)} "
                           "(the files Ray's TLS uses)")
    certificate, key, authority = (environ[name] for name in TLS_ENVIRONMENT)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server_side
                             else ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certificate, key)
        context.load_verify_locations(authority)
    except (OSError, ssl.SSLError) as error:
        raise ChannelError(f"TLS for the direct channel: cannot load Ray's TLS files "
                           f"({type(error).__name__}: {error})") from error
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    if server_side:
        # no TLS 1.3 session tickets after the handshake: a record that is not data would
        # make the driver's select wake and its read wait for data that may not be coming
        context.num_tickets = 0
    return context


class ChannelError(ConnectionError):
    """The channel is closed, or its peer failed authentication or sent a bad frame."""


def _tag(key: bytes, label: bytes, data: bytes) -> bytes:
    return hmac.new(key, label + data, hashlib.sha256).digest()


def _prove(secret: bytes, role: bytes, nonces: bytes) -> bytes:
    """The handshake's proof that ``role`` (b"driver" or b"actor") holds ``secret``."""
    return _tag(secret, b"fedmcmc channel proof " + role, nonces)


def _session_key(secret: bytes, nonces: bytes) -> bytes:
    return _tag(secret, b"fedmcmc channel session", nonces)


def _receive_exactly(sock: socket.socket, count: int) -> bytes:
    chunks, left = [], count
    while left:
        chunk = sock.recv(left)
        if not chunk:
            raise ChannelError("the peer closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class _Framing:
    """Authenticated, numbered frames over a connected socket (after the handshake)."""

    def __init__(self, sock: socket.socket, key: bytes, send_label: bytes, receive_label: bytes):
        self.sock, self.key = sock, key
        self.send_label, self.receive_label = send_label, receive_label
        self.sent = 0  # sequence number of the next frame sent
        self.received = 0  # sequence number the next frame received must have
        self.buffer = bytearray()
        self.closed: Optional[str] = None

    def send(self, payload: bytes) -> int:
        """Send ``payload`` as the next frame; returns its sequence number."""
        if self.closed is not None:
            raise ChannelError(self.closed)
        header = _HEADER.pack(self.sent, len(payload))
        try:
            self.sock.sendall(header + payload + _tag(self.key, self.send_label, header + payload))
        except OSError as error:
            self.fail(f"sending failed ({type(error).__name__}: {error})")
        self.sent += 1
        return self.sent - 1

    def fail(self, reason: str) -> None:
        """Close the channel for good and raise :class:`ChannelError` with ``reason``."""
        if self.closed is None:
            self.closed = reason
            _close_socket(self.sock)
        raise ChannelError(self.closed)

    def read_available(self) -> None:
        """Move the bytes the socket has (it is readable) into the buffer; raise
        :class:`ChannelError` if the peer closed the connection."""
        if self.closed is not None:
            raise ChannelError(self.closed)
        try:
            chunk = self.sock.recv(1 << 16)
        except OSError as error:
            self.fail(f"receiving failed ({type(error).__name__}: {error})")
        if not chunk:
            self.fail("the peer closed the channel")
        self.buffer += chunk
        # TLS: bytes already decrypted stay in the SSL object, where select does not see
        # them; take them all now
        pending = getattr(self.sock, "pending", None)
        try:
            while pending is not None and pending() > 0:
                self.buffer += self.sock.recv(pending())
        except OSError as error:
            self.fail(f"receiving failed ({type(error).__name__}: {error})")

    def frames(self) -> List[Tuple[int, bytes]]:
        """The complete frames in the buffer, each checked (tag, order), as
        ``(sequence number, payload)``."""
        out = []
        while len(self.buffer) >= _HEADER.size:
            sequence, length = _HEADER.unpack_from(self.buffer)
            if length > MAX_FRAME_BYTES:
                self.fail(f"a frame of {length} bytes was refused (at most {MAX_FRAME_BYTES})")
            end = _HEADER.size + length + _TAG_BYTES
            if len(self.buffer) < end:
                break
            body = bytes(self.buffer[:_HEADER.size + length])
            tag = bytes(self.buffer[_HEADER.size + length:end])
            del self.buffer[:end]
            if not hmac.compare_digest(tag, _tag(self.key, self.receive_label, body)):
                self.fail("a frame failed authentication")
            if sequence != self.received:
                self.fail(f"frame {sequence} arrived where {self.received} was due")
            self.received += 1
            out.append((sequence, body[_HEADER.size:]))
        return out

    def receive(self) -> List[Tuple[int, bytes]]:
        """Block until at least one frame has arrived; return those that have, in order (a
        driver that stopped waiting for a reply may have sent the next request)."""
        while True:
            ready = self.frames()
            if ready:
                return ready
            self.read_available()


def _close_socket(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def _listen(host: str, ports: Optional[Tuple[int, int]]) -> socket.socket:
    """A listening socket on ``host``: on a port the system picks (``ports`` None), else on
    the first free port of ``ports = (first, last)``, both included (a firewall rule can
    then name the range)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if ports is None:
        return socket.create_server((host, 0), family=family)
    first, last = ports
    for port in range(first, last + 1):
        try:
            return socket.create_server((host, port), family=family)
        except OSError:
            continue
    raise OSError(f"no free port in channel_ports {first}-{last} on {host}")


class ChannelServer:
    """The actor's end: listens on ``(host, port chosen by the system)`` for the driver holding
    ``secret``, then answers each request frame with ``handle(payload) -> reply`` (both
    bytes), one after the other, until the driver closes the connection or :meth:`close`.
    Connections that fail the handshake are dropped and the next one is awaited, until one
    succeeds, :meth:`close` is called or ``accept_timeout`` seconds pass (default None: no
    limit; the Ray engine closes an unused listener when the run ends, with the actor or by
    ``unload``, since the driver may connect long after asking: it connects with its next
    message to the actor). ``ports``: ``(first, last)`` to listen on the first free port of
    that range instead of one the system picks. ``tls``: a :func:`tls_context` (server side)
    to wrap each connection in TLS before the secret's handshake."""

    def __init__(self, host: str, secret: bytes, handle: Callable[[bytes], bytes],
                 accept_timeout: Optional[float] = None,
                 ports: Optional[Tuple[int, int]] = None,
                 tls: Optional[ssl.SSLContext] = None):
        if len(secret) != SECRET_BYTES:
            raise ValueError(f"secret must be {SECRET_BYTES} bytes, got {len(secret)}")
        self._secret, self._handle, self._tls = secret, handle, tls
        self._listener = _listen(host, ports)
        self._listener.settimeout(accept_timeout)
        self.address: Tuple[str, int] = (host, self._listener.getsockname()[1])
        self._connection: Optional[socket.socket] = None
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="fedmcmc-channel", daemon=True)
        self._thread.start()

    def _accept(self) -> Optional[_Framing]:
        """The first connection that proves it holds the secret (None: timed out or closed)."""
        try:
            while not self._closed:
                sock, _ = self._listener.accept()
                try:
                    sock.settimeout(HANDSHAKE_TIMEOUT)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    if self._tls is not None:  # TLS's handshake first (SSLError is an OSError)
                        sock = self._tls.wrap_socket(sock, server_side=True)
                    nonce = os.urandom(SECRET_BYTES)
                    sock.sendall(nonce)
                    answer = _receive_exactly(sock, SECRET_BYTES + _TAG_BYTES)
                    nonces = nonce + answer[:SECRET_BYTES]
                    if not hmac.compare_digest(answer[SECRET_BYTES:],
                                               _prove(self._secret, b"driver", nonces)):
                        raise ChannelError("the driver's proof failed")
                    sock.sendall(_prove(self._secret, b"actor", nonces))
                    sock.settimeout(None)
                except (OSError, ChannelError):
                    _close_socket(sock)
                    continue
                self._connection = sock
                return _Framing(sock, _session_key(self._secret, nonces), _TO_DRIVER, _TO_ACTOR)
        except OSError:  # accept timed out, or close() closed the listener
            return None
        finally:
            _close_socket(self._listener)
        return None

    def _serve(self) -> None:
        framing = self._accept()
        if framing is None:
            return
        try:
            while True:
                for _, request in framing.receive():
                    framing.send(self._handle(request))
        except (ChannelError, OSError):
            pass
        finally:
            _close_socket(framing.sock)

    def close(self) -> None:
        """Stop listening and end the connection (the serving thread then ends)."""
        self._closed = True
        _close_socket(self._listener)
        if self._connection is not None:
            _close_socket(self._connection)


class ChannelClient:
    """The driver's end of an actor's channel: :meth:`send` a request frame, then collect its
    reply with :func:`wait_for_frames` (replies come in the order of the requests).
    ``tls``: a :func:`tls_context` (client side), for an actor that listens with TLS."""

    def __init__(self, address: Sequence, secret: bytes, timeout: float = HANDSHAKE_TIMEOUT,
                 tls: Optional[ssl.SSLContext] = None):
        host, port = address
        sock = socket.create_connection((str(host), int(port)), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                sock = tls.wrap_socket(sock)
            nonce = _receive_exactly(sock, SECRET_BYTES)
            own = os.urandom(SECRET_BYTES)
            nonces = nonce + own
            sock.sendall(own + _prove(secret, b"driver", nonces))
            proof = _receive_exactly(sock, _TAG_BYTES)
            if not hmac.compare_digest(proof, _prove(secret, b"actor", nonces)):
                raise ChannelError("the actor's proof failed")
            # sending never blocks the driver for ever on an actor that stopped reading
            # (receiving waits in select, which has its own timeout)
            sock.settimeout(SEND_TIMEOUT)
        except BaseException:
            _close_socket(sock)
            raise
        self._framing = _Framing(sock, _session_key(secret, nonces), _TO_ACTOR, _TO_DRIVER)
        #: the actor's listening address
        self.address: Tuple[str, int] = (str(host), int(port))

    @property
    def closed(self) -> Optional[str]:
        """Why the channel is closed, or None while it is open."""
        return self._framing.closed

    def fileno(self) -> int:
        return self._framing.sock.fileno()

    def send(self, payload: bytes) -> int:
        """Send one request; returns its sequence number (its reply's too)."""
        return self._framing.send(payload)

    def close(self) -> None:
        if self._framing.closed is None:
            self._framing.closed = "closed by the driver"
            _close_socket(self._framing.sock)


def wait_for_frames(channels: Sequence[ChannelClient], timeout: Optional[float]
                    ) -> Dict[int, object]:
    """Wait up to ``timeout`` seconds (None: no limit; 0: do not block) until at least one of
    ``channels`` has something, and read what they have. Returns, by position in
    ``channels``, the list of complete ``(sequence number, payload)`` frames received, or the
    :class:`ChannelError` that closed that channel; positions with nothing yet are absent."""
    out: Dict[int, object] = {}
    pending = {}
    for position, channel in enumerate(channels):
        framing = channel._framing
        if framing.closed is not None:
            out[position] = ChannelError(framing.closed)
            continue
        try:
            ready = framing.frames()  # complete frames already buffered
        except ChannelError as error:
            out[position] = error
            continue
        if ready:
            out[position] = ready
        else:
            pending[framing.sock.fileno()] = position
    if out or not pending:
        return out
    try:
        readable, _, _ = select.select(list(pending), [], [], timeout)
    except (OSError, ValueError) as error:  # a socket closed under us
        for position in pending.values():
            out[position] = ChannelError(f"waiting failed ({type(error).__name__}: {error})")
        return out
    for fileno in readable:
        position = pending[fileno]
        framing = channels[position]._framing
        try:
            framing.read_available()
            frames = framing.frames()
        except ChannelError as error:
            out[position] = error
            continue
        if frames:
            out[position] = frames
    return out


def dumps(value) -> bytes:
    """``value`` pickled for a frame (the standard pickle, else cloudpickle, as Ray does)."""
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        from ray import cloudpickle

        return cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def loads(payload: bytes):
    """What :func:`dumps` made; call only on a frame that passed authentication."""
    return pickle.loads(payload)
