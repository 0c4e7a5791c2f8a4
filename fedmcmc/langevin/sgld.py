"""SGLD, Welling & Teh (2011), as written in FSGLD equations (1)-(2).

Step-size convention (the papers'): ``theta <- theta + (h/2) v(theta) + N(0, h I)``.
BlackJAX's ``sgld`` writes ``theta + eps grad + N(0, 2 eps)``: eps = h / 2.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import rng
from ..arrays import device_array
from ..clipping import distinct_row_uniforms
from ..federation import ConcatenatedData
from ..minibatch import likelihood_gradient, some_client_smaller, take_minibatch
from ..model import FlatModel

__all__ = ["SGLDState", "StepNoise", "LangevinStep", "run_updates", "init", "noise_from_keys",
           "build_kernel"]


class SGLDState(NamedTuple):
    position: jax.Array  # flat theta
    iteration: jax.Array  # int32, t
    #: pSGLD's running average V of g * g (``preconditioning.py``); None: not preconditioned
    square_average: Optional[jax.Array] = None


def init(position: jax.Array, preconditioner=None) -> SGLDState:
    """The chain at ``position`` (with the preconditioner's V when one is given)."""
    # the counter is put on the device from the host: no eager program of its own
    state = SGLDState(position=position, iteration=device_array(np.zeros((), np.int32)))
    if preconditioner is not None:
        state = state._replace(square_average=device_array(
            np.zeros(np.shape(position), position.dtype)))
    return state


class StepNoise(NamedTuple):
    """The random numbers of one update: the scheduler's uniform (federated chains), the
    minibatch's uniforms and the Langevin noise xi ~ N(0, I)."""

    client: jax.Array  # () uniform on [0, 1)
    batch: jax.Array  # (batch_size,) uniforms on [0, 1)
    normal: jax.Array  # (d,) standard normal


class LangevinStep(NamedTuple):
    """A BlackJAX-style kernel ``step(key, state) -> state`` split in pure functions:
    ``noise(key) -> StepNoise``, ``prepare(noises, state) -> (inputs, state)`` and
    ``apply(input, state) -> state``.

    ``noise`` draws an update's random numbers; the engine calls it on many keys at once
    (one batched PRNG call per block of draws instead of three small ones per update,
    which dominate a small model's step on CPU). ``prepare`` turns the random numbers of
    a block of consecutive updates (leading axis) into their ``apply`` inputs, vectorised
    over the block, and returns the state with everything except the position and the
    iteration counter advanced to the end of the block (for federated chains: which
    client each update runs on, and the visit counts). ``apply`` is the sequential part,
    scanned. ``None`` for ``prepare`` means the inputs are the random numbers themselves.

    Keeping the per-update bookkeeping out of the scanned ``apply`` matters on CPU: XLA
    runs a loop body of at most 8 operations sequentially, a longer one through a
    dependency-graph executor that costs ~0.9 us more per update (``benchmarks/bench_overheads.py``,
    logistic FSGLD: 1.2 against 2.1 us per update).

    ``step(key, state)`` runs one update: :func:`run_updates` on a block of one.
    """

    noise: Callable
    apply: Callable
    prepare: Optional[Callable] = None

    def __call__(self, key, state):
        block = jax.tree_util.tree_map(lambda leaf: leaf[None], self.noise(key))
        return run_updates(self, block, state)


def run_updates(step: LangevinStep, noises, state):
    """The updates whose random numbers are ``noises`` (leading axis: consecutive updates)."""
    inputs = noises
    if step.prepare is not None:
        inputs, state = step.prepare(noises, state)
    state, _ = jax.lax.scan(lambda s, z: (step.apply(z, s), None), state, inputs)
    return state


def step_noise(key, batch_size: int, dim: int, dtype, client_dtype=jnp.float32) -> StepNoise:
    """The random numbers of one update from its key: split in three (scheduler, minibatch,
    noise) as every engine does, so a chain's stream does not depend on how it is run.

    Drawn through :mod:`fedmcmc.rng`: ``jax.random``'s numbers bit for bit, with the
    threefry hash unrolled (XLA compiled a run's vmapped ``jax.random`` calls in about
    3.7 s on CPU, against 1.3 s unrolled: ``benchmarks/bench_overheads.py``)."""
    key_client, key_batch, key_noise = rng.split_key(key, 3)
    if jnp.dtype(client_dtype) == jnp.dtype(jax.dtypes.canonicalize_dtype(float)):
        client = rng.uniform(key_client, ())
    else:
        client = jax.random.uniform(key_client, (), dtype=client_dtype)
    return noise_from_keys(client, key_batch, key_noise, batch_size, dim, dtype)


def noise_from_keys(client, key_batch, key_noise, batch_size: int, dim: int,
                    dtype) -> StepNoise:
    """:func:`step_noise` once its key is split: the minibatch's uniforms from ``key_batch``,
    the Langevin noise from ``key_noise``, the scheduler's uniform ``client`` as given (a
    hand-off protocol's update, handed its two keys, gives 0: its one client is known)."""
    return StepNoise(
        client=client,
        batch=rng.uniform(key_batch, (batch_size,)),
        normal=rng.normal(key_noise, (dim,), dtype),
    )


def langevin_move(position, gradient, step_size, normal):
    """Equation (1) with the standard normal ``normal`` given: theta + (h/2) v + sqrt(h) xi."""
    return position + 0.5 * step_size * gradient + jnp.sqrt(step_size) * normal


def build_kernel(
    flat_model: FlatModel,
    data: ConcatenatedData,
    batch_size: int,
    schedule: Callable,
    noise: bool = True,
    private=None,
    preconditioner=None,
):
    """SGLD on the pooled data (the centralised baseline).

    Equation (2): v(theta) = grad log p(theta) + (N/m) grad log p(x^(m) | theta),
    the minibatch drawn uniformly (with replacement) from all N examples;
    ``batch_size >= N`` uses every example once (the exact gradient; :mod:`fedmcmc.minibatch`).
    ``private``: a :class:`fedmcmc.clipping.PrivateSteps` (:mod:`fedmcmc.privacy`): clipped
    per-example gradients, distinct rows, the noise times ``noise_inflation[0]``.
    ``preconditioner``: a :class:`~.preconditioning.RMSPropPreconditioner` (pSGLD, Li et al.
    2016): the update is its :meth:`~.preconditioning.RMSPropPreconditioner.move`, with V in
    ``state.square_average`` (start from :func:`init` given the preconditioner).
    """
    if private is not None and preconditioner is not None:
        raise ValueError("preconditioner cannot be combined with private: the privacy "
                         "accounting assumes the noise N(0, h I)")
    # N, on the host (the sizes are concrete when the kernel is built), as the int32 it was
    total = np.asarray(data.sizes).sum(dtype=np.int32)
    dim = flat_model.dim

    def noise_of(key: jax.Array) -> StepNoise:
        # scheduler slot unused here; the minibatch and the noise keys are the 2nd and 3rd
        return step_noise(key, batch_size, dim, flat_model.dtype)

    # batch_size is an upper bound (fedmcmc.minibatch): a batch at least as large as the
    # data is the full-data gradient (every row once)
    may_be_smaller = some_client_smaller([total], batch_size)

    if private is not None:
        flat_model = private.model(flat_model)

    def apply(random: StepNoise, state: SGLDState) -> SGLDState:
        normal = random.normal
        uniforms = random.batch
        if private is not None:
            uniforms = distinct_row_uniforms(uniforms, total)
            normal = normal * private.noise_inflation[0]
        minibatch = take_minibatch(uniforms, data.data, 0, total, may_be_smaller)
        theta = state.position
        gradient = flat_model.grad_log_prior(theta) + likelihood_gradient(flat_model, theta, minibatch)
        h = schedule(state.iteration)
        if preconditioner is not None:
            position, square_average = preconditioner.move(
                theta, gradient, h, normal, state.square_average, total, state.iteration == 0,
                noise)
            return state._replace(position=position, iteration=state.iteration + 1,
                                  square_average=square_average)
        if noise:
            position = langevin_move(theta, gradient, h, normal)
        else:
            position = theta + 0.5 * h * gradient
        return state._replace(position=position, iteration=state.iteration + 1)

    return LangevinStep(noise=noise_of, apply=apply)
