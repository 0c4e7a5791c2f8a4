"""Public classes of the baselines family: ``FALD``, ``QLSD``, ``ConsensusMC``.

They check their hyper-parameters, build the functional kernels of ``fald.py``,
``qlsd.py`` and ``consensus.py`` and run them on the in-process engine
(:func:`fedmcmc.engines.local.run_chains`: every client of every chain simulated in one
compiled program) or, with ``engine="ray"``, through the engine layer with one Ray actor
per client holding its own rows (``sample_distributed``, :mod:`fedmcmc.baselines.distributed`:
the engine's generic broadcast endpoint runs the client-side functions; a
``Federation.from_loaders`` federation's rows are loaded in the actors). The draws are the
in-process engine's (consensus MC: the same numbers; FA-LD, QLSD: to float rounding).

``result.info`` holds, besides the hyper-parameters, ``iterations``, ``rounds`` (server
communication rounds), ``messages`` and ``floats_communicated`` (and for QLSD
``bits_communicated``), summed over chains (each chain is its own federated run), and
``wall_time``; ``messages`` is the broadcast pattern's count of :mod:`fedmcmc.messages`, the
same on every engine; on ``engine="ray"`` ``transport_messages``, ``floats_communicated`` and
the byte counts are the transport's real ones. Checkpoint and resume (:mod:`fedmcmc.checkpoint`):
FALD and QLSD keep everything they need in their chain states (``supports_resume``);
ConsensusMC combines the clients' draws after sampling and cannot resume.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import messages as message_counts
from .. import rng
from ..algorithm import (
    Algorithm,
    check_nonnegative_int,
    check_optional,
    check_positive_float,
    check_positive_int,
)
from ..arrays import device_array
from ..cache import jit_with_constants_as_arguments
from ..callsite import user_stacklevel
from ..checkpoint import resume_from, split_run_options
from ..engines.local import run_chains
from ..results import client_failure_error, divergence_details, diverged_error, finish_run
from .. import privacy as privacy_module
from ..clipping import PrivateSteps
from ..privacy import as_privacy
from . import consensus, distributed, fald, qlsd, tuning
from .common import client_likelihood_gradients, global_mode, unravel_numpy

__all__ = ["FALD", "QLSD", "ConsensusMC"]

def _layout(model, federation, init):
    """What every baseline's run starts from: the flat model, the clients' rows concatenated,
    f_s in the model's dtype and the flat initial position."""
    flat_model = model.flatten(init)
    weights = device_array(federation.weights, flat_model.dtype)  # converted on the host
    return flat_model, federation.concatenated(), weights, flat_model.ravel(init)


class _Baseline(Algorithm):
    """What the three baselines share: the in-process engine runs their ``sample_local``, a
    message-passing engine (``engine="ray"``: one Ray actor per client) their
    ``sample_distributed``.

    ``thin`` and ``burn_in`` may be ``"auto"`` on both engines (``supports_run_request``:
    ``fm.sample`` passes its :class:`fedmcmc.run_length.RunRequest` as the ``run_request``
    option): FA-LD and QLSD resolve them from the relaxation time 2 / (h lambda_min) of the
    posterior's Laplace fit, ConsensusMC to one NUTS transition per draw and its warm-up
    default (:mod:`fedmcmc.baselines.tuning`). The values used are in ``info["thin"]`` and
    ``info["burn_in"]``."""

    supports_run_request: bool = True
    #: every baseline has a message-passing run (:meth:`sample_distributed`)
    message_passing: bool = True
    #: a broadcast-and-gather round per round of local steps (``engines.engine.PATTERNS``)
    message_pattern = "broadcast"

    def sample_distributed(self, model, federation, engine, *, init, num_samples, burn_in,
                           thin, chains, seed, progress, run_request=None, **options):
        """One endpoint per client on the message-passing ``engine``'s transport
        (:meth:`sample_on_transport`, ``fedmcmc.baselines.distributed``)."""
        run = dict(init=init, num_samples=num_samples, burn_in=burn_in, thin=thin,
                   chains=chains, seed=seed, progress=progress, run_request=run_request)
        if getattr(self, "privacy", None) is not None:
            return self._sample_private(model, federation, engine.label, run, options)
        self.check_run(model.flatten(init).dim, chains, num_samples)
        self.check_engine_run_options(options)
        return self.sample_on_transport(model, federation, engine,
                                        engine.session_options(options, self.name), **run)

    def _sample_private(self, model, federation, engine, run: dict, options: dict):
        """A private run (:mod:`fedmcmc.privacy`) on the local engine: the plan of every
        client (its Langevin floor ``_privacy_floor``), ``sample_local`` with the private
        kernel for the draws within the budget, the accounting in ``info["privacy"]``. One
        update per client and iteration, every chain: steps = chains (burn_in + n) thin."""
        refuse = privacy_module.refuse
        refuse(engine not in ("local", None), self.name,
               f"engine={engine!r}: private runs run on engine='local' for now")
        refuse(isinstance(self.step_size, str), self.name,
               f"step_size={self.step_size!r} ('auto' reads the clients' rows before the "
               "run): give a number")
        request = run["run_request"]
        refuse(any(isinstance(run[k], str) for k in ("thin", "burn_in"))
               or (request is not None and request.any_auto), self.name,
               "thin or burn_in 'auto' (they read the clients' Laplace fits): give integers")
        refuse(not self.noise, self.name, "noise=False (no Gaussian mechanism)")
        refuse(self.variance_reduction, self.name,
               "variance_reduction=True (its reference point and exact gradients read the "
               "rows outside the accounted steps)")
        self._check_private()
        sizes = np.asarray(federation.sizes)
        weights = np.asarray(federation.weights, np.float64)
        h = float(self.step_size)
        clients = [privacy_module.ClientPlan(
            population=int(n), sample_size=int(min(self.batch_size, n)),
            floor=self._privacy_floor(h, int(n), int(min(self.batch_size, n)), float(f)))
            for n, f in zip(sizes, weights)]
        chains, thin, burn_in = run["chains"], run["thin"], run["burn_in"]

        def steps_for_draws(n):
            return [chains * (burn_in + n) * thin] * len(clients)

        the_plan = privacy_module.plan(self.privacy, clients, steps_for_draws(run["num_samples"]),
                                       "one update per client, iteration and chain")
        steps = PrivateSteps(clip_norm=self.privacy.clip_norm, noise_inflation=device_array(
            the_plan.noise_inflation, np.dtype(model.flatten(run["init"]).dtype)))

        def sample(draws):
            return self.sample_local(model, federation, **{**run, "num_samples": draws},
                                     private=steps, **options)

        return privacy_module.run_within_budget(
            the_plan, name=self.name, num_samples=run["num_samples"],
            steps_for_draws=steps_for_draws, run=sample,
            steps_of=lambda result, draws: steps_for_draws(draws))

    def _check_private(self) -> None:
        """Settings a private run refuses beyond the shared ones; default: none."""

    def _privacy_floor(self, step_size: float, rows: int, batch: int, weight: float) -> float:
        """The noise multiplier the algorithm's own noise gives client s's update."""
        raise NotImplementedError

    def check_run(self, dim: int, chains: int, num_samples: int) -> None:
        """Refuse run arguments the algorithm cannot use (``ValueError``); default: none."""

    def check_engine_run_options(self, options) -> None:
        """Refuse run options the algorithm cannot honour (``ValueError``), on either engine;
        default: none."""


def _check_unit_fraction(value: Any, argument: str) -> float:
    number = check_positive_float(value, argument)
    if number > 1.0:
        raise ValueError(f"{argument} must be in (0, 1], got {value!r}")
    return number


def _check_flag(value: Any, argument: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{argument} must be True or False, got {value!r}")
    return bool(value)


def _bytes(floats: int, dtype) -> int:
    return int(floats) * int(np.dtype(dtype).itemsize)


def _check_batch_size(value: Any) -> int:
    return check_positive_int(value, "batch_size")


def _check_step_size(value: Any):
    """h > 0 or ``"auto"`` (:mod:`fedmcmc.baselines.tuning`)."""
    if isinstance(value, str):
        if value == "auto":
            return value
        raise ValueError(f"step_size must be a positive number or 'auto', got {value!r}")
    return check_positive_float(value, "step_size")


def _check_tolerance(value: Any) -> float:
    number = check_positive_float(value, "step_size_tolerance")
    if number >= 1.0:
        raise ValueError(f"step_size_tolerance must be in (0, 1), got {value!r}")
    return number


def _stack(state, chains: int):
    return jax.tree_util.tree_map(lambda leaf: jnp.broadcast_to(leaf, (chains,) + leaf.shape),
                                  state)


class _ReferenceSearch(NamedTuple):
    source: str  # "given" or "lbfgs"
    iterations: int
    evaluations: int  # gradient evaluations of the search: one round each


def _reference_point(flat_model, data, theta0, reference_point, max_iterations):
    """theta* and what it cost: the user's point, or the federated L-BFGS mode."""
    if reference_point is not None:
        try:
            theta_star = flat_model.ravel(reference_point)
        except Exception as error:  # noqa: BLE001 - re-raised with the argument's name
            raise ValueError(f"reference_point does not have the structure of init ({error})"
                             ) from error
        if theta_star.shape != (flat_model.dim,):
            raise ValueError(
                f"reference_point has {theta_star.shape[0]} parameters, init has {flat_model.dim}")
        if not bool(jnp.all(jnp.isfinite(theta_star))):
            raise ValueError("reference_point contains NaN or infinite values")
        return jnp.asarray(theta_star, flat_model.dtype), _ReferenceSearch("given", 0, 0)
    mode = global_mode(flat_model, data, theta0, max_iterations=max_iterations)
    if not bool(jnp.all(jnp.isfinite(mode.position))):
        raise ValueError(
            "variance_reduction: the search for the global mode theta* diverged from init; "
            "pass reference_point=... (e.g. a MAP estimate)")
    return mode.position, _ReferenceSearch("lbfgs", mode.iterations, mode.evaluations)


# ------------------------------------------------------------------------------ FALD


class FALD(_Baseline):
    """Federated averaging Langevin dynamics (FA-LD; Deng et al., UAI 2024) and, with
    ``variance_reduction=True``, VR-FALD* (Plassier, Durmus, Moulines, AISTATS 2023).

    Each round every participating client runs ``local_steps`` Langevin steps from the
    shared state on its own data, ``theta_s + (h/2) g_s(theta_s) + N(0, sigma_s^2 I)``,
    with ``g_s = grad log p + (1/f_s) grad-hat log p(x_s | .)`` and noise scaled
    (``sigma_s^2 = h / f_s``) so that the f-weighted average of the clients' chains moves
    by a Langevin step on the global posterior; the server averages. Step-size convention:
    the project's ``theta + (h/2) grad + N(0, h)``, h = ``step_size`` (the papers' eta, gamma
    are h/2). One local step with full participation and full batches is exactly ULA on
    the global posterior. See :mod:`fedmcmc.baselines.fald` for the formulas.

    An ITERATION is one local step of every participating client; a kept draw is taken
    every ``thin`` iterations and is the weighted average of the participating clients'
    chains (the server's state when ``thin`` is a multiple of ``local_steps``).

    Runs on ``engine="local"`` and on ``engine="ray"`` (one actor per client, its rows loaded
    there: :mod:`fedmcmc.baselines.distributed`; VR-FALD* then needs ``reference_point``).

    Parameters
    ----------
    step_size:
        h > 0, or ``"auto"``: the largest h whose discretisation ratio (h/4) lambda_max(P)
        and predicted minibatch-noise ratio stay within ``step_size_tolerance`` (P the
        posterior's Laplace precision from the clients' own fits), within the stability
        limit of the stiffest client's local chain, and raised only when the run cannot
        afford its relaxation time (the budget rule); ``info`` says what was chosen and why
        (:func:`fedmcmc.baselines.tuning.choose_step_size`). The prediction does not see
        the client drift of many local steps (a bias; VR-FALD* removes it).
    batch_size:
        Minibatch size m per client and local step, an upper bound: a client with at most
        m rows uses all of them (its exact gradient); the estimate is scaled by n_s / m.
    local_steps:
        Local steps per round (between two averages).
    participation:
        Fraction of clients per round, in (0, 1]. 1 (default): every client, averaged
        with the weights f_s. Below 1: K = ceil(participation * S) clients drawn per round
        with replacement with probabilities f_s (scheme I of Li et al. 2020, used by Deng
        et al.); a client drawn m times gets averaging weight m/K and noise variance
        K h / m, so the drift stays unbiased and the average's noise stays N(0, h I).
        K is reported in ``info["clients_per_round"]``.
    variance_reduction:
        VR-FALD*: control variates at the global mode theta*, which remove the client
        drift (heterogeneity bias) of many local steps.
    reference_point:
        theta* for VR-FALD* (a pytree like ``init``). ``None`` (default): found by L-BFGS
        on the global log posterior from ``init`` before sampling, one communication round
        per gradient evaluation (counted in ``info``).
    mode_max_iterations:
        L-BFGS iteration limit of that search.
    noise:
        Inject the Langevin noise (False: federated averaging of gradient ascent).
    step_size_tolerance:
        The bound of ``step_size="auto"`` on both ratios (default 0.05, the Langevin
        family's).
    privacy, clip_norm:
        ``(epsilon, delta)`` or :class:`fedmcmc.Privacy`, and C (default 1.0): a
        differentially private run (:mod:`fedmcmc.privacy`): each client's local chain
        moves by ``(h/2) (n_s / (f_s m_s)) S + sqrt(h / f_s) a_s xi``, S the clipped
        per-example gradients of distinct rows, so its noise multiplier is
        ``a_s m_s sqrt(f_s) / (n_s C sqrt(h))``; what it uploads is post-processing. Full
        participation, FA-LD (not VR-FALD*), a numeric h, the local engine.

    Notes
    -----
    ``thin="auto"`` / ``burn_in="auto"`` (``fm.sample``): from the relaxation time
    2 / (h lambda_min(P)) iterations (:mod:`fedmcmc.baselines.tuning`).
    """

    divergence_threshold: float = 1e10
    supports_resume: bool = True

    def __init__(self, step_size, batch_size, local_steps, participation=1.0,
                 variance_reduction=False, *, reference_point=None, mode_max_iterations=500,
                 noise=True, step_size_tolerance=tuning.DEFAULT_TOLERANCE, privacy=None,
                 clip_norm=None):
        self.privacy = as_privacy(privacy, clip_norm)
        self.step_size = _check_step_size(step_size)
        self.step_size_tolerance = _check_tolerance(step_size_tolerance)
        self.batch_size = _check_batch_size(batch_size)
        self.local_steps = check_positive_int(local_steps, "local_steps")
        self.participation = _check_unit_fraction(participation, "participation")
        self.variance_reduction = _check_flag(variance_reduction, "variance_reduction")
        if reference_point is not None and not self.variance_reduction:
            raise ValueError(
                "reference_point is VR-FALD*'s theta*: it needs variance_reduction=True")
        self.reference_point = reference_point
        self.mode_max_iterations = check_positive_int(mode_max_iterations, "mode_max_iterations")
        self.noise = bool(noise)

    @property
    def name(self) -> str:
        return "VR-FALD*" if self.variance_reduction else "FALD"

    def clients_per_round(self, num_clients: int) -> Optional[int]:
        """K for partial participation (``None``: every client every round)."""
        if self.participation >= 1.0:
            return None
        return max(1, math.ceil(self.participation * num_clients - 1e-9))

    def _kernel(self, flat_model, data, weights, clients_per_round, control_variates,
                step_size, private=None):
        return fald.build_kernel(flat_model, data, weights, self.batch_size, self.local_steps,
                                 step_size, clients_per_round, control_variates, self.noise,
                                 private)

    def _check_private(self) -> None:
        privacy_module.refuse(self.participation < 1.0, self.name,
                              f"participation={self.participation} (the noise of a round "
                              "depends on the draw of its participants): use 1.0")

    def _privacy_floor(self, step_size, rows, batch, weight) -> float:
        # sigma_s = sqrt(h / f_s), drift (h/2) (n_s / (f_s m_s)) S
        return privacy_module.langevin_noise_multiplier(
            math.sqrt(step_size / weight), step_size, rows / (weight * batch),
            self.privacy.clip_norm)

    def resolve_settings(self, flat_model, fit, sizes, weights, request, *, thin, burn_in,
                         num_samples, chains, theta0, info) -> tuple:
        """``(h, thin, burn_in)`` with every ``"auto"`` resolved from the Laplace ``fit``
        (:func:`fedmcmc.baselines.tuning.resolve`), the same on every engine."""
        return tuning.resolve(
            self.name, step_size=self.step_size, tolerance=self.step_size_tolerance, fit=fit,
            flat_model=flat_model, sizes=sizes, weights=weights, batch_size=self.batch_size,
            request=request, thin=thin, burn_in=burn_in, num_samples=num_samples,
            chains=chains, theta0=theta0, info=info,
            clients_per_round=self.clients_per_round(len(sizes)),
            local_steps=self.local_steps, client_drift=not self.variance_reduction)

    def settings_info(self, num_clients: int, step_size=None) -> dict:
        """The hyper-parameters as ``Result.info`` reports them (every engine); ``step_size``:
        the h used (default: the one given)."""
        k = self.clients_per_round(num_clients)
        return {
            "step_size": self.step_size if step_size is None else step_size,
            "batch_size": self.batch_size,
            "local_steps": self.local_steps,
            "participation": self.participation,
            "clients_per_round": num_clients if k is None else k,
            "variance_reduction": self.variance_reduction,
            "num_clients": num_clients,
        }

    def sample_local(self, model, federation, *, init, num_samples, burn_in, thin, chains,
                     seed, progress, run_request=None, private=None, **options):
        """The run on the in-process engine (every client of every chain in one program);
        ``private``: the kernel's :class:`fedmcmc.clipping.PrivateSteps` (given by the
        accounted run of ``privacy=``, which this method starts when it is not)."""
        if self.privacy is not None and private is None:
            return self._sample_private(model, federation, "local", dict(
                init=init, num_samples=num_samples, burn_in=burn_in, thin=thin, chains=chains,
                seed=seed, progress=progress, run_request=run_request), options)
        run_options = split_run_options(options, self.name)
        flat_model, data, weights, theta0 = _layout(model, federation, init)
        dim, num_clients = flat_model.dim, federation.num_clients
        k = self.clients_per_round(num_clients)
        info = {"chains": chains, **self.settings_info(num_clients)}  # one state per chain
        control = None
        setup_rounds, setup_floats = 0, 0
        fit = None
        if tuning.wants_fit(thin, burn_in, self.step_size):
            # the clients' Laplace fits: theta0 down, (P_s, b_s) up (one round)
            fit = tuning.in_process_laplace(flat_model, federation, theta0)
            setup_rounds, setup_floats = 1, num_clients * (
                dim + tuning.fit_floats(dim, fit.precision.ndim == 1))
        step_size, thin, burn_in = self.resolve_settings(
            flat_model, fit, np.asarray(federation.sizes), np.asarray(federation.weights),
            run_request, thin=thin, burn_in=burn_in, num_samples=num_samples, chains=chains,
            theta0=theta0, info=info)
        if self.variance_reduction:
            theta_star, found = _reference_point(flat_model, data, theta0, self.reference_point,
                                                 self.mode_max_iterations)
            gradient_star = (flat_model.grad_log_prior(theta_star)
                             + client_likelihood_gradients(flat_model, data)(theta_star).sum(0))
            control = fald.ControlVariates(theta_star, gradient_star)
            # theta* is broadcast and every client returns its gradient at it (one round),
            # plus the rounds of the mode search (theta down, value and gradient up)
            setup_rounds += 1 + found.evaluations
            setup_floats += (2 * dim * num_clients
                             + found.evaluations * num_clients * (2 * dim + 1))
            info.update(reference_point=found.source, mode_iterations=found.iterations,
                        reference_gradient_norm=float(jnp.linalg.norm(gradient_star)))
        step = self._kernel(flat_model, data, weights, k, control, step_size, private)

        local_steps = self.local_steps

        def draw_step(key, state):
            state, _ = jax.lax.scan(lambda s, kk: (step(kk, s), None), state,
                                    rng.split_key(key, thin))
            state = fald.count_draw(state, local_steps)
            return state, fald.draw(state), {"round": state.rounds}

        def initial_states(theta, client_weights):
            return _stack(fald.init(theta, client_weights), chains)

        # one compiled program, as the other families' initial states: no eager set-up programs
        states = jit_with_constants_as_arguments(initial_states)(theta0, weights)
        states, start_draw = resume_from(run_options, states)
        run = run_chains(
            draw_step, states, rng.seed_key(seed), burn_in=burn_in, num_samples=num_samples,
            position=fald.draw,
            divergence_threshold=self.divergence_threshold, progress=progress, label=self.name,
            iterations_per_draw=thin, start_draw=start_draw, **run_options,
        )
        final = run.state
        rounds = np.asarray(final.rounds)
        client_rounds = int(np.asarray(final.client_rounds, dtype=np.int64).sum())
        mid_round = int(np.asarray(final.uploads_inside_rounds, dtype=np.int64).sum())
        # per round: the shared state down to each participant and its chain back up
        messages = message_counts.broadcast(client_rounds, mid_round)
        info.update(
            rounds=int(rounds.max()) + setup_rounds,
            rounds_per_chain=(rounds + setup_rounds).tolist(),
            **message_counts.figures(messages, message_counts.setup(num_clients, setup_rounds)),
            floats_communicated=int(messages * dim + setup_floats),
            draws_inside_rounds_uploads=mid_round,
        )
        info["bytes_communicated"] = _bytes(info["floats_communicated"], flat_model.dtype)
        return self._result(run, flat_model, info, thin, start_draw)

    def _result(self, run, flat_model, info, thin, start_draw=0, label=None):
        """The run's result or its error (:func:`fedmcmc.results.finish_run`; ``label``: a
        message-passing engine's)."""
        return finish_run(run, name=self.name, info=info, dim=flat_model.dim, thin=thin,
                          start_draw=start_draw, label=label,
                          unravel=lambda draws: unravel_numpy(flat_model, draws),
                          divergence_cause=_diverged_cause(self, "lower step_size or local_steps"))

    def sample_on_transport(self, model, federation, engine, options, *,
                           init, num_samples, burn_in, thin, chains, seed, progress,
                           run_request=None):
        """One endpoint per client in a protocol session of the message-passing ``engine``
        (:func:`fedmcmc.baselines.distributed.sample_fald`; ``options``: checked engine
        options, :func:`fedmcmc.engines.options.check_engine_options`). The draws are
        ``engine="local"``'s, and so is ``info["messages"]``; the transport's real messages
        are ``info["transport_messages"]``. ``"auto"`` run lengths: from the clients' own
        Laplace fits."""
        out = distributed.sample_fald(self, model, federation, engine,
                                      options, init=init, num_samples=num_samples,
                                      burn_in=burn_in, thin=thin, chains=chains, seed=seed,
                                      progress=progress, run_request=run_request)
        return self._result(out.run, model.flatten(init), out.info, out.info["thin"],
                            label=engine.label)


# ------------------------------------------------------------------------------ QLSD


class QLSD(_Baseline):
    """Quantised Langevin stochastic dynamics (QLSD; Vono, Plassier, Durmus, Dieuleveut,
    Moulines, AISTATS 2022) and, with ``variance_reduction=True``, QLSD++.

    Every iteration each client sends the server an unbiased stochastic quantisation
    (QSGD's, ``bits`` bits per coordinate) of its stochastic gradient of
    ``f_s log p(theta) + log p(x_s | theta)``; the server takes the Langevin step
    ``theta + (h/2) sum_s C(H_s) + N(0, h I)`` (the project's convention; the paper's
    gamma is h/2) and broadcasts theta. QLSD++ adds control variates at a reference point
    refreshed every ``reference_every`` iterations (each client's exact gradient there)
    and memory terms, so that what is quantised shrinks as the chain settles. See
    :mod:`fedmcmc.baselines.qlsd` for the formulas. One iteration = one server step; a
    draw is kept every ``thin`` iterations.

    Runs on ``engine="local"`` and on ``engine="ray"`` (one actor per client, its rows loaded
    there; one broadcast-and-gather per iteration: :mod:`fedmcmc.baselines.distributed`).

    Parameters
    ----------
    step_size:
        h > 0, or ``"auto"``: the largest h whose discretisation ratio (h/4) lambda_max(P)
        and predicted ratio of minibatch and quantisation noise to the injected noise stay
        within ``step_size_tolerance`` (P the posterior's Laplace precision from the clients'
        own fits), raised only when the run cannot afford its relaxation time (the budget
        rule); ``info`` says what was chosen and why
        (:func:`fedmcmc.baselines.tuning.choose_step_size`).
    batch_size:
        Minibatch size m per client and iteration (upper bound: a client with at most m
        rows uses all of them, its exact gradient; the estimate is scaled by n_s / m).
    bits:
        Bits per coordinate of the quantised gradients, 2 to 24: a sign and one of
        s = 2^(bits-1) - 1 levels (the default 8 gives s = 127), plus one float32 norm per
        vector. ``None``: no compression (each client sends its gradient in float32).
    variance_reduction:
        QLSD++ (control variates and memory terms).
    reference_every:
        QLSD++: iterations between two refreshes of the reference point. ``None``
        (default): ceil(largest client size / batch_size), one pass over the largest
        client's data, SVRG's usual epoch.
    memory_rate:
        QLSD++: rate alpha of the memory terms, in (0, 1]. ``None`` (default):
        1 / (1 + omega), omega = min(d / s^2, sqrt(d) / s) the quantiser's variance bound.
    noise:
        Inject the Langevin noise.
    step_size_tolerance:
        The bound of ``step_size="auto"`` on both ratios (default 0.05, the Langevin
        family's).
    privacy, clip_norm:
        ``(epsilon, delta)`` or :class:`fedmcmc.Privacy`, and C (default 1.0): a
        differentially private run (:mod:`fedmcmc.privacy`). The server's Langevin noise
        moves to the clients, before quantisation: client s adds ``N(0, 4 f_s a_s^2 / h)``
        to its H_s (clipped per-example gradients of distinct rows), its share f_s h of the
        step's noise, so the server never sees an unnoised gradient; noise multiplier
        ``a_s m_s sqrt(f_s) / (n_s C sqrt(h))``. QLSD (not QLSD++), a numeric h, the local
        engine.

    Notes
    -----
    ``thin="auto"`` / ``burn_in="auto"`` (``fm.sample``): from the relaxation time
    2 / (h lambda_min(P)) iterations (:mod:`fedmcmc.baselines.tuning`).
    """

    divergence_threshold: float = 1e10
    supports_resume: bool = True

    def __init__(self, step_size, batch_size, bits=8, variance_reduction=False, *,
                 reference_every=None, memory_rate=None, noise=True,
                 step_size_tolerance=tuning.DEFAULT_TOLERANCE, privacy=None, clip_norm=None):
        self.privacy = as_privacy(privacy, clip_norm)
        self.step_size = _check_step_size(step_size)
        self.step_size_tolerance = _check_tolerance(step_size_tolerance)
        self.batch_size = _check_batch_size(batch_size)
        if bits is not None:
            if (isinstance(bits, bool) or not isinstance(bits, (int, np.integer))
                    or not 2 <= bits <= 24):
                raise ValueError(
                    f"bits must be an integer from 2 to 24 (a sign bit and 2^(bits-1) - 1 "
                    f"levels; float32 holds at most 24 bits exactly), or None, got {bits!r}")
            bits = int(bits)
        self.bits = bits
        self.variance_reduction = _check_flag(variance_reduction, "variance_reduction")
        if not self.variance_reduction and (reference_every is not None or memory_rate is not None):
            raise ValueError("reference_every and memory_rate are QLSD++ settings: they need "
                             "variance_reduction=True")
        self.reference_every = check_optional(check_positive_int, reference_every,
                                              "reference_every")
        self.memory_rate = check_optional(_check_unit_fraction, memory_rate, "memory_rate")
        self.noise = bool(noise)

    @property
    def name(self) -> str:
        return "QLSD++" if self.variance_reduction else "QLSD"

    def quantisation_settings(self, federation, dim):
        """(levels s, reference_every, memory_rate) for this federation and dimension."""
        levels = qlsd.levels_for_bits(self.bits)
        every = self.reference_every or max(
            1, math.ceil(int(federation.sizes.max()) / self.batch_size))
        rate = self.memory_rate if self.memory_rate is not None else 1.0 / (
            1.0 + qlsd.variance_bound(levels, dim))
        return levels, every, rate

    def _kernel(self, flat_model, data, weights, levels, every, rate, step_size, private=None):
        if self.variance_reduction:
            return qlsd.build_kernel_plus_plus(flat_model, data, weights, self.batch_size,
                                               step_size, levels, every, rate, self.noise)
        return qlsd.build_kernel(flat_model, data, weights, self.batch_size, step_size,
                                 levels, self.noise, private)

    def _privacy_floor(self, step_size, rows, batch, weight) -> float:
        # client s's share f_s h of the step's noise variance, drift (h/2) (n_s / m_s) S
        return privacy_module.langevin_noise_multiplier(
            math.sqrt(weight * step_size), step_size, rows / batch, self.privacy.clip_norm)

    def resolve_settings(self, flat_model, fit, sizes, weights, request, *, thin, burn_in,
                         num_samples, chains, theta0, info) -> tuple:
        """``(h, thin, burn_in)`` with every ``"auto"`` resolved from the Laplace ``fit``
        (:func:`fedmcmc.baselines.tuning.resolve`; the quantiser's variance bound omega in
        the noise), the same on every engine."""
        levels = qlsd.levels_for_bits(self.bits)
        omega = 0.0 if levels is None else qlsd.variance_bound(levels, flat_model.dim)
        return tuning.resolve(
            self.name, step_size=self.step_size, tolerance=self.step_size_tolerance, fit=fit,
            flat_model=flat_model, sizes=sizes, weights=weights, batch_size=self.batch_size,
            request=request, thin=thin, burn_in=burn_in, num_samples=num_samples,
            chains=chains, theta0=theta0, info=info, quantiser_variance=omega)

    def settings_info(self, num_clients: int, levels, every, rate, step_size=None) -> dict:
        """The hyper-parameters as ``Result.info`` reports them (every engine); ``step_size``:
        the h used (default: the one given)."""
        info = {
            "step_size": self.step_size if step_size is None else step_size,
            "batch_size": self.batch_size,
            "bits": self.bits if self.bits is not None else "none",
            "quantization_levels": levels if levels is not None else "none",
            "variance_reduction": self.variance_reduction,
            "num_clients": num_clients,
        }
        if self.variance_reduction:
            info["reference_every"] = every
            info["memory_rate"] = rate
        return info

    def sample_local(self, model, federation, *, init, num_samples, burn_in, thin, chains,
                     seed, progress, run_request=None, private=None, **options):
        """The run on the in-process engine (every client of every chain in one program);
        ``private``: the kernel's :class:`fedmcmc.clipping.PrivateSteps` (given by the
        accounted run of ``privacy=``, which this method starts when it is not)."""
        if self.privacy is not None and private is None:
            return self._sample_private(model, federation, "local", dict(
                init=init, num_samples=num_samples, burn_in=burn_in, thin=thin, chains=chains,
                seed=seed, progress=progress, run_request=run_request), options)
        run_options = split_run_options(options, self.name)
        flat_model, data, weights, theta0 = _layout(model, federation, init)
        dim, num_clients = flat_model.dim, federation.num_clients
        resolved = {}
        fit = None
        if tuning.wants_fit(thin, burn_in, self.step_size):
            # the clients' Laplace fits: theta0 down, (P_s, b_s) up (one round)
            fit = tuning.in_process_laplace(flat_model, federation, theta0)
        step_size, thin, burn_in = self.resolve_settings(
            flat_model, fit, np.asarray(federation.sizes), np.asarray(federation.weights),
            run_request, thin=thin, burn_in=burn_in, num_samples=num_samples, chains=chains,
            theta0=theta0, info=resolved)
        levels, every, rate = self.quantisation_settings(federation, dim)
        step = self._kernel(flat_model, data, weights, levels, every, rate, step_size, private)
        variance_reduction = self.variance_reduction

        def initial_states(theta):
            if variance_reduction:
                one_chain = qlsd.init_plus_plus(theta, num_clients)
            else:
                one_chain = qlsd.init(theta)
            stacked = _stack(one_chain, chains)._replace(iteration=one_chain.iteration)
            return jax.tree_util.tree_map(lambda leaf: leaf[None], stacked)

        # all chains in one state with ONE iteration counter (not vmapped), so that QLSD++'s
        # refresh is a branch, not a select that computes the full gradients every iteration
        states = jit_with_constants_as_arguments(initial_states)(theta0)
        axes = jax.tree_util.tree_map(lambda _: 0, states)._replace(iteration=None)
        all_chains = jax.vmap(step, in_axes=(0, axes), out_axes=axes)

        def draw_step(key, state):
            def one(s, k):
                return all_chains(rng.split_key(k, chains), s), None

            state, _ = jax.lax.scan(one, state, rng.split_key(key, thin))
            return state, state.position.reshape(-1), {}

        states, start_draw = resume_from(run_options, states)
        if run_options.get("on_draws") is not None:
            run_options["on_draws"] = qlsd.draws_per_chain(run_options["on_draws"], chains, dim)
        run = run_chains(
            draw_step, states, rng.seed_key(seed), burn_in=burn_in, num_samples=num_samples,
            position=lambda s: s.position.reshape(-1),
            divergence_threshold=self.divergence_threshold, progress=progress, label=self.name,
            iterations_per_draw=thin * chains, start_draw=start_draw, **run_options,
        )
        iterations = run.draws_done * thin
        bits_per_vector = 32 * dim if levels is None else 32 + self.bits * dim
        # every iteration: theta down to each client (d float32), one quantised vector up
        bits = chains * iterations * num_clients * (32 * dim + bits_per_vector)
        setup_rounds = 0
        if fit is not None:  # the Laplace round: theta0 down, (P_s, b_s) up, float32
            setup_rounds = 1
            bits += 32 * num_clients * (dim + tuning.fit_floats(dim, fit.precision.ndim == 1))
        info = {
            "chains": chains,  # the engine ran them as one state
            **self.settings_info(num_clients, levels, every, rate, step_size),
            **resolved,
            "rounds": iterations + setup_rounds,
            **message_counts.figures(message_counts.broadcast(chains * iterations * num_clients),
                                     message_counts.setup(num_clients, setup_rounds)),
            "bits_communicated": int(bits),
            "floats_communicated": int(bits // 32),
        }
        info["bytes_communicated"] = int(bits // 8)
        return self._result(run, flat_model, info, thin, chains,
                            np.asarray(run.state.position)[0], start_draw)

    def _result(self, run, flat_model, info, thin, chains, final, start_draw=0, label=None):
        """The result of a run whose chains were one state: ``final`` their last positions
        ``(chains, d)`` (which name the diverged ones); or its error
        (:func:`fedmcmc.results.finish_run`; ``label``: a message-passing engine's)."""
        dim = flat_model.dim

        def unravel(folded):
            # the engine ran the chains as one state: (1, kept, chains * d) -> (chains, kept, d)
            kept = folded.shape[1]
            return unravel_numpy(flat_model, folded[0].reshape(kept, chains, dim).transpose(1, 0, 2))

        def diverged(result):
            # the chains share one engine state, so they all stop at the first bad draw;
            # name the ones whose final position is bad
            bad = ~np.all(np.isfinite(final) & (np.abs(final) < self.divergence_threshold), axis=1)
            chains_bad = np.nonzero(bad)[0] if bad.any() else np.arange(chains)
            first = int(run.first_bad_draw[0])
            details = [{"chain": int(c), "draw": first, "iteration": (first + 1) * thin}
                       for c in chains_bad]
            return diverged_error(self.name, result, details, _diverged_cause(
                self, "lower step_size (all chains stop at that draw)"))

        return finish_run(run, name=self.name, info=info, dim=dim, thin=thin,
                          start_draw=start_draw, sample_stats={}, label=label, unravel=unravel,
                          divergence_error=diverged)

    def sample_on_transport(self, model, federation, engine, options, *,
                           init, num_samples, burn_in, thin, chains, seed, progress,
                           run_request=None):
        """One endpoint per client in a protocol session of the message-passing ``engine``
        (:func:`fedmcmc.baselines.distributed.sample_qlsd`; ``options``: checked engine
        options). The draws are ``engine="local"``'s, and so is ``info["messages"]``;
        ``info["transport_messages"]`` counts the transport's real messages
        (``bits_communicated`` the quantised code's, as on the in-process engine).
        ``"auto"`` run lengths: from the clients' own Laplace fits."""
        out = distributed.sample_qlsd(self, model, federation, engine,
                                      options, init=init, num_samples=num_samples,
                                      burn_in=burn_in, thin=thin, chains=chains, seed=seed,
                                      progress=progress, run_request=run_request)
        out.info["chains"] = chains
        return self._result(out.run, model.flatten(init), out.info, out.info["thin"], chains,
                            np.asarray(out.state.position), label=engine.label)


# ------------------------------------------------------------------------------ ConsensusMC


class ConsensusMC(_Baseline):
    """Consensus Monte Carlo (Scott et al. 2016): each client samples its subposterior
    p(x_s | theta) p(theta)^(1/S) with NUTS (BlackJAX) on its own data; the server
    combines the clients' g-th draws by precision-weighted averaging,
    ``theta_g = (sum_s W_s)^(-1) sum_s W_s theta_{s,g}`` with W_s client s's estimate of its
    subposterior's precision, by default from Stein's identity (its draws and its
    subposterior's gradients there; exact for a Gaussian subposterior), which it sends with
    its draws. One round of communication. Exact when every subposterior is Gaussian. See
    :mod:`fedmcmc.baselines.consensus`.

    ``num_samples``, ``chains``: per client (every chain of every client is a NUTS chain;
    the g-th combined draw of a chain combines the clients' g-th draws of that chain).
    The clients' own draws are in ``result.info["client_samples"]`` (each leaf of shape
    ``(chains, num_samples, S, *leaf_shape)``).
    ``thin``: NUTS transitions per kept draw. ``burn_in``: NUTS warm-up (window
    adaptation of the step size and a diagonal mass matrix) of ``burn_in * thin``
    transitions, discarded, unless ``num_warmup`` is given. ``thin="auto"``: 1 (NUTS draws
    are nearly independent); ``burn_in="auto"``: the warm-up default, ``default_warmup``
    (200) transitions, or with ``num_warmup`` given no draw discarded after it; the values
    used are in ``info["thin"]``, ``info["burn_in"]`` and ``info["warmup_steps"]``.

    Runs on ``engine="local"`` and on ``engine="ray"`` (one actor per client, its rows loaded
    there; each client sends its draws up chunk by chunk, so that a failure keeps the draws
    made: :mod:`fedmcmc.baselines.distributed`).

    Parameters
    ----------
    weighting:
        ``"stein"`` (default): W_s = sym(K_s C_s^-1), the Stein estimate of the subposterior's
        precision from each client's draws and its gradients there (exact for a Gaussian
        subposterior, whatever the draws; a client whose estimate is not positive definite
        uses the inverse sample covariance, with a warning naming it;
        :func:`fedmcmc.baselines.consensus.stein_precision`); ``"precision"``: W_s = inverse
        sample covariance (both need more draws per client, chains x num_samples, than
        parameters); ``"diagonal"``: inverse sample variances; ``"equal"``: the plain
        average (W_s = I).
    num_warmup:
        NUTS warm-up transitions per client. ``None`` (default): ``burn_in * thin``, or
        200 when that is 0 (NUTS is not run untuned by default); the value used is in
        ``info["warmup_steps"]``. With ``num_warmup`` given, ``burn_in`` draws are
        discarded after the warm-up. 0: no adaptation (``step_size``, identity mass).
    step_size:
        NUTS step size when ``num_warmup=0`` (otherwise adapted; this is the start).
    target_acceptance:
        Target acceptance rate of the step-size adaptation.
    max_num_doublings:
        NUTS tree depth limit.
    """

    name = "ConsensusMC"
    divergence_threshold: float = 1e10
    supports_resume: bool = False
    default_warmup: int = 200

    def __init__(self, weighting="stein", *, num_warmup=None, step_size=0.1,
                 target_acceptance=0.8, max_num_doublings=10):
        if weighting not in consensus.WEIGHTINGS:
            raise ValueError(f"weighting must be one of {consensus.WEIGHTINGS}, got {weighting!r}")
        self.weighting = weighting
        if num_warmup is not None:
            num_warmup = check_nonnegative_int(num_warmup, "num_warmup")
        self.num_warmup = num_warmup
        self.step_size = check_positive_float(step_size, "step_size")
        target = check_positive_float(target_acceptance, "target_acceptance")
        if target >= 1:
            raise ValueError(f"target_acceptance must be in (0, 1), got {target_acceptance!r}")
        self.target_acceptance = target
        self.max_num_doublings = check_positive_int(max_num_doublings, "max_num_doublings")

    def warmup_steps(self, burn_in: int, thin: int) -> int:
        if self.num_warmup is not None:
            return self.num_warmup
        return burn_in * thin if burn_in > 0 else self.default_warmup

    def settings_info(self, num_clients: int, warmup: int) -> dict:
        """The settings as ``Result.info`` reports them (every engine)."""
        return {"weighting": self.weighting, "warmup_steps": warmup, "num_clients": num_clients}

    def check_run(self, dim: int, chains: int, num_samples: int) -> None:
        """The weights W_s need enough draws per client: more than d for ``"stein"`` and
        ``"precision"``, 2 for ``"diagonal"`` (``ValueError`` naming ``num_samples``)."""
        if self.weighting in ("stein", "precision") and chains * num_samples <= dim:
            raise ValueError(
                f"num_samples: weighting={self.weighting!r} estimates each client's {dim}x{dim} "
                f"covariance from chains x num_samples = {chains * num_samples} draws; take "
                f"more than {dim} (or weighting='diagonal')")
        if self.weighting == "diagonal" and chains * num_samples < 2:
            raise ValueError("num_samples: weighting='diagonal' needs at least 2 draws per client")

    #: the run options it cannot honour: it combines the clients' draws after sampling
    REFUSED_RUN_OPTIONS = ("start_draw", "resume_state", "on_draws", "on_chunk")

    def check_engine_run_options(self, options) -> None:
        """No resume and no draws chunk by chunk, on either engine (``ValueError``)."""
        for option in self.REFUSED_RUN_OPTIONS:
            if options.get(option):
                raise ValueError(f"{option}: ConsensusMC cannot resume or report draws chunk by "
                                 "chunk (it combines the clients' draws after sampling)")

    def run_lengths(self, thin, burn_in, info: dict):
        """``(thin, burn_in)`` with ``"auto"`` resolved: one NUTS transition per draw, the
        warm-up default (:func:`fedmcmc.baselines.tuning.consensus_run`)."""
        return tuning.consensus_run(thin, burn_in, self.num_warmup,
                                    self.default_warmup, info)

    def sample_local(self, model, federation, *, init, num_samples, burn_in, thin, chains,
                     seed, progress, run_request=None, **options):
        """The run on the in-process engine (every chain of every client's NUTS vmapped)."""
        run_options = split_run_options(options, self.name)
        resolved = {}
        thin, burn_in = self.run_lengths(thin, burn_in, resolved)
        self.check_engine_run_options(run_options)
        for option in self.REFUSED_RUN_OPTIONS:  # only unset ones are left after the check
            run_options.pop(option, None)
        flat_model = model.flatten(init)
        dim = flat_model.dim
        num_clients = federation.num_clients
        self.check_run(dim, chains, num_samples)
        padded = federation.padded()
        theta0 = flat_model.ravel(init)
        warmup = self.warmup_steps(burn_in, thin)
        key = rng.seed_key(seed)

        def warm_up_keys(run_key):
            return jax.random.split(jax.random.fold_in(run_key, 2**20), chains)

        warm_keys = jit_with_constants_as_arguments(warm_up_keys)(key)
        if warmup > 0:
            build = consensus.build_warmup(flat_model, padded, warmup, self.target_acceptance)
            states = build(warm_keys, theta0)
        else:
            step_size = self.step_size

            def untuned_states(theta):
                return _stack(consensus.untuned_states(flat_model, padded, theta, step_size),
                              chains)

            states = jit_with_constants_as_arguments(untuned_states)(theta0)
        discard = burn_in if self.num_warmup is not None else 0
        step = consensus.build_kernel(flat_model, padded, self.max_num_doublings)

        def draw_step(k, state):
            state, _ = jax.lax.scan(lambda s, kk: (step(kk, s), None), state,
                                    jax.random.split(k, thin))
            return state, state.position.reshape(-1), {}

        run = run_chains(
            draw_step, states, key, burn_in=discard, num_samples=num_samples,
            position=lambda s: s.position.reshape(-1),
            divergence_threshold=self.divergence_threshold, progress=progress, label=self.name,
            iterations_per_draw=thin, **run_options,
        )
        final = run.state
        info = self.settings_info(num_clients, warmup)
        info.update(resolved)
        info["step_size_per_client"] = np.asarray(final.step_size).mean(axis=0).tolist()
        kept = run.draws.shape[1]
        client_weights = None
        weight_floats = 0
        if self.weighting == "stein":
            usable = self.usable_draws(run, discard)
            if chains * usable > dim:  # otherwise the run has too few draws to combine
                client_draws = np.asarray(run.draws).reshape(chains, kept, num_clients, dim)
                gradients = consensus.build_client_gradients(flat_model, num_clients)
                rows = jax.tree_util.tree_map(np.asarray, padded.data)
                mask = np.asarray(padded.mask)
                replies = []
                for s in range(num_clients):  # what client s computes and sends
                    own = client_draws[:, :usable, s].reshape(-1, dim)
                    replies.append(consensus.client_weights(own, np.asarray(gradients(
                        own, jax.tree_util.tree_map(lambda leaf: leaf[s], rows), mask[s]))))
                client_weights = self.stack_weights(replies, info)
                weight_floats = sum(reply.weight.size + (0 if reply.halves is None
                                                         else reply.halves.size)
                                    for reply in replies)
        # one round: each chain's init down to every client, its kept draws (and the clients'
        # weights) up
        info.update(rounds=1, **message_counts.figures(message_counts.broadcast(
                        chains * num_clients)),
                    floats_communicated=int(num_clients * dim + num_clients * chains * kept * dim
                                            + weight_floats))
        info["bytes_communicated"] = _bytes(info["floats_communicated"], flat_model.dtype)
        return self._result(run, flat_model, info, chains, thin, discard,
                            np.asarray(final.divergences), np.asarray(final.acceptance),
                            client_weights=client_weights)

    @staticmethod
    def usable_draws(run, discard: int) -> int:
        """The kept draws of every chain the combination uses: those before any divergence."""
        kept = run.draws.shape[1]
        if run.diverged.any():
            return int(max(0, min(run.first_bad_draw[run.diverged]) - discard))
        return kept

    def stack_weights(self, replies, info: dict) -> tuple:
        """The clients' :class:`~fedmcmc.baselines.consensus.ClientWeights` stacked
        (:func:`~fedmcmc.baselines.consensus.stack_client_weights`), W_s into
        ``info["client_weights"]`` ``(S, d, d)``; the clients whose Stein weight was unusable
        go into ``info["stein_fallback_clients"]`` and a warning."""
        weights, halves, fallback = consensus.stack_client_weights(replies)
        info["client_weights"] = weights
        info["stein_fallback_clients"] = fallback
        if fallback:
            warnings.warn(
                f"ConsensusMC: the Stein weight W_s = sym(K_s C_s^-1) of client(s) {fallback} "
                "is not positive definite or is ill-conditioned (a subposterior far from "
                "Gaussian, or too few draws); those clients use the inverse sample covariance "
                "of their draws instead. Raise num_samples or chains, or check those "
                "clients' subposteriors", consensus.CombinationWarning,
                stacklevel=user_stacklevel())
        return weights, halves

    def _result(self, run, flat_model, info, chains, thin, discard, divergences, acceptance,
                label=None, client_weights=None):
        """Combine the clients' draws of a run (``divergences``, ``acceptance``: the clients'
        NUTS sums, ``(chains, S)``; ``client_weights``: ``(W (S, d, d), halves' weights)``
        the clients sent, with ``weighting="stein"``) into the result, or the error that
        stopped the run (:func:`fedmcmc.results.finish_run`; ``label``: a message-passing
        engine's), whose result is ``None`` when too few draws were made to combine."""
        dim = flat_model.dim
        num_clients = run.draws.shape[-1] // dim
        kept = run.draws.shape[1]
        client_draws = np.asarray(run.draws).reshape(chains, kept, num_clients, dim)
        transitions = run.draws_done * thin
        info.update(
            acceptance_per_client=(acceptance.sum(axis=0) / max(chains * transitions, 1)
                                   ).tolist(),
            divergent_transitions_per_client=divergences.sum(axis=0).astype(int).tolist())
        info.setdefault("rounds", 1)
        usable = self.usable_draws(run, discard)

        def combine(draws):
            # the server's combination of the clients' draws made before any divergence
            per_client = draws.reshape(chains, draws.shape[1], num_clients, dim)[:, :usable]
            combined, _ = consensus.combine(per_client, *self.combination_weights(
                client_weights)[:2])
            return unravel_numpy(flat_model, combined.astype(flat_model.dtype))

        cause = _diverged_cause(self, "a client's subposterior is improper or NUTS failed; "
                                "check the model on each client's data")
        needed = dim + 1 if self.weighting in ("stein", "precision") else 2
        if chains * usable < needed:  # too few draws to combine: the error carries no result
            if run.failure is not None:
                raise client_failure_error(self.name, label, run, None)
            raise diverged_error(self.name, None, divergence_details(run, thin), cause)

        def diverged(result):
            del result.info["client_samples"]  # only a run that ended keeps them
            return diverged_error(self.name, result, divergence_details(run, thin), cause)

        # the clients' own draws (also those sent before a failure)
        info["client_samples"] = unravel_numpy(flat_model, client_draws)
        return finish_run(run, name=self.name, info=info, dim=dim, thin=thin, sample_stats={},
                          label=label, unravel=combine, divergence_error=diverged,
                          checks=lambda result: self._report_combination_error(
                              result.info, client_draws, client_weights))


    def combination_weights(self, client_weights) -> tuple:
        """``(weighting, weights, half_weights)`` of the combination: the clients' Stein
        weights with ``"stein"``, or the server's estimate from the draws (``None``)."""
        if self.weighting == "stein":
            if client_weights is not None:
                return ("stein",) + tuple(client_weights)
            # a client failed before sending its weight: the draws made are combined
            warnings.warn("ConsensusMC: no Stein weights were received (a client failed); "
                          "the draws made are combined with the inverse sample covariances",
                          consensus.CombinationWarning, stacklevel=user_stacklevel())
            return "precision", None, None
        return self.weighting, None, None

    def _report_combination_error(self, info, client_draws, client_weights=None) -> None:
        """``info["combination_error_sd"]``: the predicted error of the combined mean from
        the estimated weights, in posterior sds (the largest coordinate;
        :func:`fedmcmc.baselines.consensus.combination_error`), and a
        :class:`~fedmcmc.baselines.consensus.CombinationWarning` above
        :data:`~fedmcmc.baselines.consensus.COMBINATION_ERROR_WARNING`."""
        weighting, weights, halves = self.combination_weights(client_weights)
        error = float(np.max(consensus.combination_error(client_draws, weighting,
                                                         weights=weights, half_weights=halves)))
        info["combination_error_sd"] = error
        if error > consensus.COMBINATION_ERROR_WARNING:
            warnings.warn(
                f"ConsensusMC: the combined mean is predicted to be off by about {error:.2g} "
                f"posterior sd (up to {3 * error:.2g} at 3 sd) because the weights W_s are "
                "estimated from each client's draws; R-hat and ESS cannot see it. Raise "
                "num_samples or chains (the error shrinks as 1/sqrt(draws per client)), or use "
                "a sampler without a combination step", consensus.CombinationWarning,
                stacklevel=user_stacklevel())

    def sample_on_transport(self, model, federation, engine, options, *,
                           init, num_samples, burn_in, thin, chains, seed, progress,
                           run_request=None):
        """One endpoint per client in a protocol session of the message-passing ``engine``
        (:func:`fedmcmc.baselines.distributed.sample_consensus`; ``options``: checked engine
        options). The draws are ``engine="local"``'s, and so is ``info["messages"]``;
        ``info["transport_messages"]`` counts the transport's real messages (the draws go up
        chunk by chunk)."""
        resolved = {}
        thin, burn_in = self.run_lengths(thin, burn_in, resolved)
        out = distributed.sample_consensus(self, model, federation, engine,
                                           options, init=init, num_samples=num_samples,
                                           burn_in=burn_in, thin=thin, chains=chains, seed=seed,
                                           progress=progress)
        discard = burn_in if self.num_warmup is not None else 0
        out.info.update(resolved)
        return self._result(out.run, model.flatten(init), out.info, chains, thin, discard,
                            out.state["divergences"], out.state["acceptance"],
                            label=engine.label, client_weights=out.client_weights)


def _diverged_cause(algorithm, advice: str) -> str:
    return (f"diverged (non-finite or |theta| > {algorithm.divergence_threshold:g}); {advice}")
