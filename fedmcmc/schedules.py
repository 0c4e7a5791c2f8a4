"""Step-size schedules h_t, shared by every family (the Langevin samplers' paper convention,
see ``langevin/sgld.py``; DULA/GT-DULA's alpha_k).

A schedule is a function of the iteration counter t (a traced integer) that
returns the step size h_t; a plain float is the constant schedule.
"""

from __future__ import annotations

import math

from typing import Callable, Optional, Union

import jax.numpy as jnp

__all__ = ["constant", "polynomial", "piecewise_constant", "cyclical", "as_schedule", "StepSize", "describe_step_size",
           "decaying_schedule"]

StepSize = Union[float, Callable]


def constant(step_size: float) -> Callable:
    """h_t = step_size."""
    if not step_size > 0:
        raise ValueError(f"step_size must be positive, got {step_size}")
    # a constant XLA can fold (h_t + 0 * t is not folded: it cost a fused op per step)
    return lambda t: jnp.full(jnp.shape(t), step_size, dtype=jnp.float32)


def polynomial(a: float, b: float = 1.0, gamma: float = 0.55) -> Callable:
    """h_t = a (b + t)^(-gamma), the decay of Welling & Teh (2011).

    ``gamma`` in (0.5, 1] satisfies sum h_t = inf and sum h_t^2 < inf
    (FSGLD section 2).
    """
    if not a > 0:
        raise ValueError(f"a must be positive, got {a}")
    if not b > 0:
        raise ValueError(f"b must be positive, got {b}")
    if not 0 < gamma <= 1:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")
    return lambda t: a * (b + t) ** (-gamma)


def piecewise_constant(boundaries, values) -> Callable:
    """h_t = values[k] for boundaries[k-1] <= t < boundaries[k] (e.g. the x0.1 reductions of GT-DULA)."""
    boundaries = jnp.asarray(boundaries)
    values = jnp.asarray(values, dtype=jnp.float32)
    if values.shape[0] != boundaries.shape[0] + 1:
        raise ValueError("values must have one more entry than boundaries")
    if not bool(jnp.all(values > 0)):
        raise ValueError("values (step sizes) must be positive")
    return lambda t: values[jnp.searchsorted(boundaries, t, side="right")]


def cyclical(initial: float, total_iterations: int, cycles: int) -> Callable:
    """The cyclical cosine schedule of cyclical SG-MCMC (Zhang et al., ICLR 2020, eq. (1)):
    ``h_t = (initial / 2) (cos(pi mod(t, L) / L) + 1)`` with ``L = ceil(total_iterations /
    cycles)`` (the paper's k - 1 = t, counted from 0): ``cycles`` cycles, each starting at
    ``initial`` and falling to near 0, so that a chain explores a new mode at the start of a
    cycle with large steps and samples it with small ones at its end (the multi-modal
    posteriors of Bayesian neural networks). The paper's exploration stage (no noise during
    the first part of each cycle) is not part of a schedule; every update here keeps its
    noise, so the draws of a whole cycle are SGLD draws at varying step sizes."""
    if not initial > 0 or not math.isfinite(initial):
        raise ValueError(f"initial must be a positive finite number, got {initial}")
    if isinstance(total_iterations, bool) or not isinstance(total_iterations, int) \
            or total_iterations < 1:
        raise ValueError(f"total_iterations must be a positive integer, got {total_iterations!r}")
    if isinstance(cycles, bool) or not isinstance(cycles, int) or not 1 <= cycles <= total_iterations:
        raise ValueError(f"cycles must be an integer in [1, total_iterations], got {cycles!r}")
    length = -(-total_iterations // cycles)  # ceil(K / M)
    initial = float(initial)

    def schedule(t):
        phase = jnp.mod(t, length).astype(jnp.float32) / length
        # (h0 / 2)(cos(pi x) + 1) = h0 cos^2(pi x / 2): no cancellation near the cycle's end
        return initial * jnp.cos(0.5 * jnp.pi * phase) ** 2

    return schedule


def as_schedule(step_size: StepSize, argument: str = "step_size") -> Callable:
    """A schedule from a float (constant) or a callable; ``ValueError`` naming ``argument`` otherwise."""
    if callable(step_size):
        return step_size
    try:
        value = float(step_size)
    except (TypeError, ValueError):
        raise ValueError(f"{argument} must be a positive number or a schedule, got {step_size!r}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{argument} must be a positive finite number, got {step_size!r}")
    return constant(value)


def describe_step_size(step_size):
    """A step size as ``result.info`` records it: the number, ``"auto"``, or a schedule's name."""
    return step_size if not callable(step_size) else getattr(step_size, "__name__", "schedule")


def decaying_schedule(step_size, decay_every: Optional[int], decay_factor: float) -> Callable:
    """``step_size`` (a number or schedule) multiplied by ``decay_factor`` every ``decay_every``
    iterations (DULA/GT-DULA's optional decay; ``None``: no decay)."""
    schedule = as_schedule(step_size)
    if decay_every is None:
        return schedule
    every = int(decay_every)

    def decayed(t):
        return schedule(t) * jnp.asarray(decay_factor, jnp.float32) ** (t // every)

    return decayed
