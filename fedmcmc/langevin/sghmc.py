"""Federated SGHMC: stochastic-gradient Hamiltonian Monte Carlo (Chen, Fox & Guestrin, 2014)
whose momentum travels with the chain from client to client.

The chain's carry is the pair (theta, v). A visit is ``local_steps`` updates on one client,
each the discretisation of the SGHMC dynamics, equation (15) of Chen et al. (2014), in the
form of their Algorithm 2 (unit mass M = I):

    theta' = theta + h v
    v'     = v + h g_s(theta') - h C v + N(0, 2 (C - B_hat) h I)

with friction C, an estimate B_hat of the gradient noise (default 0), step size h (a number or
a schedule h_t), and g_s the client's estimate of the log posterior's gradient, equation (4) of
the FSGLD paper: ``grad log p(theta) + (1 / f_s) (N_s / m_s) sum_j grad log p(x_j | theta)``
over a minibatch of at most ``batch_size`` of client s's rows, unbiased when client s is drawn
with probability f_s (``fedmcmc.minibatch.client_gradient_estimate``). The server draws the next
client of the chain with probability f_s and hands it (theta, v): the momentum is not reset
between visits, so the chain keeps the dynamics' inertia across clients (SGHMC's Algorithm 2
optionally resamples the momentum between outer loops; here it is never resampled, and starts
at v = 0).

It is written as a hand-off protocol (``fedmcmc.protocols.HandoffProtocol``) and nothing else:
``fm.FedSGHMC`` is ``fm.HandoffAlgorithm`` of it, so it runs on ``engine="local"`` (clients as
objects in this process) and ``engine="ray"`` with the same draws.
"""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
import numpy as np

from .. import rng
from ..algorithm import (check_nonnegative_float, check_positive_float, check_positive_int)
from ..handoff_algorithm import HandoffAlgorithm
from ..minibatch import client_gradient_estimate
from ..protocols import HandoffProtocol
from ..schedules import as_schedule, describe_step_size

__all__ = ["SGHMCProtocol", "FedSGHMC"]


class SGHMCProtocol(HandoffProtocol):
    """SGHMC (Chen et al., 2014, equation (15), Algorithm 2, unit mass) as a hand-off protocol:
    the carry (theta, v) travels from client to client; see the module docstring."""

    name = "FedSGHMC"
    update_reads_only_rows = True  # the update reads the context's flat model and rows only

    def __init__(self, step_size, friction: float, batch_size: int, local_steps: int,
                 noise_estimate: float = 0.0, divergence_threshold: float = 1e10):
        self.step_size = step_size
        self.schedule = as_schedule(step_size)
        self.friction = float(friction)
        self.noise_estimate = float(noise_estimate)
        self.batch_size = int(batch_size)
        self.local_steps = int(local_steps)
        self.divergence_threshold = float(divergence_threshold)

    def init_carry(self, position):
        """(theta, v): the position and the momentum, which starts at zero."""
        return (position, np.zeros_like(position))

    def build_update(self, context, parameters):
        schedule, friction, batch_size = self.schedule, self.friction, self.batch_size
        noise_rate = 2.0 * (friction - self.noise_estimate)  # 2 (C - B_hat)

        def update(step, carry):
            position, momentum = carry
            h = schedule(step.iteration)
            position = position + h * momentum
            gradient = client_gradient_estimate(context, position, step.minibatch_key,
                                                batch_size, parameters.weight)
            noise = rng.normal(step.noise_key, position.shape, position.dtype)
            momentum = (momentum + h * gradient - h * friction * momentum
                        + jnp.sqrt(noise_rate * h) * noise)
            return (position, momentum)

        return update


class FedSGHMC(HandoffAlgorithm):
    """Federated stochastic-gradient Hamiltonian Monte Carlo: SGHMC (Chen, Fox & Guestrin,
    2014, equation (15)) whose chain, position and momentum together, is handed from client to
    client as DSGLD's position is.

    Each visit runs ``local_steps`` SGHMC updates on one client with its estimator (4) of the
    posterior gradient (a minibatch of at most ``batch_size`` of its rows, scaled by 1/f_s);
    the next client is drawn with probability f_s and receives (theta, v).

    Parameters
    ----------
    step_size:
        h > 0, or a schedule ``h(t)`` (``fm.schedules``). The position moves by h v per update.
    friction:
        C > 0, the friction of the momentum (per unit time). With unit mass, ``C`` about
        ``2 sqrt(lambda_min)`` of the posterior precision damps its slowest direction
        critically; the stationary law's O(h) discretisation error grows with ``h C``.
    batch_size:
        Rows per minibatch (an upper bound: a client with fewer rows uses all of them).
    local_steps:
        Updates per visit before the chain is handed on.
    noise_estimate:
        B_hat in [0, C): an estimate of the gradient noise's contribution to the friction,
        subtracted from the injected noise (Chen et al., section 3.3). Default 0 (the
        injected noise is the full 2 C h).
    divergence_threshold:
        A draw with a non-finite coordinate or one above this in absolute value stops its chain.

    Run options: those of :class:`fedmcmc.HandoffAlgorithm` (``visit_timeout``,
    ``on_client_failure``, ...). ``thin`` and ``burn_in`` are integers (no ``"auto"``).
    """

    def __init__(self, step_size, friction: float, batch_size: int, local_steps: int,
                 noise_estimate: float = 0.0, divergence_threshold: float = 1e10):
        if isinstance(step_size, str) or not callable(step_size):
            step_size = check_positive_float(step_size, "step_size")
        friction = check_positive_float(friction, "friction")
        noise_estimate = check_nonnegative_float(noise_estimate, "noise_estimate")
        if noise_estimate >= friction:
            raise ValueError(f"noise_estimate must be below friction ({friction:g}), got "
                             f"{noise_estimate:g}: the injected noise 2 (C - B_hat) h must be "
                             "positive")
        divergence_threshold = check_positive_float(divergence_threshold,
                                                    "divergence_threshold")
        self.step_size = step_size
        self.friction = friction
        self.batch_size = check_positive_int(batch_size, "batch_size")
        self.local_steps = check_positive_int(local_steps, "local_steps")
        self.noise_estimate = noise_estimate
        self.divergence_threshold = divergence_threshold
        super().__init__(SGHMCProtocol(step_size, friction, self.batch_size, self.local_steps,
                                       noise_estimate, divergence_threshold))

    def hyperparameters(self) -> dict:
        return {name: getattr(self, name)
                for name in ("step_size", "friction", "batch_size", "local_steps",
                             "noise_estimate", "divergence_threshold")}

    def run_info(self) -> Optional[dict]:
        return {"step_size": describe_step_size(self.step_size), "friction": self.friction,
                "batch_size": self.batch_size, "noise_estimate": self.noise_estimate}
