"""Public classes ``FedZigZag``, ``FedBPS``, ``FedBoomerang`` (Fed-PDMC, Bierkens & Duncan 2022).

They resolve the model's rate bounds, place the prior, set the privacy rate,
build the federated kernel of :mod:`.federated` and run it with
:func:`fedmcmc.engines.local.run_chains` (one ``draw_step`` = advance one chain
by ``sample_interval`` units of process time). Trajectories are simulated in
float64 (``jax.enable_x64``); draws are returned in the dtype of ``init``.

``fm.sample(..., thin=...)`` does not apply to these algorithms (``info["thin"]`` is 1):
draws are taken every ``sample_interval`` units of process time and ``burn_in`` counts
draws of the same length (``burn_in * sample_interval`` time units are discarded).
``thin="auto"`` is refused (pass ``sample_interval="auto"``).

Run lengths the library chooses (issue 44; ``supports_run_request``):
``sample_interval="auto"`` is one predicted relaxation time ``R`` of the process (process
time, :mod:`.relaxation`: from the federated Newton's Laplace fit and every worker's
gradient and Hessian at its centre), and ``burn_in="auto"`` the draws of that length that
:func:`fedmcmc.run_length.resolve` asks for a relaxation time of ``R / sample_interval``
draws. ``info`` records ``sample_interval``, ``relaxation_time`` (process time),
``relaxation_time_draws``, ``burn_in``, ``predicted_ess``, ``predicted_event_rate`` and
``predicted_events_per_chain``. The budget: ``max_iterations`` (``fm.sample``) counts
iterations of Algorithm 2 per chain (server rounds, ``info["event_iterations_per_chain"]``;
each is one velocity change or one rejected proposal, so at least the predicted number of
events). A run whose predicted events exceed it warns ``fm.RunLengthWarning``; with
``sample_interval="auto"`` the interval is shortened to fit (as ``thin="auto"`` is).
Without any ``"auto"`` nothing is predicted and the draws are those of a run without
these options.

Checkpoint and resume (``supports_resume``, :mod:`fedmcmc.checkpoint`): the chain
state carried by the engine is ``(FedState, RunSums)``. ``FedState`` holds the
process time, position, velocity, prior shares, bound scales, clocks, event
counters, trajectory integrals and skeleton; ``RunSums`` holds what ``info``
otherwise computed from the per-draw record (rate sums for ``mean_rate_*``,
interval-mean batch sums for ``ess_batch_means``). So every ``info`` figure of
a resumed run covers the whole run from draw 0, except ``wall_time`` and
``ess_per_second`` (this call's wall time; ``fedmcmc run`` adds up ``wall_time``).
Everything built before the chain loop (bounds, Newton reference, control
variates, initial states) is a deterministic function of the seed.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import rng
from ..arrays import device_array
from ..cache import jit_with_constants_as_arguments
from .. import run_length
from ..callsite import user_stacklevel
from ..algorithm import (
    Algorithm,
    check_nonnegative_float,
    check_positive_float,
    check_positive_int,
)
from ..checkpoint import resume_from, split_run_options
from ..engines.local import run_chains
from ..federation import UNPADDED_ABOVE_PADDING
from ..model import unravel_draws_numpy
from ..results import SamplingDivergedError, assemble_result, divergence_details, diverged_error
from .distributed import sample_pdmp
from . import federated, privacy as privacy_module, relaxation
from .boomerang import BoomerangSpec
from .bounds import (
    prior_hessian_bounds,
    whitened_bound,
)
from .bps import BPSSpec
from .output import ess_from_batch_sums
from .setup import LocalWorkers
from .single import make_reference
from .zigzag import ZigZagSpec
from ..engines.session import client_failure_error

__all__ = ["FedZigZag", "FedBPS", "FedBoomerang", "PDMPBoundError", "BuiltSampler"]

PRIOR_PLACEMENTS = ("server", "worker", "split")
BOUNDS = ("auto", "exact", "hessian", "custom", "estimate")
THINNINGS = ("auto", "per_worker", "superposition")


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


def _batch_length(num_samples: int) -> int:
    """Batch length of the batch-means ESS: floor(sqrt(n)) for the n planned kept draws."""
    return max(1, int(math.floor(math.sqrt(num_samples))))


def _summed_slope_bound(per_example_bound):
    """A worker's slope bound from the model's ``zigzag_slope_bound(x, v, h, example)``: the
    sum over its real rows (``mask_m``) of the per-example bounds."""

    def custom_slope(x, v, h, data_m, mask_m):
        per = jax.vmap(lambda example: per_example_bound(x, v, h, example))(data_m)
        return jnp.sum(per * mask_m[:, None], axis=0)

    return custom_slope


#: exact event times (quadratic potentials) take the unpadded layout above this share of
#: padding only: per event they need one gradient and one Hessian-vector product, for which
#: the unpadded layout's row gather and its transpose, a segment sum, cost about as much as
#: padding up to half the rows (``benchmarks/bench_pdmp.py --quick --federated-only``,
#: linear regression with sizes ~ 1/rank: 4 workers, 48% padding, 118.6 us/event padded
#: against 154.1 unpadded; 16 workers, 79%, 215.9 -> 142.6; 64 workers, 92%, 545.3 -> 122.1)
EXACT_UNPADDED_ABOVE_PADDING = 0.6


def _unpadded_workers_data_grad(flat_model, padded, sizes, reference_share=None, exact=False):
    """``X (M, d) -> (M, d)``: every worker's data potential gradient at its own row of ``X``,
    summed over the real rows only
    (:meth:`~fedmcmc.model.FlatModel.grad_log_likelihood_per_client`), or ``None`` when the
    clients are of nearly equal size: padding at most
    :data:`fedmcmc.federation.UNPADDED_ABOVE_PADDING` of the padded rows (with ``exact`` event
    times, at most :data:`EXACT_UNPADDED_ABOVE_PADDING`).

    The padded layout evaluates every worker on as many rows as the largest one has: with
    clients of very unequal size (1/rank sizes, 64 workers: 13x the rows) most of a thinning
    pass's gradients were padding. Same sums as ``data_grad`` worker by worker, in another
    order. ``reference_share``: ``(precision, mean, n_total)`` of the Boomerang's reference
    potential when the data workers hold ``-n_m / N U_ref``."""
    threshold = EXACT_UNPADDED_ABOVE_PADDING if exact else UNPADDED_ABOVE_PADDING
    if padded.padding_share <= threshold:
        return None
    rows, owner = padded.unpadded()
    shares = None if reference_share is None else device_array(
        np.asarray(sizes, np.float64) / reference_share[2])

    def workers_data_grad(X):
        g = -flat_model.grad_log_likelihood_per_client(X, rows, owner)
        if reference_share is not None:  # n_m / N of -grad U_ref
            precision, mean, _ = reference_share
            g = g - shares[:, None] * jax.vmap(lambda x: precision @ (x - mean))(X)
        return g

    return workers_data_grad


def _positions_only(on_draws, d: int, dtype):
    """``on_draws`` for the engines' draws, (position, mean over the draw's interval): the
    callback gets the positions in ``dtype`` (the model's), what ``result.samples`` holds."""

    def positions(draws, stats, first_index):
        on_draws(np.asarray(draws[..., :d], dtype=np.dtype(dtype)), stats, first_index)

    return positions


def _run_sums(burn_in: int, num_samples: int, d: int, chains: int):
    """``(accumulate, initial RunSums (chains, ...), batch length)``:
    ``accumulate(n_draws_before, sums, draw, stats) -> sums`` adds one draw of one chain
    (the same on every engine)."""
    b = _batch_length(num_samples)
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


class BuiltSampler(NamedTuple):
    """What :meth:`_FedPDMP.build` returns: the federated kernel, ready to run."""

    config: Any  # federated.FedConfig
    draw_step: Any  # draw_step(key, state) -> (state, draw, stats): one chain, one draw
    initial_states: Any  # FedState, leading axis chains
    key: Any  # the run's key (draw k of the run uses fold_in(key, k))
    output_model: Any  # FlatModel in the dtype of init (draws are returned in it)
    info: dict
    on_violation: str
    # with_protocol=True only (the distributed run composes them)
    protocol: Any = None  # federated.FedProtocol
    prior_part: Any = None  # federated.PriorPart
    workers: Any = None  # federated.Workers (data=None on the distributed run)


class _FedPDMP(Algorithm):
    spec: Any = None
    #: the broadcast-and-gather run (:meth:`sample_distributed`; on Ray one actor per worker)
    message_passing = True
    #: a broadcast-and-gather round with every worker per event (``engines.engine.PATTERNS``)
    message_pattern = "event_rounds"
    divergence_threshold = 1e10
    #: accepts the generic run options of ``fedmcmc.checkpoint.RUN_OPTIONS``
    #: (``start_draw``, ``resume_state``, ``on_chunk``, ``on_draws``, ``chunk_size``)
    supports_resume: bool = True
    #: fm.sample passes ``run_request`` (burn_in="auto"; sample_interval="auto" is ours)
    supports_run_request: bool = True

    def __init__(
        self,
        sample_interval,
        refresh_rate: float,
        *,
        excess_rate: float = 0.0,
        privacy: Optional[tuple] = None,
        sensitivity: Optional[float] = None,
        prior: str = "server",
        bound: str = "auto",
        on_bound_violation: Optional[str] = None,
        safety: float = 2.0,
        control_variates: Any = False,
        redistribution_rate: float = 0.0,
        max_thinning: int = 100_000,
        max_events_per_draw: int = 1_000_000,
        thinning: str = "auto",
    ):
        if run_length.is_auto(sample_interval):
            self.sample_interval = run_length.AUTO
        else:
            try:
                self.sample_interval = check_positive_float(sample_interval, "sample_interval")
            except (TypeError, ValueError) as error:
                raise ValueError(f"sample_interval must be a positive number or 'auto', got "
                                 f"{sample_interval!r}") from error
        self.refresh_rate = check_nonnegative_float(refresh_rate, "refresh_rate")
        self.excess_rate = check_nonnegative_float(excess_rate, "excess_rate")
        if privacy is not None:
            if not (isinstance(privacy, (tuple, list)) and len(privacy) == 2):
                raise ValueError(f"privacy must be a pair (epsilon, delta), got {privacy!r}")
            if sensitivity is None:
                raise ValueError("sensitivity (K of Theorem 5.1) is required with privacy=(epsilon, delta)")
            if self.excess_rate > 0:
                raise ValueError("excess_rate and privacy both set rho: give only one of them")
            check_positive_float(privacy[0], "privacy epsilon")
            eps = float(privacy[0])
            delta = check_positive_float(privacy[1], "privacy delta")
            if delta >= 1:
                raise ValueError(f"privacy delta must be in (0, 1), got {delta!r}")
            sensitivity = check_positive_float(sensitivity, "sensitivity")
            self.privacy = (eps, delta)
            self.sensitivity = sensitivity
            self.rho = privacy_module.rho_for_privacy(eps, delta, sensitivity)
        else:
            if sensitivity is not None:
                check_positive_float(sensitivity, "sensitivity")
            self.privacy = None
            self.sensitivity = sensitivity
            self.rho = self.excess_rate
        if prior not in PRIOR_PLACEMENTS:
            raise ValueError(f"prior must be one of {PRIOR_PLACEMENTS}, got {prior!r}")
        self.prior = prior
        if bound not in BOUNDS:
            raise ValueError(f"bound must be one of {BOUNDS}, got {bound!r}")
        self.bound = bound
        if on_bound_violation not in (None, "enlarge", "error"):
            raise ValueError(
                f"on_bound_violation must be None, 'enlarge' or 'error', got {on_bound_violation!r}")
        self.on_bound_violation = on_bound_violation
        self.safety = check_positive_float(safety, "safety")
        if self.safety < 1:
            raise ValueError(f"safety must be >= 1, got {safety!r}")
        if not (isinstance(control_variates, bool) or np.ndim(control_variates) == 1):
            raise ValueError("control_variates must be True/False or a reference point (flat vector)")
        self.control_variates = control_variates
        self.redistribution_rate = check_nonnegative_float(redistribution_rate, "redistribution_rate")
        if self.redistribution_rate > 0 and prior != "split":
            raise ValueError(
                "redistribution_rate > 0 (Appendix D) redistributes the prior across workers: "
                "it needs prior='split'")
        self.max_thinning = check_positive_int(max_thinning, "max_thinning")
        self.max_events_per_draw = check_positive_int(max_events_per_draw, "max_events_per_draw")
        if thinning not in THINNINGS:
            raise ValueError(f"thinning must be one of {THINNINGS}, got {thinning!r}")
        self.thinning = thinning

    # ------------------------------------------------------------------ setup
    def _resolve_bound(self, model, is_zigzag):
        attrs = model.attributes
        quadratic = bool(attrs.get("quadratic_potential", False))
        linear = self.spec.linear
        mode = self.bound
        if mode == "auto":
            if quadratic and linear:
                mode = "exact"
            elif attrs.get("hessian_bound") is not None:
                mode = "hessian"
            elif attrs.get("zigzag_slope_bound") is not None and is_zigzag:
                mode = "custom"
            else:
                mode = "estimate"
        if mode == "exact" and not (quadratic and linear):
            raise ValueError(
                "bound='exact' needs a model with quadratic_potential=True and linear dynamics "
                "(Zig-Zag, BPS)")
        if mode == "hessian" and attrs.get("hessian_bound") is None:
            raise ValueError("bound='hessian' needs the model attribute hessian_bound")
        if mode == "custom" and (attrs.get("zigzag_slope_bound") is None or not is_zigzag):
            raise ValueError("bound='custom' needs FedZigZag and the model attribute zigzag_slope_bound")
        return mode, quadratic

    def _reference(self, flat_model, newton, theta0, info):
        """The Boomerang's Gaussian reference (None for Zig-Zag and BPS); ``newton(theta0)``
        returns the posterior mode and Hessian there (federated Newton)."""
        return None

    def _check_run(self, thin, burn_in, run_request) -> None:
        """``thin`` and ``burn_in`` (``ValueError``), checked before either run."""
        if run_length.is_auto(thin):
            raise ValueError(
                f"thin='auto' does not apply to {self.name}: it takes a draw every "
                "sample_interval units of process time; pass sample_interval='auto' to the "
                f"algorithm ({self.name}(sample_interval='auto')) and thin=1")
        if thin != 1:
            # the contract: PDMPs take a draw every sample_interval, whatever thin says; a
            # thin given is not applied, and the user is told (never silently ignored)
            warnings.warn(
                f"thin={thin!r} does not apply to {self.name}: it takes a draw every "
                f"sample_interval={self.sample_interval!r} units of process time, so thin is "
                "not applied; set the algorithm's sample_interval (a number, or 'auto') "
                "instead", UserWarning, stacklevel=user_stacklevel())
        if run_length.is_auto(burn_in) and run_request is None:
            raise ValueError("burn_in='auto' needs fm.sample's run request (num_samples, chains, "
                             "max_iterations); call fm.sample, or give burn_in as an integer")

    @staticmethod
    def _check_outputs(skeleton, init_jitter) -> tuple:
        """The skeleton's buffer size (``skeleton``) and ``init_jitter``, checked."""
        if skeleton is True:
            skeleton = 10_000
        skeleton_size = 0 if skeleton is False else check_positive_int(skeleton, "skeleton")
        return skeleton_size, check_nonnegative_float(init_jitter, "init_jitter")

    def sample_local(self, model, federation, *, init, num_samples, burn_in, thin, chains,
                     seed, progress, skeleton=False, init_jitter=0.0, rate_diagnostics=True,
                     **options):
        """Run the sampler (see :func:`fedmcmc.sample`).

        Options: ``skeleton`` (False, True = 10,000 points per chain, or an int buffer size):
        return the skeleton points (T_k, X_k, V_k) in ``info``; ``init_jitter`` (default 0):
        chains start at ``init + init_jitter * N(0, I)`` (velocities are always drawn per
        chain); ``rate_diagnostics`` (default True): record the federated, plain and
        canonical event rates at every draw (one extra gradient per draw).
        ``thin`` does not apply (see the module docstring; ``"auto"`` is refused). The
        ``run_request`` fm.sample passes resolves ``burn_in="auto"`` (and the budget of
        ``sample_interval="auto"``). The generic run options of
        :mod:`fedmcmc.checkpoint` (``chunk_size``, ``start_draw``, ``resume_state``,
        ``on_chunk``, ``on_draws``) are accepted; ``on_draws`` receives the positions only,
        in the dtype of ``init`` (the draws of ``result.samples``). On a message-passing
        engine (:meth:`sample_distributed`) only ``chunk_size`` and ``on_draws`` are used:
        the run cannot be resumed, so ``on_chunk`` is not called and
        ``start_draw``/``resume_state`` are refused.
        """
        run_request = options.pop("run_request", None)  # before the run-option checks
        self._check_run(thin, burn_in, run_request)
        run_options = split_run_options(options, self.name)
        skeleton_size, init_jitter = self._check_outputs(skeleton, init_jitter)
        with jax.enable_x64(True):
            return self._sample(model, federation, init, num_samples, burn_in, chains, seed,
                                progress, skeleton_size, init_jitter, bool(rate_diagnostics),
                                run_options, run_request)

    def sample_distributed(self, model, federation, engine, *, init, num_samples, burn_in,
                           thin, chains, seed, progress, skeleton=False, init_jitter=0.0,
                           rate_diagnostics=True, **options):
        """One endpoint per worker on ``engine``'s transport (``pdmp/distributed.py``), with
        the options of :meth:`sample_local`."""
        run_request = options.pop("run_request", None)  # before the run-option checks
        self._check_run(thin, burn_in, run_request)
        # with the run options the broadcast run honours: draws per call (its chains wait
        # for each other only at a chunk's end) and the draws callback; on_chunk is not
        # called (such a run is not resumed from a checkpoint)
        engine_options = engine.session_options(options, self.name)
        skeleton_size, init_jitter = self._check_outputs(skeleton, init_jitter)
        with jax.enable_x64(True):
            return self._sample_distributed(
                model, federation, engine, engine_options, init, num_samples, burn_in, chains,
                seed, progress, skeleton_size, init_jitter, bool(rate_diagnostics), run_request)

    def _sample_distributed(self, model, federation, engine, engine_options, init, num_samples,
                            burn_in, chains, seed, progress, skeleton_size, init_jitter,
                            rate_diagnostics, run_request=None):
        """One endpoint per worker (``pdmp/distributed.py``): the workers simulate their own
        event times on their own data; the server gathers and applies the earliest."""
        d = model.flatten(init).dim
        b = _batch_length(num_samples)
        options = dict(engine_options)
        if options.get("on_draws") is not None:
            options["on_draws"] = _positions_only(options["on_draws"], d,
                                                  model.flatten(init).dtype)
        distributed = sample_pdmp(
            self, model, federation, engine, options, init=init, num_samples=num_samples,
            burn_in=burn_in, chains=chains, seed=seed, progress=progress,
            skeleton_size=skeleton_size, init_jitter=init_jitter,
            rate_diagnostics=rate_diagnostics,
            run_sums=lambda resolved_burn_in: _run_sums(resolved_burn_in, num_samples, d,
                                                        chains)[:2],
            run_request=run_request)
        run, failure, messages = distributed.run, distributed.failure, distributed.messages
        cfg, out_model = distributed.built.config, distributed.built.output_model
        burn_in = cfg.burn_in  # resolved ("auto")
        info, on_violation = distributed.built.info, distributed.built.on_violation
        try:
            result = self._result(run, cfg, out_model, federation, info, num_samples, burn_in,
                                  chains, on_violation, skeleton_size, b)
        except (SamplingDivergedError, PDMPBoundError) as error:
            error.result.info.update(messages)
            if failure is None:
                raise
            result = error.result  # the worker's failure is what stopped the run
        else:
            result.info.update(messages)
        if failure is not None:
            raise client_failure_error(self.name, engine.label, run, result, role="worker")
        return result

    def _sample(self, model, federation, init, num_samples, burn_in, chains, seed, progress,
                skeleton_size, init_jitter, rate_diagnostics, run_options, run_request=None):
        built = self.build(model, federation, init, burn_in=burn_in, chains=chains, seed=seed,
                           skeleton_size=skeleton_size, init_jitter=init_jitter,
                           rate_diagnostics=rate_diagnostics, num_samples=num_samples,
                           run_request=run_request)
        cfg, draw_step, fed_states, k_run = (built.config, built.draw_step,
                                             built.initial_states, built.key)
        out_model, info, on_violation = built.output_model, built.info, built.on_violation
        d = cfg.dim
        burn_in = cfg.burn_in  # resolved ("auto")
        accumulate, sums, b = _run_sums(burn_in, num_samples, d, chains)

        # One jitted function for the engine's two traces of a draw (its output shapes, then
        # the loop): JAX traces and batches a jitted function once per input shapes, so the
        # second trace reuses the first (the draw step's while loop is most of a run's tracing).
        traced_draw_step = jax.jit(draw_step, inline=True)

        def run_step(key, carry):
            st, sums = carry
            n_before = st.n_draws
            st, draw, stats = traced_draw_step(key, st)
            return (st, accumulate(n_before, sums, draw, stats)), draw, stats

        states = (fed_states, sums)
        states, start_draw = resume_from(run_options, states)
        if run_options.get("on_draws") is not None:
            run_options["on_draws"] = _positions_only(run_options["on_draws"], d,
                                                      out_model.dtype)
        run = run_chains(
            run_step, states, k_run, burn_in=burn_in, num_samples=num_samples,
            position=lambda s: s[0].x, divergence_threshold=self.divergence_threshold,
            progress=progress, label=self.name, start_draw=start_draw, **run_options)
        if start_draw:
            info["start_draw"] = int(start_draw)
        return self._result(run, cfg, out_model, federation, info, num_samples, burn_in, chains,
                            on_violation, skeleton_size, b)

    def _run_length(self, workers_access, theta0, info, *, run_request, burn_in, num_samples,
                    chains, prior_grad, reference, ref_share, g_ref, g_ref0, control_variates,
                    coords):
        """``(sample_interval, burn_in)`` with ``"auto"`` resolved (module docstring).

        The posterior's Laplace fit comes from the federated Newton (the one the Boomerang's
        reference and the control variates use: computed once), every worker's gradient and
        Hessian at its centre from one more round of Newton terms; they are composed into
        the gradients the rates see (prior shares, the Boomerang's reference shares, the
        control-variate shifts) and :func:`.relaxation.predict` turns them into ``R``."""
        d = theta0.shape[0]
        M = workers_access.num_workers
        sizes = workers_access.sizes
        mode, hess, rounds = workers_access.newton(theta0)
        mode = np.asarray(mode, np.float64)
        precision = 0.5 * (np.asarray(hess, np.float64) + np.asarray(hess, np.float64).T)
        info.setdefault("laplace_rounds", rounds)
        if not np.all(np.isfinite(precision)) or np.linalg.eigvalsh(precision).min() <= 0:
            raise ValueError(
                f"sample_interval='auto' / burn_in='auto': {self.name} predicts the relaxation "
                "time from the posterior's Laplace fit, and the Hessian at the mode the "
                "federated Newton found is not positive definite; give sample_interval and "
                "burn_in as numbers")
        g_data, h_data = workers_access.worker_terms(mode)
        if ref_share is not None:  # the data workers hold -n_m/N U_ref (the Boomerang)
            ref_precision = np.asarray(reference.precision, np.float64)
            ref_mean = np.asarray(reference.mean, np.float64)
            g_data = g_data - np.outer(ref_share, ref_precision @ (mode - ref_mean))
            h_data = h_data - ref_share[:, None, None] * ref_precision[None]
        mode_device = device_array(mode)
        g0 = np.asarray(prior_grad(mode_device), np.float64)
        h0 = np.asarray(jax.jacfwd(prior_grad)(mode_device), np.float64)
        prior_worker = self.prior != "split"
        alpha = np.zeros(M) if prior_worker else sizes / sizes.sum()
        g_hold = g_data + alpha[:, None] * g0[None]
        h_hold = h_data + alpha[:, None, None] * h0[None]
        if control_variates:  # Remark 4.3: minus s_m = g_m(x*) + a_m g_0(x*) - w_m g(x*)
            weights = sizes / sizes.sum()
            total = np.asarray(g_ref, np.float64).sum(axis=0) + g_ref0
            g_hold = g_hold - (np.asarray(g_ref, np.float64) + alpha[:, None] * g_ref0[None]
                               - weights[:, None] * total[None])
        holder_coords = np.asarray(coords, np.float64)
        if prior_worker:
            g_prior = g0 - (g_ref0 if control_variates else 0.0)
            g_hold = np.concatenate([g_hold, g_prior[None]])
            h_hold = np.concatenate([h_hold, h0[None]])
            holder_coords = np.concatenate([holder_coords, np.ones((1, d))])
        prediction = relaxation.predict(
            self.spec.name, mode, precision,
            relaxation.WorkerTerms(g=g_hold, H=h_hold, coords=holder_coords),
            refresh_rate=self.refresh_rate, rho=self.rho, num_workers=M,
            reference_chol=None if reference is None else np.asarray(reference.chol))
        R = prediction.relaxation_time
        if not math.isfinite(R) or R <= 0:
            raise ValueError(
                f"sample_interval='auto' / burn_in='auto': {self.name} with "
                f"refresh_rate={self.refresh_rate:g} predicts no finite relaxation time (it "
                "needs refresh_rate > 0 to be ergodic); give refresh_rate > 0")
        offset = relaxation.initial_offset(theta0, mode, precision)
        auto_interval = run_length.is_auto(self.sample_interval)
        interval = R if auto_interval else float(self.sample_interval)
        request = run_request
        if request is None:
            request = run_length.RunRequest(num_samples=int(num_samples or 1), burn_in=burn_in,
                                            thin=1, chains=chains)
        # draws are the units (thin does not apply); the burn_in build was given
        request = request._replace(thin=1, burn_in=burn_in)

        def burn_in_for(interval_):
            return run_length.resolve(request, R / interval_, offset, name=self.name,
                                      info=None).burn_in

        resolved_burn_in = burn_in_for(interval)
        rate = prediction.event_rate
        budget = float(request.max_iterations)

        def events(interval_, burn_in_):
            return (burn_in_ + request.num_samples) * interval_ * rate

        planned = events(interval, resolved_burn_in)
        if planned > budget:
            wanted_interval, wanted_burn_in = interval, resolved_burn_in
            if auto_interval:
                for _ in range(3):  # a shorter interval means more burn-in draws: refit
                    interval = interval * budget / events(interval, resolved_burn_in)
                    resolved_burn_in = burn_in_for(interval)
                # never an interval with which the whole run covers less than one
                # relaxation time (run_length.budget_step_size's floor)
                floor = R / (resolved_burn_in + request.num_samples)
                if interval < floor:
                    interval = floor
                    resolved_burn_in = burn_in_for(interval)
            fitted = events(interval, resolved_burn_in)
            ess = run_length.predicted_ess(R, interval, request.num_samples, request.chains)
            asked = "sample_interval='auto' wants " if auto_interval else "sample_interval="
            warnings.warn(
                f"{self.name}: {asked}{wanted_interval:.3g} ({'one relaxation time' if auto_interval else 'given'}) "
                f"and {wanted_burn_in + request.num_samples} draws of it, predicted "
                f"{planned:,.0f} events per chain ({rate:.3g} per unit of process time), over "
                f"max_iterations={request.max_iterations:,} (iterations of Algorithm 2 per "
                "chain, each at least one event)"
                + (f"; sample_interval={interval:.3g} is used ({fitted:,.0f} events, "
                   f"predicted bulk ESS {ess:.0f})" if auto_interval else "")
                + f". Raise max_iterations to {int(math.ceil(planned)):,} to keep "
                + ("one relaxation time per draw" if auto_interval else "this run's length"),
                run_length.RunLengthWarning, stacklevel=user_stacklevel())
        final = run_length.resolve(request._replace(burn_in=resolved_burn_in), R / interval,
                                   offset, name=self.name, info=info)
        info.update(
            relaxation_time=float(R),  # process time (resolve recorded it in draws)
            relaxation_time_draws=float(R / interval),
            relaxation_diffusive=float(prediction.diffusive),
            relaxation_refresh_clock=float(prediction.refresh_clock),
            posterior_largest_sd=float(prediction.largest_sd),
            predicted_event_rate=float(rate),
            predicted_events_per_chain=float(events(interval, final.burn_in)),
            burn_in_auto=run_length.is_auto(burn_in),
            sample_interval_auto=auto_interval)
        return float(interval), int(final.burn_in)

    def build(self, model, federation, init, *, burn_in=0, chains=1, seed=0, skeleton_size=0,
              init_jitter=0.0, rate_diagnostics=True, workers_access=None, with_protocol=False,
              num_samples=None, run_request=None):
        """The federated kernel for this model and federation, without running it (call
        under ``jax.enable_x64(True)``). Returns a :class:`BuiltSampler`; its
        ``draw_step(key, state)`` advances one chain by ``sample_interval`` (what
        :func:`run_chains` vmaps).

        ``workers_access`` answers what the server asks of the workers (Newton terms, bounds
        and the other per-worker summaries): :class:`~.setup.LocalWorkers` (default, all data
        in this process) or ``distributed.RemoteWorkers`` (messages). With ``with_protocol=True``
        it also carries the :class:`~.federated.FedProtocol` pieces, the ``PriorPart`` and
        the ``Workers`` (the distributed run composes them).

        ``sample_interval="auto"`` or ``burn_in="auto"`` (with ``run_request``, a
        :class:`fedmcmc.run_length.RunRequest`) are resolved here (:meth:`_run_length`);
        ``config.sample_interval`` and ``config.burn_in`` hold the values used."""
        spec = self.spec
        is_zigzag = spec is ZigZagSpec
        out_model = model.flatten(init)
        # host-side conversions (device_array, NumPy): jnp.asarray of a host value compiles a
        # small program per shape and dtype, a good part of a warm start's time
        init64 = jax.tree_util.tree_map(lambda leaf: np.asarray(leaf, np.float64), init)
        flat_model = model.flatten(init64)
        theta0 = flat_model.ravel(init64)
        d = flat_model.dim
        if workers_access is None:
            workers_access = LocalWorkers(flat_model, federation.padded(), federation.sizes)
        M = workers_access.num_workers
        sizes = workers_access.sizes
        attrs = model.attributes
        info: dict = {"num_workers": M, "prior_placement": self.prior}

        mode, quadratic = self._resolve_bound(model, is_zigzag)
        info["bound"] = mode
        on_violation = self.on_bound_violation or ("error" if mode in ("hessian", "custom") else "enlarge")
        info["on_bound_violation"] = on_violation
        q0, l0 = prior_hessian_bounds(flat_model, model, theta0, self.safety,
                                      auto=(mode == "estimate"))

        reference = self._reference(flat_model, workers_access.newton, theta0, info)
        # The Boomerang's rates use grad(U - U_ref), U_ref the reference potential; the
        # correction -U_ref is held exactly once in total. prior="split": worker m holds
        # alpha_m (U_0 - U_ref). Otherwise U_0's own proposer holds U_0 alone and data worker
        # m holds -n_m/N U_ref (ref_share): held whole by the prior's proposer, -U_ref cancels
        # the data workers' gradients in the sum but not in the positive parts of the rates,
        # and far from mu_ref the extra reflections keep the Boomerang on its initial orbit
        # for hundreds of time units (issue 3: trajectory sd ~3x too large).
        ref_share = None
        if reference is not None and self.prior != "split":
            ref_share = sizes / sizes.sum()
        ref_precision = None
        if reference is not None:
            # + the reference term (whitened: I) where it is held with U_0
            lw0 = whitened_bound(q0, l0, reference.chol) + (1.0 if ref_share is None else 0.0)
            ref_precision = reference.precision
        else:
            lw0 = 0.0

        n_total = float(sizes.sum())

        def data_grad(x, data_m, mask_m):
            g = -jax.grad(lambda th: flat_model.log_likelihood_sum(th, data_m, mask_m))(x)
            if ref_share is not None:  # n_m / N of -grad U_ref (n_m: the worker's rows)
                g = g - (jnp.sum(mask_m) / n_total) * (ref_precision @ (x - reference.mean))
            return g

        def prior_grad(x):
            g = -jax.grad(flat_model.log_prior)(x)
            if ref_precision is not None and ref_share is None:
                g = g - ref_precision @ (x - reference.mean)
            return g

        # Control variates (Remark 4.3): shift worker m's gradient by
        # s_m = grad U_m(x*) - w_m grad U(x*); the shifts sum to zero.
        cv = self.control_variates
        x_star = None
        g_ref0 = np.zeros(d)
        if cv is not False:
            if cv is True:
                x_star, _, rounds = workers_access.newton(theta0)
                info["control_variate_rounds"] = rounds
            else:
                x_star = jnp.asarray(cv, jnp.float64)
                if x_star.shape != (d,):
                    raise ValueError(f"control_variates reference point must have shape ({d},)")
            g_ref0 = np.asarray(prior_grad(x_star))
            info["control_variate_point"] = np.asarray(x_star).tolist()

        # What each worker computes on its own data: Hessian bounds of its data potential
        # (Appendix A), whitened for the Boomerang, its coordinates (Remark 3.1) and its
        # gradient at the control-variate point.
        q, l, lw, coords, g_ref = workers_access.summaries(
            mode=mode, safety=1.0 if quadratic else self.safety, theta0=theta0,
            hessian_bound=attrs.get("hessian_bound"),
            chol=None if reference is None else reference.chol, x_star=x_star,
            coordinates_fn=attrs.get("worker_coordinates"))
        if ref_share is not None and cv is not False:  # the workers' potentials hold -n_m/N U_ref
            g_ref = g_ref - np.outer(ref_share, np.asarray(ref_precision @ (x_star - reference.mean)))
        prior_part = federated.PriorPart(
            q=device_array(q0), l=device_array(l0), lw=device_array(lw0),
            g_ref=device_array(g_ref0), g_total_ref=device_array(g_ref.sum(axis=0) + g_ref0))
        info["coordinates_per_worker"] = coords.sum(axis=1).astype(int).tolist()

        # Distributed workers keep their data and bounds (q is None on the server).
        workers = federated.Workers(
            data=workers_access.data,
            mask=None if workers_access.mask is None else device_array(workers_access.mask, np.float64),
            coords=device_array(coords), q=None if q is None else device_array(q),
            l=device_array(l), lw=device_array(lw if ref_share is None else lw + ref_share),
            rho=device_array(np.full((M,), self.rho, np.float64)),
            cv_weight=device_array(sizes / sizes.sum()), g_ref=device_array(g_ref))

        workers_data_grad = None
        if isinstance(workers_access, LocalWorkers):
            workers_data_grad = _unpadded_workers_data_grad(
                flat_model, workers_access.padded, sizes,
                None if ref_share is None else (ref_precision, reference.mean, n_total),
                exact=(mode == "exact"))
        # rows a thinning pass evaluates: the padded layout, or every worker's own rows
        info["gradient_layout"] = "padded" if workers_data_grad is None else "unpadded"

        sample_interval = self.sample_interval
        if run_length.is_auto(sample_interval) or run_length.is_auto(burn_in):
            sample_interval, burn_in = self._run_length(
                workers_access, theta0, info, run_request=run_request, burn_in=burn_in,
                num_samples=num_samples, chains=chains, prior_grad=prior_grad,
                reference=reference, ref_share=ref_share, g_ref=g_ref, g_ref0=g_ref0,
                control_variates=cv is not False, coords=coords)

        thinning = self.thinning
        if thinning == "auto":  # the same law either way; superposition needs the data here
            thinning = "superposition" if isinstance(workers_access, LocalWorkers) else "per_worker"
        if thinning == "superposition" and not isinstance(workers_access, LocalWorkers):
            raise ValueError("thinning='superposition' runs in-process only (engine='local'); "
                             "a distributed engine thins on every worker: use thinning="
                             "'per_worker' or 'auto'")
        info["thinning"] = "exact" if mode == "exact" else thinning

        custom_slope, horizon = None, float("inf")
        if mode == "custom":
            custom_slope = _summed_slope_bound(attrs["zigzag_slope_bound"])
            horizon = float(attrs.get("slope_horizon", 0.5))

        cfg = federated.FedConfig(
            spec=spec, dim=d, num_workers=M, prior_worker=self.prior != "split",
            exact=(mode == "exact"), data_grad=data_grad, prior_grad=prior_grad,
            workers_data_grad=workers_data_grad, custom_slope=custom_slope, horizon=horizon,
            refresh_rate=self.refresh_rate,
            redistribution_rate=self.redistribution_rate, control_variates=cv is not False,
            reference=reference, max_thinning=self.max_thinning,
            max_iterations_per_draw=self.max_events_per_draw, skeleton_size=skeleton_size,
            sample_interval=float(sample_interval), burn_in=int(burn_in),
            rate_diagnostics=rate_diagnostics, has_excess=self.rho > 0, thinning=thinning)
        init_fn, _, draw_step, protocol = federated.build(cfg, workers, prior_part,
                                                          with_protocol=True)

        def initial_states(key, theta0):
            k_init, k_jit, k_run = rng.split_key(key, 3)
            starts = jnp.broadcast_to(theta0, (chains, d))
            if init_jitter > 0:
                starts = starts + init_jitter * jax.random.normal(k_jit, (chains, d))
            return jax.vmap(init_fn)(rng.split_key(k_init, chains), starts), k_run

        # one compiled program (the keys, the starts and the states), not op by op: in a new
        # process each eager op compiles (or loads) a program of its own
        states, k_run = jit_with_constants_as_arguments(initial_states)(rng.seed_key(seed),
                                                                        theta0)
        built = BuiltSampler(cfg, draw_step, states, k_run, out_model, info, on_violation)
        if with_protocol:
            built = built._replace(protocol=protocol, prior_part=prior_part, workers=workers)
        return built

    # ----------------------------------------------------------------- output
    def _result(self, run, cfg, out_model, federation, info, num_samples, burn_in, chains,
                on_violation, skeleton_size, batch_length):
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
        comm_workers = M + (1 if self.prior == "worker" else 0)
        iterations = int(st.iterations.sum())
        coords = np.asarray(info["coordinates_per_worker"] + ([d] if self.prior == "worker" else []))
        reply = 2 if self.spec is ZigZagSpec else 1 + d
        info.update(
            algorithm=self.name,
            chains=chains,
            dim=d,
            sample_interval=cfg.sample_interval,
            sample_interval_auto=run_length.is_auto(self.sample_interval),
            burn_in=int(burn_in),
            thin=1,  # a draw every sample_interval: thin does not apply
            refresh_rate=self.refresh_rate,
            rho=self.rho,
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
            messages=int(2 * comm_workers * iterations),
            floats_communicated=int(iterations * (2 * coords.sum() + comm_workers * reply)),
        )
        if cfg.prior_worker:
            info["prior_bound_violations"] = int(st.violations.sum(axis=0)[M])
        if self.privacy is not None:
            # every event round each worker sends one proposed time (Theorem 5.1 per time)
            info["privacy"] = privacy_module.composed_report(
                self.privacy[0], self.privacy[1], self.sensitivity, self.rho, [iterations] * M)
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

        result = assemble_result(
            run, algorithm=self.name, info=info, dim=d, thin=None,  # draws are not iterations
            burn_in=burn_in,
            unravel=lambda draws: unravel_draws_numpy(out_model, np.asarray(draws)[..., :d]))
        if run.diverged.any():
            raise diverged_error(
                self.name, result, divergence_details(run, thin=None),
                f"diverged (non-finite or |x| > {self.divergence_threshold:g}); check the "
                "model's rate bounds")
        if bool(np.any(st.overflow)):
            raise PDMPBoundError(
                f"{self.name}: the event simulation hit its limit (max_thinning={self.max_thinning} "
                f"proposals for one event, or max_events_per_draw={self.max_events_per_draw} events "
                "in one sample_interval); the bound is far too loose or the rate explodes. "
                "Draws so far are in error.result.", result)
        if on_violation == "error" and info["bound_violations"] > 0:
            raise PDMPBoundError(
                f"{self.name}: the rate bound ({info['bound']}) was exceeded "
                f"{info['bound_violations']} time(s) (per worker: "
                f"{info['bound_violations_per_worker']}): the model's Hessian/rate bound is too "
                "small, so thinning would sample the wrong distribution. Fix the bound, or pass "
                "on_bound_violation='enlarge' to double it automatically.", result)
        return result


class FedZigZag(_FedPDMP):
    """Federated Zig-Zag sampler (Algorithm 2 with the Zig-Zag of Examples 2.1, 2.4).

    Parameters
    ----------
    sample_interval:
        Process time between kept draws (``burn_in`` counts draws of this length).
    refresh_rate:
        Excess switching rate gamma_i per coordinate (Example 2.4), simulated by the server.
    excess_rate:
        rho: constant rate added to every worker's rate (Section 5).
    privacy, sensitivity:
        ``privacy=(epsilon, delta)`` with sensitivity K sets rho by equation (7).
    prior:
        ``"server"`` (default: the server simulates the prior's events), ``"worker"``
        (an extra worker does, Remark 3.2) or ``"split"`` (worker m holds ``n_m/N`` of it).
    bound:
        ``"auto"`` (exact inversion for quadratic potentials, else the model's
        ``hessian_bound``, else its ``zigzag_slope_bound``, else an estimate),
        or one of ``"exact"``, ``"hessian"``, ``"custom"``, ``"estimate"``.
    on_bound_violation:
        ``"error"`` (default for model-supplied bounds) or ``"enlarge"`` (default for
        the estimated bound): what to do when a true rate exceeds its bound.
    safety:
        Factor on the estimated Hessian bound.
    control_variates:
        ``True`` (reference point = the mode, found by federated Newton) or a flat
        reference point: Remark 4.3's shift of the workers' gradients.
    redistribution_rate:
        lambda_redist of Appendix D (Algorithm 4); needs ``prior="split"``.
    thinning:
        How event times are found by Poisson thinning (Appendix A) when rates are not exact:
        ``"per_worker"`` (Algorithm 3: every worker thins its own rate to its first event and
        the server takes the earliest), ``"superposition"`` (one thinning of the sum of the
        workers' bounds: the proposing worker is drawn in proportion to its bound and only
        it evaluates its gradient; in-process only) or ``"auto"`` (default: superposition
        in-process, per-worker on a distributed engine). The law of the process is the same.
    """

    name = "FedZigZag"
    spec = ZigZagSpec

    def __init__(self, sample_interval, refresh_rate: float = 0.0, **kwargs):
        super().__init__(sample_interval, refresh_rate, **kwargs)


class FedBPS(_FedPDMP):
    """Federated Bouncy Particle Sampler (Examples 2.2, 2.5): worker m reflects the velocity on
    grad U_m at its events; the server refreshes v ~ N(0, I) at ``refresh_rate``. Other
    arguments as :class:`FedZigZag`; privacy events are refreshments."""

    name = "FedBPS"
    spec = BPSSpec

    def __init__(self, sample_interval, refresh_rate: float = 1.0, **kwargs):
        super().__init__(sample_interval, refresh_rate, **kwargs)


class FedBoomerang(_FedPDMP):
    """Federated Boomerang sampler: elliptical dynamics around a Gaussian reference N(mu, Sigma).

    ``reference="laplace"`` (default) uses the mode and inverse Hessian of the
    posterior, found by federated Newton (each round: every worker sends its
    gradient and Hessian); or pass ``reference=(mean, cov)``. The reference
    potential is subtracted exactly once: with ``prior="split"`` (the default here) worker m
    holds n_m/N of U_0 - U_ref; with ``prior="server"`` or ``"worker"`` the prior's proposer
    holds U_0 and every data worker n_m/N of -U_ref (see ``build``).
    Bounds: Hessian bounds whitened by the reference (see ``boomerang.py``).
    """

    name = "FedBoomerang"
    spec = BoomerangSpec

    def __init__(self, sample_interval, refresh_rate: float = 0.1, *, reference: Any = "laplace",
                 prior: str = "split", **kwargs):
        super().__init__(sample_interval, refresh_rate, prior=prior, **kwargs)
        if isinstance(reference, str):
            if reference != "laplace":
                raise ValueError(f"reference must be 'laplace' or (mean, cov), got {reference!r}")
        elif not (isinstance(reference, (tuple, list)) and len(reference) == 2):
            raise ValueError("reference must be 'laplace' or a pair (mean, cov)")
        self.reference = reference
        if self.bound == "custom":
            raise ValueError("bound='custom' is a Zig-Zag bound; FedBoomerang uses Hessian bounds")

    def _reference(self, flat_model, newton, theta0, info):
        d = flat_model.dim
        if isinstance(self.reference, str):
            mode, hess, rounds = newton(theta0)
            info["laplace_rounds"] = rounds
            cov = np.linalg.inv(0.5 * (hess + hess.T))
            if not np.all(np.linalg.eigvalsh(cov) > 0):
                raise ValueError("reference='laplace': the Hessian at the mode is not positive "
                                 "definite; pass reference=(mean, cov)")
            mean = np.asarray(mode)
        else:
            mean = np.asarray(self.reference[0], dtype=np.float64)
            cov = np.asarray(self.reference[1], dtype=np.float64)
            if mean.shape != (d,) or cov.shape != (d, d):
                raise ValueError(f"reference must be (mean of shape ({d},), cov of shape ({d}, {d}))")
            if not np.all(np.linalg.eigvalsh(0.5 * (cov + cov.T)) > 0):
                raise ValueError("reference cov must be positive definite")
        info["reference_mean"] = mean.tolist()
        return make_reference(mean, cov)
