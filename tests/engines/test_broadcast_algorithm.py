"""A broadcast-pattern algorithm defined here, outside the package (issue 43): federated
Langevin with the full gradient summed over the clients every iteration (each client sends
the gradient of its own log likelihood, d floats per chain). It imports nothing from a family:
the protocol class (``fedmcmc.protocols.BroadcastProtocol``), the engine's generic server
(``engines.broadcast.sample_broadcast``) and the engine objects are all it uses. Its draws on
``engine="ray"`` equal those of ``engine="local"`` (in-process endpoints) bit for bit."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc.algorithm import Algorithm
from fedmcmc.engines.broadcast import sample_broadcast
from fedmcmc.engines.engine import InProcessEngine
from fedmcmc.protocols import BroadcastProtocol

DIM = 2
SIZES = (6, 15, 9)
MODEL = fm.Model(log_prior=lambda mu: -0.5 * jnp.sum(mu**2),
                 log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2))


class GradientSumLangevin(BroadcastProtocol):
    """theta' = theta + h (grad log p(theta) + sum_s grad log p(x_s | theta)) + sqrt(2h) xi:
    the unadjusted Langevin algorithm, the likelihood's gradient summed over the clients."""

    name = "GradientSumLangevin"

    def __init__(self, step_size):
        self.step_size = float(step_size)

    def client_configure(self, context, weight):
        flat, rows = context.flat_model, context.raw_data
        gradient = jax.grad(lambda theta: flat.log_likelihood_sum(theta, rows))
        context.store["gradient"] = jax.jit(jax.vmap(gradient))  # over the chains
        return 0

    def client_respond(self, context, positions):
        return np.asarray(context.store["gradient"](jnp.asarray(positions)))

    def init_state(self, position, chains):
        return np.tile(position, (chains, 1))

    def message(self, state, key):
        return (state,)

    def update(self, state, replies, key):
        h = self.step_size
        prior = -state  # grad log p(theta) of the N(0, I) prior
        noise = np.asarray(jax.random.normal(key, state.shape, jnp.float32))
        return (state + h * (prior + np.sum(replies, axis=0)) + np.sqrt(2 * h) * noise)

    def position(self, state):
        return state


class FederatedULA(Algorithm):
    name, message_passing = "FederatedULA", True

    def __init__(self, step_size):
        self.protocol = GradientSumLangevin(step_size)

    def sample_local(self, model, federation, **run):
        return sample_broadcast(self.protocol, model, federation, InProcessEngine(), **run)

    def sample_distributed(self, model, federation, engine, **run):
        return sample_broadcast(self.protocol, model, federation, engine, **run)


def federation():
    rng = np.random.default_rng(5)
    return fm.Federation([rng.normal(0.4, 1.0, size=(n, DIM)).astype(np.float32)
                          for n in SIZES])


RUN = dict(init=np.zeros(DIM, np.float32), num_samples=40, burn_in=5, thin=2, chains=2,
           seed=4, progress=False, convergence=False)


def exact_posterior():
    pooled = federation().pooled()
    precision = len(pooled) + 1.0
    return pooled.sum(axis=0) / precision, precision


def test_the_local_run_is_the_algorithm_it_says():
    """The in-process run: message counts from the transport, and the ULA chain of the pooled
    data: its mean within 0.1 of the exact one (posterior sd 0.18; about 40 effective draws
    per coordinate, so about 3.4 standard errors; leaving out the largest client moves it by
    more), and a
    step far too large is reported as a divergence."""
    result = fm.sample(MODEL, federation(), FederatedULA(2e-3), **{**RUN, "num_samples": 300})
    info = result.info
    assert info["engine"] == "local" and info["algorithm"] == "GradientSumLangevin"
    # one message to every client and one reply per iteration, and a configuration each
    assert info["messages_to_clients"] >= len(SIZES) * (info["iterations"] + 1)
    mean, precision = exact_posterior()
    assert 1 / np.sqrt(precision) == pytest.approx(0.18, abs=0.01)
    np.testing.assert_allclose(result.flat_samples().mean(axis=(0, 1)), mean, atol=0.1)
    without_one = fm.Federation([federation().clients[s] for s in (0, 2)])
    shifted = without_one.pooled().sum(axis=0) / (len(without_one.pooled()) + 1.0)
    assert np.max(np.abs(shifted - mean)) > 0.1  # what the tolerance would catch
    with pytest.raises(fm.SamplingDivergedError):
        fm.sample(MODEL, federation(), FederatedULA(1.0), **RUN)


def test_ray_draws_equal_the_local_draws(local_ray):
    """The test module's classes are pickled by value, as a user's script's would be."""
    local_ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    local = fm.sample(MODEL, federation(), FederatedULA(2e-3), **RUN)
    on_ray = fm.sample(MODEL, federation(), FederatedULA(2e-3),
                       engine=fm.RayEngine(visit_timeout=120.0), **RUN)
    assert on_ray.info["engine"] == "ray" and "ray_authentication" in on_ray.info
    np.testing.assert_array_equal(on_ray.flat_samples(), local.flat_samples())
    assert on_ray.info["messages"] == local.info["messages"]
