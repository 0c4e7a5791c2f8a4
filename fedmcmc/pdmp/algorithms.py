"""Public classes ``FedZigZag``, ``FedBPS``, ``FedBoomerang`` (Fed-PDMC, Bierkens & Duncan 2022).

They check their options and set the privacy rate; :mod:`.setup` resolves the model's
rate bounds, places the prior and builds the federated kernel of :mod:`.federated`
(:func:`.setup.build_sampler`), which ``sample_local`` runs with
:func:`fedmcmc.engines.local.run_chains` (one ``draw_step`` = advance one chain by
``sample_interval`` units of process time) and ``sample_distributed`` with one endpoint per
worker (:mod:`.distributed`); :mod:`.output` makes the result of either
(:func:`.output.finish`). Trajectories are simulated in float64 (``jax.enable_x64``); draws
are returned in the dtype of ``init``.

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

import warnings
from typing import Any, Optional

import jax
import numpy as np

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
from . import privacy as privacy_module
from .boomerang import BoomerangSpec
from .bps import BPSSpec
from .distributed import sample_pdmp
from .output import PDMPBoundError, finish, positions_only, run_sums
from .setup import BuiltSampler, build_sampler
from .zigzag import ZigZagSpec

__all__ = ["FedZigZag", "FedBPS", "FedBoomerang", "PDMPBoundError", "BuiltSampler"]

PRIOR_PLACEMENTS = ("server", "worker", "split")
BOUNDS = ("auto", "exact", "hessian", "custom", "estimate")
THINNINGS = ("auto", "per_worker", "superposition")


class _FedPDMP(Algorithm):
    """The options, checks and runs the three Fed-PDMC samplers share; the set-up is
    :func:`.setup.build_sampler`'s, the result :func:`.output.finish`'s."""

    spec: Any = None
    #: the Gaussian reference of elliptical dynamics (FedBoomerang's ``reference``); None:
    #: none (:func:`.setup.gaussian_reference`)
    reference: Any = None
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
        control_variates: Any = "auto",
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
        if isinstance(control_variates, str):
            if control_variates != "auto":
                raise ValueError(f"control_variates must be 'auto', True, False or a reference "
                                 f"point (flat vector), got {control_variates!r}")
        elif not (isinstance(control_variates, bool) or np.ndim(control_variates) == 1):
            raise ValueError("control_variates must be 'auto', True, False or a reference point "
                             "(flat vector)")
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


    def build(self, model, federation, init, *, burn_in=0, chains=1, seed=0, skeleton_size=0,
              init_jitter=0.0, rate_diagnostics=True, workers_access=None, with_protocol=False,
              num_samples=None, run_request=None) -> BuiltSampler:
        """The federated kernel for this model and federation, without running it (call
        under ``jax.enable_x64(True)``): :func:`.setup.build_sampler`, which describes the
        options."""
        return build_sampler(
            self, model, federation, init, burn_in=burn_in, chains=chains, seed=seed,
            skeleton_size=skeleton_size, init_jitter=init_jitter,
            rate_diagnostics=rate_diagnostics, workers_access=workers_access,
            with_protocol=with_protocol, num_samples=num_samples, run_request=run_request)

    def _sample_distributed(self, model, federation, engine, engine_options, init, num_samples,
                            burn_in, chains, seed, progress, skeleton_size, init_jitter,
                            rate_diagnostics, run_request=None):
        """One endpoint per worker (``pdmp/distributed.py``): the workers simulate their own
        event times on their own data; the server gathers and applies the earliest."""
        d = model.flatten(init).dim
        options = dict(engine_options)
        if options.get("on_draws") is not None:
            options["on_draws"] = positions_only(options["on_draws"], d,
                                                 model.flatten(init).dtype)
        distributed = sample_pdmp(
            self, model, federation, engine, options, init=init, num_samples=num_samples,
            burn_in=burn_in, chains=chains, seed=seed, progress=progress,
            skeleton_size=skeleton_size, init_jitter=init_jitter,
            rate_diagnostics=rate_diagnostics,
            run_sums=lambda resolved_burn_in: run_sums(resolved_burn_in, num_samples, d,
                                                       chains)[:2],
            run_request=run_request)
        # the transport's counts join info (transport_messages, bytes, floats_communicated)
        return finish(self, distributed.run, distributed.built, num_samples=num_samples,
                      chains=chains, skeleton_size=skeleton_size,
                      session_figures=distributed.messages, label=engine.label)

    def _sample(self, model, federation, init, num_samples, burn_in, chains, seed, progress,
                skeleton_size, init_jitter, rate_diagnostics, run_options, run_request=None):
        """The in-process run: the kernel of :meth:`build`, its chains vmapped in one compiled
        program (:func:`~fedmcmc.engines.local.run_chains`), with the run sums of ``info``
        carried next to the states."""
        built = self.build(model, federation, init, burn_in=burn_in, chains=chains, seed=seed,
                           skeleton_size=skeleton_size, init_jitter=init_jitter,
                           rate_diagnostics=rate_diagnostics, num_samples=num_samples,
                           run_request=run_request)
        cfg, draw_step, fed_states, k_run = (built.config, built.draw_step,
                                             built.initial_states, built.key)
        d = cfg.dim
        burn_in = cfg.burn_in  # resolved ("auto")
        accumulate, sums, _ = run_sums(burn_in, num_samples, d, chains)

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
            run_options["on_draws"] = positions_only(run_options["on_draws"], d,
                                                     built.output_model.dtype)
        run = run_chains(
            run_step, states, k_run, burn_in=burn_in, num_samples=num_samples,
            position=lambda s: s[0].x, divergence_threshold=self.divergence_threshold,
            progress=progress, label=self.name, start_draw=start_draw, **run_options)
        if start_draw:
            built.info["start_draw"] = int(start_draw)
        return finish(self, run, built, num_samples=num_samples, chains=chains,
                      skeleton_size=skeleton_size)



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
        Remark 4.3's shift of the workers' gradients, ``s_m = grad U_m(x*) - w_m grad U(x*)``:
        ``"auto"`` (default: on, centred at the mode found by federated Newton, when Newton
        converges to a positive definite Hessian and neither ``privacy`` nor a distributed
        ``on_client_failure="drop"`` is set; ``info["control_variates"]`` and
        ``info["control_variates_reason"]`` say what was chosen and why,
        :func:`.setup.resolve_control_variates`), ``True`` (always, at that mode), ``False``
        (never) or a flat reference point ``x*``.
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
    holds U_0 and every data worker n_m/N of -U_ref (see ``setup.build_sampler``).
    Bounds: Hessian bounds whitened by the reference (see ``boomerang.py``).

    ``start="reference"`` (default): every chain starts at its own draw from the reference
    N(mu, Sigma) (``init`` gives the parameters' structure and the point the reference's
    Newton starts from); ``start="init"``: at ``init`` (plus ``init_jitter``). The flow and the
    reflections keep the whitened radius ``|L^{-1}(x - mu)|^2 + |L^{-1} v|^2`` of an orbit, and
    refreshment shrinks it only where the orbit passes near mu: from a start tens of posterior
    sd away the chains stay on wide orbits for thousands of time units (issue 48: Poisson
    regression on grouseticks from 0, 40 sd from the mode, a coefficient 8 units off after
    1,200 time units; contraception-like logistic regression from 0, means 9-14 sd off).
    ``info["start"]`` records the choice.
    """

    name = "FedBoomerang"
    spec = BoomerangSpec

    def __init__(self, sample_interval, refresh_rate: float = 0.1, *, reference: Any = "laplace",
                 prior: str = "split", start: str = "reference", **kwargs):
        super().__init__(sample_interval, refresh_rate, prior=prior, **kwargs)
        if start not in ("reference", "init"):
            raise ValueError(f"start must be 'reference' or 'init', got {start!r}")
        self.start = start
        if isinstance(reference, str):
            if reference != "laplace":
                raise ValueError(f"reference must be 'laplace' or (mean, cov), got {reference!r}")
        elif not (isinstance(reference, (tuple, list)) and len(reference) == 2):
            raise ValueError("reference must be 'laplace' or a pair (mean, cov)")
        self.reference = reference
        if self.bound == "custom":
            raise ValueError("bound='custom' is a Zig-Zag bound; FedBoomerang uses Hessian bounds")

