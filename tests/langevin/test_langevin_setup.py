"""The Langevin set-up (``fedmcmc.langevin.setup``) behind its one interface: the in-process
statistics (``InProcessClients``, mapped over the federation's layout) and the clients' own
(``MessagePassingClients``, each computed by its client on its rows) agree, and the set-up
both paths run gives the same choices and draws, FSGLD's given surrogates included."""

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc.engines.engine import InProcessEngine
from fedmcmc.engines.handoff import HandoffClient
from fedmcmc.langevin import setup
from fedmcmc.protocols import ServerSide
from fedmcmc import surrogates as surrogate_module

DIM = 2
MODEL = fm.Model(log_prior=lambda mu: -0.5 * jnp.sum(mu**2) / 10.0,
                 log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2))


def _clients():
    rng = np.random.default_rng(7)
    return [rng.normal(rng.uniform(-1, 1, DIM), 1.0, size=(n, DIM)).astype(np.float32)
            for n in (12, 20, 30, 16)]


class _KeptOnClients(InProcessEngine):
    """The in-process transport with the rows left to the clients (as on Ray): the protocol's
    own set-up runs, message for message."""

    loads_on_clients = True


def _both_statistics(protocol, seed=3):
    """The same federation's statistics in process and asked of in-process hand-off clients."""
    rows = _clients()
    federation = fm.Federation(rows)
    init = jnp.zeros(DIM)
    flat = MODEL.flatten(init)
    theta0 = flat.ravel(init)
    weights = np.asarray(federation.weights, np.float32)
    info_here, info_there = {}, {}
    here = setup.InProcessClients(flat, federation, federation.concatenated(), theta0,
                                  setup.setup_key(seed), protocol.batch_size, info_here,
                                  weights=jnp.asarray(weights))
    spec = {"seed": seed, "chains": 1, "thin": 1, "num_clients": len(rows)}
    endpoints = [HandoffClient(s, r, MODEL, init, protocol, spec) for s, r in enumerate(rows)]

    def ask(name, args_of, clients=None):
        return [endpoints[s].setup(name, *args_of(s))
                for s in (range(len(rows)) if clients is None else clients)]

    there = setup.MessagePassingClients(ServerSide(
        ask=ask, flat_model=flat, theta0=np.asarray(theta0), num_clients=len(rows), seed=seed,
        info=info_there, weights=np.asarray(federation.weights, np.float64)))
    return here, there


@pytest.mark.slow  # about 20 s: every statistic's program, in process and on a client
def test_in_process_and_message_passing_statistics_agree():
    protocol = fm.FSGLD(step_size="auto", batch_size=5, local_steps=3).handoff_protocol()
    here, there = _both_statistics(protocol)
    fits_here, modes_here = here.laplace_fits(None)
    fits_there, modes_there = there.laplace_fits(None)
    np.testing.assert_allclose(modes_there, modes_here, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fits_there.precision, fits_here.precision, rtol=1e-4)
    center, precision = surrogate_module.laplace_of_product(here.flat_model, fits_here,
                                                            here.theta0)
    np.testing.assert_allclose(there.taylor(center, False).shift,
                               here.taylor(center, False).shift, rtol=1e-4, atol=1e-5)
    for anchor in (None, center, modes_here):
        noise_here = here.noise(anchor, center, precision)
        noise_there = there.noise(anchor, center, precision)
        np.testing.assert_allclose(noise_there.within, noise_here.within, rtol=1e-3, atol=1e-5)
        np.testing.assert_allclose(noise_there.means, noise_here.means, rtol=1e-3, atol=1e-4)
    # a statistic of another anchor is another statistic (the comparison can fail)
    assert not np.allclose(here.noise(center, center, precision).within,
                           here.noise(None, center, precision).within, rtol=1e-3)
    product = surrogate_module.product(fits_here)
    weights = np.asarray(here.weights)
    moments_here = here.estimator_moments(jnp.asarray(weights), 1.0, fits_here, product,
                                          center, range(4))
    moments_there = there.estimator_moments(
        weights, 1.0, fits_here, (np.asarray(product.precision), np.asarray(product.shift)),
        center, range(4))
    for ours, theirs in zip(moments_here, moments_there):
        np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # about 10 s
@pytest.mark.filterwarnings("ignore::fedmcmc.langevin.step_size.StepSizeWarning")
@pytest.mark.filterwarnings("ignore::fedmcmc.convergence.ConvergenceWarning")
def test_given_surrogates_with_the_automatic_trust_radius_run_on_the_clients():
    """FSGLD with given surrogates and trust_radius="auto", data on the clients: the server
    sends each client its own q_s with the moments' request (it has no fit of its own before
    it is configured), and the radius and draws are the in-process ones."""
    given = (np.stack([np.eye(DIM, dtype=np.float32) * (s + 1) for s in range(4)]),
             np.full((4, DIM), 0.1, np.float32))
    run = dict(init=np.zeros(DIM, np.float32), num_samples=12, burn_in=4, thin=3, chains=2,
               seed=3, progress=False)
    make = lambda: fm.FSGLD(step_size=1e-3, batch_size=5, local_steps=3,  # noqa: E731
                            surrogate=given)
    local = fm.sample(MODEL, fm.Federation(_clients()), make(), **run)
    on_clients = fm.sample(
        MODEL, fm.Federation.from_loaders([lambda rows=rows: rows for rows in _clients()]),
        make(), engine=_KeptOnClients(), **run)
    assert on_clients.info["trust_radius"] == pytest.approx(local.info["trust_radius"],
                                                            rel=1e-5)
    np.testing.assert_array_equal(on_clients.sample_stats["client"],
                                  local.sample_stats["client"])
    np.testing.assert_allclose(on_clients.flat_samples(), local.flat_samples(), rtol=0,
                               atol=1e-4)
