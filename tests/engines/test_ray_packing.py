"""Several client endpoints per Ray actor (issue 18: Ray set-up on one machine).

``clients_per_actor`` (default ``"auto"``, as ../shared/CONTRACT.md describes engine="ray":
one actor per CPU of the cluster, so clients are packed when they outnumber the CPUs, one per
client with ``client_resources``; an integer k: at most k per actor) packs client endpoints into :class:`~fedmcmc.engines.ray_engine.ClientHost`
actors. Packing changes where endpoints run, never what they compute: the draws are the
in-process engine's; each client still loads, holds and answers for its own rows; a client
that fails (at start or later) fails alone, the others of its actor go on.

Every test binds loopback only and shuts Ray down (the module fixture ``local_ray``, 2 CPUs).
"""

import functools
import os

import numpy as np
import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import jax.numpy as jnp  # noqa: E402

import fedmcmc as fm  # noqa: E402
from fedmcmc.engines.comm import ClientFailureError  # noqa: E402
from fedmcmc.engines.ray_engine import Unpacked, actor_groups, packed, unpacked  # noqa: E402

from toy_problems import GAUSSIAN_MODEL, DIM, gaussian_federation  # noqa: E402

TIMEOUT = 120.0  # seconds any one message may take: bounds every run
RUN = dict(init=jnp.zeros(DIM), num_samples=60, burn_in=0, thin=5, chains=2, seed=7)


# ----------------------------------------------------------------------------- grouping rule

def test_messages_travel_as_one_byte_string_unless_pickle_cannot_take_them():
    """A message or reply of arrays and scalars is one pickled byte string (Ray moves it as it
    is); one holding a local function (a set-up message with the model) is left to Ray."""
    message = (3, "respond", (np.arange(6, dtype=np.uint32).reshape(3, 2), np.ones((2, 3)),
                              np.float32(0.5), True))
    wire = packed(message)
    assert isinstance(wire, bytes)
    client, method, args = unpacked(wire)
    assert (client, method) == (3, "respond") and len(args) == 4
    for sent, received in zip(message[2], args):
        np.testing.assert_array_equal(received, sent)
        assert np.asarray(received).dtype == np.asarray(sent).dtype
    with_function = (0, "setup", (lambda theta: theta,))
    wire = packed(with_function)
    assert isinstance(wire, Unpacked) and unpacked(wire) is with_function


def test_auto_groups_are_one_actor_per_cpu_in_balanced_contiguous_blocks():
    assert actor_groups(30, None, None, 2) == [list(range(15)), list(range(15, 30))]  # default
    assert actor_groups(30, "auto", None, 2) == [list(range(15)), list(range(15, 30))]
    assert actor_groups(30, 1, None, 2) == [[c] for c in range(30)]  # one actor per client
    assert actor_groups(2, None, None, 2) == [[0], [1]]  # no more clients than CPUs
    # 30 clients on 4 CPUs: blocks of 8, 8, 7, 7 (not 8, 8, 8, 6)
    sizes = [len(g) for g in actor_groups(30, "auto", None, 4)]
    assert sizes == [8, 8, 7, 7]
    # more CPUs than clients: one actor per client
    assert actor_groups(3, "auto", None, 64) == [[0], [1], [2]]
    # a cluster reporting no CPU still gets one actor
    assert actor_groups(5, "auto", None, 0) == [[0, 1, 2, 3, 4]]


def test_explicit_clients_per_actor_and_resources():
    assert actor_groups(4, 1, None, 2) == [[0], [1], [2], [3]]
    assert actor_groups(5, 2, None, 64) == [[0, 1], [2, 3], [4]]
    # client_resources: one actor per client unless asked, and then only equal dicts share
    pinned = [{"site_a": 1}, {"site_b": 1}, {"site_a": 1}, {"site_b": 1}, {}]
    assert actor_groups(5, None, pinned, 2) == [[0], [1], [2], [3], [4]]
    assert actor_groups(5, "auto", pinned, 2) == [[0], [1], [2], [3], [4]]
    assert actor_groups(5, 4, pinned, 2) == [[0, 2], [1, 3], [4]]
    groups = actor_groups(7, 3, None, 1)
    assert sorted(c for g in groups for c in g) == list(range(7))
    assert max(len(g) for g in groups) <= 3


def test_clients_per_actor_is_checked():
    federation = gaussian_federation()
    algorithm = fm.DSGLD(step_size=2e-3, batch_size=5, local_steps=10)
    for bad in (0, -1, 1.5, "two", "Auto"):
        with pytest.raises(ValueError, match="clients_per_actor"):
            fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="ray", clients_per_actor=bad,
                      **RUN)
    with pytest.raises(ValueError, match="clients_per_actor"):  # not an option of engine="local"
        fm.sample(GAUSSIAN_MODEL, federation, algorithm, clients_per_actor=2, **RUN)


def test_the_default_placement_packs_and_warns_only_when_it_cannot(monkeypatch):
    """The default placement packs 30 clients into one actor per CPU, with no warning; only
    when it still gives far more actors than CPUs (client_resources, one actor per client)
    does it warn (PlacementWarning naming clients_per_actor, pointing at the caller's line); a
    placement the user chose (any clients_per_actor) and a few actors per CPU get none."""
    import warnings

    from fedmcmc.engines import ray_transport
    from fedmcmc.engines.ray_engine import PlacementWarning, RayTransport, placement_hint

    pinned = [{"site": 1}] * 30
    hint = placement_hint(30, 2.0, None, pinned)
    assert "30 client actors" in hint and "client_resources" in hint and "2 CPUs" in hint
    assert "clients_per_actor=1" in hint
    assert placement_hint(8, 2.0, None, pinned) is None  # 4 actors per CPU: no hint
    assert placement_hint(9, 2.0, None, pinned) is not None
    for chosen in ("auto", 1, 3):
        assert placement_hint(30, 2.0, chosen, pinned) is None
    assert placement_hint(30, 16.0, None, pinned) is None

    class _Cluster:  # no Ray: the transport's choice of groups, not its actors
        @staticmethod
        def cluster_resources():
            return {"CPU": 2.0}

    class _Recorded(RayTransport):
        def __init__(self, specs, **kwargs):
            self.kwargs = kwargs

    monkeypatch.setattr(ray_transport, "_import_ray", lambda: _Cluster)
    specs = [(object, ())] * 30
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(_Recorded.from_options(specs, {}).kwargs["groups"]) == 2  # the default
        assert len(_Recorded.from_options(specs, {"clients_per_actor": "auto"}).kwargs["groups"]) == 2
        assert len(_Recorded.from_options(specs, {"clients_per_actor": 1}).kwargs["groups"]) == 30
        _Recorded.from_options(specs, {"clients_per_actor": 1, "client_resources": pinned})
        _Recorded.from_options(specs[:8], {"client_resources": pinned[:8]})
    with pytest.warns(PlacementWarning, match="clients_per_actor=k") as caught:
        made = _Recorded.from_options(specs, {"client_resources": pinned})
    assert len(made.kwargs["groups"]) == 30
    assert caught[0].filename == __file__  # the caller's line, not fedmcmc's


# ----------------------------------------------------------------------------- on Ray

@pytest.fixture(scope="module")
def dsgld_reference():
    federation = gaussian_federation()
    algorithm = fm.DSGLD(step_size=2e-3, batch_size=5, local_steps=10)
    return federation, algorithm, fm.sample(GAUSSIAN_MODEL, federation, algorithm, **RUN)


def _pids(result):
    return [where["pid"] for where in result.info["client_locations"]]


def test_packed_actors_give_the_in_process_draws(local_ray, dsgld_reference):
    federation, algorithm, reference = dsgld_reference
    packed = fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="ray",
                       visit_timeout=TIMEOUT, **RUN)
    # the default ("auto") on the fixture's 2-CPU instance: 4 clients in 2 actors of 2
    assert packed.info["ray_actors"] == [[0, 1], [2, 3]]
    pids = _pids(packed)
    assert pids[0] == pids[1] and pids[2] == pids[3] and pids[0] != pids[2]
    np.testing.assert_allclose(packed.flat_samples(), reference.flat_samples(), rtol=0, atol=1e-4)
    # every client still answered its own visits
    assert set(np.unique(packed.sample_stats["client"])) == {0, 1, 2, 3}

    separate = fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="ray",
                         visit_timeout=TIMEOUT, clients_per_actor=1, **RUN)  # one per client
    assert separate.info["ray_actors"] == [[0], [1], [2], [3]]
    assert len(set(_pids(separate))) == 4
    np.testing.assert_allclose(separate.flat_samples(), reference.flat_samples(), rtol=0,
                               atol=1e-4)
    # packing changes no message: same counts and bytes either way
    for key in ("messages_to_clients", "messages_from_clients", "bytes_to_clients",
                "bytes_from_clients"):
        assert packed.info[key] == separate.info[key], key


@pytest.mark.slow  # packing in the default suite: test_packed_actors_give_the_in_process_draws
def test_fed_zigzag_and_dula_run_packed(local_ray):
    federation = gaussian_federation()
    # (per-worker thinning in-process too: the Ray workers thin their own rates)
    for algorithm, kwargs in ((fm.FedZigZag(sample_interval=0.2, thinning="per_worker"),
                               dict(chains=1)),
                              (fm.DULA(step_size=1e-3, beta=0.3), dict(chains=2, thin=3))):
        run = dict(init=jnp.zeros(DIM), num_samples=20, burn_in=0, seed=3)
        run.update(kwargs)
        local = fm.sample(GAUSSIAN_MODEL, federation, algorithm, **run)
        # the broadcasts as batched actor calls (direct_channel=False; with the channels, the
        # default, in test_ray_engine.py's Fed Zig-Zag run): the same draws
        on_ray = fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="ray",
                           visit_timeout=TIMEOUT, clients_per_actor=3, direct_channel=False,
                           **run)
        assert on_ray.info["ray_actors"] == [[0, 1], [2, 3]]
        assert "ray_direct_channels" not in on_ray.info
        np.testing.assert_allclose(on_ray.flat_samples(), local.flat_samples(), rtol=0,
                                   atol=1e-4)


def test_a_dropped_client_leaves_its_actor_serving_the_others(local_ray, dsgld_reference):
    federation, algorithm, _ = dsgld_reference
    result = fm.sample(
        GAUSSIAN_MODEL, federation, algorithm, engine="ray", visit_timeout=TIMEOUT,
        on_client_failure="drop", clients_per_actor="auto",
        fault_injection={"client": 1, "after_visits": 2, "kind": "exit"}, **RUN)
    info = result.info
    assert info["ray_actors"] == [[0, 1], [2, 3]] and info["dropped_clients"] == [1]
    assert np.isfinite(result.flat_samples()).all()
    # client 0 shares client 1's actor and goes on serving visits after 1 stopped
    clients = np.asarray(result.sample_stats["client"])
    last_of_1 = max(np.flatnonzero(row == 1).max(initial=-1) for row in clients)
    assert any((row[last_of_1 + 1:] == 0).any() for row in clients)


def test_a_client_failing_to_start_fails_alone_and_is_named(local_ray, tmp_path):
    federation = gaussian_federation()
    # loaders run in the client actors; client 2's file does not exist there
    loaders = [functools.partial(np.asarray, rows) for rows in federation.clients]
    loaders[2] = functools.partial(np.load, str(tmp_path / "client_2_is_gone.npy"))
    algorithm = fm.DSGLD(step_size=2e-3, batch_size=5, local_steps=10)
    with pytest.raises(ClientFailureError) as caught:
        fm.sample(GAUSSIAN_MODEL, fm.Federation.from_loaders(loaders), algorithm, engine="ray",
                  visit_timeout=TIMEOUT, clients_per_actor="auto", **RUN)
    error = caught.value
    assert error.client == 2 and error.result is None
    assert "failed to start" in error.reason and "client_2_is_gone" in error.reason


def test_call_each_sends_one_actor_call_per_actor_and_keeps_failures_per_client(local_ray,
                                                                                tmp_path):
    """RayTransport.call_each: the messages to one actor's clients travel together, each is
    counted, each client's reply (or failure) is its own; a stopped client of a shared actor
    fails alone."""
    from fedmcmc.engines.comm import ClientEndpoint, collect
    from fedmcmc.engines.ray_engine import RayTransport, _is_direct

    rows = [np.full((n, 2), float(s), np.float32) for s, n in enumerate((3, 4, 5, 6))]
    sources = [functools.partial(np.asarray, r) for r in rows]
    sources[1] = functools.partial(np.load, str(tmp_path / "client_1_is_gone.npy"))
    transport = RayTransport([(ClientEndpoint, (s, sources[s])) for s in range(4)],
                             groups=[[0, 1, 2], [3]])
    try:
        pendings = transport.call_each([0, 1, 2, 3], "ping", lambda client: ())
        # clients 0-2 share one batched actor call; client 3's actor gets a plain call
        assert len({id(getattr(p.handle, "batch", p.handle)) for p in pendings}) == 2
        values, failures = collect(transport, pendings, TIMEOUT)
        assert values == [0, None, 2, 3]
        assert [(p.client, "failed to start" in reason) for p, reason in failures] == [(1, True)]
        assert transport.counts == {"to_clients": 4, "from_clients": 3}

        transport.kill(2)  # client 2 stops; its actor goes on serving client 0
        pendings = transport.call_each([0, 2, 3], "describe", lambda client: ())
        # the actors have opened their direct channels by now: one request per actor there
        assert len({id(p.handle.batch) for p in pendings if p.handle is not None}) == 2
        assert all(_is_direct(p.handle) for p in pendings if p.handle is not None)
        values, failures = collect(transport, pendings, TIMEOUT)
        assert [v.size for v in (values[0], values[2])] == [3, 6] and values[1] is None  # rows
        assert [p.client for p, _ in failures] == [2]
        assert transport.placement() == {"ray_actors": [[0, 1, 2], [3]], "ray_actors_reused": 0,
                                         "ray_direct_channels": 2, "ray_channel_tls": False}
    finally:
        transport.close()


@pytest.mark.slow  # a transport's waiting in the default suite: collect in the other tests
def test_wait_every_returns_once_every_reply_is_in_or_at_the_timeout(local_ray):
    """RayTransport.wait_every (the broadcast rounds' one wait for all replies): a crashed
    client's call counts as ready (reading it raises ClientFailure), and at the timeout the
    replies in hand come back as ready, the missing one as not ready."""
    import time

    from fedmcmc.engines.comm import ClientEndpoint, ClientFailure
    from fedmcmc.engines.ray_engine import RayTransport

    class Napping(ClientEndpoint):  # local class: Ray ships it by value
        def nap(self, seconds):
            time.sleep(seconds)
            return self.index

        def crash(self):
            os._exit(1)

    source = functools.partial(np.zeros, (2, 1), np.float32)
    transport = RayTransport([(Napping, (s, source)) for s in range(3)])
    try:
        pendings = [transport.call(0, "nap", 0.0), transport.call(1, "nap", 0.5),
                    transport.call(2, "crash")]
        ready, waiting = transport.wait_every(pendings, timeout=TIMEOUT)
        assert sorted(p.client for p in ready) == [0, 1, 2] and waiting == []
        assert [transport.result(p) for p in pendings[:2]] == [0, 1]
        with pytest.raises(ClientFailure):
            transport.result(pendings[2])
        late = [transport.call(0, "nap", 0.0), transport.call(1, "nap", 60.0)]
        ready, waiting = transport.wait_every(late, timeout=2.0)
        assert [p.client for p in ready] == [0] and [p.client for p in waiting] == [1]
    finally:
        transport.close()


def test_reused_actors_host_the_next_run_and_busy_or_dead_ones_end(local_ray, monkeypatch):
    """reuse=True: at close an actor that answers ``unload`` in time goes to the idle pool and
    hosts the next transport's client (same process); one still busy, or dead, is ended; an
    idle actor that died is replaced by a new one; a transport without reuse neither takes
    nor gives; release_idle_actors ends the pool."""
    import signal
    import time

    from fedmcmc.engines import ray_actors
    from fedmcmc.engines.comm import ClientEndpoint, collect
    from fedmcmc.engines.ray_engine import RayTransport, idle_actors, release_idle_actors

    class Probe(ClientEndpoint):  # local class: Ray ships it by value
        def pid(self):
            return os.getpid()

        def nap(self, seconds):
            time.sleep(seconds)
            return self.index

        def crash(self):
            os._exit(1)

    release_idle_actors()
    monkeypatch.setattr(ray_actors, "UNLOAD_TIMEOUT", 1.0)
    source = functools.partial(np.zeros, (2, 1), np.float32)
    specs = [(Probe, (s, source)) for s in range(3)]

    def pids(transport):
        values, failures = collect(transport, transport.call_each(range(3), "pid", lambda c: ()),
                                   TIMEOUT)
        assert failures == []
        return values

    first = RayTransport(specs, reuse=True)
    try:
        before = pids(first)
        assert first.reused_actors == 0 and len(set(before)) == 3
        busy = first.call(1, "nap", 60.0)  # still running at close: ended, not kept
        crashed = first.call(2, "crash")  # dead: ended
        _, failures = collect(first, [crashed], TIMEOUT)
        assert [p.client for p, _ in failures] == [2]
        assert busy.handle is not None
    finally:
        first.close()
    assert idle_actors() == 1  # client 0's
    # the short timeout served the busy actor above; a loaded machine may take longer than
    # a second to answer unload, so the later runs (no call left running) get a long one
    monkeypatch.setattr(ray_actors, "UNLOAD_TIMEOUT", 60.0)

    os.kill(before[0], signal.SIGKILL)  # the idle actor dies: the next run starts a new one
    second = RayTransport(specs, reuse=True)
    try:
        assert second.reused_actors == 0
        fresh = pids(second)
        assert not set(fresh) & set(before)
    finally:
        second.close()
    assert idle_actors() == 3

    third = RayTransport(specs, reuse=True)
    try:
        assert third.reused_actors == 3 and third.placement()["ray_actors_reused"] == 3
        assert sorted(pids(third)) == sorted(fresh)  # the same processes
    finally:
        third.close()
    assert idle_actors() == 3

    fourth = RayTransport(specs)  # reuse=False: new actors, ended at close
    try:
        assert fourth.reused_actors == 0 and not set(pids(fourth)) & set(fresh)
    finally:
        fourth.close()
    assert idle_actors() == 3
    assert release_idle_actors() == 3 and idle_actors() == 0


def test_a_reused_actor_gets_back_the_run_wide_objects_of_equal_bytes(local_ray, monkeypatch):
    """The arguments an endpoint names in RUN_WIDE_ARGUMENTS go as Interned: the actor that
    hosts the next run's clients gets back the object it built for the last run when the
    driver's object pickles alike (a new driver object with the same contents), and a new
    object when the contents differ; the clients of one actor share one object."""
    from fedmcmc.engines import ray_actors
    from fedmcmc.engines.comm import ClientEndpoint, collect
    from fedmcmc.engines.ray_engine import RayTransport, idle_actors, release_idle_actors

    # an idle actor answers unload within this or is ended instead of kept: on a loaded CI
    # machine the default 5 s was too short (the last run's actor was ended, none kept)
    monkeypatch.setattr(ray_actors, "UNLOAD_TIMEOUT", 60.0)

    class Settings:  # local classes: Ray ships them by value
        def __init__(self, step_size):
            self.step_size = step_size

    class Endpoint(ClientEndpoint):
        RUN_WIDE_ARGUMENTS = (2,)

        def __init__(self, index, source, settings):
            super().__init__(index, source)
            # a probe, not what endpoints do: count the clients built on this object
            settings.hosted = getattr(settings, "hosted", 0) + 1
            self.settings, self.built = settings, settings.hosted

        def settings_of(self):
            return os.getpid(), self.built, self.settings.step_size

    release_idle_actors()
    source = functools.partial(np.zeros, (2, 1), np.float32)

    def run(step_size):
        settings = Settings(step_size)  # a new driver object each run
        transport = RayTransport([(Endpoint, (s, source, settings)) for s in range(2)],
                                 groups=[[0, 1]], reuse=True)
        try:
            values, failures = collect(
                transport, transport.call_each(range(2), "settings_of", lambda c: ()), TIMEOUT)
            assert failures == []
            return transport.reused_actors, values
        finally:
            transport.close()

    reused, first = run(1e-3)
    pid = first[0][0]
    assert reused == 0 and first == [(pid, 1, 1e-3), (pid, 2, 1e-3)]  # one object for both
    reused, second = run(1e-3)
    assert reused == 1 and second == [(pid, 3, 1e-3), (pid, 4, 1e-3)]  # the same object
    reused, third = run(2e-3)
    assert reused == 1 and third == [(pid, 1, 2e-3), (pid, 2, 2e-3)]  # a new object
    assert release_idle_actors() == 1 and idle_actors() == 0


def test_idle_actors_holding_cpus_give_them_up_to_a_run_that_needs_them(local_ray):
    """Idle actors that reserve CPUs and do not match a run's actors are ended before the
    run starts new ones: on this 2-CPU instance, two idle 1-CPU actors would otherwise keep
    a 2-CPU actor from ever starting."""
    from fedmcmc.engines.comm import ClientEndpoint, collect
    from fedmcmc.engines.ray_engine import RayTransport, idle_actors, release_idle_actors

    release_idle_actors()
    assert local_ray.cluster_resources()["CPU"] == 2
    source = functools.partial(np.zeros, (2, 1), np.float32)
    specs = [(ClientEndpoint, (s, source)) for s in range(2)]
    first = RayTransport(specs, num_cpus=1, reuse=True)  # two actors, one CPU each
    try:
        assert collect(first, first.call_each(range(2), "ping", lambda c: ()), TIMEOUT)[1] == []
    finally:
        first.close()
    assert idle_actors() == 2
    packed = RayTransport(specs, num_cpus=1, groups=[[0, 1]], reuse=True)  # one 2-CPU actor
    try:
        assert packed.reused_actors == 0 and idle_actors() == 0
        values, failures = collect(packed, packed.call_each(range(2), "ping", lambda c: ()), 60.0)
        assert failures == [] and values == [0, 1]
    finally:
        packed.close()
    assert release_idle_actors() == 1
