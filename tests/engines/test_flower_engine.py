"""``engine="flower"`` (issue 46): a real SuperLink and one site per client (a stock
``flower-supernode --isolation process`` and the fedmcmc executor of its tasks) as
subprocesses on 127.0.0.1, without TLS (loopback only).

Every run is bounded (``visit_timeout`` on every message, ``flower_connect_timeout`` for
the start) and every process it starts is ended after it (the tests check that no Flower
process of this test process is left). Flower 1.42's SuperNode polls every 3 s when idle,
and starting a SuperLink and three sites imports Flower and JAX in four processes: one run
takes tens of seconds on a 2-core machine, so the default suite has one such run
(DSGLD, the data loaded on the sites, draws equal to the local engine's) and the rest are
``slow``.
"""

import functools
import os
import signal

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("flwr", reason="engine='flower' needs flwr (pip install 'fedmcmc[flower]')")

import fedmcmc as fm  # noqa: E402
from fedmcmc.engines.comm import ClientFailureError  # noqa: E402
from fedmcmc.engines.flower_engine import FlowerLatencyError  # noqa: E402

from flower_processes import flower_processes  # noqa: E402
from toy_problems import DIM, GAUSSIAN_MODEL, gaussian_federation  # noqa: E402

TIMEOUT = 300.0  # seconds any one message may take (a site compiles its visit first)
BOUNDS = dict(visit_timeout=TIMEOUT, flower_connect_timeout=600.0)
RUN = dict(init=jnp.zeros(DIM), num_samples=12, burn_in=0, thin=5, chains=1, seed=7,
           progress=False)


def _three_clients():
    return fm.Federation(gaussian_federation().clients[:3])


def load_rows(rows, log):
    """A site's loader: its rows, and the id of the process that called it, logged."""
    with open(log, "a") as handle:
        handle.write(f"{os.getpid()}\n")
    return rows


def test_dsgld_on_flower_equals_local_with_the_data_on_the_sites(tmp_path):
    """No address: a SuperLink and 3 sites on loopback; each loader runs in its site's
    process (never here), the draws equal the local engine's for the same seed, and every
    process the run started is ended after it."""
    clients = _three_clients().clients
    log = str(tmp_path / "loaders.log")
    federation = fm.Federation.from_loaders(
        [functools.partial(load_rows, rows, log) for rows in clients])
    algorithm = fm.DSGLD(step_size=2e-3, batch_size=5, local_steps=10)
    on_flower = fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="flower",
                          audit_messages=True, **BOUNDS, **RUN)
    assert flower_processes() == []
    assert federation.is_deferred  # the driver never loaded the rows
    with open(log) as handle:
        loaders_ran_in = [int(line) for line in handle if line.strip()]
    assert len(loaders_ran_in) == 3 and os.getpid() not in loaders_ran_in
    assert len(set(loaders_ran_in)) == 3  # one process per site
    locations = on_flower.info["client_locations"]
    assert sorted(where["pid"] for where in locations) == sorted(loaders_ran_in)
    local = fm.sample(GAUSSIAN_MODEL, fm.Federation(clients), algorithm, **RUN)
    np.testing.assert_array_equal(on_flower.sample_stats["client"], local.sample_stats["client"])
    np.testing.assert_allclose(on_flower.flat_samples(), local.flat_samples(), rtol=0, atol=1e-5)
    info = on_flower.info
    assert info["engine"] == "flower" and info["flower_sites"] == ["0", "1", "2"]
    assert info["flower_address"].startswith("127.0.0.1:")
    # what the sites sent is parameter-sized: never rows (each site holds 15 to 25 of them)
    for _client, _method, arrays in info["client_message_audit"]:
        for shape, _dtype in arrays:  # a position (d,) or a visit's draws (<= 2, d)
            assert not shape or (shape[-1] == DIM and len(shape) <= 2
                                 and (len(shape) == 1 or shape[0] <= 10 // RUN["thin"])), shape


def test_round_per_event_algorithms_are_refused_with_the_latency():
    federation = _three_clients()
    for algorithm in (fm.FedZigZag(sample_interval=0.1), fm.DULA(step_size=1e-3, beta=0.1)):
        with pytest.raises(FlowerLatencyError,
                           match=r"took about \d.* s on loopback.*engine='ray'"):
            fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="flower", **RUN)


def test_flower_options_are_checked_before_anything_starts():
    federation, algorithm = _three_clients(), fm.DSGLD(step_size=2e-3, batch_size=5,
                                                       local_steps=10)
    with pytest.raises(ValueError, match="not on loopback.*root_certificates"):
        fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="flower",
                  flower_address="192.0.2.1:9093", **RUN)
    with pytest.raises(ValueError, match="flower_address"):
        fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="local",
                  flower_address="127.0.0.1:9093", **RUN)
    with pytest.raises(ValueError, match="sites names the sites of a running SuperLink"):
        fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="flower",
                  flower_sites=["a", "b", "c"], **RUN)
    with pytest.raises(ValueError, match="ray_address is a Ray option"):
        fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="flower",
                  ray_address="auto", **RUN)
    with pytest.raises(ValueError, match="flower_address is a Flower option"):
        fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="ray",
                  flower_address="127.0.0.1:9093", **RUN)
    with pytest.raises(ValueError, match=r"flower_address is an engine option.*"
                                         r"FlowerEngine\(address=\.\.\.\)"):
        fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine=fm.FlowerEngine(),
                  flower_address="127.0.0.1:9093", **RUN)
    assert flower_processes() == []


@pytest.mark.parametrize("arguments, message", [
    (dict(address=9093), "address must be 'HOST:PORT'"),
    (dict(address="192.0.2.1:9093"), "not on loopback and no root_certificates"),
    (dict(root_certificates="ca.crt"), "root_certificates is for a running SuperLink"),
    (dict(address="127.0.0.1:9093", insecure="yes"), "insecure must be True or False"),
    (dict(address="127.0.0.1:9093", sites="abc"), "sites must be a list of site names"),
    (dict(address="127.0.0.1:9093", sites=["a", "a"]), "sites must name distinct sites"),
    (dict(address="127.0.0.1:9093", log_dir="logs"), "log_dir is for the local federation"),
    (dict(connect_timeout=0), "connect_timeout"),
    (dict(on_client_failure="retry"), "on_client_failure"),
])
def test_the_flower_engine_checks_its_arguments(arguments, message):
    with pytest.raises(ValueError, match=message):
        fm.FlowerEngine(**arguments)


def test_the_flower_shorthand_maps_the_keyword_options_onto_the_engine():
    """``engine="flower"`` with ``flower_<argument>`` options is ``fm.FlowerEngine(...)``;
    the algorithm's options stay; the engine object carries the hand-off and broadcast
    patterns and nothing of Flower is imported to build it."""
    from fedmcmc.api import resolve_engine

    options = {"flower_address": "192.0.2.1:9093", "flower_insecure": True,
               "flower_sites": ["a", "b"], "visit_timeout": 30, "chunk_size": 5}
    engine = resolve_engine("flower", options)
    assert isinstance(engine, fm.FlowerEngine) and engine.label == "flower"
    assert (engine.address, engine.insecure, engine.sites, engine.visit_timeout) == (
        "192.0.2.1:9093", True, ["a", "b"], 30.0)
    assert options == {"chunk_size": 5}
    assert engine.offered_by(fm.DSGLD(step_size=1e-3, batch_size=5, local_steps=10))
    assert engine.offered_by(fm.FALD(step_size=1e-3, batch_size=5, local_steps=10))
    assert not engine.offered_by(fm.FedZigZag(sample_interval=0.1))
    assert fm.RayEngine().offered_by(fm.FedZigZag(sample_interval=0.1))  # Ray carries it


# ----------------------------------------------------------------------------- slow


@pytest.fixture(scope="module")
def running_federation(tmp_path_factory):
    """A SuperLink and 3 sites that outlive one run: the runs below connect to it by address
    (as to sites started by their organisations), and it is ended after the module."""
    from fedmcmc.engines.flower_engine import LocalFlowerFederation

    federation = LocalFlowerFederation(3, str(tmp_path_factory.mktemp("flower_logs")))
    try:
        federation.wait_ready(600.0)
        yield federation
    finally:
        federation.close()
        assert flower_processes() == []


@pytest.mark.slow
def test_fsgld_on_running_sites_equals_local(running_federation):
    federation = _three_clients()
    algorithm = fm.FSGLD(step_size=2e-3, batch_size=5, local_steps=10)
    on_flower = fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="flower",
                          flower_address=running_federation.address, chunk_size=4,
                          **BOUNDS, **dict(RUN, chains=2))
    local = fm.sample(GAUSSIAN_MODEL, federation, algorithm, **dict(RUN, chains=2))
    np.testing.assert_allclose(on_flower.flat_samples(), local.flat_samples(), rtol=0, atol=1e-4)
    assert on_flower.info["flower_address"] == running_federation.address


@pytest.mark.slow
def test_fald_on_running_sites_equals_local(running_federation):
    federation = _three_clients()
    algorithm = fm.FALD(step_size=2e-3, batch_size=5, local_steps=10)
    kw = dict(RUN, num_samples=8, thin=10)
    on_flower = fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="flower",
                          flower_address=running_federation.address, **BOUNDS, **kw)
    local = fm.sample(GAUSSIAN_MODEL, federation, algorithm, **kw)
    np.testing.assert_allclose(on_flower.flat_samples(), local.flat_samples(), rtol=0, atol=1e-4)


def _site_killer(site: int):
    """An ``on_draws`` callback that SIGKILLs (as in a crash) site ``site`` of the local
    federation the run started (one not running when this is called), once; and the list of
    the pids it killed."""
    from fedmcmc.engines import flower_engine

    killed = []
    before = set(flower_engine._LIVE_FEDERATIONS)  # the module's running federation, say

    def kill(*_):
        if not killed:
            [local] = [f for f in flower_engine._LIVE_FEDERATIONS if f not in before]
            os.kill(local.sites[site].pid, signal.SIGKILL)
            killed.append(local.sites[site].pid)

    return kill, killed


@pytest.mark.slow
@pytest.mark.parametrize("make", [
    lambda: fm.QLSD(step_size=2e-3, batch_size=5, bits=4),
    lambda: fm.ConsensusMC(num_warmup=40),
], ids=["QLSD", "ConsensusMC"])
def test_broadcast_baselines_on_running_sites_equal_local(running_federation, make):
    """QLSD (a compressed gradient from every site every iteration) and consensus Monte
    Carlo (each site samples its subposterior, one combination) on sites started apart from
    the run give the local engine's draws."""
    federation = _three_clients()
    kw = dict(RUN, num_samples=8, thin=2)
    on_flower = fm.sample(GAUSSIAN_MODEL, federation, make(), engine="flower",
                          flower_address=running_federation.address, convergence=False,
                          **BOUNDS, **kw)
    local = fm.sample(GAUSSIAN_MODEL, federation, make(), convergence=False, **kw)
    assert on_flower.info["engine"] == "flower"
    np.testing.assert_allclose(on_flower.flat_samples(), local.flat_samples(), rtol=0, atol=1e-4)


@pytest.mark.slow
def test_auto_set_up_runs_on_the_sites_with_their_own_data(running_federation, tmp_path):
    """step_size, thin and burn_in "auto" with loaders: the sites fit their Laplace
    surrogates and report noise statistics on rows that never reach the driver, and the
    choices and draws are the local engine's on the same rows."""
    clients = _three_clients().clients
    log = str(tmp_path / "loaders.log")
    deferred = fm.Federation.from_loaders(
        [functools.partial(load_rows, rows, log) for rows in clients])
    # FSGLD: its conducive gradients let "auto" take a large h (DSGLD's client-sampling noise
    # makes it choose thousands of iterations per draw here: hours at Flower's round trip)
    algorithm = fm.FSGLD(step_size="auto", batch_size=40, local_steps=10)
    kw = dict(RUN, num_samples=10, thin="auto", burn_in="auto")
    on_flower = fm.sample(GAUSSIAN_MODEL, deferred, algorithm, engine="flower",
                          flower_address=running_federation.address, convergence=False,
                          **BOUNDS, **kw)
    assert deferred.is_deferred
    with open(log) as handle:
        assert os.getpid() not in {int(line) for line in handle if line.strip()}
    local = fm.sample(GAUSSIAN_MODEL, fm.Federation(clients), algorithm, convergence=False, **kw)
    for key in ("step_size", "thin", "burn_in"):
        np.testing.assert_allclose(on_flower.info[key], local.info[key], rtol=1e-4, err_msg=key)
    np.testing.assert_allclose(on_flower.flat_samples(), local.flat_samples(), rtol=0, atol=1e-3)


@pytest.mark.slow
def test_killed_site_dropped_the_run_goes_on_without_it():
    """on_client_failure="drop": a site killed mid-run is dropped, the run ends with every
    draw, the target changes to the remaining sites (reported) and the draws made before the
    failure are the uninterrupted run's."""
    federation = _three_clients()
    algorithm = fm.DSGLD(step_size=2e-3, batch_size=5, local_steps=10)
    kill_site_1, killed = _site_killer(1)
    kw = dict(RUN, num_samples=30, chunk_size=2)
    result = fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="flower",
                       on_client_failure="drop", on_draws=kill_site_1, convergence=False,
                       **BOUNDS, **kw)
    info = result.info
    assert killed and info["dropped_clients"] == [1] and info["target_changed"] is True
    assert result.flat_samples().shape == (1, kw["num_samples"], DIM)
    assert np.isfinite(result.flat_samples()).all()
    weights = np.asarray(info["weights_after_drop"])
    assert weights[1] == 0 and np.isclose(weights.sum(), 1.0)
    reference = fm.sample(GAUSSIAN_MODEL, federation, algorithm, convergence=False, **kw)
    made = np.asarray(info["client_failures"][0]["chain_iterations"]) // kw["thin"]
    assert made.sum() > 0
    np.testing.assert_allclose(result.flat_samples()[0, :made[0]],
                               reference.flat_samples()[0, :made[0]], rtol=0, atol=1e-5)


@pytest.mark.slow
def test_killed_site_stops_the_run_and_keeps_the_draws():
    """A site's process killed mid-run (SIGKILL, as in a crash): the run stops with
    ClientFailureError naming the client, and error.result holds the draws made before."""
    federation = _three_clients()
    algorithm = fm.DSGLD(step_size=2e-3, batch_size=5, local_steps=10)
    running_before = set(flower_processes())
    kill_site_1, killed = _site_killer(1)
    kw = dict(RUN, num_samples=60, chunk_size=2)
    with pytest.raises(ClientFailureError) as caught:
        fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="flower", on_draws=kill_site_1,
                  **BOUNDS, **kw)
    error = caught.value
    assert killed and error.client == 1 and "process ended" in error.reason
    made = error.result.info["draws_per_chain"]
    assert 0 < sum(made) < kw["num_samples"]
    local = fm.sample(GAUSSIAN_MODEL, federation, algorithm, **kw)
    np.testing.assert_allclose(error.result.flat_samples()[0, :made[0]],
                               local.flat_samples()[0, :made[0]], rtol=0, atol=1e-5)
    assert set(flower_processes()) <= running_before  # the run's own processes all ended


def test_site_data_calls_the_sites_own_function_and_names_what_is_missing():
    """SiteData travels as its name; on a site it calls the function the site registered
    (--data NAME=module:function), elsewhere it raises naming the data."""
    import pickle

    from fedmcmc.engines import flower_site

    data = pickle.loads(pickle.dumps(flower_site.SiteData("toy_rows")))
    with pytest.raises(ValueError, match="no data named 'toy_rows'"):
        data()
    try:
        assert flower_site.register_data("toy_rows=toy_problems:gaussian_federation") == \
            "toy_rows"
        assert data().num_clients == 4  # the registered function, called here
    finally:
        flower_site._SITE_SOURCES.clear()
    with pytest.raises(ValueError, match="NAME=module:function"):
        flower_site.register_data("toy_rows")
