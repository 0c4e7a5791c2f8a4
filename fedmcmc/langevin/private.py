"""Private runs of SGLD, DSGLD and FSGLD (:mod:`fedmcmc.privacy` has the mechanism).

One update on client s (SGLD: the pooled data, one "client") is
``theta + (h/2) [grad log p(theta) + (N_s / (w_s m_s)) S + g(theta)] + sqrt(h) a_s xi``,
S the sum of ``m_s = min(m, N_s)`` clipped per-example gradients of distinct rows, ``w_s = 1``
(SGLD) or f_s (DSGLD, FSGLD: the scheduler's probability of the client), ``g`` the
data-free part (FSGLD's conducive gradient of *given* surrogates). The Langevin floor of
the noise multiplier is therefore (``fedmcmc.privacy.langevin_noise_multiplier``)

    z_L = sqrt(h) / ((h/2) (N_s / (w_s m_s)) 2 C) = w_s m_s / (N_s C sqrt(h)),

and a_s = z_s / z_L. Updates per client: SGLD every iteration of every chain; DSGLD and
FSGLD the updates of the visits the scheduler draws (planned at their 1 - 1e-6 quantile,
accounted as made: ``local_steps`` per started visit, summed over the chains; a schedule past
its plan stops the run at its last draw within the budget,
:func:`fedmcmc.privacy.run_within_budget`).

What the accountant cannot count is refused (``ValueError`` naming ``privacy``): a step size
that is ``"auto"`` or a schedule, ``thin`` / ``burn_in`` ``"auto"``, control variates,
``client_selection="variance"`` (each reads the rows outside the accounted steps), FSGLD
surrogates fitted from the rows (``"laplace"``, ``"exact"``, ``"sgld"``; give precomputed
``(precision, shift)``, e.g. from public data, which the accountant treats as public) and
FSGLD's trust region (its damping reads the minibatch gradient: the update is then not a
Gaussian mechanism on S), and ``noise=False``.

On a message-passing engine (DSGLD and FSGLD through the hand-off protocol) the
driver plans as in process, from the clients' row counts and f_s, and sends each client its
a_s and C with its parameters (:class:`fedmcmc.langevin.handoff.PrivateNoise`); the client
clips and adds the noise inside its own visit, so what leaves it (the chain's state after a
visit, the draws taken during it) is the output of the accounted mechanism. The same seed gives
the in-process draws. Refused there: a ``Federation.from_loaders`` federation (the plan needs
every client's row count before the run, which the driver learns only from the clients) and
``on_client_failure="drop"`` (a drop changes the f_s the plan was made for).
"""

from __future__ import annotations

import math

import numpy as np

from .. import privacy as privacy_module
from ..arrays import device_array
from ..clipping import PrivateSteps
from .handoff import PrivateNoise

__all__ = ["check_settings", "check_distributed", "sgld_plan", "federated_plan",
           "private_noise", "private_steps"]


def check_settings(algorithm, request) -> None:
    """Refuse what a private run of a Langevin algorithm cannot account (module docstring)."""
    name = algorithm.name
    refuse = privacy_module.refuse
    step_size = algorithm.step_size
    refuse(isinstance(step_size, str) or callable(step_size), name,
           f"step_size={step_size!r} ('auto' reads the clients' rows before the run, a "
           "schedule changes the noise each step): give a number")
    refuse(request is not None and request.any_auto, name,
           "thin or burn_in 'auto' (they read the clients' Laplace fits): give integers")
    refuse(not algorithm.noise, name, "noise=False (no Gaussian mechanism)")
    variates = getattr(algorithm, "control_variates", None)
    refuse(variates not in (None, False), name,
           f"control_variates={variates!r} (their anchors and anchor gradients read the rows)")
    refuse(getattr(algorithm, "client_selection", None) == "variance", name,
           "client_selection='variance' (the f_s are chosen from the rows' gradient noise)")


def _floors(privacy, sizes, weights, batch_size, step_size) -> list:
    clip = privacy.clip_norm
    return [privacy_module.ClientPlan(
        population=int(n), sample_size=int(min(batch_size, n)),
        floor=privacy_module.langevin_noise_multiplier(
            math.sqrt(step_size), step_size, n / (w * min(batch_size, n)), clip))
        for n, w in zip(sizes, weights)]


def sgld_plan(privacy, total_rows: int, batch_size: int, step_size: float, chains: int,
              thin: int, burn_in: int, num_clients: int, num_samples: int):
    """SGLD's plan: the pooled data as one mechanism, its epsilon reported for every client
    (each client's rows are rows of the pool). Returns (plan, steps_for_draws)."""
    clients = _floors(privacy, [total_rows], [1.0], batch_size, step_size) * num_clients

    def steps_for_draws(n):
        return [chains * (burn_in + n) * thin] * num_clients

    the_plan = privacy_module.plan(privacy, clients, steps_for_draws(num_samples),
                                   "every iteration of every chain")
    return the_plan, steps_for_draws


def federated_plan(privacy, sizes, weights, batch_size: int, step_size: float,
                   local_steps: int, chains: int, thin: int, burn_in: int, num_samples: int):
    """DSGLD's and FSGLD's plan per client. Returns (plan, steps_for_draws)."""
    clients = _floors(privacy, sizes, weights, batch_size, step_size)

    def steps_for_draws(n):
        rounds = -(-((burn_in + n) * thin) // local_steps)
        return privacy_module.scheduled_steps(rounds, chains, weights, local_steps)

    the_plan = privacy_module.plan(
        privacy, clients, steps_for_draws(num_samples),
        f"local_steps per visit; visits planned at their 1 - {privacy_module.SCHEDULE_TAIL:g} "
        "quantile, accounted as made")
    return the_plan, steps_for_draws


def check_distributed(algorithm, federation, options) -> None:
    """Refuse what a private run on a message-passing engine cannot account (module
    docstring): data the driver cannot count before the run, a drop policy. ``options``: the
    run's checked engine options (``engine.session_options``)."""
    refuse = privacy_module.refuse
    refuse(federation.is_deferred, algorithm.name,
           "a Federation.from_loaders federation: the plan needs every client's number of "
           "rows before the run, which the driver learns only from the clients; give the "
           "federation in memory")
    policy = options.get("on_client_failure", "stop")
    refuse(policy != "stop", algorithm.name,
           f"on_client_failure={policy!r}: a dropped client changes the f_s the plan was "
           "made for; use 'stop'")


def private_noise(the_plan):
    """What a hand-off protocol sends the clients: C and every client's a_s
    (:class:`fedmcmc.langevin.handoff.PrivateNoise`)."""
    return PrivateNoise(clip_norm=float(the_plan.privacy.clip_norm),
                        noise_inflation=np.asarray(the_plan.noise_inflation, np.float64))


def private_steps(the_plan, dtype) -> PrivateSteps:
    """What the kernel needs: C and the noise inflation per client."""
    return PrivateSteps(clip_norm=the_plan.privacy.clip_norm,
                        noise_inflation=device_array(the_plan.noise_inflation.astype(
                            np.dtype(dtype))))

