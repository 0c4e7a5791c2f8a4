"""Public classes of the decentralised family: ``DULA`` and ``GTDULA``.

Every client of the federation is an agent on a communication graph; all
agents of a chain live in one kernel state and every chain is vmapped in one
compiled loop (``engines.local.run_chains``). One iteration updates every
agent once; a draw is kept every ``thin`` iterations.

``result.samples`` is the network average (1/n) sum_i w_i; the agents' own
states are in ``result.info["agent_samples"]`` (shape
``(chains, num_samples, n_agents, *leaf_shape)`` per leaf), and
``result.sample_stats`` holds per draw the consensus error
(1/n) sum_i ||w_i - w_bar||^2 and, unless ``gradient_error=False``, the
gradient error ||d - 1 (x) u_bar|| of section 4.3 (for DULA, d_i is the exact
local gradient grad E_i(w_i), the direction DULA follows).

Checkpoint and resume (``supports_resume``, :mod:`fedmcmc.checkpoint`, local
engine): the chain state holds the agents' samples, the iteration counter (which
is also the position in the step-size schedule and its decay) and, for GT-DULA,
the gradient trackers and the last local gradient estimates; the initial states
are a function of the seed. A resumed run's ``info`` counts iterations, rounds
and messages from draw 0; ``info["agent_samples"]`` holds the agents' draws
of this call only (from global draw ``max(start_draw, burn_in)``, recorded in
``info["agent_samples_first_draw"]``): ``fedmcmc run`` stitches the network
average, not the agents' draws; ``info["bias_estimate"]`` likewise measures the draws of
the resumed call.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..callsite import user_stacklevel
from .. import messages as message_counts
from .. import rng, run_length
from ..arrays import device_array
from ..cache import jit_with_constants_as_arguments
from ..algorithm import Algorithm, check_optional, check_positive_float, check_positive_int
from ..checkpoint import resume_from, split_run_options
from ..engines.local import run_chains
from ..diagnostics import bias_estimate
from ..model import unravel_draws_numpy
from ..results import SamplingDivergedError, divergence_details, diverged_error, finish_run
from ..schedules import decaying_schedule
from . import graphs as graph_module
from . import kernels, tuning
from .distributed import sample_decentralised

__all__ = ["DULA", "GTDULA", "NetworkBiasWarning"]

AUTO = "auto"
#: set-up reports (Hessians, d^2 floats per agent) are gathered when d is at most this
MAX_SETUP_DIM = 200


class NetworkBiasWarning(UserWarning):
    """The draws say the network average is likely biased (``info["bias_estimate"]``)."""


def _check_step_size(step_size: Any) -> Any:
    if isinstance(step_size, str):
        if step_size != AUTO:
            raise ValueError(f"step_size must be a positive number, a schedule or 'auto', "
                             f"got {step_size!r}")
        return AUTO
    if callable(step_size):
        return step_size
    check_positive_float(step_size, "step_size")
    return float(step_size)


def _check_coefficient(value: Any, argument: str) -> Any:
    if isinstance(value, str):
        if value != AUTO:
            raise ValueError(f"{argument} must be a positive number or 'auto', got {value!r}")
        return AUTO
    return check_positive_float(value, argument)


class Settings(NamedTuple):
    """The numbers a run uses, and what the set-up learned (``"auto"`` resolved)."""

    step_size: Any  # float or schedule
    beta: float
    gamma: Optional[float]
    laplace_mean: Optional[np.ndarray]  # (d,) global mode, None when not computed
    laplace_cov: Optional[np.ndarray]  # (d, d)
    prediction: Optional[tuning.Prediction]
    info: dict
    #: the chains' start in posterior sds along the Laplace fit (None: no set-up)
    initial_offset: Optional[float] = None
    #: iterations per relaxation time of the network average (None: not predicted)
    relaxation_time: Optional[float] = None
    #: why the budget raised an "auto" step size (None: the exact one is used)
    budget_reason: Optional[str] = None


def _check_graph(graph: Any) -> Any:
    if isinstance(graph, str):
        if graph not in graph_module.GRAPH_NAMES:
            raise ValueError(
                f"graph must be one of {graph_module.GRAPH_NAMES} or a networkx graph, got {graph!r}"
            )
        return graph
    import networkx as nx  # not at module level: see graphs.py

    if isinstance(graph, nx.Graph):
        graph_module.check_graph(graph)
        return graph
    raise ValueError(
        f"graph must be one of {graph_module.GRAPH_NAMES} or a networkx graph, "
        f"got {type(graph).__name__}"
    )


class _Plan(NamedTuple):
    """What both runs of a decentralised algorithm start from (``_Decentralised._plan``)."""

    topo: Any
    settings: Settings
    problems: Any
    thin: int
    burn_in: int
    run_info: dict
    min_ess: float


class _Decentralised(Algorithm):
    tracking: bool = False
    #: the neighbour-exchange run (:meth:`sample_distributed`; on Ray one actor per agent,
    #: neighbour messages actor to actor)
    message_passing = True
    #: a neighbour exchange every iteration (``fedmcmc.engines.engine.PATTERNS``)
    message_pattern = "neighbour_exchange"
    divergence_threshold: float = 1e10
    #: accepts the generic run options of ``fedmcmc.checkpoint.RUN_OPTIONS`` on the local
    #: engine (on engine="ray" the callbacks are accepted but not called, and resuming is
    #: refused: see ``engines/options.check_engine_options``)
    supports_resume: bool = True
    #: fm.sample passes ``run_request`` (thin / burn_in ``"auto"``, ``max_iterations``): the
    #: set-up predicts the relaxation times (:meth:`run_length_of`)
    supports_run_request: bool = True

    def _common(
        self,
        step_size,
        beta,
        graph,
        batch_size,
        graph_options,
        condition,
        decay_every,
        decay_factor,
        noise,
        gradient_error,
        keep_agent_samples,
        tolerance,
        spread_limit,
    ):
        self.step_size = _check_step_size(step_size)
        self.beta = _check_coefficient(beta, "beta")
        self.graph = _check_graph(graph)
        if batch_size is not None:
            batch_size = check_positive_int(batch_size, "batch_size")
        self.batch_size = batch_size
        if graph_options is not None and not isinstance(graph_options, Mapping):
            raise ValueError(f"graph_options must be a dict, got {type(graph_options).__name__}")
        self.graph_options = dict(graph_options or {})
        if condition not in ("warn", "raise", "ignore"):
            raise ValueError(f"condition must be 'raise', 'warn' or 'ignore', got {condition!r}")
        self.condition = condition
        self.tolerance = check_positive_float(tolerance, "tolerance")
        self.spread_limit = check_optional(check_positive_float, spread_limit, "spread_limit")
        self.decay_every = check_optional(check_positive_int, decay_every, "decay_every")
        factor = check_positive_float(decay_factor, "decay_factor")
        if factor > 1:
            raise ValueError(f"decay_factor must be in (0, 1], got {decay_factor!r}")
        self.decay_factor = factor
        self.noise = bool(noise)
        self.gradient_error = bool(gradient_error)
        self.keep_agent_samples = bool(keep_agent_samples)

    # ------------------------------------------------------------- building
    def topology(self, num_agents: int) -> graph_module.Topology:
        """The checked communication graph for ``num_agents`` agents (one per client)."""
        return graph_module.topology(self.graph, num_agents, self.graph_options)

    def fixed_gamma(self):
        """GT-DULA's ``gamma`` when it is a number, else None (DULA; ``gamma="auto"``, chosen
        at set-up)."""
        return None

    def _kernel(self, local_gradient, mix, schedule, n, beta, gamma):  # pragma: no cover
        raise NotImplementedError

    def _init_state(self, key, positions, local_gradient):  # pragma: no cover - interface
        raise NotImplementedError

    # ------------------------------------------------------------- settings
    def settings(self, model, federation, init, topo: Optional[graph_module.Topology] = None,
                 setup: Optional[bool] = None,
                 run_request: Optional[run_length.RunRequest] = None) -> Settings:
        """Resolve ``"auto"`` and gather what the run-time checks need (the set-up).

        ``beta="auto"``: 1/lambda_n; ``gamma="auto"``: min(beta, 1/lambda_2, 1/lambda_n);
        ``step_size="auto"``: the largest alpha whose predicted bias of the network average
        is at most ``tolerance`` posterior sd (:mod:`fedmcmc.decentralised.tuning`). The
        set-up (Newton rounds to the global mode on the agents' gradient and Hessian
        reports) also runs for numeric settings when the model has at most
        ``MAX_SETUP_DIM`` parameters, for the spread check and the predicted bias in
        ``info``; ``setup=False`` skips it (then ``step_size='auto'`` is refused).

        With a ``run_request`` (``fm.sample``'s run length), ``step_size="auto"`` obeys the
        budget rule (:func:`fedmcmc.run_length.budget_step_size`): when the exact alpha's
        relaxation time ``1 / (alpha lambda_min(A))`` is more than the run affords, alpha is
        raised, at most to :func:`fedmcmc.decentralised.tuning.budget_ceiling` (predicted
        ``|bias|`` at most ``1.25 x tolerance`` sd and variance inflation at most 25 %) unless
        ``max_iterations`` would not make one relaxation time, and never past
        :func:`fedmcmc.decentralised.tuning.stability_ceiling` (``0.5 / lambda_max(A)`` and
        ``0.5 / (n max_i lambda_max(A_i))``: the agents' own steps) or a linearised
        recursion that is not stable. ``info`` then
        has ``step_size_exact``, ``step_size_budget_reason``, ``predicted_variance_inflation``
        and the predictions at the alpha used.
        """
        n = federation.num_clients
        topo = topo if topo is not None else self.topology(n)
        requested = {name: getattr(self, name) == AUTO for name in ("step_size", "beta")}
        beta = tuning.choose_beta(topo) if requested["beta"] else float(self.beta)
        gamma = None
        if self.tracking:
            requested["gamma"] = self.gamma == AUTO
            gamma = tuning.choose_gamma(topo, beta) if requested["gamma"] else float(self.gamma)
        info = {"auto": sorted(k for k, v in requested.items() if v)}
        flat_dim = model.flatten(init).dim
        wanted = self.step_size == AUTO or (flat_dim <= MAX_SETUP_DIM and not callable(
            self.step_size))
        if setup is None:
            setup = wanted and not federation.is_deferred
        if self.step_size == AUTO and not setup:
            raise ValueError(
                "step_size='auto' needs the agents' curvature reports, which this engine does "
                "not gather for a from_loaders federation: give step_size as a number (run "
                "the same federation in memory with engine='local' to see the value 'auto' "
                "picks)" if federation.is_deferred else
                "step_size='auto' needs the set-up reports; do not pass setup=False")
        if self.step_size == AUTO and flat_dim > MAX_SETUP_DIM:
            raise ValueError(
                f"step_size='auto' needs every agent's d x d Hessian and the model has "
                f"d = {flat_dim} > {MAX_SETUP_DIM} parameters: give step_size as a number "
                "(beta and gamma may stay 'auto')")
        if not setup:
            return Settings(self.step_size, beta, gamma, None, None, None, info)
        terms, third, minibatch_noise = tuning.local_terms_fn(
            model, init, federation.padded(), self.batch_size)
        theta0 = np.asarray(model.flatten(init).ravel(init), np.float64)
        try:
            mode, at_mode, rounds = tuning.global_mode(terms, theta0)
        except ValueError:
            if self.step_size == AUTO:
                raise
            info["setup"] = "skipped: no positive-definite Laplace approximation at the mode"
            return Settings(self.step_size, beta, gamma, None, None, None, info)
        noise = minibatch_noise(mode)
        precision = at_mode.hessian.sum(0)
        laplace_cov = np.linalg.inv(precision)
        laplace_cov = 0.5 * (laplace_cov + laplace_cov.T)
        info["setup_rounds"] = int(rounds)
        laplacian = np.asarray(topo.laplacian, np.float64)
        offset = tuning.initial_offset(theta0, mode, precision)
        reason = None
        if self.step_size == AUTO:
            prediction = tuning.choose_step_size(mode, at_mode, third, laplacian, beta, gamma,
                                                 self.tolerance, gradient_noise=noise)
            step_size = prediction.step_size
            if run_request is not None:
                prediction, reason = self._budget(prediction, run_request, offset, mode,
                                                  at_mode, third, laplacian, beta, gamma,
                                                  noise, info)
                step_size = prediction.step_size
        else:
            step_size = self.step_size
            try:
                prediction = tuning.predict(mode, at_mode, third, laplacian, float(step_size),
                                            beta, gamma, gradient_noise=noise)
            except ValueError:  # the linearised recursion is unstable: no stationary law
                prediction = None
                info["predicted"] = "none: the linearised recursion is unstable"
        relaxation = None
        if not callable(step_size) and self.decay_every is None:
            relaxation = tuning.relaxation_time(float(step_size), precision)
        return Settings(step_size, beta, gamma, mode, laplace_cov, prediction, info,
                        initial_offset=offset, relaxation_time=relaxation, budget_reason=reason)

    def _budget(self, exact: tuning.Prediction, request: run_length.RunRequest, offset: float,
                mode, at_mode, third, laplacian, beta, gamma, noise, info: dict):
        """The budget rule of ``step_size="auto"`` (:meth:`settings`): ``(prediction at the
        alpha used, reason or None)``; records the exact alpha and the reason in ``info``."""
        precision = at_mode.hessian.sum(0)
        stability = tuning.stability_ceiling(at_mode.hessian)

        def relaxation_of(alpha):
            return tuning.relaxation_time(alpha, precision)

        # would the rule raise alpha at all? (the accuracy ceiling costs Lyapunov solves)
        wanted, _ = run_length.budget_step_size(
            exact.step_size, relaxation_of, request, accuracy_ceiling=stability,
            stability_ceiling=stability, initial_offset=offset)
        if wanted <= exact.step_size:
            return exact, None
        ceiling = tuning.budget_ceiling(mode, at_mode, third, laplacian, beta, gamma,
                                        self.tolerance, exact, run_length.BUDGET_TOLERANCE,
                                        gradient_noise=noise)
        alpha, reason = run_length.budget_step_size(
            exact.step_size, relaxation_of, request, accuracy_ceiling=ceiling.step_size,
            stability_ceiling=stability, initial_offset=offset)
        if reason is None:
            return exact, None
        prediction = ceiling if alpha == ceiling.step_size else None
        while prediction is None:
            try:
                prediction = tuning.predict(mode, at_mode, third, laplacian, alpha, beta, gamma,
                                            gradient_noise=noise)
                if prediction.spectral_radius >= 1.0:
                    raise ValueError("unstable")
            except ValueError:  # the floor pushed alpha past a stable linearised recursion
                prediction = None
                alpha = max(exact.step_size, 0.5 * alpha)
                if alpha <= ceiling.step_size:
                    prediction, alpha = ceiling, ceiling.step_size
        if prediction.step_size <= exact.step_size:
            return exact, None
        used = relaxation_of(prediction.step_size)
        if used > request.max_iterations:
            # the floor (one relaxation time within max_iterations) is past the stability
            # ceiling (or the linearised recursion is unstable there): said, not hidden
            reason += (f"; even the largest stable step, {prediction.step_size:.3g} (the "
                       f"agents' stability ceiling {stability:.3g}), relaxes in {used:,.0f} "
                       f"iterations, more than max_iterations={request.max_iterations:,}: "
                       "the run cannot make one relaxation time")
        info["step_size_exact"] = float(exact.step_size)
        info["step_size_budget_reason"] = reason
        info["predicted_bias_in_sd_exact"] = exact.bias_in_sd.tolist()
        inflation = prediction.sd_ratio ** 2 - 1.0
        info["predicted_variance_inflation"] = float(inflation[np.argmax(np.abs(inflation))])
        return prediction, reason

    def run_length_of(self, settings: Settings, topo: graph_module.Topology,
                      request: run_length.RunRequest) -> tuple:
        """``(thin, burn_in, info)``: the run length used (``"auto"`` resolved).

        ``thin="auto"``: one relaxation time of the network average,
        ``R = 1 / (alpha lambda_min(A))`` iterations (:func:`tuning.relaxation_time`), per
        kept draw, within ``max_iterations`` (:func:`fedmcmc.run_length.resolve`).

        ``burn_in="auto"`` covers two transients, since every agent starts at ``init``:
        the network average's approach to the posterior, ``k R`` iterations, and the
        agents' (and GT-DULA's trackers') disagreement settling to its stationary spread,
        ``k C`` iterations with the consensus time ``C = 1 / (min(beta, gamma) lambda_2)``
        (:func:`tuning.consensus_time`): the agents start in agreement but GT-DULA's
        trackers start at the local gradients at ``init``, and along the way to the mode the
        agents' heterogeneous gradients pull them apart, a disagreement of the size of the
        offset, so its decay needs as many time constants. ``k = max(5, 2 ln(z0 / 0.05))``
        (:func:`fedmcmc.run_length.burn_in_relaxations`) with ``z0`` the initial offset
        in posterior sds along the Laplace fit; burn-in is the larger of the two (and at
        least a tenth of ``num_samples``), in kept draws of ``thin`` iterations. On a ring of
        60 agents ``C`` is about 400 iterations, ``R`` 400 to 40,000.

        ``R`` is not predicted (no set-up: more than 200 parameters, a federation kept on
        the clients on Ray, no positive-definite Laplace approximation; a step-size schedule
        or ``decay_every``): ``"auto"`` is refused with a ``ValueError`` naming it. Given
        integers are kept.
        """
        info: dict = {}
        relaxation = settings.relaxation_time
        length = run_length.resolve(request, relaxation, settings.initial_offset,
                                    name=self.name, info=info)
        thin, burn_in = length.thin, length.burn_in
        if relaxation is not None:
            consensus = tuning.consensus_time(topo.lambda_2, settings.beta, settings.gamma)
            info["consensus_time"] = consensus
            if request.auto_burn_in:
                relaxations = run_length.burn_in_relaxations(settings.initial_offset)
                info["burn_in_relaxations"] = relaxations
                burn_in = max(burn_in, int(math.ceil(relaxations * consensus / thin)))
                info["burn_in"] = int(burn_in)
        return int(thin), int(burn_in), info

    def _resolved(self, settings: Settings):
        """A copy of this algorithm with the settings' numbers (what the Ray engine reads)."""
        resolved = copy.copy(self)
        resolved.step_size, resolved.beta = settings.step_size, settings.beta
        if self.tracking:
            resolved.gamma = settings.gamma
        # what the Ray engine's driver needs for the spread check and the bias estimate
        resolved.laplace_cov = settings.laplace_cov
        resolved.spread_limit_value = _spread_limit(self.spread_limit, settings)
        return resolved

    # --------------------------------------------------------------- sample
    def _plan(self, model, federation, init, num_samples, burn_in, thin, chains, options,
              setup) -> "_Plan":
        """What both runs start from: the graph, the settings (``setup=False``: the agents'
        curvature reports are not available, their data staying on the clients), Condition
        1's problems and the run lengths (``run_request`` taken from ``options``)."""
        request = options.pop("run_request", None)
        if request is None:  # called directly, not through fm.sample
            request = run_length.RunRequest(
                num_samples=int(num_samples),
                burn_in=run_length.check_run_length(burn_in, "burn_in", 0),
                thin=run_length.check_run_length(thin, "thin", 1), chains=int(chains))
        topo = self.topology(federation.num_clients)
        settings = self.settings(model, federation, init, topo, setup=setup,
                                 run_request=request)
        problems = graph_module.check_condition_1(topo, settings.beta, settings.gamma,
                                                  self.condition)
        thin, burn_in, run_info = self.run_length_of(settings, topo, request)
        if settings.budget_reason is not None:
            _warn_budget(self.name, settings, run_info, self.tolerance)
        return _Plan(topo, settings, problems, thin, burn_in, run_info, float(request.min_ess))

    def sample_distributed(self, model, federation, engine, *, init, num_samples, burn_in,
                           thin, chains, seed, progress, **options):
        """One endpoint per agent on the message-passing ``engine``'s transport, neighbour
        messages relayed agent to agent (``fedmcmc.decentralised.distributed``)."""
        plan = self._plan(model, federation, init, num_samples, burn_in, thin, chains,
                          options, setup=False if federation.is_deferred else None)
        settings, problems = plan.settings, plan.problems
        resolved = self._resolved(settings)
        family_info = dict(settings.info)
        family_info.update(_prediction_info(settings, self.tolerance))
        family_info.update(plan.run_info)
        family_info["step_size"] = _describe_step(settings.step_size)
        family_info["condition_1"] = problems
        family_info["spread_limit"] = (resolved.spread_limit_value
                                       if resolved.spread_limit_value is not None else "off")
        result, run = sample_decentralised(
            resolved, model, federation, engine, init=init,
            num_samples=num_samples, burn_in=plan.burn_in, thin=plan.thin, chains=chains,
            seed=seed, progress=progress, family_info=family_info,
            divergence_error=lambda result, run: self.stopped_error(
                result, run, plan.thin, resolved.spread_limit_value, problems),
            **options,
        )
        if "bias_estimate" in result.info:
            _warn_if_biased(self.name, result.info["bias_estimate"], self.tolerance,
                            self.step_size == AUTO, result.info, plan.min_ess)
        return result

    def sample_local(self, model, federation, *, init, num_samples, burn_in, thin, chains,
                     seed, progress, **options):
        plan = self._plan(model, federation, init, num_samples, burn_in, thin, chains,
                          options, setup=None)
        n = federation.num_clients
        topo, settings, problems = plan.topo, plan.settings, plan.problems
        thin, burn_in, run_info, min_ess = plan.thin, plan.burn_in, plan.run_info, plan.min_ess
        run_options = split_run_options(options, self.name)
        beta, gamma = settings.beta, settings.gamma

        flat_model = model.flatten(init)
        dim = flat_model.dim
        padded = federation.padded()
        local_gradient = kernels.local_gradient_fn(flat_model, padded, self.batch_size)
        full_gradient = kernels.full_gradient_fn(flat_model, padded)
        mix = topo.mixer()
        schedule = decaying_schedule(settings.step_size, self.decay_every, self.decay_factor)
        step = self._kernel(local_gradient, mix, schedule, n, beta, gamma)

        theta0 = flat_model.ravel(init)

        def initial_states(key, theta0):
            positions = jnp.broadcast_to(theta0, (n, dim))
            init_keys = rng.split_key(rng.fold_in(key, 2**20), chains)
            return jax.vmap(lambda k: self._init_state(k, positions, local_gradient))(init_keys)

        # the keys and the states in one compiled program: eager key operations and
        # broadcasts each compile (or load) a small program of their own in a new process
        key = rng.seed_key(seed)
        states = jit_with_constants_as_arguments(initial_states)(key, theta0)
        states, start_draw = resume_from(run_options, states)
        # the caller's chunk length, else the engine's (one compiled program either way: a
        # shorter last chunk runs the same program with a smaller trip count)
        chunk_size = run_options.pop("chunk_size", None)
        on_draws = run_options.pop("on_draws", None)
        if on_draws is not None:
            # The engine's draws are (network average[, every agent]): pass on result.samples.
            def average_only(draws, stats, first_index, _user=on_draws):
                _user(draws[..., :dim], stats, first_index)

            run_options["on_draws"] = average_only
        track = self.gradient_error
        keep_agents = self.keep_agent_samples
        tracking = self.tracking
        # the spread check: after burn-in, a consensus error past spread_limit x the posterior's
        # total variance (Laplace) stops the run (module docstring)
        spread_limit = _spread_limit(self.spread_limit, settings)
        check_after = int(burn_in) * int(thin)
        # a device array, not a Python float: the run program takes it as an argument
        # (cache.jit_with_constants_as_arguments), so a run on other data, with
        # another limit, is the same program
        limit = None if spread_limit is None else device_array(spread_limit, flat_model.dtype)

        def draw_step(key, state):
            keys = rng.split_key(key, thin)
            state, _ = jax.lax.scan(lambda s, k: (step(k, s), None), state, keys)
            w = state.position
            w_bar = jnp.mean(w, axis=0)
            consensus = kernels.consensus_error(w)
            stats = {"consensus_error": consensus}
            draw = w_bar
            if track:
                at_average = full_gradient(jnp.broadcast_to(w_bar, w.shape))
                directions = state.tracker if tracking else full_gradient(w)
                stats["gradient_error"] = kernels.tracking_error_from(directions, at_average)
                # sum_i grad E_i(w_bar): zero on average under the posterior (the bias estimate)
                draw = jnp.concatenate([draw, jnp.sum(at_average, axis=0)])
            # the kept draw carries every agent (and so does the divergence check);
            # without agent samples only the average (a diverging agent makes it non-finite)
            if keep_agents:
                draw = jnp.concatenate([draw, w.reshape(-1)])
            if spread_limit is not None:
                spread = (state.iteration > check_after) & (consensus > limit)
                draw = jnp.where(spread, jnp.nan, draw)
            return state, draw, stats

        def position(s):
            parts = [jnp.mean(s.position, 0)]
            if track:
                parts.append(jnp.zeros((dim,), s.position.dtype))
            if keep_agents:
                parts.append(s.position.reshape(-1))
            return jnp.concatenate(parts)

        run = run_chains(
            draw_step,
            states,
            key,
            burn_in=burn_in,
            num_samples=num_samples,
            position=position,
            divergence_threshold=self.divergence_threshold,
            progress=progress,
            label=self.name,
            iterations_per_draw=thin,
            chunk_size=chunk_size,
            start_draw=start_draw,
            **run_options,
        )
        draws = np.asarray(run.draws)
        kept = draws.shape[1]
        average = draws[:, :, :dim]
        offset = dim
        global_gradient = None
        if track:
            global_gradient = draws[:, :, dim:2 * dim]
            offset = 2 * dim
        agents = draws[:, :, offset:].reshape(chains, kept, n, dim) if keep_agents else None
        samples = unravel_draws_numpy(flat_model, average)
        iterations = run.draws_done * thin
        floats_per_message = dim * (2 if self.tracking else 1)
        directed_edges = 2 * topo.num_edges
        info = {
            "step_size": _describe_step(settings.step_size),
            "beta": beta,
            "batch_size": self.batch_size if self.batch_size is not None else "full",
            "decay_every": self.decay_every if self.decay_every is not None else 0,
            "decay_factor": self.decay_factor,
            "mixing": "dense" if topo.use_dense() else "edge_list",
            "condition_1": problems,
            # one communication round per iteration: every agent sends each chain's state
            # (w_i, and d_i for GT-DULA) to each neighbour; the Ray engine's agents send all
            # chains' in one transfer per directed edge (messages_between_agents)
            "rounds": iterations,
            **message_counts.figures(message_counts.neighbour_exchange(
                iterations, directed_edges, chains)),
            "messages_between_agents": int(iterations * directed_edges),
            "floats_communicated": int(iterations * directed_edges * floats_per_message * chains),
            "spread_limit": spread_limit if spread_limit is not None else "off",
        }
        info.update(settings.info)
        info.update(_prediction_info(settings, self.tolerance))
        info.update(run_info)
        info.update(topo.describe())
        if gamma is not None:
            info["gamma"] = gamma
        if self.keep_agent_samples:
            info["agent_samples"] = unravel_draws_numpy(flat_model, agents)
        if start_draw:
            if self.keep_agent_samples:
                info["agent_samples_first_draw"] = int(max(start_draw, burn_in))
        if global_gradient is not None and not run.diverged.any():
            estimate = bias_estimate(average, global_gradient, settings.laplace_cov)
            if estimate is not None:
                info["bias_estimate"] = estimate
                _warn_if_biased(self.name, estimate, self.tolerance, self.step_size == AUTO,
                                info, min_ess)
        return finish_run(
            run, name=self.name, info=info, dim=dim, thin=thin, start_draw=start_draw,
            unravel=lambda draws: samples,
            divergence_error=lambda result: self.stopped_error(result, run, thin, spread_limit,
                                                               problems))

    def stopped_error(self, result, run, thin: int, spread_limit: Optional[float],
                      problems) -> SamplingDivergedError:
        """The error of a run whose chains stopped (either engine): an agent's state became
        non-finite or exploded, or, past the burn-in, the agents' consensus error went over
        ``spread_limit`` (the spread check; the draw's ``consensus_error`` stat says which)."""
        details = divergence_details(run, thin)
        at_bad = run.bad_stats.get("consensus_error")
        for detail in details:
            c = detail["chain"]
            if spread_limit is not None and at_bad is not None and float(at_bad[c]) > spread_limit:
                detail["consensus_error"] = float(at_bad[c])
        condition = f" (Condition 1: {'; '.join(problems)})" if problems else ""
        spread = [d for d in details if "consensus_error" in d]
        if spread:
            cause = (
                f"the agents' consensus error reached {spread[0]['consensus_error']:.3g}, "
                f"more than spread_limit={self.spread_limit:g} times its expected size "
                f"({spread_limit / self.spread_limit:.3g}: the larger of the posterior's total "
                "variance and the consensus error predicted for these settings): the agents "
                "no longer agree, so their average is not a posterior draw. Use 'auto' "
                "settings or a smaller step_size / beta" + (" / gamma" if self.tracking else "")
                + condition + "; spread_limit=None switches this check off")
        else:
            cause = (f"an agent's state became non-finite or exceeded "
                     f"{self.divergence_threshold:g}; lower step_size or beta"
                     + (" / gamma" if self.tracking else "") + condition)
        return diverged_error(self.name, result, details, cause)


def _describe_step(step_size):
    return step_size if not callable(step_size) else getattr(step_size, "__name__", "schedule")


def _spread_scale(settings: Settings) -> float:
    """The consensus error a healthy run can have: the larger of the posterior's total variance
    (trace of the Laplace covariance) and the stationary consensus error the linearised law
    predicts for these settings (when it is stable). On a sparse graph of many agents the
    agents' spread legitimately exceeds the posterior's variance several-fold (measured: 65
    agents on a ring, 5.8x predicted and 5.9x observed), so the variance alone would stop good
    runs."""
    scale = float(np.trace(settings.laplace_cov))
    prediction = settings.prediction
    if (prediction is not None and np.isfinite(prediction.consensus_error)
            and prediction.spectral_radius < 1.0):
        scale = max(scale, float(prediction.consensus_error))
    return scale


def _spread_limit(multiple: Optional[float], settings: Settings) -> Optional[float]:
    """The consensus error that stops a run: ``spread_limit`` x :func:`_spread_scale`."""
    if multiple is None or settings.laplace_cov is None:
        return None
    return float(multiple * _spread_scale(settings))


def _prediction_info(settings: Settings, tolerance: float) -> dict:
    prediction = settings.prediction
    if prediction is None:
        return {}
    return {
        "tolerance": tolerance,
        "predicted_bias_in_sd": prediction.bias_in_sd.tolist(),
        "predicted_sd_ratio": prediction.sd_ratio.tolist(),
        "predicted_consensus_error": prediction.consensus_error,
        "iterations_per_effective_draw": prediction.iterations_per_effective_draw,
    }


#: the bias warning needs this effective sample size (below it the standard error is
#: unreliable) unless fm.sample's convergence check names another (its ``min_ess_bulk``):
#: a run whose ESS is too low for the bias estimate gets the ConvergenceWarning instead
MIN_ESS_FOR_WARNING = run_length.DEFAULT_MIN_ESS


def _warn_if_biased(name: str, estimate: dict, tolerance: float, auto: bool,
                    info: Optional[dict] = None,
                    min_ess: float = MIN_ESS_FOR_WARNING) -> None:
    """:class:`NetworkBiasWarning` when ``info["bias_estimate"]`` minus three standard errors
    exceeds ``tolerance`` in a coordinate whose bias estimate has at least ``min_ess``
    effective draws (the convergence check's bulk-ESS threshold: with fewer, the
    ``ConvergenceWarning`` says the run is too short and this estimate is not trusted). The
    advice follows from what the set-up predicted (``info``): a burn-in shorter than the
    chains' transient, the bias predicted at the alpha used (raised by the budget or given)."""
    z = np.asarray(estimate["in_sd"])
    se = np.asarray(estimate["standard_error"])
    ess = np.asarray(estimate["ess"])
    # the bias is above the tolerance with confidence: its lower 3-standard-error bound is
    flagged = np.nonzero((np.abs(z) - 3 * se > tolerance) & (ess >= min_ess))[0]
    if not flagged.size:
        return
    worst = int(flagged[np.argmax(np.abs(z[flagged]))])
    info = info or {}
    causes = []
    relaxation, thin, burn_in = (info.get("relaxation_time"), info.get("thin"),
                                 info.get("burn_in"))
    if relaxation and thin and burn_in is not None:
        needed = run_length.burn_in_relaxations(info.get("initial_offset_sd")) * relaxation
        if burn_in * thin < needed:
            causes.append(
                f"the burn-in ({burn_in} draws of thin={thin}) covers "
                f"{burn_in * thin / relaxation:.2g} relaxation times of the network average "
                f"and the chains' start needs {needed / relaxation:.2g}: pass burn_in='auto' "
                f"(about {int(math.ceil(needed / thin))} draws)")
    predicted = info.get("predicted_bias_in_sd")
    if predicted is not None and abs(predicted[worst]) > tolerance:
        raised = info.get("step_size_budget_reason")
        causes.append(
            f"the set-up predicts a bias of {predicted[worst]:+.2f} sd there at the step size "
            "used" + (f" (raised by the budget: {raised}; raise max_iterations for the exact "
                      f"step size {info.get('step_size_exact', float('nan')):.3g})"
                      if raised else ""))
    if not causes:
        causes.append(
            "either the draws include the chains' approach to stationarity (raise burn_in) or "
            "the agents' spread around their average biases it: "
            + ("lower tolerance" if auto else "use step_size='auto' or a smaller step_size")
            + ", or use a better connected graph")
    warnings.warn(
        f"{name}: the network average looks biased: coordinate {worst} by about "
        f"{z[worst]:+.2f} posterior sd (standard error {se[worst]:.2f}; "
        "info['bias_estimate'], from the mean of the total gradient at the average, zero "
        "under the posterior): " + "; ".join(causes),
        NetworkBiasWarning, stacklevel=user_stacklevel())


def _warn_budget(name: str, settings: Settings, run_info: dict, tolerance: float) -> None:
    """:class:`fedmcmc.RunLengthWarning`: the budget raised ``step_size="auto"``."""
    info = settings.info
    prediction = settings.prediction
    bias = np.abs(prediction.bias_in_sd)
    ess = run_info.get("predicted_ess")
    warnings.warn(
        f"{name}: step_size='auto' is {info['step_size_exact']:.3g} for a predicted bias of at "
        f"most {tolerance:g} posterior sd, but {info['step_size_budget_reason']}; it uses "
        f"{settings.step_size:.3g} instead, predicted bias up to {bias.max():.2f} sd "
        f"(coordinate {int(np.argmax(bias))}) and variance inflation "
        f"{info['predicted_variance_inflation']:+.0%}, relaxation time "
        f"{settings.relaxation_time:,.0f} iterations"
        + (f", predicted bulk ESS {ess:.0f}" if ess is not None else "")
        + ". " + ("Raise max_iterations (fm.sample)" if run_info.get("thin_auto") else
                  f"Raise thin (now {run_info.get('thin')}) or num_samples")
        + " for the exact step size, or use a better connected graph",
        run_length.RunLengthWarning, stacklevel=user_stacklevel())


_COMMON_DOC = """
    step_size:
        ``"auto"`` (default): the largest alpha whose predicted bias of the network
        average is at most ``tolerance`` posterior sd in every coordinate, from the
        agents' curvature reports and the graph (:mod:`fedmcmc.decentralised.tuning`;
        models of at most 200 parameters). Or the paper's alpha > 0 (drift
        alpha * n * ..., noise sqrt(2 alpha n) v_i), or a schedule ``k -> alpha_k`` such
        as ``fm.schedules.piecewise_constant([1000, 2000], [1e-4, 1e-5, 1e-6])``.
    beta:
        Consensus step size of the samples, W_beta = I - beta L; ``"auto"`` (default):
        1 / lambda_n, the largest for which no disagreement mode oscillates.
    graph:
        ``"ring"`` (default), ``"path"``, ``"star"``, ``"complete"``, ``"grid"``,
        ``"torus"``, ``"erdos_renyi"``, ``"exponential"``, or any connected
        ``networkx`` graph with one node per client (agent i = i-th node).
    batch_size:
        ``None`` (default): full-batch local gradients. Otherwise an upper bound:
        an agent with more than m rows draws m with replacement per iteration and
        scales its likelihood gradient by 1/f_i = M_i/m; an agent with at most m rows
        uses all of them (its exact gradient).
    graph_options:
        Options of named graphs: ``shape`` (grid, torus), ``p``, ``seed``
        (erdos_renyi).
    condition:
        What to do when (beta, gamma) break Condition 1 or make a mixing step
        unstable: ``"raise"`` (default: ``ValueError`` naming beta or gamma and the
        bound), ``"warn"`` (a ``ConditionWarning``) or ``"ignore"``.
    decay_every, decay_factor:
        Multiply the step size by ``decay_factor`` (default 0.1, the paper's
        reductions) every ``decay_every`` iterations; ``None`` keeps it constant.
    gradient_error:
        Record the gradient error per draw (costs one full-data gradient of
        every agent per draw, two for DULA); the consensus error is always recorded.
    keep_agent_samples:
        Keep every agent's draws in ``info["agent_samples"]`` (default True).
    noise:
        Inject the Langevin noise (False gives the deterministic consensus
        gradient method, for debugging).
    tolerance:
        The bias ``step_size="auto"`` allows, in posterior sds (default 0.1), and the
        threshold of the :class:`NetworkBiasWarning` raised when ``info["bias_estimate"]``
        (measured from the draws) minus three of its standard errors still exceeds it.
    spread_limit:
        After burn-in, a kept draw whose consensus error ``(1/n) sum_i ||w_i - w_bar||^2``
        exceeds ``spread_limit`` times its expected size (the larger of the posterior's
        total variance, the trace of the Laplace covariance, and the stationary consensus
        error predicted for the run's settings) stops the run with
        :class:`fedmcmc.SamplingDivergedError`,
        keeping the draws made before (default 10: the agents no longer agree, so their
        average is no posterior draw). ``None`` switches the check off. Needs the set-up
        (models of at most 200 parameters, a positive-definite Laplace approximation);
        ``info["spread_limit"]`` says whether it was on.

    Notes
    -----
    The set-up (every run of a model with at most 200 parameters, and ``"auto"``):
    damped Newton rounds on the agents' gradient and Hessian reports find the global
    mode; the linearised recursion's stationary law then predicts the network
    average's bias (``info["predicted_bias_in_sd"]``, ``info["predicted_sd_ratio"]``,
    ``info["iterations_per_effective_draw"]``). With ``gradient_error=True`` the run
    also measures the bias from its own draws, ``info["bias_estimate"]``.
"""


class DULA(_Decentralised):
    __doc__ = (
        """Decentralised unadjusted Langevin algorithm (Parayil et al. 2020), equation (3)
    of the GT-DULA paper:

    ``w_i <- w_i - beta sum_{j in N_i} (w_i - w_j) - alpha n g_hat_i(w_i) + sqrt(2 alpha n) v_i``.

    Parameters
    ----------"""
        + _COMMON_DOC
    )

    name = "DULA"
    tracking = False

    def __init__(
        self,
        step_size: Any = AUTO,
        beta: Any = AUTO,
        graph: Any = "ring",
        *,
        batch_size: Optional[int] = None,
        graph_options: Optional[Mapping[str, Any]] = None,
        condition: str = "raise",
        decay_every: Optional[int] = None,
        decay_factor: float = 0.1,
        noise: bool = True,
        gradient_error: bool = True,
        keep_agent_samples: bool = True,
        tolerance: float = 0.1,
        spread_limit: Optional[float] = 10.0,
    ):
        self._common(step_size, beta, graph, batch_size, graph_options, condition,
                     decay_every, decay_factor, noise, gradient_error, keep_agent_samples,
                     tolerance, spread_limit)

    def _kernel(self, local_gradient, mix, schedule, n, beta, gamma):
        return kernels.dula_kernel(local_gradient, mix, beta, schedule, n, self.noise)

    def _init_state(self, key, positions, local_gradient):
        return kernels.dula_init(positions)


class GTDULA(_Decentralised):
    __doc__ = (
        """Gradient-tracking DULA, equations (4)-(8) of Bhar, Bai, George, Busart (2025):

    ``w_{k+1} = W_beta w_k - alpha n d_k + sqrt(2 alpha n) v_k``,
    ``d_{k+1} = W_gamma d_k + g_hat_{k+1} - g_hat_k``, ``d_0 = g_hat_0``.

    Parameters
    ----------
    gamma:
        Consensus step size of the gradient trackers, W_gamma = I - gamma L
        (Condition 1: gamma <= min(beta, 1/lambda_2))."""
        + _COMMON_DOC
    )

    name = "GTDULA"
    tracking = True

    def __init__(
        self,
        step_size: Any = AUTO,
        beta: Any = AUTO,
        gamma: Any = AUTO,
        graph: Any = "ring",
        *,
        batch_size: Optional[int] = None,
        graph_options: Optional[Mapping[str, Any]] = None,
        condition: str = "raise",
        decay_every: Optional[int] = None,
        decay_factor: float = 0.1,
        noise: bool = True,
        gradient_error: bool = True,
        keep_agent_samples: bool = True,
        tolerance: float = 0.1,
        spread_limit: Optional[float] = 10.0,
    ):
        self._common(step_size, beta, graph, batch_size, graph_options, condition,
                     decay_every, decay_factor, noise, gradient_error, keep_agent_samples,
                     tolerance, spread_limit)
        self.gamma = _check_coefficient(gamma, "gamma")

    def fixed_gamma(self):
        return None if self.gamma == AUTO else self.gamma

    def _kernel(self, local_gradient, mix, schedule, n, beta, gamma):
        return kernels.gtdula_kernel(local_gradient, mix, beta, gamma, schedule, n, self.noise)

    def _init_state(self, key, positions, local_gradient):
        return kernels.gtdula_init(key, positions, local_gradient)
