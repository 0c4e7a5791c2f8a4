"""The Ray transport's direct channels (``direct_channel``, ``fedmcmc.engines.channel``):
the driver's messages (``call_each``, ``call``) go through one authenticated socket per actor
once the actor has opened it; relays between actors stay actor calls.

What must hold: the same replies and draws as actor calls; each actor answers the driver's
messages in the order they were sent (a broadcast to an actor with an actor call still
running goes as an actor call behind it); a dead actor fails its clients' messages, not the
run's wait; a channel that cannot be opened leaves its actor on actor calls, with a warning
and a record in ``info``; the actors listen on loopback here.

Every test binds loopback only and shuts Ray down (the module fixture ``local_ray``)."""

import functools
import os
import time

import numpy as np
import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import fedmcmc as fm  # noqa: E402
from fedmcmc.engines.comm import ClientEndpoint, collect  # noqa: E402

from toy_problems import DIM, GAUSSIAN_MODEL, gaussian_federation  # noqa: E402

TIMEOUT = 120.0  # seconds any one message may take: bounds every run
SOURCE = functools.partial(np.zeros, (2, 1), np.float32)


def logbook_class():
    """An endpoint that keeps the messages it answered, in order (a class made in a function:
    Ray ships it by value; a test module's class would be imported by name in the actor)."""

    class Logbook(ClientEndpoint):
        def __init__(self, index, source):
            super().__init__(index, source)
            self.log = []

        def nap(self, seconds, word):
            time.sleep(seconds)
            self.log.append(word)
            return list(self.log)

        def note(self, word):
            self.log.append(word)
            return list(self.log)

        def fail(self):
            raise RuntimeError(f"client {self.index} refuses")

    return Logbook


def _kinds(pendings):
    from fedmcmc.engines.ray_engine import _is_direct

    return ["direct" if _is_direct(p.handle) else "call" for p in pendings]


def _opened(transport, clients):
    """A broadcast collected (the actors answer open_channel before it), so the next one
    goes through the channels."""
    values, failures = collect(transport, transport.call_each(clients, "ping", lambda c: ()),
                               TIMEOUT)
    assert failures == []


@pytest.mark.slow  # default suite: direct single messages, a dead actor (channel open)
def test_broadcasts_go_direct_and_wait_behind_a_running_actor_call(local_ray):
    from fedmcmc.engines.ray_engine import RayTransport

    transport = RayTransport([(logbook_class(), (s, SOURCE)) for s in range(3)],
                             groups=[[0, 1], [2]])
    try:
        _opened(transport, [0, 1, 2])
        pendings = transport.call_each([0, 1, 2], "note", lambda c: (f"first {c}",))
        assert _kinds(pendings) == ["direct"] * 3
        values, failures = collect(transport, pendings, TIMEOUT)
        assert failures == [] and values == [["first 0"], ["first 1"], ["first 2"]]
        # the actor of clients 0 and 1 has two actor calls queued (relays are actor calls):
        # the broadcast goes as an actor call behind them and sees both; client 2's actor
        # is free: direct
        napping = transport.relay(0, "nap", 0.5, "nap")
        queued = transport.relay(1, "note", "queued")
        assert _kinds([napping, queued]) == ["call", "call"]
        pendings = transport.call_each([0, 1, 2], "note", lambda c: ("broadcast",))
        assert _kinds(pendings) == ["call", "call", "direct"]
        values, failures = collect(transport, pendings, TIMEOUT)
        assert failures == []
        assert values == [["first 0", "nap", "broadcast"], ["first 1", "queued", "broadcast"],
                          ["first 2", "broadcast"]]
        assert transport.result(napping)[-1] == "nap" and transport.result(queued)[-1] == "queued"
        # once they are done, broadcasts go direct again
        pendings = transport.call_each([0, 1, 2], "note", lambda c: ("again",))
        assert _kinds(pendings) == ["direct"] * 3
        assert collect(transport, pendings, TIMEOUT)[1] == []
        placement = transport.placement()
        assert placement["ray_direct_channels"] == 2 and "ray_channel_failures" not in placement
        # the actors listen on the address Ray knows their node by: loopback here
        for channel in transport._direct.values():
            assert channel.address[0] == "127.0.0.1"
    finally:
        transport.close()


def test_single_messages_go_direct_and_relays_take_their_replies_as_values(local_ray):
    """``call`` (a hand-off visit) uses the channel too; an actor call sent while direct
    requests are unanswered is answered after them; a relay (actor to actor) whose argument
    is a reply that came through a channel gets its value, and fails, naming the cause, when
    that reply is a failure."""
    from fedmcmc.engines.comm import ClientFailure
    from fedmcmc.engines.ray_engine import RayTransport

    transport = RayTransport([(logbook_class(), (s, SOURCE)) for s in range(2)])
    try:
        _opened(transport, [0, 1])
        first = transport.call(0, "note", "one", tag="chain 0")
        second = transport.call(0, "note", "two", tag="chain 1")  # pipelined on one channel
        assert _kinds([first, second]) == ["direct", "direct"] and first.tag == "chain 0"
        # an actor call sent before those replies are read still comes after them
        behind = transport.relay(0, "note", "relayed")
        assert _kinds([behind]) == ["call"]
        assert transport.result(behind) == ["one", "two", "relayed"]
        ready, _ = transport.wait_every([first, second], TIMEOUT)
        assert len(ready) == 2
        assert transport.result(first) == ["one"] and transport.result(second) == ["one", "two"]
        relayed = transport.relay(1, "note", first)
        assert _kinds([relayed]) == ["call"]
        assert transport.result(relayed) == [["one"]]
        failing = transport.call(0, "fail")
        broken = transport.relay(1, "note", failing)
        with pytest.raises(ClientFailure, match="argument from client 0 failed.*refuses"):
            transport.result(broken)
        assert transport.counts["to_clients"] == 2 + 3  # relays are not counted
    finally:
        transport.close()


@pytest.mark.parametrize("connected", [
    True, pytest.param(False, marks=pytest.mark.slow)], ids=["channel-open", "before-connecting"])
def test_a_dead_actor_fails_its_clients_and_the_others_answer(local_ray, connected):
    """Its channel's end (or, when it died before the driver connected, the actor call that
    replaces the broadcast) reports it; no ChannelWarning: the channel is not at fault."""
    import warnings

    ray = local_ray
    from fedmcmc.engines.ray_engine import ChannelWarning, RayTransport

    transport = RayTransport([(logbook_class(), (s, SOURCE)) for s in range(3)])
    try:
        _opened(transport, [0, 1, 2])
        if connected:
            _opened(transport, [0, 1, 2])
            assert transport.placement()["ray_direct_channels"] == 3
        ray.kill(transport.actors[1], no_restart=True)  # not through the transport: a crash
        time.sleep(1.0)
        started = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("error", ChannelWarning)
            pendings = transport.call_each([0, 1, 2], "note", lambda c: ("after",))
            values, failures = collect(transport, pendings, TIMEOUT)
        assert time.perf_counter() - started < TIMEOUT / 2  # reported, not timed out
        assert values[0] == ["after"] and values[2] == ["after"] and values[1] is None
        assert [(p.client, reason.startswith("actor died")) for p, reason in failures] == \
            [(1, True)]
    finally:
        transport.close()


@pytest.mark.slow  # default suite: direct single messages, a dead actor (channel open)
def test_a_channel_that_cannot_be_opened_leaves_actor_calls_and_says_so(local_ray,
                                                                       monkeypatch):
    from fedmcmc.engines import ray_direct
    from fedmcmc.engines.ray_engine import ChannelWarning, RayTransport

    attempts = []

    class Firewalled:
        def __init__(self, address, secret, timeout=None, tls=None):
            attempts.append(address)
            raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(ray_direct, "ChannelClient", Firewalled)
    transport = RayTransport([(logbook_class(), (s, SOURCE)) for s in range(2)])
    try:
        _opened(transport, [0, 1])
        with pytest.warns(ChannelWarning, match="could not be opened"):
            pendings = transport.call_each([0, 1], "note", lambda c: ("hello",))
        assert _kinds(pendings) == ["call", "call"]
        values, failures = collect(transport, pendings, TIMEOUT)
        assert failures == [] and values == [["hello"], ["hello"]]
        placement = transport.placement()
        assert placement["ray_direct_channels"] == 0
        failures = placement["ray_channel_failures"]
        assert [f["actor"] for f in failures] == [0, 1]
        # one connection tried per host: the second actor of the same host is not tried
        assert "ConnectionRefusedError" in failures[0]["reason"]
        assert failures[1]["reason"].startswith("not tried") and len(attempts) == 1
    finally:
        transport.close()


def test_the_options_are_checked():
    algorithm = fm.FedZigZag(sample_interval=0.5)
    federation = gaussian_federation(seed=2, sizes=(15, 25, 40))
    cases = [("ray", {"direct_channel": "yes"}), ("local", {"direct_channel": True}),
             ("ray", {"channel_ports": (5000, 4000)}), ("ray", {"channel_ports": 5000}),
             ("ray", {"channel_ports": (0, 10)}), ("ray", {"channel_ports": (1.5, 10)}),
             ("ray", {"channel_ports": (True, 10)}), ("local", {"channel_ports": (1, 2)})]
    for engine, option in cases:
        with pytest.raises(ValueError, match=next(iter(option))):
            fm.sample(GAUSSIAN_MODEL, federation, algorithm, init=np.zeros(DIM, np.float32),
                      num_samples=5, engine=engine, **option)
    from fedmcmc.engines.options import check_channel_ports

    assert check_channel_ports((20000, 20010)) == (20000, 20010)
    assert check_channel_ports([np.int64(7), 7]) == (7, 7)


@pytest.mark.slow  # default suite: direct single messages, a dead actor (channel open)
def test_channels_listen_in_the_port_range_given_and_a_full_range_is_reported(local_ray):
    import socket

    from fedmcmc.engines.ray_engine import ChannelWarning, RayTransport

    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    upper = min(port + 200, 65535)
    try:
        transport = RayTransport([(logbook_class(), (s, SOURCE)) for s in range(2)],
                                 channel_ports=(port, upper))
        try:
            _opened(transport, [0, 1])
            _opened(transport, [0, 1])
            ports = sorted(channel.address[1] for channel in transport._direct.values())
            assert len(set(ports)) == 2 and port < ports[0] and ports[1] <= upper
        finally:
            transport.close()
        transport = RayTransport([(logbook_class(), (0, SOURCE))], channel_ports=(port, port))
        try:
            _opened(transport, [0])
            with pytest.warns(ChannelWarning, match=f"no free port in channel_ports {port}"):
                _opened(transport, [0])  # answered all the same, as an actor call
            [failure] = transport.placement()["ray_channel_failures"]
            assert failure["address"] is None and "OSError" in failure["reason"]
        finally:
            transport.close()
    finally:
        taken.close()


def test_with_ray_tls_the_channels_are_on_and_in_tls(monkeypatch):
    """Under Ray's TLS the channels are TLS too (test_channel.py checks the TLS channel
    itself): the option is on by default and True is accepted; False turns them off."""
    from fedmcmc.engines.ray_engine import direct_channel_wanted

    for tls in (None, "1"):
        if tls is None:
            monkeypatch.delenv("RAY_USE_TLS", raising=False)
        else:
            monkeypatch.setenv("RAY_USE_TLS", tls)
        assert direct_channel_wanted(None) and direct_channel_wanted(True)
        assert not direct_channel_wanted(False)