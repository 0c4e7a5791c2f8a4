"""FA-LD, QLSD and consensus Monte Carlo on ``engine="ray"``: one Ray actor per client.

Each test runs a baseline on a federation of loaders (every loader runs inside its client's
actor, none in the driver) and compares the draws with ``engine="local"``'s (consensus MC:
the same numbers; FA-LD and QLSD: to float rounding), then makes a client's actor die in the
middle of a run: the run stops with :class:`ClientFailureError` and keeps the draws made
before. Ray binds loopback only and is shut down after the module (the ``local_ray``
fixture of ``tests/conftest.py``); every message is bounded by ``visit_timeout``.
"""

import functools
import os
import sys

import numpy as np
import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray", reason="engine='ray' needs ray (pip install 'fedmcmc[ray]')")

import jax.numpy as jnp  # noqa: E402

import fedmcmc as fm  # noqa: E402
from fedmcmc.engines.comm import ClientFailureError  # noqa: E402

DIM = 2
SIZES = (15, 25, 4, 40)  # very unequal, one client smaller than the batch
MODEL = fm.models.gaussian_mean(DIM)
RUN = dict(init=jnp.zeros(DIM), num_samples=30, burn_in=5, thin=3, chains=2, seed=2,
           progress=False)
H = 0.2 / (sum(SIZES) + 1)
TIMEOUT = 120.0  # seconds any one message may take: bounds every run


def client_rows():
    rng = np.random.default_rng(0)
    means = rng.uniform(-1.5, 1.5, size=(len(SIZES), DIM))
    return [rng.normal(m, 1.0, size=(n, DIM)).astype(np.float32) for m, n in zip(means, SIZES)]


def load_client(index: int, log: str):
    """Client ``index``'s loader: its rows (a real one reads the client's own files); logs the
    id of the process that called it."""
    with open(log, "a") as handle:
        handle.write(f"{os.getpid()}\n")
    return client_rows()[index]


@pytest.fixture(scope="module")
def ray_clients(local_ray):
    # the loader is a function of this test module, which the actors cannot import: ship it
    # by value (a real deployment's loader module is installed on the client machines)
    local_ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield local_ray
    local_ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def check_on_ray(algorithm, tmp_path, tolerance, after):
    """The baseline on Ray with loaders (draws against engine='local'), then with client 2's
    actor dying after ``after`` messages (the run stops with the draws made before)."""
    log = str(tmp_path / "loaders.log")
    federation = fm.Federation.from_loaders(
        [functools.partial(load_client, s, log) for s in range(len(SIZES))])
    on_ray = fm.sample(MODEL, federation, algorithm, engine="ray", visit_timeout=TIMEOUT,
                       audit_messages=True, **RUN)
    with open(log) as handle:
        calls = [int(line) for line in handle if line.strip()]
    assert len(calls) == len(SIZES) and os.getpid() not in calls
    assert sorted(calls) == sorted(where["pid"] for where in on_ray.info["client_locations"])
    assert federation.is_deferred and on_ray.info["engine"] == "ray"
    local = fm.sample(MODEL, fm.Federation(client_rows()), algorithm, **RUN)
    np.testing.assert_allclose(on_ray.flat_samples(), local.flat_samples(), rtol=0,
                               atol=tolerance)
    for _, method, arrays in on_ray.info["client_message_audit"]:
        for shape, _dtype in arrays:  # per chain and coordinate, never the clients' rows
            assert shape[-1:] in ([], [DIM], [RUN["chains"]]), (method, shape)

    run = dict(RUN, burn_in=0, num_samples=40)
    with pytest.raises(ClientFailureError) as caught:
        fm.sample(MODEL, fm.Federation(client_rows()), algorithm, engine="ray",
                  visit_timeout=TIMEOUT, chunk_size=8,
                  fault_injection={"client": 2, "after_visits": after, "kind": "exit"}, **run)
    error = caught.value
    assert error.client == 2 and "died" in error.reason
    kept = error.result.flat_samples()
    assert 0 < kept.shape[1] < 40 and np.isfinite(kept).all()
    return local, on_ray, error


def test_fald_on_ray(ray_clients, tmp_path):
    algorithm = fm.FALD(step_size=H, batch_size=10, local_steps=2, participation=0.5)
    local, on_ray, error = check_on_ray(algorithm, tmp_path, 1e-5, after=12)
    assert on_ray.info["rounds_per_chain"] == local.info["rounds_per_chain"]
    kept = error.result.flat_samples()
    reference = fm.sample(MODEL, fm.Federation(client_rows()), algorithm,
                          **dict(RUN, burn_in=0, num_samples=40))
    np.testing.assert_allclose(kept, reference.flat_samples()[:, :kept.shape[1]], rtol=0,
                               atol=1e-5)


@pytest.mark.slow  # about 70 s: a broadcast-and-gather round trip per iteration
def test_qlsd_on_ray(ray_clients, tmp_path):
    algorithm = fm.QLSD(step_size=H, batch_size=10, bits=4, variance_reduction=True)
    local, on_ray, _ = check_on_ray(algorithm, tmp_path, 1e-5, after=40)
    assert on_ray.info["bits_communicated"] == local.info["bits_communicated"]
    assert on_ray.info["messages"] == local.info["messages"]
    assert on_ray.info["transport_messages"] >= 2 * len(SIZES) * on_ray.info["rounds"]


@pytest.mark.slow  # about 140 s: every actor compiles NUTS and its warm-up
def test_consensus_on_ray(ray_clients, tmp_path):
    algorithm = fm.ConsensusMC(num_warmup=40)
    local, on_ray, error = check_on_ray(algorithm, tmp_path, 0.0, after=3)
    assert on_ray.info["step_size_per_client"] == local.info["step_size_per_client"]
    sent = np.asarray(error.result.info["client_samples"])
    reference = fm.sample(MODEL, fm.Federation(client_rows()), algorithm,
                          **dict(RUN, burn_in=0, num_samples=40))
    np.testing.assert_array_equal(
        sent, np.asarray(reference.info["client_samples"])[:, :sent.shape[1]])
