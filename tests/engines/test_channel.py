"""The direct channel between the driver and a client actor (``fedmcmc.engines.channel``),
without Ray: a :class:`ChannelServer` on loopback answering a :class:`ChannelClient`.

What must hold: only a peer holding the run's secret gets an answer (a wrong secret fails
the handshake on both sides, and the server goes on waiting for the right driver); every
frame is authenticated, in order and used once (a changed, reordered or replayed frame
ends the connection before its bytes are unpickled); requests are answered in order, also
when the driver sends the next before reading a reply; a closed peer is reported, not
waited for."""

import os
import pickle
import socket
import threading
import time

import numpy as np
import pytest
from certificates import openssl_certificate

from fedmcmc.engines import channel as ch
from fedmcmc.engines.channel import (
    SECRET_BYTES,
    ChannelClient,
    ChannelError,
    ChannelServer,
    wait_for_frames,
)

LOOPBACK = "127.0.0.1"
SECRET = bytes(range(SECRET_BYTES))


def doubling(payload: bytes) -> bytes:
    """The served function: a pickled array back, doubled."""
    return pickle.dumps(2 * pickle.loads(payload))


def reply_of(client: ChannelClient, timeout: float = 10.0):
    frames = wait_for_frames([client], timeout)[0]
    assert not isinstance(frames, Exception), frames
    return frames


def check_doubling_and_close(client: ChannelClient) -> None:
    """One request on ``client`` answered (doubled), then the channel closed."""
    client.send(pickle.dumps(np.ones(2)))
    [(_, payload)] = reply_of(client)
    np.testing.assert_array_equal(pickle.loads(payload), np.full(2, 2.0))
    client.close()


def test_requests_are_answered_in_order_with_their_sequence_numbers():
    server = ChannelServer(LOOPBACK, SECRET, doubling)
    assert server.address[0] == LOOPBACK and server.address[1] > 0
    client = ChannelClient(server.address, SECRET)
    try:
        # one at a time
        for k in range(3):
            sequence = client.send(pickle.dumps(np.arange(4.0) + k))
            assert sequence == k
            [(answered, payload)] = reply_of(client)
            assert answered == k
            np.testing.assert_array_equal(pickle.loads(payload), 2 * (np.arange(4.0) + k))
        # the next requests sent before the replies are read (a driver that stopped waiting):
        # answered in order
        sent = [client.send(pickle.dumps(np.full(3, float(k)))) for k in range(3, 6)]
        received = []
        deadline = time.monotonic() + 10
        while len(received) < 3 and time.monotonic() < deadline:
            received += reply_of(client)
        assert [sequence for sequence, _ in received] == sent
        for k, (_, payload) in zip(range(3, 6), received):
            np.testing.assert_array_equal(pickle.loads(payload), np.full(3, 2.0 * k))
        # nothing more: a non-blocking wait returns nothing
        assert wait_for_frames([client], 0.0) == {}
    finally:
        client.close()
        server.close()


def test_a_wrong_secret_gets_no_channel_and_the_right_driver_still_connects():
    server = ChannelServer(LOOPBACK, SECRET, doubling)
    try:
        with pytest.raises((ChannelError, OSError)):
            ChannelClient(server.address, bytes(SECRET_BYTES))  # all zeros
        # a connection that never completes the handshake is dropped too
        stray = socket.create_connection(server.address, timeout=5)
        stray.close()
        check_doubling_and_close(ChannelClient(server.address, SECRET))
    finally:
        server.close()


def test_an_impostor_actor_is_refused_by_the_driver():
    """The driver checks the actor's proof: a listener without the secret gets nothing sent."""
    listener = socket.create_server((LOOPBACK, 0))
    received = []

    def impostor():
        connection, _ = listener.accept()
        connection.sendall(os.urandom(SECRET_BYTES))
        received.append(ch._receive_exactly(connection, 2 * SECRET_BYTES))
        connection.sendall(os.urandom(32))  # not the proof
        time.sleep(0.5)
        connection.close()

    thread = threading.Thread(target=impostor)
    thread.start()
    try:
        with pytest.raises(ChannelError, match="actor's proof"):
            ChannelClient(listener.getsockname(), SECRET)
    finally:
        thread.join(10)
        listener.close()


def _raw_channel():
    """A server and a client's socket and framing, to send hand-made frames."""
    calls = []

    def handle(payload):
        calls.append(payload)
        return payload

    server = ChannelServer(LOOPBACK, SECRET, handle)
    client = ChannelClient(server.address, SECRET)
    return server, client, client._framing, calls


def _frame(framing, sequence, payload, tag=None):
    header = ch._HEADER.pack(sequence, len(payload))
    if tag is None:
        tag = ch._tag(framing.key, framing.send_label, header + payload)
    return header + payload + tag


@pytest.mark.parametrize("tamper", ["changed byte", "wrong key", "replayed", "skipped"])
def test_a_frame_that_fails_the_checks_ends_the_connection_unread(tamper):
    server, client, framing, calls = _raw_channel()
    try:
        client.send(b"first")
        assert reply_of(client)[0][1] == b"first"
        if tamper == "changed byte":
            wire = bytearray(_frame(framing, 1, b"second"))
            wire[ch._HEADER.size] ^= 1
        elif tamper == "wrong key":
            header = ch._HEADER.pack(1, 6)
            wire = header + b"second" + ch._tag(bytes(32), framing.send_label, header + b"second")
        elif tamper == "replayed":
            wire = _frame(framing, 0, b"first")
        else:
            wire = _frame(framing, 2, b"second")
        framing.sock.sendall(bytes(wire))
        outcome = wait_for_frames([client], 10.0)[0]
        assert isinstance(outcome, ChannelError)
        assert calls == [b"first"]  # the bad frame was never handed on
    finally:
        client.close()
        server.close()


def test_the_driver_refuses_a_forged_reply():
    """A reply whose tag is not the actor's (someone else writing on the connection) closes
    the channel on the driver's side before it is unpickled."""
    server = ChannelServer(LOOPBACK, SECRET, lambda payload: payload)
    client = ChannelClient(server.address, SECRET)
    try:
        framing = client._framing
        # a frame as the actor would send it, under the wrong key
        header = ch._HEADER.pack(0, 4)
        forged = header + b"evil" + ch._tag(bytes(32), framing.receive_label, header + b"evil")
        framing.buffer += forged
        outcome = wait_for_frames([client], 0.0)[0]
        assert isinstance(outcome, ChannelError) and "authentication" in str(outcome)
    finally:
        client.close()
        server.close()


def test_a_closed_server_is_reported_to_the_waiting_driver():
    release = threading.Event()

    def slow(payload):
        release.wait(10)
        return payload

    server = ChannelServer(LOOPBACK, SECRET, slow)
    client = ChannelClient(server.address, SECRET)
    try:
        client.send(b"x")
        assert wait_for_frames([client], 0.2) == {}  # not answered yet: nothing, no error
        server.close()  # the actor ends its channel (or its process ends)
        outcome = wait_for_frames([client], 10.0)[0]
        assert isinstance(outcome, ChannelError)
        with pytest.raises(ChannelError):
            client.send(b"y")
    finally:
        release.set()
        client.close()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="secret"):
        ChannelServer(LOOPBACK, b"short", doubling)


def test_sending_to_an_actor_that_stopped_reading_times_out(monkeypatch):
    """The driver never blocks for ever on a stuck actor: a request whose bytes the actor
    does not take within SEND_TIMEOUT closes the channel as failed."""
    monkeypatch.setattr(ch, "SEND_TIMEOUT", 1.0)
    release = threading.Event()

    def stuck(payload):
        release.wait(30)
        return b""

    server = ChannelServer(LOOPBACK, SECRET, stuck)
    client = ChannelClient(server.address, SECRET)
    try:
        client.send(b"x")  # taken, then the actor is stuck in it
        started = time.monotonic()
        with pytest.raises(ChannelError, match="sending failed"):
            client.send(bytes(64 << 20))  # more than the socket buffers hold
        assert time.monotonic() - started < 20
        assert client.closed is not None
    finally:
        release.set()
        client.close()
        server.close()


def test_closing_an_unused_listener_ends_its_thread_and_refuses_connections():
    """The Ray engine closes a listener the driver never connected to when the run ends (the
    listener itself waits without a time limit: the driver connects with its next message)."""
    server = ChannelServer(LOOPBACK, SECRET, doubling)
    time.sleep(0.1)
    server.close()
    server._thread.join(5)
    assert not server._thread.is_alive()
    with pytest.raises(OSError):
        ChannelClient(server.address, SECRET, timeout=2)


def test_a_port_range_is_honoured_and_its_exhaustion_named():
    taken = socket.create_server((LOOPBACK, 0))
    port = taken.getsockname()[1]
    try:
        with pytest.raises(OSError, match=f"no free port in channel_ports {port}-{port}"):
            ChannelServer(LOOPBACK, SECRET, doubling, ports=(port, port))
        upper = min(port + 200, 65535)
        server = ChannelServer(LOOPBACK, SECRET, doubling, ports=(port, upper))
        try:
            assert port < server.address[1] <= upper  # the first free one after the taken
            client = ChannelClient(server.address, SECRET)
            client.send(pickle.dumps(np.ones(1)))
            assert pickle.loads(reply_of(client)[0][1]) == 2.0
            client.close()
        finally:
            server.close()
    finally:
        taken.close()


# ------------------------------------------------------------------------------------ TLS

@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    import shutil

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    directory = str(tmp_path_factory.mktemp("tls"))
    cert, key = openssl_certificate(directory, "cluster")
    other_cert, other_key = openssl_certificate(directory, "other")
    return {"cluster": {"RAY_TLS_SERVER_CERT": cert, "RAY_TLS_SERVER_KEY": key,
                        "RAY_TLS_CA_CERT": cert},
            "other": {"RAY_TLS_SERVER_CERT": other_cert, "RAY_TLS_SERVER_KEY": other_key,
                      "RAY_TLS_CA_CERT": other_cert}}


def test_with_tls_frames_of_any_size_arrive_in_order(tls_files):
    """Ray's TLS files make both ends TLS: requests (pipelined, up to 3 MB, more than one TLS
    record and more than one read) are answered in order, the bytes on the wire encrypted."""
    server = ChannelServer(LOOPBACK, SECRET, doubling,
                           tls=ch.tls_context(True, tls_files["cluster"]))
    client = ChannelClient(server.address, SECRET, tls=ch.tls_context(False, tls_files["cluster"]))
    try:
        assert client._framing.sock.version() in ("TLSv1.2", "TLSv1.3")
        sizes = (1, 20_000, 400_000, 3)
        sent = [client.send(pickle.dumps(np.full(n, float(k)))) for k, n in enumerate(sizes)]
        received = []
        deadline = time.monotonic() + 30
        while len(received) < len(sent) and time.monotonic() < deadline:
            # a large frame takes several reads: a wait may return before it is complete
            frames = wait_for_frames([client], 10.0).get(0, [])
            assert not isinstance(frames, Exception), frames
            received += frames
        assert [sequence for sequence, _ in received] == sent
        for k, ((_, payload), n) in enumerate(zip(received, sizes)):
            np.testing.assert_array_equal(pickle.loads(payload), np.full(n, 2.0 * k))
        assert wait_for_frames([client], 0.0) == {}
    finally:
        client.close()
        server.close()


def test_with_tls_a_peer_without_the_cas_certificate_gets_no_channel(tls_files):
    """The actor refuses a driver without TLS, or with a certificate of another CA (and goes
    on waiting for the right one); the driver refuses an actor of another CA."""
    server = ChannelServer(LOOPBACK, SECRET, doubling,
                           tls=ch.tls_context(True, tls_files["cluster"]))
    try:
        with pytest.raises((ChannelError, OSError)):
            ChannelClient(server.address, SECRET, timeout=5.0)  # plain TCP, right secret
        with pytest.raises((ChannelError, OSError)):
            ChannelClient(server.address, SECRET, timeout=5.0,
                          tls=ch.tls_context(False, tls_files["other"]))
        check_doubling_and_close(ChannelClient(server.address, SECRET,
                                               tls=ch.tls_context(False, tls_files["cluster"])))
    finally:
        server.close()
    impostor = ChannelServer(LOOPBACK, SECRET, doubling,
                             tls=ch.tls_context(True, tls_files["other"]))
    try:
        with pytest.raises((ChannelError, OSError)):
            ChannelClient(impostor.address, SECRET, timeout=5.0,
                          tls=ch.tls_context(False, tls_files["cluster"]))
    finally:
        impostor.close()


def test_tls_context_names_what_is_missing(tls_files, tmp_path):
    with pytest.raises(ChannelError, match="RAY_TLS_SERVER_KEY, RAY_TLS_CA_CERT"):
        ch.tls_context(True, {"RAY_TLS_SERVER_CERT": tls_files["cluster"]["RAY_TLS_SERVER_CERT"]})
    unreadable = dict(tls_files["cluster"], RAY_TLS_CA_CERT=str(tmp_path / "absent.crt"))
    with pytest.raises(ChannelError, match="cannot load"):
        ch.tls_context(False, unreadable)
