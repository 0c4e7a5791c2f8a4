"""``fm.Federation.from_loaders``: data that stay where they are (issue 14).

A loader is a picklable zero-argument callable run where the client's data live. On
``engine="local"`` the loaders run in this process (every client is simulated here); on
``engine="ray"`` each runs inside its client's actor and the driver receives only the
client's size and the shapes of one example. The loaders below read a client's rows from
its own file and append the id of the process that called them to a log, which the tests
read. Ray: loopback only, bounded by ``visit_timeout``, shut down by the fixture.
"""

import functools
import os
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm

# its runs start Ray instances of their own (conftest: the shared one is shut down first)
pytestmark = pytest.mark.own_ray

SIZES = [7, 19, 3, 31, 12]  # very unequal clients, one smaller than the batch size
DIM = 3


def _client_rows():
    rng = np.random.default_rng(11)
    theta = np.array([0.8, -0.5, 0.3])
    rows = []
    for size in SIZES:
        x = rng.normal(size=(size, DIM)).astype(np.float32)
        y = (x @ theta + rng.normal(size=size)).astype(np.float32)
        rows.append({"x": x, "y": y})
    return rows


def load_rows(path: str, log: str):
    """A client's loader: its rows from its own file; logs the calling process id."""
    with open(log, "a") as handle:
        handle.write(f"{os.getpid()}\n")
    with np.load(path) as stored:
        return {"x": stored["x"], "y": stored["y"]}


def _model():
    return fm.Model(
        log_prior=lambda p: -0.5 * jnp.sum(p["w"] ** 2),
        log_likelihood=lambda p, e: -0.5 * (e["y"] - e["x"] @ p["w"]) ** 2,
    )


@pytest.fixture
def stored_clients(tmp_path):
    log = str(tmp_path / "calls.log")
    loaders = []
    for index, rows in enumerate(_client_rows()):
        path = str(tmp_path / f"client_{index}.npz")
        np.savez(path, **rows)
        loaders.append(functools.partial(load_rows, path, log))
    return loaders, log


def _calls(log):
    if not os.path.exists(log):
        return []
    with open(log) as handle:
        return [int(line) for line in handle if line.strip()]


FSGLD = dict(step_size=1e-3, batch_size=10, local_steps=4)
RUN = dict(init={"w": jnp.zeros(DIM)}, num_samples=30, burn_in=5, thin=2, chains=2, seed=4,
           progress=False)


def test_loaders_run_here_on_local_engine_and_match_in_memory(stored_clients):
    loaders, log = stored_clients
    federation = fm.Federation.from_loaders(loaders)
    assert federation.is_deferred and _calls(log) == []  # nothing read before it is needed
    result = fm.sample(_model(), federation, fm.FSGLD(**FSGLD), **RUN)
    assert _calls(log) == [os.getpid()] * len(SIZES)  # each loader once, in this process
    reference = fm.sample(_model(), fm.Federation(_client_rows()), fm.FSGLD(**FSGLD), **RUN)
    np.testing.assert_array_equal(result.flat_samples(), reference.flat_samples())
    np.testing.assert_array_equal(federation.sizes, SIZES)


def test_loader_weights_and_sizes():
    rows = _client_rows()
    federation = fm.Federation.from_loaders([functools.partial(dict, r) for r in rows])
    np.testing.assert_allclose(federation.weights, np.asarray(SIZES) / sum(SIZES))
    given = np.full(len(SIZES), 1 / len(SIZES))
    federation = fm.Federation.from_loaders([functools.partial(dict, r) for r in rows], weights=given)
    np.testing.assert_allclose(federation.weights, given)


def test_bad_loaders_are_named():
    with pytest.raises(ValueError, match="loaders is empty"):
        fm.Federation.from_loaders([])
    with pytest.raises(ValueError, match=r"loaders\[1\]"):
        fm.Federation.from_loaders([lambda: {"x": np.ones((2, 1))}, np.ones((2, 1))])
    with pytest.raises(ValueError, match="weights must sum to 1"):
        fm.Federation.from_loaders([lambda: {"x": np.ones((2, 1))}] * 2, weights=[0.2, 0.2])

    def broken():
        raise OSError("disk gone")

    with pytest.raises(ValueError, match=r"loaders\[0\] failed: OSError: disk gone"):
        fm.Federation.from_loaders([broken]).load()
    nan = fm.Federation.from_loaders([lambda: {"x": np.ones((2, 1))},
                                      lambda: {"x": np.full((2, 1), np.nan)}])
    with pytest.raises(ValueError, match=r"clients\[1\]: data contains NaN"):
        nan.load()


def test_remote_view_refuses_driver_side_loading(stored_clients):
    loaders, log = stored_clients
    federation = fm.Federation.from_loaders(loaders)
    with federation.kept_on_clients():
        with pytest.raises(RuntimeError, match="stay on the clients"):
            federation.sizes  # noqa: B018 - the access itself is the test
    assert _calls(log) == []


# ------------------------------------------------------------------------------------- Ray


@pytest.fixture
def ray_available():
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback only (see ray_engine)
    ray = pytest.importorskip("ray", reason="engine='ray' needs ray (pip install 'fedmcmc[ray]')")
    if ray.is_initialized():  # fm.sample starts (and shuts down) its own loopback instance
        ray.shutdown()
    # the loader is a function of this test module, which the actors cannot import: ship it
    # by value (a real deployment's loader module is installed on the client machines)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert not ray.is_initialized()


# slow for CI time (90 s on 2 cores): loaders that run in the clients' processes stay in the
# default suite through the Flower engine's test (tests/engines/test_flower_engine.py)
@pytest.mark.parametrize("algorithm", [
    pytest.param(fm.FSGLD(**FSGLD), marks=pytest.mark.slow),
    pytest.param(fm.FedZigZag(sample_interval=0.2), marks=pytest.mark.slow),
], ids=["FSGLD", "FedZigZag"])
def test_ray_calls_every_loader_in_a_client_process_and_none_in_the_driver(
        stored_clients, ray_available, algorithm):
    loaders, log = stored_clients
    federation = fm.Federation.from_loaders(loaders)
    on_ray = fm.sample(_model(), federation, algorithm, engine="ray", visit_timeout=120.0, **RUN)
    calls = _calls(log)
    assert len(calls) == len(SIZES) and os.getpid() not in calls
    assert federation.is_deferred  # the driver never loaded the rows
    locations = on_ray.info["client_locations"]
    assert sorted(calls) == sorted(where["pid"] for where in locations)
    local = fm.sample(_model(), fm.Federation(_client_rows()), algorithm, **RUN)
    np.testing.assert_allclose(on_ray.flat_samples(), local.flat_samples(), rtol=0, atol=1e-4)
