"""The Ray engine (issue 7): DSGLD/FSGLD, DULA/GT-DULA and Fed-PDMC on Ray actors with the
default placement (on the fixture's 2-CPU instance, 4 clients in 2 actors of 2; the placements,
``clients_per_actor``, in test_ray_packing.py).

Every test binds loopback only (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` before
Ray is imported, ``_node_ip_address="127.0.0.1"``), bounds its run time
(``visit_timeout`` on every run, small problems) and shuts down what it starts
(the module-scoped fixture ``local_ray`` of ``tests/conftest.py``; the multi-node test
shuts its cluster down).

Audit rule (test_client_messages_are_parameter_sized): every array a client
actor sends is parameter-sized: its last axis has length d (a position, a draw
of the position, a surrogate shift), and its leading axes count only draws of
the chain taken during one visit (at most ceil(local_steps / thin)) or, for the
surrogate precision (d, d), the d of the matrix -- parameter-sized metadata
sent once. Scalars (indices) are metadata. Data rows (the client holds 15 to 40
of them, of width d) would break the rule.
"""

import math
import os
import warnings

import numpy as np
import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray", reason="engine='ray' needs ray (pip install 'fedmcmc[ray]')")

import jax.numpy as jnp  # noqa: E402

import fedmcmc as fm  # noqa: E402
from fedmcmc.engines.comm import ClientFailureError  # noqa: E402

from chunks import DrawsReceived  # noqa: E402
from stats import check_gaussian_moments  # noqa: E402
from toy_problems import (  # noqa: E402
    GAUSSIAN_MODEL,
    DIM,
    expected_variance,
    gaussian_federation,
    gaussian_posterior,
    step_size_for,
)

TIMEOUT = 120.0  # seconds any one message may take: bounds every run
CHUNK = 16  # chunk_size of the identity runs: their on_draws chunks are checked


def _listening_addresses():
    """Addresses of listening TCP sockets owned by Ray processes started here (best effort)."""
    import subprocess

    try:
        out = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = [line.split() for line in out.splitlines()[1:]]
    return [r[3] for r in rows if len(r) >= 6 and any(k in r[5] for k in ("raylet", "gcs_server", "ray::", "default_worker"))]


def _fsgld_runs(num_samples, burn_in, chains, seed, surrogate="exact", **surrogate_options):
    """FSGLD on Ray and in-process with the same seed."""
    federation = gaussian_federation()
    h = step_size_for(federation, "fsgld", batch_size=10)
    precision = federation.total_size + 1.0
    thin = int(np.ceil(2.0 / (h * precision)))
    algorithm = fm.FSGLD(step_size=h, batch_size=10, local_steps=100, surrogate=surrogate,
                         **surrogate_options)
    common = dict(init=jnp.zeros(DIM), thin=thin, num_samples=num_samples, burn_in=burn_in,
                  chains=chains, seed=seed)
    received = DrawsReceived()  # the run options every engine honours
    on_ray = fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="ray",
                       visit_timeout=TIMEOUT, audit_messages=True, chunk_size=CHUNK,
                       on_draws=received, **common)
    listening = _listening_addresses()
    in_process = fm.sample(GAUSSIAN_MODEL, federation, algorithm, **common)
    return dict(federation=federation, h=h, thin=thin, algorithm=algorithm, ray=on_ray,
                local=in_process, listening=listening, received=received, burn_in=burn_in)


@pytest.fixture(scope="module")
def fsgld_runs(local_ray):
    """A short run (the default suite): identity with the in-process engine, audit, accounting.

    Surrogates fitted by each client with SGLD on its own data: the in-process engine fits the
    same ones only if the client uses the key the in-process engine gives it (a bug once), so
    the identity test covers the client-side fit and the trust radius from the clients'
    estimator moments (the slow long run below uses exact surrogates)."""
    return _fsgld_runs(num_samples=100, burn_in=20, chains=4, seed=3, surrogate="sgld",
                       surrogate_draws=300, surrogate_burn_in=100)


@pytest.fixture(scope="module")
def long_fsgld_runs(local_ray):
    """8 chains x 1000 draws (about 1700 visits) for the posterior check."""
    return _fsgld_runs(num_samples=1000, burn_in=200, chains=8, seed=3)


@pytest.mark.slow
def test_fsgld_on_ray_matches_exact_posterior(long_fsgld_runs):
    federation, h = long_fsgld_runs["federation"], long_fsgld_runs["h"]
    mean, _ = gaussian_posterior(federation)
    variance = expected_variance(federation, "fsgld", h, batch_size=10)
    draws = long_fsgld_runs["ray"].flat_samples()
    assert draws.shape == (8, 1000, DIM)
    figures = check_gaussian_moments(draws, mean, np.diag(variance))
    assert figures["ok"], figures
    # the same check rejects a chain whose draws are off by the posterior sd / 2
    shifted = draws + 0.5 * np.sqrt(variance)
    assert not check_gaussian_moments(shifted, mean, np.diag(variance))["ok"]


@pytest.mark.slow
def test_long_ray_run_identical_to_in_process(long_fsgld_runs):
    test_ray_draws_identical_to_in_process(long_fsgld_runs)


def test_ray_draws_identical_to_in_process(fsgld_runs):
    """Same seed, same random streams: the Ray engine reproduces the in-process draws; its
    chunks (``chunk_size``) reach ``on_draws``."""
    on_ray, local = fsgld_runs["ray"], fsgld_runs["local"]
    fsgld_runs["received"].check(on_ray, fsgld_runs["burn_in"], CHUNK)
    np.testing.assert_allclose(on_ray.flat_samples(), local.flat_samples(), rtol=0, atol=1e-4)
    np.testing.assert_array_equal(on_ray.sample_stats["client"], local.sample_stats["client"])
    np.testing.assert_array_equal(on_ray.sample_stats["round"], local.sample_stats["round"])
    assert on_ray.info["rounds"] == local.info["rounds"]
    assert on_ray.info["trust_radius"] == pytest.approx(local.info["trust_radius"], rel=1e-4)
    assert on_ray.info["visits_per_client"] == local.info["visits_per_client"]


def test_message_accounting(fsgld_runs):
    info = fsgld_runs["ray"].info
    rounds = sum(info["rounds_per_chain"])
    clients = info["num_clients"]
    assert info["engine"] == "ray"
    # one visit request and one reply per round, a surrogate and a configuration per client
    assert info["messages_to_clients"] >= rounds + 2 * clients
    assert info["messages_from_clients"] == info["messages_to_clients"]
    assert info["transport_messages"] == (info["messages_to_clients"]
                                          + info["messages_from_clients"])
    # the hand-off pattern's count, as engine="local" makes it: the visits, the surrogates
    assert info["messages"] == 2 * rounds + 2 * clients == fsgld_runs["local"].info["messages"]
    assert info["bytes_to_clients"] > 0 and info["bytes_from_clients"] > 0


def test_client_messages_are_parameter_sized(fsgld_runs):
    info = fsgld_runs["ray"].info
    d = info["dim"]
    max_draws = math.ceil(fsgld_runs["algorithm"].local_steps / fsgld_runs["thin"])
    audit = info["client_message_audit"]
    assert len(audit) == info["messages_from_clients"]
    methods = {m for _, m, _ in audit}
    assert {"setup", "configure", "visit"} <= methods
    sizes = fsgld_runs["federation"].sizes
    assert max_draws < sizes.min()  # so a block of data rows could not pass as draws
    for client, method, arrays in audit:
        for shape, _dtype in arrays:
            assert len(shape) >= 1 and shape[-1] == d, (client, method, shape)
            if len(shape) == 2:
                assert shape[0] <= max(max_draws, d), (client, method, shape)
            assert len(shape) <= 2, (client, method, shape)


@pytest.mark.parametrize("make", [
    pytest.param(lambda: fm.DSGLD(step_size="auto", batch_size=5, local_steps=10),
                 marks=pytest.mark.slow),
    pytest.param(lambda: fm.DSGLD(step_size=2e-4, batch_size=5, local_steps=10,
                                  control_variates=True), marks=pytest.mark.slow),
    # slow since the clients' set-up test below covers "auto" on Ray in the default suite
    pytest.param(lambda: fm.FSGLD(step_size="auto", batch_size=5, local_steps=10),
                 marks=pytest.mark.slow),
], ids=["DSGLD-auto", "DSGLD-control-variates", "FSGLD-auto"])
def test_auto_and_control_variates_on_ray_give_the_in_process_run(local_ray, make):
    """step_size='auto' (and the control variates it may choose) on Ray: the driver resolves
    them as the in-process engine does; each client computes its own anchor gradient; the
    draws are the in-process ones."""
    federation = gaussian_federation()
    kw = dict(init=jnp.zeros(DIM), num_samples=30, burn_in=10, thin=20, chains=2, seed=5)
    local = fm.sample(GAUSSIAN_MODEL, federation, make(), **kw)
    on_ray = fm.sample(GAUSSIAN_MODEL, federation, make(), engine="ray", visit_timeout=TIMEOUT,
                       **kw)
    assert on_ray.info["step_size"] == local.info["step_size"]
    assert on_ray.info["control_variates"] == local.info["control_variates"]
    assert on_ray.info["setup_by"] == "driver"
    np.testing.assert_allclose(on_ray.flat_samples(), local.flat_samples(), rtol=0, atol=1e-4)
    np.testing.assert_array_equal(on_ray.sample_stats["client"], local.sample_stats["client"])


def _logistic_clients(sizes=(12, 30, 4, 50), dim=2, seed=7):
    """Unequal logistic-regression clients (one smaller than the batch): the estimator's noise
    with control variates is real (not rounding), so f_s chosen for variance is well defined."""
    rng = np.random.default_rng(seed)
    clients = []
    for size in sizes:
        x = (rng.normal(size=(size, dim)) + rng.uniform(-1, 1, size=dim)).astype(np.float32)
        x[:, 0] = 1.0
        y = (rng.random(size) < 1 / (1 + np.exp(-(x @ np.array([0.5, -1.0]))))).astype(np.float32)
        clients.append({"x": x, "y": y})
    return clients


#: the set-up's figures both engines report (the Ray run adds setup_by and its own counts)
SETUP_KEYS = ("step_size", "minibatch_noise_ratio", "discretisation_ratio",
              "iterations_per_effective_draw", "step_size_auto", "step_size_tolerance",
              "control_variates", "client_selection", "client_selection_step_gain")


@pytest.mark.parametrize("case", [
    # slow for CI time: the clients' set-up on Ray stays in the default suite through
    # test_langevin_run_length's Ray case, and in process through test_langevin_setup
    pytest.param("DSGLD", id="DSGLD-auto-global-variance", marks=pytest.mark.slow),
    pytest.param("FSGLD", id="FSGLD-auto-global-variance", marks=pytest.mark.slow),
])
def test_auto_with_data_on_the_clients_is_set_up_by_the_clients(local_ray, case):
    """Federation.from_loaders on Ray: "auto" with control variates and f_s chosen for
    variance, set up by the clients (each computes its statistics on its own rows, the
    server chooses with the in-process set-up's functions): the same h, anchor and f_s as
    the local engine on the same data, and the same draws."""
    if case == "DSGLD":
        clients, model, init = gaussian_federation().clients, GAUSSIAN_MODEL, jnp.zeros(DIM)
        make = lambda: fm.DSGLD(step_size="auto", batch_size=5, local_steps=10,  # noqa: E731
                                control_variates=True, client_selection="variance")
    else:
        clients, model, init = _logistic_clients(), fm.models.logistic_regression(2), jnp.zeros(2)
        make = lambda: fm.FSGLD(step_size="auto", batch_size=5, local_steps=10,  # noqa: E731
                                control_variates=True, client_selection="variance")
    # loaders that build the rows in the client's process (the lambdas travel by value)
    federation = fm.Federation.from_loaders([lambda rows=rows: rows for rows in clients])
    kw = dict(init=init, num_samples=30, burn_in=10, thin=20, chains=2, seed=5)
    on_ray = fm.sample(model, federation, make(), engine="ray", visit_timeout=TIMEOUT,
                       audit_messages=True, **kw)
    assert federation.is_deferred  # the driver never loaded the rows
    local = fm.sample(model, fm.Federation(clients), make(), **kw)
    assert on_ray.info["setup_by"] == "clients"
    for key in SETUP_KEYS:
        assert key in on_ray.info and key in local.info, key
    assert on_ray.info["step_size"] == pytest.approx(local.info["step_size"], rel=1e-4)
    assert on_ray.info["control_variates"] == local.info["control_variates"] == "global"
    assert on_ray.info["client_selection"] == local.info["client_selection"]
    np.testing.assert_allclose(on_ray.info["client_weights"], local.info["client_weights"],
                               rtol=1e-4)
    if case == "FSGLD":
        assert on_ray.info["trust_radius"] == pytest.approx(local.info["trust_radius"], rel=1e-4)
        assert on_ray.info["surrogate_expanded_at_global_mode"] is True
    np.testing.assert_array_equal(on_ray.sample_stats["client"], local.sample_stats["client"])
    np.testing.assert_allclose(on_ray.flat_samples(), local.flat_samples(), rtol=0, atol=1e-4)
    # what the clients sent during the set-up is parameter-sized (never rows)
    d = on_ray.info["dim"]
    setup = [arrays for _, method, arrays in on_ray.info["client_message_audit"]
             if method == "setup"]
    assert setup
    for arrays in setup:
        for shape, _dtype in arrays:
            assert len(shape) <= 2 and (not shape or shape[-1] == d), shape


def _is_loopback(address: str) -> bool:
    import ipaddress

    host = address.rsplit(":", 1)[0].strip("[]").split("%")[0]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # "*" (every interface) or a name
    if getattr(ip, "ipv4_mapped", None) is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def test_ray_binds_loopback_only(fsgld_runs):
    assert fsgld_runs["listening"], "no Ray socket found by ss -ltnp"
    for address in fsgld_runs["listening"]:
        assert _is_loopback(address), address


def _stream_check(result, reference, chains):
    """Every draw the run kept equals the uninterrupted in-process run's draw (same seed)."""
    draws = result.flat_samples()
    ref = reference.flat_samples()[:, :draws.shape[1]]  # a stopped run ends early
    made = np.isfinite(draws).all(axis=-1)
    assert made.any()
    np.testing.assert_allclose(draws[made], ref[made], rtol=0, atol=1e-4)
    return made


KILL_KW = dict(init=jnp.zeros(DIM), num_samples=100, burn_in=0, thin=5, chains=4, seed=7)


@pytest.fixture(scope="module")
def kill_setup(local_ray):
    federation = gaussian_federation()
    algorithm = fm.DSGLD(step_size=2e-3, batch_size=5, local_steps=10)
    reference = fm.sample(GAUSSIAN_MODEL, federation, algorithm, **KILL_KW)
    return federation, algorithm, reference


def test_killed_client_stops_run_and_keeps_draws(kill_setup):
    federation, algorithm, reference = kill_setup
    with pytest.raises(ClientFailureError) as caught:
        fm.sample(
            GAUSSIAN_MODEL, federation, algorithm, engine="ray", visit_timeout=TIMEOUT,
            on_client_failure="stop",
            fault_injection={"client": 1, "after_visits": 3, "kind": "exit"}, **KILL_KW,
        )
    error = caught.value
    assert error.client == 1 and "died" in error.reason
    assert "client 1" in str(error)
    result = error.result
    made = _stream_check(result, reference, 4)
    per_chain = result.info["draws_per_chain"]
    assert per_chain == made.sum(axis=1).tolist()
    assert 0 < sum(per_chain) < 4 * 100
    assert result.info["client_failures"][0]["client"] == 1


@pytest.mark.slow
def test_killed_client_dropped_run_continues(kill_setup):
    federation, algorithm, reference = kill_setup
    result = fm.sample(
        GAUSSIAN_MODEL, federation, algorithm, engine="ray", visit_timeout=TIMEOUT,
        on_client_failure="drop",
        fault_injection={"client": 1, "after_visits": 3, "kind": "exit"}, **KILL_KW,
    )
    draws = result.flat_samples()
    assert np.isfinite(draws).all() and draws.shape == (4, 100, DIM)
    info = result.info
    assert info["target_changed"] is True and info["dropped_clients"] == [1]
    weights = np.asarray(info["weights_after_drop"])
    assert weights[1] == 0 and np.isclose(weights.sum(), 1.0)
    expected = federation.weights.copy()
    expected[1] = 0
    np.testing.assert_allclose(weights, expected / expected.sum(), rtol=1e-6)
    # every draw made before the failure (under the original target) is the uninterrupted run's
    ref = reference.flat_samples()
    before = np.asarray(info["client_failures"][0]["chain_iterations"]) // KILL_KW["thin"]
    assert before.sum() > 0
    for chain, count in enumerate(before):
        np.testing.assert_allclose(draws[chain, :count], ref[chain, :count], rtol=0, atol=1e-4)
    # client 1 served at most its 3 visits (2 draws each) before dying
    assert (result.sample_stats["client"] == 1).sum() <= 3 * 2


@pytest.mark.slow
def test_hung_client_times_out(kill_setup):
    federation, algorithm, reference = kill_setup
    result = fm.sample(
        GAUSSIAN_MODEL, federation, algorithm, engine="ray", visit_timeout=3.0,
        on_client_failure="drop",
        fault_injection={"client": 2, "after_visits": 2, "kind": "hang", "seconds": 600},
        **KILL_KW,
    )
    info = result.info
    assert info["dropped_clients"] == [2]
    assert "visit_timeout" in info["client_failures"][0]["reason"]
    assert np.isfinite(result.flat_samples()).all()


def test_engine_options_are_checked(local_ray):
    federation = gaussian_federation()
    algorithm = fm.DSGLD(step_size=2e-3, batch_size=5, local_steps=10)
    with pytest.raises(ValueError, match="on_client_failure"):
        fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="ray", on_client_failure="retry",
                  **KILL_KW)
    with pytest.raises(ValueError, match="visit_timeout"):
        fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="ray", visit_timeout=-1,
                  **KILL_KW)
    with pytest.raises(ValueError, match="not supported with engine='ray'"):
        fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="ray", start_draw=5, **KILL_KW)
    with pytest.raises(ValueError, match="dropping an agent changes the graph"):
        fm.sample(GAUSSIAN_MODEL, federation, fm.DULA(step_size=1e-3, beta=0.3), engine="ray",
                  on_client_failure="drop", **KILL_KW)
    with pytest.raises(ValueError, match="engine='ray' is not available"):
        fm.sample(GAUSSIAN_MODEL, federation, fm.SGLD(step_size=1e-3, batch_size=5),
                  engine="ray", **KILL_KW)
    # every engine uses both on Ray (checked before any actor starts)
    for other in (algorithm, fm.FedZigZag(sample_interval=0.5), fm.DULA(step_size=1e-3, beta=0.3),
                  fm.FALD(step_size=1e-3, batch_size=5, local_steps=2)):
        for bad in (dict(chunk_size=0), dict(on_draws="draws.npy")):
            with pytest.raises(ValueError, match=next(iter(bad))):
                fm.sample(GAUSSIAN_MODEL, federation, other, engine="ray", **bad, **KILL_KW)
    # consensus MC combines the clients' draws after sampling: no draws chunk by chunk,
    # on either engine
    for engine in ("local", "ray"):
        with pytest.raises(ValueError, match="on_draws: ConsensusMC"):
            fm.sample(GAUSSIAN_MODEL, federation, fm.ConsensusMC(), engine=engine,
                      on_draws=print, **KILL_KW)


@pytest.mark.slow  # reuse is in the default suite through test_ray_packing's reused-actor test
def test_later_runs_reuse_the_actors_and_give_the_same_draws(local_ray):
    """On a Ray instance that outlives the run (the default reuse_actors=True) the next run's
    clients are hosted by the previous run's actors: the same draws as new actors give; a
    client that died is not kept; reuse_actors=False starts and ends its own. One actor per
    client (clients_per_actor=1), so that a dead client's actor is its own."""
    from fedmcmc.engines.ray_engine import idle_actors, release_idle_actors

    release_idle_actors()
    federation = gaussian_federation()
    algorithm = fm.DSGLD(step_size=2e-3, batch_size=5, local_steps=10)
    kw = dict(KILL_KW, num_samples=20, engine="ray", visit_timeout=TIMEOUT, clients_per_actor=1)
    fresh = fm.sample(GAUSSIAN_MODEL, federation, algorithm, reuse_actors=False, **kw)
    assert fresh.info["ray_actors_reused"] == 0 and idle_actors() == 0
    first = fm.sample(GAUSSIAN_MODEL, federation, algorithm, **kw)
    assert first.info["ray_actors_reused"] == 0 and idle_actors() == 4
    second = fm.sample(GAUSSIAN_MODEL, federation, algorithm, **kw)
    assert second.info["ray_actors_reused"] == 4 and idle_actors() == 4
    for run in (first, second):
        np.testing.assert_array_equal(run.flat_samples(), fresh.flat_samples())
    with pytest.raises(ClientFailureError):
        fm.sample(GAUSSIAN_MODEL, federation, algorithm,
                  fault_injection={"client": 1, "after_visits": 3, "kind": "exit"}, **kw)
    assert idle_actors() == 3  # client 1's actor ended
    third = fm.sample(GAUSSIAN_MODEL, federation, algorithm, **kw)
    assert third.info["ray_actors_reused"] == 3
    np.testing.assert_array_equal(third.flat_samples(), fresh.flat_samples())
    with pytest.raises(ValueError, match="reuse_actors must be True or False"):
        fm.sample(GAUSSIAN_MODEL, federation, algorithm, reuse_actors="yes", **kw)
    local_kw = {k: v for k, v in kw.items()
                if k not in ("engine", "visit_timeout", "clients_per_actor")}
    with pytest.raises(ValueError, match="reuse_actors"):
        fm.sample(GAUSSIAN_MODEL, federation, algorithm, reuse_actors=True, **local_kw)
    assert release_idle_actors() == 4 and idle_actors() == 0


DECENTRALISED_KW = dict(init=jnp.zeros(DIM), num_samples=40, burn_in=5, thin=3, chains=2, seed=4)


def _decentralised_identity(algorithm):
    """Agents as Ray actors exchanging object references: the in-process engine's draws."""
    federation = gaussian_federation()
    local = fm.sample(GAUSSIAN_MODEL, federation, algorithm, **DECENTRALISED_KW)
    received = DrawsReceived()
    on_ray = fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="ray",
                       visit_timeout=TIMEOUT, audit_messages=True, chunk_size=CHUNK,
                       on_draws=received, **DECENTRALISED_KW)
    np.testing.assert_allclose(on_ray.flat_samples(), local.flat_samples(), rtol=0, atol=1e-4)
    received.check(on_ray, DECENTRALISED_KW["burn_in"], CHUNK)  # the network average
    np.testing.assert_allclose(np.asarray(on_ray.info["agent_samples"]),
                               np.asarray(local.info["agent_samples"]), rtol=0, atol=1e-4)
    np.testing.assert_allclose(on_ray.sample_stats["consensus_error"],
                               local.sample_stats["consensus_error"], rtol=1e-3, atol=1e-7)
    # ||d - 1 (x) u_bar|| (section 4.3): the agents send d_i and grad E_i(w_bar), the driver
    # takes the norm. Same to float rounding (measured <= 2e-6 relative); u_bar taken as the mean
    # of the agents' gradients at their own w_i instead of at w_bar is off by ~3e-3 here
    kept = (DECENTRALISED_KW["chains"], DECENTRALISED_KW["num_samples"])
    assert on_ray.sample_stats["gradient_error"].shape == kept
    assert np.isfinite(on_ray.sample_stats["gradient_error"]).all()
    np.testing.assert_allclose(on_ray.sample_stats["gradient_error"],
                               local.sample_stats["gradient_error"], rtol=1e-5, atol=1e-5)
    info = on_ray.info
    iterations = (DECENTRALISED_KW["num_samples"] + DECENTRALISED_KW["burn_in"]) * DECENTRALISED_KW["thin"]
    assert info["engine"] == "ray" and info["iterations"] == iterations
    # ring of 4 agents: 8 directed edges, one message each per iteration
    assert info["messages_between_agents"] == 8 * iterations
    # the driver: one gather of the 4 agents per draw; per kept draw w_bar to each agent and
    # (d_i, grad E_i(w_bar)) back
    draws = DECENTRALISED_KW["num_samples"] + DECENTRALISED_KW["burn_in"]
    chains, d = DECENTRALISED_KW["chains"], DIM
    assert info["messages_to_clients"] == 4 * DECENTRALISED_KW["num_samples"]
    assert info["bytes_to_clients"] == 4 * DECENTRALISED_KW["num_samples"] * chains * d * 4
    assert info["messages_from_clients"] == 4 * draws + 4 * DECENTRALISED_KW["num_samples"]
    assert info["transport_messages"] == (info["messages_between_agents"]
                                          + info["messages_to_clients"]
                                          + info["messages_from_clients"])
    # the pattern's count: one message per directed edge, iteration and chain
    assert info["messages"] == info["messages_between_agents"] * chains
    # audit: every array an agent sends the driver is one d-vector per chain
    audit = info["client_message_audit"]
    assert len(audit) == info["messages_from_clients"]
    assert {m for _, m, _ in audit} == {"step", "setup"}
    for agent, method, arrays in audit:
        for shape, _dtype in arrays:
            assert tuple(shape) == (chains, d), (agent, method, shape)


@pytest.mark.slow
def test_gtdula_minibatch_on_ray_identical_to_in_process(local_ray):
    _decentralised_identity(fm.GTDULA(step_size=1e-3, beta=0.3, gamma=0.3, batch_size=5))


@pytest.mark.slow  # the neighbour exchange in the default suite: test_neighbour_protocol
def test_dula_on_ray_identical_to_in_process(local_ray):
    _decentralised_identity(fm.DULA(step_size=1e-3, beta=0.3))


@pytest.mark.slow
def test_gradient_error_off_sends_nothing_extra(local_ray):
    """gradient_error=False: no statistic, and the driver only gathers the kept draws."""
    kw = dict(DECENTRALISED_KW, num_samples=4, burn_in=1)
    result = fm.sample(GAUSSIAN_MODEL, gaussian_federation(),
                       fm.GTDULA(step_size=1e-3, beta=0.3, gamma=0.3, gradient_error=False),
                       engine="ray", visit_timeout=TIMEOUT, **kw)
    assert "gradient_error" not in result.sample_stats
    info = result.info
    assert info["messages_to_clients"] == 0 and info["bytes_to_clients"] == 0
    assert info["messages_from_clients"] == 4 * 5
    assert info["bytes_from_clients"] == 4 * 5 * kw["chains"] * DIM * 2 * 4  # (w_i, d_i)


@pytest.mark.slow
def test_multi_node_cluster_with_pinned_clients():
    """Head + one node per client on a loopback ray.cluster_utils.Cluster; actors pinned by
    custom resources; the run completes and each client ran on its own node."""
    import shutil
    import tempfile

    from ray.cluster_utils import Cluster

    from fedmcmc.engines.ray_security import AuthEnvironment

    temp_dir = tempfile.mkdtemp(prefix="fmray", dir="/tmp")  # AF_UNIX paths: < 108 bytes
    previous_tmpdir = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp_dir  # cluster_utils writes its address file in ./ray
    os.makedirs(os.path.join(temp_dir, "ray"))
    # the README's recipe: token authentication on the head, every node and the driver
    # (fm.sample refuses a cluster without it; tests/engines/test_ray_auth.py)
    token_path = os.path.join(temp_dir, "token")
    with open(token_path, "w") as handle:
        handle.write("6b" * 32)
    authentication = AuthEnvironment()
    authentication.set(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token_path, RAY_AUTH_TOKEN=None)

    if ray.is_initialized():
        ray.shutdown()  # the module fixture's instance; its teardown is then a no-op
    federation = gaussian_federation(sizes=(15, 25))
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                        "include_dashboard": False, "temp_dir": temp_dir},
    )
    try:
        nodes = [
            cluster.add_node(num_cpus=1, resources={f"client_{s}": 1},
                             node_ip_address="127.0.0.1")
            for s in range(federation.num_clients)
        ]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        listening = _listening_addresses()

        def run():
            return fm.sample(
                GAUSSIAN_MODEL, federation,
                fm.FSGLD(step_size=2e-3, batch_size=5, local_steps=10, surrogate="laplace"),
                init=jnp.zeros(DIM), num_samples=50, burn_in=10, thin=5, chains=2, seed=0,
                engine="ray", visit_timeout=TIMEOUT,
                client_resources=[{f"client_{s}": 1} for s in range(federation.num_clients)],
            )

        result = run()
        assert np.isfinite(result.flat_samples()).all()
        assert result.info["engine"] == "ray"
        assert all(v > 0 for v in result.info["visits_per_client"])
        assert len(nodes) == 2
        locations = result.info["client_locations"]
        node_ids = [where["node_id"] for where in locations]
        expected = [node.node_id for node in nodes]
        assert node_ids == expected, (node_ids, expected)
        assert result.info["ray_authentication"] == "token"
        for address in listening:
            assert _is_loopback(address), address
        # a second run on the cluster: each client's actor is reused, on the client's node
        again = run()
        assert again.info["ray_actors_reused"] == 2
        assert [where["node_id"] for where in again.info["client_locations"]] == expected
        np.testing.assert_array_equal(again.flat_samples(), result.flat_samples())
    finally:
        ray.shutdown()
        cluster.shutdown()
        authentication.restore()
        shutil.rmtree(temp_dir, ignore_errors=True)
        if previous_tmpdir is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = previous_tmpdir


# ------------------------------------------------------------------ Fed-PDMC on Ray
# One actor per worker; every event iteration broadcasts (x, v, cap) and gathers the workers'
# proposals (engines/broadcast.py). Same keys as in-process: the draws must be the same.

from stats import trajectory_check  # noqa: E402
from toy_problems import D as PDMP_DIM, pdmp_gaussian_problem as pdmp_problem  # noqa: E402

PDMP_KW = dict(init=np.zeros(PDMP_DIM, np.float32), burn_in=20, chains=2, seed=7,
               progress=False, rate_diagnostics=False)


@pytest.fixture(scope="module")
def zigzag_runs(local_ray):
    model, federation, mean, cov = pdmp_problem(4, False)
    algorithm = fm.FedZigZag(sample_interval=0.5)
    kw = dict(PDMP_KW, num_samples=300)
    local = fm.sample(model, federation, algorithm, **kw)
    received = []  # on_draws: (first kept index, draws) per chunk
    on_ray = fm.sample(model, federation, algorithm, engine="ray", visit_timeout=TIMEOUT,
                       audit_messages=True, chunk_size=80,
                       on_draws=lambda draws, stats, first: received.append((first, draws)),
                       **kw)
    return local, on_ray, mean, cov, received


def test_fed_zigzag_on_ray_identical_to_in_process_and_exact(zigzag_runs):
    local, on_ray, mean, cov, received = zigzag_runs
    np.testing.assert_allclose(on_ray.flat_samples(), local.flat_samples(), rtol=0, atol=1e-6)
    # chunk_size and on_draws are honoured on Ray (320 draws, 20 of them burn-in)
    assert [first for first, _ in received] == [20, 80, 160, 240]
    np.testing.assert_array_equal(np.concatenate([d for _, d in received], axis=1),
                                  on_ray.samples)
    assert on_ray.info["events_per_worker"] == local.info["events_per_worker"]
    ok, figures = trajectory_check(on_ray.info, mean, cov, on_ray.flat_samples())
    assert ok, figures
    assert on_ray.info["engine"] == "ray" and len(on_ray.info["client_locations"]) == 4
    # the event rounds went through the actors' direct channels (test_ray_channel.py), one
    # per actor of the default placement
    assert on_ray.info["ray_actors"] == [[0, 1], [2, 3]]
    assert on_ray.info["ray_direct_channels"] == 2 and on_ray.info["ray_channel_tls"] is False


def test_fed_pdmp_worker_messages_are_parameter_sized(zigzag_runs):
    """Every array a worker actor sends has at most chains x d entries (a gradient per
    chain at its proposed event) or d x d (Newton Hessian, not used by the exact Gaussian
    Zig-Zag); its 60-150 data rows never leave it."""
    on_ray = zigzag_runs[1]
    info = on_ray.info
    chains, d = PDMP_KW["chains"], PDMP_DIM
    audit = info["client_message_audit"]
    assert audit and {m for _, m, _ in audit} >= {"respond", "setup"}
    for client, method, arrays in audit:
        for shape, _dtype in arrays:
            assert int(np.prod(shape)) <= max(chains * d, d * d), (client, method, shape)
    # one broadcast per event iteration (4 calls + 4 replies) plus set-up messages
    assert info["messages_from_clients"] >= 4 * info["event_rounds_broadcast"]
    assert info["bytes_from_clients"] > 0 and info["bytes_to_clients"] > 0


@pytest.mark.slow  # Fed-PDMC on Ray against the in-process draws stays in the default suite with Zig-Zag
def test_fed_boomerang_on_ray_identical_to_in_process(local_ray):
    """Boomerang: federated Newton by messages (Laplace reference), whitened bounds computed
    by each worker, thinning on the worker: the in-process engine's draws."""
    from fedmcmc.pdmp import models as pdmp_models

    model = pdmp_models.logistic_model()
    clients, _ = pdmp_models.logistic_data(0, 120, 3, num_workers=3, non_iid=True)
    federation = fm.Federation(clients)
    # per-worker thinning on both engines (the Ray workers thin their own rates; in-process
    # thinning="auto" would thin the superposition: the same law, other draws)
    algorithm = fm.FedBoomerang(sample_interval=0.5, refresh_rate=0.2, thinning="per_worker")
    # with the rate diagnostics (the default): the workers' gradients at a draw's end ride on
    # the next round's replies
    kw = dict(PDMP_KW, init=np.zeros(3, np.float32), num_samples=40, burn_in=5,
              rate_diagnostics=True)
    local = fm.sample(model, federation, algorithm, **kw)
    on_ray = fm.sample(model, federation, algorithm, engine="ray", visit_timeout=TIMEOUT, **kw)
    np.testing.assert_allclose(on_ray.flat_samples(), local.flat_samples(), rtol=0, atol=1e-5)
    for name in ("rate_federated", "rate_plain", "rate_canonical"):  # rates of order 1 at
        # the same x up to the rounding of the per-worker sums that the draws' atol allows
        np.testing.assert_allclose(on_ray.sample_stats[name], local.sample_stats[name],
                                   rtol=1e-5, atol=1e-5, err_msg=name)
    assert 0 < on_ray.info["gradient_rounds_broadcast"] < 45
    np.testing.assert_allclose(on_ray.info["reference_mean"], local.info["reference_mean"],
                               rtol=1e-8, atol=1e-10)


@pytest.mark.slow  # a crashed worker is in the default suite through test_broadcast_protocol and test_ray_channel
def test_fed_pdmp_killed_worker_stop_and_drop(local_ray):
    model, federation, _, _ = pdmp_problem(4, False)
    algorithm = fm.FedZigZag(sample_interval=0.5)
    kw = dict(PDMP_KW, burn_in=0, num_samples=60, visit_timeout=TIMEOUT)
    fault = {"client": 1, "after_visits": 300, "kind": "exit"}
    with pytest.raises(ClientFailureError) as caught:
        fm.sample(model, federation, algorithm, engine="ray", fault_injection=fault, **kw)
    error = caught.value
    assert error.client == 1 and error.result is not None
    # the chains stop at different draws (they are not held in step): each keeps its own
    kept = error.result.flat_samples()
    assert 0 < kept.shape[1] < 60
    made = np.isfinite(kept).all(axis=-1)
    # (no draws_per_chain when the chains happen to have stopped at the same draw)
    per_chain = error.result.info.get("draws_per_chain", [kept.shape[1]] * kept.shape[0])
    assert per_chain == made.sum(axis=1).tolist() and min(per_chain) > 0
    result = fm.sample(model, federation, algorithm, engine="ray", fault_injection=fault,
                       on_client_failure="drop", **kw)
    assert result.info["dropped_clients"] == [1] and result.info["target_changed"]
    assert result.flat_samples().shape[1] == 60 and np.isfinite(result.flat_samples()).all()


@pytest.mark.slow
def test_decentralised_auto_settings_and_spread_check_on_ray(local_ray):
    """'auto' is resolved by the driver the same way on both engines (the draws agree), the
    settings and the bias estimate reach info, and the spread check stops a Ray run whose
    agents drift apart (Condition 1 broken under condition='warn'), keeping its draws."""
    federation = gaussian_federation()
    algorithm = fm.GTDULA(graph="ring")
    local = fm.sample(GAUSSIAN_MODEL, federation, algorithm, **DECENTRALISED_KW)
    on_ray = fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="ray",
                       visit_timeout=TIMEOUT, **DECENTRALISED_KW)
    np.testing.assert_allclose(on_ray.flat_samples(), local.flat_samples(), rtol=0, atol=1e-4)
    for key in ("step_size", "beta", "gamma", "auto", "predicted_bias_in_sd", "spread_limit"):
        assert on_ray.info[key] == local.info[key], key
    assert set(on_ray.info["bias_estimate"]) == {"in_sd", "standard_error", "ess"}
    np.testing.assert_allclose(on_ray.info["bias_estimate"]["in_sd"],
                               local.info["bias_estimate"]["in_sd"], atol=1e-3)
    # a step far above 'auto''s: the agents spread far beyond the posterior's scale
    broken = fm.GTDULA(step_size=30 * local.info["step_size"])
    with pytest.raises(fm.SamplingDivergedError, match="consensus error") as caught:
        fm.sample(GAUSSIAN_MODEL, federation, broken, **DECENTRALISED_KW)
    with pytest.raises(fm.SamplingDivergedError, match="consensus error") as caught:
        fm.sample(GAUSSIAN_MODEL, federation, broken, engine="ray", visit_timeout=TIMEOUT,
                  **DECENTRALISED_KW)
    assert caught.value.result is not None and caught.value.chains


@pytest.mark.slow
def test_weighted_conducive_gradients_reach_the_clients(local_ray, monkeypatch):
    """Surrogates whose conducive gradients the set-up weighted (``conducive_weights``, here
    forced on the server) are sent to clients that fitted their own (data on the clients):
    the Ray run's draws are the in-process ones with the same weights. Without the sending,
    the clients would run their unweighted fits and the draws would differ."""
    from fedmcmc.langevin import step_size as step_size_module

    forced = np.array([1.0, 0.0, 0.5, 1.0])
    monkeypatch.setattr(step_size_module, "conducive_weights",
                        lambda prediction: (forced, np.ones(len(prediction))))
    clients = _logistic_clients()
    make = lambda: fm.FSGLD(step_size="auto", batch_size=5, local_steps=10)  # noqa: E731
    kw = dict(init=jnp.zeros(2), num_samples=30, burn_in=10, thin=20, chains=2, seed=5)
    federation = fm.Federation.from_loaders([lambda rows=rows: rows for rows in clients])
    model = fm.models.logistic_regression(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        on_ray = fm.sample(model, federation, make(), engine="ray", visit_timeout=TIMEOUT, **kw)
        local = fm.sample(model, fm.Federation(clients), make(), **kw)
    assert on_ray.info["setup_by"] == "clients"
    assert on_ray.info["conducive_weights"] == local.info["conducive_weights"] == forced.tolist()
    np.testing.assert_allclose(on_ray.flat_samples(), local.flat_samples(), rtol=0, atol=1e-4)
