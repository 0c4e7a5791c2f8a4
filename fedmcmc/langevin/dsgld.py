"""DSGLD, Ahn et al. (2014), as written in FSGLD equations (3)-(4).

A chain visits one client at a time: at the start of a visit the scheduler
draws client s with probability f_s; the chain then takes ``local_steps``
updates (3) there, using only that client's data through the estimator (4),
and is handed on. The same machinery runs FSGLD (``fsgld.py``), whose
estimator adds the conducive gradient.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from ..federation import ConcatenatedData
from ..model import FlatModel
from .estimators import client_from_uniform, dsgld_gradient, minibatch_from_uniforms
from .sgld import LangevinStep, StepNoise, langevin_move, step_noise

__all__ = ["FederatedChainState", "init", "build_kernel", "build_federated_kernel"]


class FederatedChainState(NamedTuple):
    position: jax.Array  # flat theta
    client: jax.Array  # int32, the client the chain is on
    steps_on_client: jax.Array  # int32, local steps taken in the current visit
    iteration: jax.Array  # int32, t (total updates)
    rounds: jax.Array  # int32, visits started
    visits: jax.Array  # (S,) int32, visits per client


def init(position: jax.Array, num_clients: int) -> FederatedChainState:
    zero = jnp.zeros((), jnp.int32)
    return FederatedChainState(
        position=position,
        client=zero,
        steps_on_client=zero,
        iteration=zero,
        rounds=zero,
        visits=jnp.zeros((num_clients,), jnp.int32),
    )


def build_federated_kernel(
    estimator: Callable,
    data: ConcatenatedData,
    client_weights: jax.Array,
    batch_size: int,
    local_steps: int,
    schedule: Callable,
    noise: bool = True,
    dim: int = None,
    dtype=jnp.float32,
):
    """One update (3) of a chain handed between clients, as a :class:`~.sgld.LangevinStep`
    (``step(key, state)``, or ``noise``/``apply`` for bulk random numbers).

    ``estimator(theta, batch, client, client_size, iteration)`` returns the
    gradient estimate v_s(theta) (+ g_s for FSGLD); ``dim``/``dtype``: the flat parameter's.
    """
    if dim is None:
        raise ValueError("dim (the flat parameter's length) is required")
    cumulative_weights = jnp.cumsum(client_weights)

    def apply(random: StepNoise, state: FederatedChainState) -> FederatedChainState:
        new_visit = state.steps_on_client == 0
        client = jnp.where(new_visit, client_from_uniform(random.client, cumulative_weights),
                           state.client)
        batch, client_size = minibatch_from_uniforms(random.batch, data, client)
        gradient = estimator(state.position, batch, client, client_size, state.iteration)
        h = schedule(state.iteration)
        if noise:
            position = langevin_move(state.position, gradient, h, random.normal)
        else:
            position = state.position + 0.5 * h * gradient
        visit_increment = new_visit.astype(jnp.int32)
        return FederatedChainState(
            position=position,
            client=client,
            steps_on_client=(state.steps_on_client + 1) % local_steps,
            iteration=state.iteration + 1,
            rounds=state.rounds + visit_increment,
            visits=state.visits.at[client].add(visit_increment),
        )

    def noise_of(key: jax.Array) -> StepNoise:
        return step_noise(key, batch_size, dim, dtype, cumulative_weights.dtype)

    return LangevinStep(noise=noise_of, apply=apply)


def build_kernel(
    flat_model: FlatModel,
    data: ConcatenatedData,
    client_weights: jax.Array,
    batch_size: int,
    local_steps: int,
    schedule: Callable,
    noise: bool = True,
    weight_scaling: Optional[jax.Array] = None,
):
    """DSGLD: the estimator (4) inside the client-visiting chain.

    ``weight_scaling`` replaces the 1/f_s factor's f_s (a deliberately wrong
    variant for tests; leave ``None``).
    """
    weights_in_estimator = client_weights if weight_scaling is None else weight_scaling

    def estimator(theta, batch, client, client_size, iteration):
        return dsgld_gradient(
            flat_model, theta, batch, client_size, batch_size, weights_in_estimator[client]
        )

    return build_federated_kernel(
        estimator, data, client_weights, batch_size, local_steps, schedule, noise,
        flat_model.dim, flat_model.dtype,
    )
