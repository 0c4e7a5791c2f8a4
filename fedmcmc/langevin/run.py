"""The in-process run of a Langevin kernel: ``thin`` kernel updates per draw, vmapped over
chains (``fedmcmc.engines.local.run_chains``), and its ``Result``.

The kernel (``sgld.build_kernel``, ``dsgld.build_kernel``, ``fsgld.build_kernel``) carries the
configuration; its random numbers for the ``thin`` updates of a draw come from the keys
``split(key, thin)``, as ``step(k, s)`` would draw them one update at a time. A hand-off
kernel's state counts its rounds and visits, from which the run's message counts follow
(a round hands the chain, d floats, to a client and back with the draws of the visit).
"""

from __future__ import annotations

from typing import Callable, Optional

import jax
import numpy as np

from .. import messages as message_counts
from .. import rng
from ..arrays import device_array
from ..checkpoint import resume_from
from ..engines.local import run_chains
from ..model import unravel_draws_numpy
from ..results import Result, assemble_result, divergence_details, diverged_error
from . import sgld

__all__ = ["run_in_process"]


def run_in_process(
    *,
    name: str,
    step: Callable,
    initial_state,
    flat_model,
    federation,
    num_samples,
    burn_in,
    thin,
    chains,
    seed,
    progress,
    label,
    info: dict,
    client_aware: bool,
    divergence_threshold: float,
    divergence_advice: str = "",
    run_options: Optional[dict] = None,
) -> Result:
    """Run ``step`` (a kernel with ``step.noise``) from ``initial_state`` on ``chains`` chains
    (seed ``seed``): ``burn_in`` + ``num_samples`` draws of ``thin`` updates each; ``info``
    starts the result's ``info``, which adds the message counts (``client_aware``: a hand-off
    kernel, whose draws record the client and round). ``run_options``: the resume and chunk
    options of ``fedmcmc.checkpoint``. A diverged chain (non-finite, or a coordinate above
    ``divergence_threshold``) raises ``diverged_error`` naming ``name``, with
    ``divergence_advice`` appended."""
    def draw_noise(key):
        # the random numbers of the draw's ``thin`` updates, from the keys
        # split(key, thin) (what ``step(k, s)`` would draw one update at a time)
        return jax.vmap(step.noise)(rng.split_key(key, thin))

    def draw_step(noise, state):
        state = sgld.run_updates(step, noise, state)
        stats = {}
        if client_aware:
            stats = {"client": state.client, "round": state.rounds}
        return state, state.position, stats

    # on the host (the initial state is concrete): eager broadcasts compile programs
    states = jax.tree_util.tree_map(
        lambda leaf: device_array(np.broadcast_to(np.asarray(leaf),
                                                  (chains,) + np.shape(leaf))),
        initial_state)
    run_options = dict(run_options or {})
    states, start_draw = resume_from(run_options, states)
    run = run_chains(
        draw_step,
        states,
        rng.seed_key(seed),
        burn_in=burn_in,
        num_samples=num_samples,
        position=lambda s: s.position,
        divergence_threshold=divergence_threshold,
        progress=progress,
        label=label,
        iterations_per_draw=thin,
        start_draw=start_draw,
        draw_noise=draw_noise,
        **run_options,
    )
    final = run.state
    info = dict(info)
    if client_aware:
        visits_per_chain = np.asarray(final.visits)
        rounds = visits_per_chain.sum(axis=-1)  # final.rounds, in NumPy
        visits = visits_per_chain.sum(axis=0)
        info["rounds"] = int(rounds.max())
        info["rounds_per_chain"] = rounds.tolist()
        info["visits_per_client"] = visits.tolist()
        # Every round hands the chain (d floats) to a client and back, with the
        # draws taken during the visit; surrogates travel once (FSGLD).
        handoff_messages = message_counts.handoff(rounds)
        info.update(message_counts.figures(handoff_messages,
                                           info.get("surrogate_messages", 0)))
        # the carry: the position, and pSGLD's V when preconditioned
        carry_floats = flat_model.dim * (1 if initial_state.square_average is None else 2)
        info["floats_communicated"] = int(
            handoff_messages * carry_floats
            + run.draws_done * chains * flat_model.dim
            + info.get("surrogate_floats", 0)
        )
    else:
        info["rounds"] = 0
        info["messages"] = 0
        info["floats_communicated"] = 0
    info["bytes_communicated"] = info["floats_communicated"] * int(np.dtype(flat_model.dtype).itemsize)
    result = assemble_result(
        run, algorithm=name, unravel=lambda draws: unravel_draws_numpy(flat_model, draws),
        info=info, dim=flat_model.dim, thin=thin, start_draw=start_draw)
    if run.diverged.any():
        raise diverged_error(
            name, result, divergence_details(run, thin, ("client", "round")),
            f"diverged (non-finite or |theta| > {divergence_threshold:g}); lower step_size"
            + (f" (this one is past the stability limit: (h/4) lambda_max of the posterior "
               f"curvature is {info['discretisation_ratio']:.3g} >= 1; step_size='auto' "
               "chooses a stable one)" if info.get("discretisation_ratio", 0) >= 1 else "")
            + divergence_advice)
    return result
