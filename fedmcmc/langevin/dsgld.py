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
    """A chain handed between clients. Visits start at the iterations that are multiples
    of ``local_steps``, so the local step within a visit is ``iteration % local_steps``
    and the number of visits started is ``visits.sum()`` (:attr:`rounds`): neither is
    stored, as every stored counter costs a separate operation per update on CPU."""

    position: jax.Array  # flat theta
    client: jax.Array  # int32, the client the chain is on
    iteration: jax.Array  # int32, t (total updates)
    visits: jax.Array  # (S,) int32, visits per client

    @property
    def rounds(self) -> jax.Array:
        """Visits started (rounds of communication)."""
        return jnp.sum(self.visits, axis=-1)


def init(position: jax.Array, num_clients: int) -> FederatedChainState:
    zero = jnp.zeros((), jnp.int32)
    return FederatedChainState(
        position=position,
        client=zero,
        iteration=zero,
        visits=jnp.zeros((num_clients,), jnp.int32),
    )


# Up to this many clients a visit is counted with a one-hot comparison over all clients,
# one fused operation; a scatter into the counts took three separate ones per update on
# CPU (index padding, slicing, update). Beyond it the scatter's O(1) work wins.
ONE_HOT_VISIT_MAX_CLIENTS = 64


def count_visit(visits, client, new_visit):
    """``visits`` with ``client``'s count increased by one when ``new_visit``."""
    if visits.shape[-1] <= ONE_HOT_VISIT_MAX_CLIENTS:
        hit = (jnp.arange(visits.shape[-1], dtype=jnp.int32) == client) & new_visit
        return visits + hit.astype(visits.dtype)
    return visits.at[client].add(new_visit.astype(visits.dtype))


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
        new_visit = state.iteration % local_steps == 0
        client = jnp.where(new_visit, client_from_uniform(random.client, cumulative_weights),
                           state.client)
        batch, client_size = minibatch_from_uniforms(random.batch, data, client)
        gradient = estimator(state.position, batch, client, client_size, state.iteration)
        h = schedule(state.iteration)
        if noise:
            position = langevin_move(state.position, gradient, h, random.normal)
        else:
            position = state.position + 0.5 * h * gradient
        return FederatedChainState(
            position=position,
            client=client,
            iteration=state.iteration + 1,
            visits=count_visit(state.visits, client, new_visit),
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
