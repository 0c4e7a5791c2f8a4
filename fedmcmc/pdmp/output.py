"""The output of a Fed-PDMC run: what ``result.info`` reports and the result itself.

* :class:`RunSums` (:func:`run_sums`): the per-chain sums over the kept draws that ``info``
  reports (rate means, the batch sums of the batch-means ESS), carried next to the chain
  state on every engine, so that a resumed run reports them for the whole run;
* :func:`positions_only`: the ``on_draws`` callback of the draws (positions only, in the
  model's dtype);
* :func:`finish`: the run's figures from the chain states (process time, trajectory
  moments, events, bound violations, rounds and messages, ESS by batch means over process
  time, :func:`ess_from_batch_sums`), the :class:`~fedmcmc.results.Result`, or the error
  that stopped the run (diverged chains, :class:`PDMPBoundError`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import messages as message_counts
from .. import run_length
from ..arrays import device_array
from ..model import unravel_draws_numpy
from ..results import finish_run
from . import federated, privacy as privacy_module
from .zigzag import ZigZagSpec

__all__ = ["ess_from_batch_sums", "PDMPBoundError", "RATE_KEYS", "RunSums", "batch_length_of",
           "positions_only", "run_sums", "run_figures", "finish", "raise_bound_errors"]


def ess_from_batch_sums(batch_sums: np.ndarray, batch_length: int, variance: np.ndarray) -> np.ndarray:
    """ESS of the trajectory average, per coordinate, summed over chains, by batch means.

    The exact averages of X(t) over consecutive sample intervals are grouped into batches
    of ``batch_length``; with ``s^2`` the variance of the batch means and ``b`` the batch
    length, the asymptotic variance of one interval is ``b s^2`` and
    ``ESS = n variance / (b s^2)`` (``variance``: the target's variance, e.g. the
    trajectory variance).

    ``batch_sums`` has shape ``(chains, nb, d)``: the sum of ``batch_length``
    consecutive interval means per batch (what the samplers accumulate in their
    chain state, so that a resumed run can report the ESS of the whole run).
    """
    sums = np.asarray(batch_sums, dtype=np.float64)
    chains, nb, d = sums.shape
    b = int(batch_length)
    total = np.zeros(d)
    for c in range(chains):
        batches = sums[c] / b
        s2 = batches.var(axis=0, ddof=1) if nb > 1 else np.full(d, np.inf)
        asym = np.maximum(b * s2, 1e-300)
        total += (nb * b) * np.asarray(variance) / asym
    return total


class PDMPBoundError(RuntimeError):
    """A rate bound was exceeded (with ``on_bound_violation='error'``), or the event
    simulation hit its iteration limit. ``result`` holds the run's draws and info."""

    def __init__(self, message, result=None):
        super().__init__(message)
        self.result = result



RATE_KEYS = federated.RATE_KEYS


class RunSums(NamedTuple):
    """Per-chain sums over the kept draws that ``info`` reports, carried in the chain state
    so that a resumed run reports them for the whole run (see the module docstring)."""

    rate_sum: jax.Array  # (3,) sums of the RATE_KEYS stats (NaN skipped)
    rate_count: jax.Array  # (3,) number of non-NaN values summed
    batch_sum: jax.Array  # (num_batches, d) sums of the interval means per batch


def batch_length_of(num_samples: int) -> int:
    """Batch length of the batch-means ESS: floor(sqrt(n)) for the n planned kept draws."""
    return max(1, int(math.floor(math.sqrt(num_samples))))



def positions_only(on_draws, d: int, dtype):
    """``on_draws`` for the engines' draws, (position, mean over the draw's interval): the
    callback gets the positions in ``dtype`` (the model's), what ``result.samples`` holds."""

    def positions(draws, stats, first_index):
        on_draws(np.asarray(draws[..., :d], dtype=np.dtype(dtype)), stats, first_index)

    return positions


def run_sums(burn_in: int, num_samples: int, d: int, chains: int):
    """``(accumulate, initial RunSums (chains, ...), batch length)``:
    ``accumulate(n_draws_before, sums, draw, stats) -> sums`` adds one draw of one chain
    (the same on every engine)."""
    b = batch_length_of(num_samples)
    num_batches = num_samples // b

    def accumulate(n_draws_before, sums, draw, stats):
        index = n_draws_before - burn_in  # kept-draw index of this draw (< 0: burn-in)
        counting = index >= 0
        rates = jnp.stack([jnp.asarray(stats.get(k, jnp.nan), jnp.float64) for k in RATE_KEYS])
        use = counting & ~jnp.isnan(rates)
        batch = index // b
        in_batch = counting & (batch < num_batches)
        row = jnp.clip(batch, 0, num_batches - 1)
        return RunSums(
            rate_sum=sums.rate_sum + jnp.where(use, rates, 0.0),
            rate_count=sums.rate_count + use.astype(jnp.int32),
            batch_sum=sums.batch_sum.at[row].add(jnp.where(in_batch, draw[d:], 0.0)),
        )

    sums = RunSums(
        rate_sum=device_array(np.zeros((chains, len(RATE_KEYS)), np.float64)),
        rate_count=device_array(np.zeros((chains, len(RATE_KEYS)), np.int32)),
        batch_sum=device_array(np.zeros((chains, max(num_batches, 1), d), np.float64)),
    )
    return accumulate, sums, b


def run_figures(algorithm, run, built, *, num_samples: int, chains: int,
                skeleton_size: int) -> dict:
    """``built.info`` (the set-up's figures; ``built``: the run's
    :class:`~.setup.BuiltSampler`) with the run's, from the chain states: process time,
    trajectory moments, events, rejections, bound violations, rounds and the messages of
    the event rounds, rate means, batch-means ESS, skeleton."""
    cfg, info = built.config, built.info
    burn_in = cfg.burn_in  # resolved ("auto")
    batch_length = batch_length_of(num_samples)
    d = cfg.dim
    M = cfg.num_workers
    st, sums = jax.tree_util.tree_map(np.asarray, run.state)
    draws = np.asarray(run.draws, dtype=np.float64)
    positions = draws[..., :d]
    kept_time = st.kept_time  # (chains,)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_c = st.sum_x / kept_time[:, None]
        second_c = st.sum_xx / kept_time[:, None, None]
    mean = mean_c.mean(axis=0)
    cov = second_c.mean(axis=0) - np.outer(mean, mean)
    total_time = float(np.sum(st.t))
    events = st.events.sum(axis=0)
    excess = st.excess_events.sum(axis=0)
    velocity_changes = int(events.sum() + excess.sum() + st.refreshes.sum())
    comm_workers = M + (1 if algorithm.prior == "worker" else 0)
    iterations = int(st.iterations.sum())
    coords = np.asarray(info["coordinates_per_worker"] + ([d] if algorithm.prior == "worker" else []))
    reply = 2 if algorithm.spec is ZigZagSpec else 1 + d
    info.update(
        algorithm=algorithm.name,
        chains=chains,
        dim=d,
        sample_interval=cfg.sample_interval,
        sample_interval_auto=run_length.is_auto(algorithm.sample_interval),
        burn_in=int(burn_in),
        thin=1,  # a draw every sample_interval: thin does not apply
        refresh_rate=algorithm.refresh_rate,
        rho=algorithm.rho,
        process_time=total_time,
        kept_time=float(kept_time.sum()),
        draws_kept=int(positions.shape[1]),
        wall_time=run.wall_time,
        interrupted=run.interrupted,
        trajectory_mean=mean.tolist(),
        trajectory_var=np.diag(cov).tolist(),
        trajectory_cov=cov.tolist(),
        trajectory_mean_per_chain=mean_c.tolist(),
        events=velocity_changes,
        gradient_events=int(events.sum()),
        excess_events=int(excess.sum()),
        refreshments=int(st.refreshes.sum()),
        redistributions=int(st.redistributions.sum()),
        events_per_worker=events[:M].tolist(),
        excess_events_per_worker=excess[:M].tolist(),
        prior_events=int(events[M]) if cfg.prior_worker else 0,
        effective_switching_rate=velocity_changes / max(total_time, 1e-300),
        event_iterations=iterations,
        event_iterations_per_chain=st.iterations.tolist(),
        thinning_proposals=int(st.thinning.sum()),
        rejections=int(st.rejections.sum()),
        rejections_per_worker=st.rejections.sum(axis=0)[:M].tolist(),
        bound_violations=int(st.violations.sum()),
        bound_violations_per_worker=st.violations.sum(axis=0)[:M].tolist(),
        bound_scale_final=st.scale.max(axis=0).tolist(),
        rounds=iterations,
        # the rounds each chain took part in: on a message-passing engine the chains share
        # the rounds (event_rounds_broadcast); this count is the same on every engine
        **message_counts.figures(message_counts.event_rounds(st.iterations, comm_workers)),
        floats_communicated=int(iterations * (2 * coords.sum() + comm_workers * reply)),
    )
    if cfg.prior_worker:
        info["prior_bound_violations"] = int(st.violations.sum(axis=0)[M])
    if algorithm.privacy is not None:
        # every event round each worker sends one proposed time (Theorem 5.1 per time)
        info["privacy"] = privacy_module.composed_report(
            algorithm.privacy[0], algorithm.privacy[1], algorithm.sensitivity, algorithm.rho, [iterations] * M)
    if cfg.rate_diagnostics:
        # means over every kept draw of the run (also of a resumed one: the sums are state)
        count = sums.rate_count.sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            rate_means = sums.rate_sum.sum(axis=0) / count
        for key, mean_rate, n in zip(RATE_KEYS, rate_means, count):
            if n > 0:
                info["mean_" + key] = float(mean_rate)
    if "mean_rate_federated" in info and info["mean_rate_federated"] > 0:
        info["rate_reduction_control_variates"] = (
            info["mean_rate_plain"] / info["mean_rate_federated"])
    # Batch means over the whole run's kept draws so far: complete batches of
    # floor(sqrt(num_samples)) interval means.
    kept_so_far = max(0, run.draws_done - burn_in)
    full_batches = min(kept_so_far // batch_length, num_samples // batch_length)
    batch_sums = sums.batch_sum[:, :full_batches]
    if kept_so_far >= 4 and full_batches >= 2 and np.all(np.isfinite(batch_sums)):
        ess = ess_from_batch_sums(batch_sums, batch_length, np.diag(cov))
        info["ess_batch_means"] = ess.tolist()
        info["ess_batch_means_min"] = float(ess.min())
        info["ess_per_second"] = float(ess.min() / max(run.wall_time, 1e-9))
    if skeleton_size:
        n = np.minimum(st.sk_n, skeleton_size)
        info["skeleton_times"] = [st.sk_t[c, : n[c]].tolist() for c in range(chains)]
        info["skeleton_positions"] = [st.sk_x[c, : n[c]].tolist() for c in range(chains)]
        info["skeleton_velocities"] = [st.sk_v[c, : n[c]].tolist() for c in range(chains)]
        info["skeleton_truncated"] = bool(np.any(st.sk_n >= skeleton_size))
    return info


def finish(algorithm, run, built, *, num_samples: int, chains: int, skeleton_size: int,
           session_figures=None, label=None):
    """The :class:`~fedmcmc.results.Result` of a Fed-PDMC run
    (:func:`fedmcmc.results.finish_run` of its :func:`run_figures`; on a message-passing
    engine, ``label``, updated with the session's ``session_figures``: the transport's
    counts, ``transport_messages`` next to the event rounds' ``messages``), or the error
    that stopped it, carrying that result: a worker's failure, diverged chains, a
    :class:`PDMPBoundError`."""
    info = run_figures(algorithm, run, built, num_samples=num_samples, chains=chains,
                       skeleton_size=skeleton_size)
    if session_figures is not None:
        info.update(session_figures)
    d, out_model = built.config.dim, built.output_model
    overflow = bool(np.any(np.asarray(run.state[0].overflow)))

    def bound_checks(result):
        raise_bound_errors(algorithm, result, overflow, built.on_violation)

    return finish_run(
        run, name=algorithm.name, info=info, dim=d, label=label, role="worker",
        thin=None,  # draws are not iterations
        burn_in=built.config.burn_in,
        unravel=lambda draws: unravel_draws_numpy(out_model, np.asarray(draws)[..., :d]),
        divergence_cause=(f"diverged (non-finite or |x| > {algorithm.divergence_threshold:g}); "
                          "check the model's rate bounds"),
        checks=bound_checks)


def raise_bound_errors(algorithm, result, overflow: bool, on_violation: str) -> None:
    """The :class:`PDMPBoundError` of a run whose event simulation hit its limit
    (``overflow``), or whose rate bounds were exceeded with ``on_violation="error"``."""
    info = result.info
    if overflow:
        raise PDMPBoundError(
            f"{algorithm.name}: the event simulation hit its limit (max_thinning={algorithm.max_thinning} "
            f"proposals for one event, or max_events_per_draw={algorithm.max_events_per_draw} events "
            "in one sample_interval); the bound is far too loose or the rate explodes. "
            "Draws so far are in error.result.", result)
    if on_violation == "error" and info["bound_violations"] > 0:
        raise PDMPBoundError(
            f"{algorithm.name}: the rate bound ({info['bound']}) was exceeded "
            f"{info['bound_violations']} time(s) (per worker: "
            f"{info['bound_violations_per_worker']}): the model's Hessian/rate bound is too "
            "small, so thinning would sample the wrong distribution. Fix the bound, or pass "
            "on_bound_violation='enlarge' to double it automatically.", result)

