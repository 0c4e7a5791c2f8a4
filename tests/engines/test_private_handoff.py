"""Private DSGLD and FSGLD through the hand-off protocol (issue 47 on the message-passing
engines; fedmcmc.langevin.private): the driver plans as in process and sends each client its
noise factor a_s and the clip norm C; the client clips and adds the noise inside its visit.

The in-process transport (``InProcessEngine``: every client an endpoint object, every message
counted) stands for Ray and Flower: the same seed must give the in-process engine's draws and
the same accounting; a client that skipped the privacy noise would not. The Ray case is slow.
"""

import functools

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc import privacy
from fedmcmc.engines.engine import InProcessEngine
from fedmcmc.langevin.handoff import DSGLDProtocol

pytest.importorskip("dp_accounting")
pytestmark = pytest.mark.filterwarnings("ignore::fedmcmc.ConvergenceWarning")

SIZES = (60, 25, 8)  # the last client has fewer rows than the batch: read whole
RUN = dict(init=jnp.zeros(2), num_samples=30, burn_in=10, thin=2, chains=2, seed=3)


def client_rows(seed=0):
    rng = np.random.default_rng(seed)
    clients = []
    for n in SIZES:
        x = rng.normal(size=(n, 2)).astype(np.float32)
        y = (x @ np.array([1.0, -1.0]) + rng.normal(size=n)).astype(np.float32)
        clients.append({"x": x, "y": y})
    return clients


MODEL = fm.Model(log_prior=lambda p: -0.5 * jnp.sum(p ** 2),
                 log_likelihood=lambda p, e: -0.5 * (e["y"] - e["x"] @ p) ** 2)


def given_surrogates():
    """Precomputed (precision, shift): public, as the accountant treats them."""
    return (np.stack([np.eye(2) * n for n in SIZES]).astype(np.float32),
            np.zeros((len(SIZES), 2), np.float32))


CASES = {
    "DSGLD": lambda: fm.DSGLD(step_size=1e-3, batch_size=10, local_steps=5, privacy=fm.Privacy(
        noise_multiplier=1.3, clip_norm=2.0, delta=1e-5)),
    "FSGLD": lambda: fm.FSGLD(step_size=1e-3, batch_size=10, local_steps=5,
                              surrogate=given_surrogates(), trust_radius=None,
                              privacy=(4.0, 1e-5)),
}


def _assert_same_run(distributed, local, exact: bool):
    if exact:
        np.testing.assert_array_equal(distributed.flat_samples(), local.flat_samples())
    else:  # float rounding only (FSGLD's global surrogate is multiplied on the server)
        np.testing.assert_allclose(distributed.flat_samples(), local.flat_samples(), atol=1e-6)
    for key in ("epsilon", "steps", "noise_multiplier", "noise_inflation", "delta"):
        assert distributed.info["privacy"][key] == local.info["privacy"][key], key


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_private_run_through_the_protocol_is_the_in_process_run(name):
    federation = fm.Federation(client_rows())
    local = fm.sample(MODEL, federation, CASES[name](), **RUN)
    distributed = fm.sample(MODEL, federation, CASES[name](), engine=InProcessEngine(), **RUN)
    _assert_same_run(distributed, local, exact=name == "DSGLD")
    # the clients sent what the accountant counted: local_steps per visit, per client
    assert distributed.info["privacy"]["steps"] == [
        5 * v for v in distributed.info["visits_per_client"]]
    assert distributed.info["privacy"]["noise_chosen_by"] == local.info["privacy"][
        "noise_chosen_by"]


def test_a_client_that_skips_the_privacy_noise_is_caught(monkeypatch):
    """The broken variant: a client that runs its visit without clipping and the extra noise
    (the protocol builds its kernel with no private steps) gives other draws than the
    accounted run; the comparison above rejects it."""
    federation = fm.Federation(client_rows())
    local = fm.sample(MODEL, federation, CASES["DSGLD"](), **RUN)
    monkeypatch.setattr(DSGLDProtocol, "_private_steps", lambda self, parameters: None)
    broken = fm.sample(MODEL, federation, CASES["DSGLD"](), engine=InProcessEngine(), **RUN)
    with pytest.raises(AssertionError):
        _assert_same_run(broken, local, exact=True)


def test_a_run_past_its_plan_stops_at_the_last_draw_within_the_budget(monkeypatch):
    """As in process (tests/core/test_privacy.py): planned at the median of the visits'
    law, a client is visited more often than planned; the distributed run stops at its last
    draw within the budget, with the in-process run's draws and accounting."""
    monkeypatch.setattr(privacy, "SCHEDULE_TAIL", 0.5)
    federation = fm.Federation(client_rows())
    algorithm = fm.DSGLD(step_size=1e-3, batch_size=10, local_steps=3,
                         privacy=fm.Privacy(epsilon=0.5, delta=1e-5, clip_norm=2.0))
    run = dict(init=jnp.zeros(2), num_samples=8, burn_in=4, thin=1, chains=2, seed=0)
    stopped = []
    for engine in ("local", InProcessEngine()):
        with pytest.raises(fm.PrivacyBudgetExceeded, match="more often than planned") as caught:
            fm.sample(MODEL, federation, algorithm, engine=engine, **run)
        stopped.append(caught.value.result)
    local, distributed = stopped
    draws = distributed.info["privacy"]["draws_within_budget"]
    assert 0 < draws < 8 and draws == local.info["privacy"]["draws_within_budget"]
    assert max(distributed.info["privacy"]["epsilon"]) <= 0.5
    # (the calibrated a_s reach the client as float32, as in process: equal up to rounding)
    _assert_same_run(distributed, local, exact=False)


def _load(rows):
    return rows


@pytest.mark.parametrize("federation, engine, match", [
    # (refused before Ray starts: the clients would load their rows in their own processes)
    (lambda: fm.Federation.from_loaders([functools.partial(_load, r) for r in client_rows()]),
     lambda: "ray", "from_loaders"),
    (lambda: fm.Federation(client_rows()), lambda: InProcessEngine(on_client_failure="drop"),
     "on_client_failure"),
])
def test_what_the_plan_cannot_cover_is_refused(federation, engine, match):
    with pytest.raises(ValueError, match=f"privacy= cannot account.*{match}"):
        fm.sample(MODEL, federation(), CASES["DSGLD"](), engine=engine(), **RUN)


@pytest.mark.slow
def test_a_private_dsgld_run_on_ray_is_the_in_process_run(local_ray):
    federation = fm.Federation(client_rows())
    local = fm.sample(MODEL, federation, CASES["DSGLD"](), **RUN)
    on_ray = fm.sample(MODEL, federation, CASES["DSGLD"](), engine="ray", **RUN)
    _assert_same_run(on_ray, local, exact=True)


@pytest.mark.slow
def test_a_private_dsgld_run_on_flower_is_the_in_process_run():
    """A SuperLink and three sites on loopback (about a minute on 2 cores): the sites clip
    and add the noise; the draws and the accounting are the in-process run's, and every
    Flower process is ended after the run."""
    pytest.importorskip("flwr", reason="engine='flower' needs flwr")
    from flower_processes import flower_processes

    run = dict(RUN, num_samples=6, burn_in=2)
    federation = fm.Federation(client_rows())
    local = fm.sample(MODEL, federation, CASES["DSGLD"](), **run)
    on_flower = fm.sample(MODEL, federation, CASES["DSGLD"](), engine="flower",
                          visit_timeout=300.0, flower_connect_timeout=600.0, **run)
    assert flower_processes() == []
    _assert_same_run(on_flower, local, exact=True)
