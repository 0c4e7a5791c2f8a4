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
import numpy as np

from ..arrays import device_array
from ..clipping import distinct_row_uniforms
from ..federation import ConcatenatedData
from ..model import FlatModel
from ..minibatch import some_client_smaller
from .estimators import (
    ControlVariates,
    client_from_uniform,
    dsgld_gradient,
    dsgld_gradient_with_control_variates,
    minibatch_from_uniforms,
)
from .sgld import LangevinStep, StepNoise, langevin_move, step_noise

__all__ = ["FederatedChainState", "VisitInputs", "init", "assign_clients", "build_kernel",
           "build_federated_kernel"]


class FederatedChainState(NamedTuple):
    """A chain handed between clients. Visits start at the iterations that are multiples
    of ``local_steps``, so the local step within a visit is ``iteration % local_steps``
    and the number of visits started is ``visits.sum()`` (:attr:`rounds`): neither is
    stored, as every stored counter costs a separate operation per update on CPU."""

    position: jax.Array  # flat theta
    client: jax.Array  # int32, the client the chain is on
    iteration: jax.Array  # int32, t (total updates)
    visits: jax.Array  # (S,) int32, visits per client
    #: pSGLD's running average V of g * g (``preconditioning.py``), which travels with the
    #: chain; None: not preconditioned
    square_average: Optional[jax.Array] = None

    @property
    def rounds(self) -> jax.Array:
        """Visits started (rounds of communication)."""
        return jnp.sum(self.visits, axis=-1)


def init(position: jax.Array, num_clients: int, preconditioner=None) -> FederatedChainState:
    """A chain at ``position`` on ``num_clients`` clients (with the preconditioner's V, zeros
    until the first update, when one is given)."""
    # device_array: no eager program outside a trace, a constant inside one
    zero = device_array(0, np.int32)
    square_average = None
    if preconditioner is not None:
        square_average = device_array(np.zeros(np.shape(position), position.dtype))
    return FederatedChainState(
        position=position,
        client=zero,
        iteration=zero,
        visits=device_array(np.zeros((num_clients,), np.int32)),
        square_average=square_average,
    )


class VisitInputs(NamedTuple):
    """One update's inputs once its client is known (``prepare`` of the federated kernel)."""

    client: jax.Array  # int32, the client the update runs on
    batch: jax.Array  # (batch_size,) uniforms on [0, 1): the minibatch rows
    normal: jax.Array  # (d,) standard normal: the Langevin noise


# Up to this many clients visits are counted with a one-hot comparison, one fused
# operation; beyond it a scatter-add, whose work does not grow with the number of clients.
ONE_HOT_VISIT_MAX_CLIENTS = 64


def count_visits(visits, clients, new_visit):
    """``visits`` plus one for each update of the block that starts a visit, at its client."""
    starts = new_visit.astype(visits.dtype)
    if visits.shape[-1] <= ONE_HOT_VISIT_MAX_CLIENTS:
        one_hot = clients[:, None] == jnp.arange(visits.shape[-1], dtype=clients.dtype)
        return visits + jnp.sum(one_hot * starts[:, None], axis=0, dtype=visits.dtype)
    return visits.at[clients].add(starts)


def assign_clients(uniforms, iteration, current_client, visits, cumulative_weights,
                   local_steps: int):
    """The scheduler of equation (3) for a block of consecutive updates, vectorised.

    Update t of the block (iteration ``iteration + t``) starts a visit when its iteration
    is a multiple of ``local_steps``; the visit's client is drawn with probability f_s from
    that update's uniform, and the updates until the next start stay on it. Updates
    before the block's first start stay on ``current_client``. Returns the clients of
    the block's updates, the client after the block and the visit counts after it.
    """
    steps = jnp.arange(uniforms.shape[0], dtype=jnp.int32)
    iterations = iteration + steps
    new_visit = iterations % local_steps == 0
    drawn = client_from_uniform(uniforms, cumulative_weights)
    # position in the block of the latest visit start at or before each update (visits
    # start every local_steps iterations); negative: the visit began before the block
    last_start = iterations - iterations % local_steps - iteration
    clients = jnp.where(last_start >= 0, drawn[jnp.maximum(last_start, 0)], current_client)
    return clients, clients[-1], count_visits(visits, drawn, new_visit)


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
    private=None,
    preconditioner=None,
    total_rows=None,
):
    """One update (3) of a chain handed between clients, as a :class:`~.sgld.LangevinStep`
    (``step(key, state)``, or ``noise``/``prepare``/``apply`` for blocks of updates).

    ``prepare`` runs the scheduler for a block of updates at once (:func:`assign_clients`);
    ``apply`` is the update itself, on the client it is given.
    ``estimator(theta, minibatch, client, iteration)`` returns the
    gradient estimate v_s(theta) (+ g_s for FSGLD); ``dim``/``dtype``: the flat parameter's.
    ``private``: a :class:`fedmcmc.clipping.PrivateSteps`: minibatches of distinct rows and the
    noise of an update on client s times ``noise_inflation[s]`` (the estimator must be built
    on the clipped model, :meth:`~fedmcmc.clipping.PrivateSteps.model`).
    ``preconditioner``: a :class:`~.preconditioning.RMSPropPreconditioner` (pSGLD, Li et al.
    2016): the update is its :meth:`~.preconditioning.RMSPropPreconditioner.move` with the
    gradient estimate divided by ``total_rows`` (N, the federation's rows) in V, which is
    ``state.square_average`` (start from :func:`init` given the preconditioner).
    """
    if dim is None:
        raise ValueError("dim (the flat parameter's length) is required")
    if preconditioner is not None:
        if private is not None:
            raise ValueError("preconditioner cannot be combined with private: the privacy "
                             "accounting assumes the noise N(0, h I)")
        if total_rows is None:
            raise ValueError("total_rows (N, the federation's rows) is required with a "
                             "preconditioner")
    # the cumulative f_s are computed inside the compiled step (no eager program of their own
    # at set-up); their dtype, which the scheduler's uniforms take, is known without running it
    weights_dtype = jax.eval_shape(jnp.cumsum, client_weights).dtype
    # batch_size is an upper bound (fedmcmc.minibatch): the whole-client branch is compiled
    # in only when some client has fewer rows than the batch
    may_be_smaller = some_client_smaller(data.sizes, batch_size)

    def prepare(noises: StepNoise, state: FederatedChainState):
        clients, client, visits = assign_clients(
            noises.client, state.iteration, state.client, state.visits,
            jnp.cumsum(client_weights), local_steps)
        inputs = VisitInputs(client=clients, batch=noises.batch, normal=noises.normal)
        return inputs, state._replace(client=client, visits=visits)

    def apply(inputs: VisitInputs, state: FederatedChainState) -> FederatedChainState:
        uniforms, normal = inputs.batch, inputs.normal
        if private is not None:
            uniforms = distinct_row_uniforms(uniforms, data.sizes[inputs.client])
            normal = normal * private.noise_inflation[inputs.client]
        minibatch = minibatch_from_uniforms(uniforms, data, inputs.client, may_be_smaller)
        gradient = estimator(state.position, minibatch, inputs.client, state.iteration)
        h = schedule(state.iteration)
        if preconditioner is not None:
            position, square_average = preconditioner.move(
                state.position, gradient, h, normal, state.square_average, total_rows,
                state.iteration == 0, noise)
            return state._replace(position=position, iteration=state.iteration + 1,
                                  square_average=square_average)
        if noise:
            position = langevin_move(state.position, gradient, h, normal)
        else:
            position = state.position + 0.5 * h * gradient
        return state._replace(position=position, iteration=state.iteration + 1)

    def noise_of(key: jax.Array) -> StepNoise:
        return step_noise(key, batch_size, dim, dtype, weights_dtype)

    return LangevinStep(noise=noise_of, apply=apply, prepare=prepare)


def build_kernel(
    flat_model: FlatModel,
    data: ConcatenatedData,
    client_weights: jax.Array,
    batch_size: int,
    local_steps: int,
    schedule: Callable,
    noise: bool = True,
    weight_scaling: Optional[jax.Array] = None,
    control_variates: Optional[ControlVariates] = None,
    private=None,
    preconditioner=None,
    total_rows=None,
):
    """DSGLD: the estimator (4) inside the client-visiting chain.

    ``weight_scaling`` replaces the 1/f_s factor's f_s (a deliberately wrong
    variant for tests; leave ``None``). ``control_variates``: the estimator of
    :func:`~.estimators.dsgld_gradient_with_control_variates` instead of (4). ``private``:
    a :class:`fedmcmc.clipping.PrivateSteps` (clipped per-example gradients, distinct rows,
    inflated noise; :mod:`fedmcmc.privacy`). ``preconditioner``, ``total_rows``: pSGLD's
    (:func:`build_federated_kernel`); ``total_rows`` defaults to the rows of ``data``.
    """
    if private is not None:
        flat_model = private.model(flat_model)
    if preconditioner is not None and total_rows is None:
        total_rows = np.asarray(data.sizes).sum(dtype=np.int32)
    weights_in_estimator = client_weights if weight_scaling is None else weight_scaling

    def estimator(theta, minibatch, client, iteration):
        if control_variates is not None:
            return dsgld_gradient_with_control_variates(
                flat_model, theta, minibatch, weights_in_estimator[client], client,
                control_variates)
        return dsgld_gradient(flat_model, theta, minibatch, weights_in_estimator[client])

    return build_federated_kernel(
        estimator, data, client_weights, batch_size, local_steps, schedule, noise,
        flat_model.dim, flat_model.dtype, private, preconditioner, total_rows,
    )
