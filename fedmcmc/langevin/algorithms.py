"""Public classes of the stochastic-gradient Langevin family: ``SGLD``, ``DSGLD``, ``FSGLD``.

They check their hyper-parameters, build the functional kernel of ``sgld.py``,
``dsgld.py`` or ``fsgld.py`` and hand it to an engine. Step sizes follow the
papers' convention: ``theta + (h/2) grad + N(0, h I)`` with ``h = step_size``.
"""

from __future__ import annotations

from typing import Any, Optional

import jax.numpy as jnp
import numpy as np

from ..arrays import device_array
from ..algorithm import (
    Algorithm,
    check_nonnegative_float,
    check_nonnegative_int,
    check_positive_float,
    check_positive_int,
)
from .. import messages as message_counts
from .. import rng
from .. import run_length
from ..checkpoint import split_run_options
from ..federation import ConcatenatedData
from ..results import Result
from .. import surrogates as surrogate_module
from .. import privacy as privacy_module
from ..privacy import as_privacy, run_within_budget
from . import private
from . import dsgld, fsgld, sgld
from . import preconditioning
from . import setup
from .run import run_in_process
from . import step_size as step_size_module
from .handoff import DSGLDProtocol, FSGLDProtocol
from .setup import ClientSetup, Settings as _Settings, setup_key, weights_of as _weights_of
from .step_size import StepSizeWarning
from ..schedules import as_schedule, describe_step_size
from ..engines.handoff import sample_handoff

__all__ = ["SGLD", "DSGLD", "FSGLD", "StepSizeWarning"]


def _check_step_size(step_size: Any) -> Any:
    if callable(step_size) or (isinstance(step_size, str) and step_size == "auto"):
        return step_size
    if isinstance(step_size, str):
        raise ValueError(f"step_size must be a positive number, a schedule or 'auto', got {step_size!r}")
    check_positive_float(step_size, "step_size")
    return step_size


def _check_tolerance(tolerance: Any) -> float:
    tolerance = check_positive_float(tolerance, "step_size_tolerance")
    if tolerance >= 1:
        raise ValueError(f"step_size_tolerance must be below 1, got {tolerance!r}")
    return tolerance


def _run_request(options: dict, num_samples, burn_in, thin, chains) -> run_length.RunRequest:
    """The run's length as asked: what ``fm.sample`` passes (``run_request``, popped from
    ``options`` before the run options are checked), else the arguments' own."""
    request = options.pop("run_request", None)
    if request is None:
        request = run_length.RunRequest(num_samples=num_samples, burn_in=burn_in, thin=thin,
                                        chains=chains)
    return request


class _LangevinAlgorithm(Algorithm):
    """Shared run loop: ``thin`` kernel updates per draw, vmapped over chains."""

    divergence_threshold: float = 1e10
    #: accepts the generic run options of ``fedmcmc.checkpoint.RUN_OPTIONS``
    #: (``start_draw``, ``resume_state``, ``on_chunk``, ``on_draws``, ``chunk_size``)
    supports_resume: bool = True
    #: appended to the advice of a divergence error
    divergence_advice: str = ""

    def _run(self, **run) -> Result:
        """The in-process run of a built kernel (:func:`fedmcmc.langevin.run.run_in_process`)
        with this algorithm's name and divergence rule."""
        return run_in_process(name=self.name, divergence_threshold=self.divergence_threshold,
                              divergence_advice=self.divergence_advice, **run)

    def _run_within_plan(self, num_samples: int, plan=None, steps_of=None, **run) -> Result:
        """:meth:`_run` of ``num_samples`` draws, or with a privacy ``plan`` (``(plan,
        steps_for_draws)`` of :mod:`fedmcmc.langevin.private`) the draws the budget affords
        (:func:`fedmcmc.privacy.run_within_budget`); ``steps_of(result, draws)``: the steps a
        run made, as accounted (default: the plan's ``steps_for_draws(draws)``)."""
        def run_draws(draws):
            return self._run(num_samples=draws, **run)

        if plan is None:
            return run_draws(num_samples)
        return self._within_budget(num_samples, plan, run_draws, steps_of)

    def _within_budget(self, num_samples: int, plan, run_draws, steps_of=None) -> Result:
        """``run_draws(n)`` for the draws a privacy ``plan`` (``(plan, steps_for_draws)``)
        affords (:func:`fedmcmc.privacy.run_within_budget`), on any engine."""
        the_plan, steps_for_draws = plan
        return run_within_budget(
            the_plan, name=self.name, num_samples=num_samples, steps_for_draws=steps_for_draws,
            run=run_draws,
            steps_of=steps_of or (lambda result, draws: steps_for_draws(draws)))


class SGLD(_LangevinAlgorithm):
    """Stochastic-gradient Langevin dynamics on the pooled data (centralised baseline).

    FSGLD equations (1)-(2): ``theta <- theta + (h/2) v(theta) + N(0, h I)`` with
    ``v = grad log p(theta) + (N/m) grad log p(x^(m)|theta)``. (BlackJAX's
    ``sgld`` step size is h/2.)

    Parameters
    ----------
    step_size:
        h > 0, or a schedule ``t -> h_t`` such as
        ``fm.schedules.polynomial(a, b, gamma)``.
    batch_size:
        Minibatch size m, drawn uniformly with replacement from all N examples; an upper
        bound: with m >= N every example is used once (the exact gradient).
    privacy:
        ``(epsilon, delta)`` or :class:`fedmcmc.Privacy`: a differentially private run
        (:mod:`fedmcmc.privacy`; the pooled rows as one mechanism, per-example gradients
        clipped, m distinct rows per step); ``result.info["privacy"]`` says what it spent.
    clip_norm:
        With ``privacy``: C, the bound on every per-example gradient's norm (default 1.0).
    preconditioner:
        ``None`` (default), ``"rmsprop"`` or :class:`fedmcmc.RMSPropPreconditioner`: pSGLD's
        diagonal preconditioning (Li et al., 2016; :mod:`fedmcmc.langevin.preconditioning`,
        which states the bias of the term it drops). Needs a numeric h or a schedule and
        integer ``thin`` and ``burn_in``; no ``privacy``.
    """

    name = "SGLD"

    def __init__(self, step_size, batch_size: int, *, noise: bool = True,
                 step_size_tolerance: float = step_size_module.DEFAULT_TOLERANCE,
                 privacy: Any = None, clip_norm: Optional[float] = None,
                 preconditioner: Any = None):
        self.step_size = _check_step_size(step_size)
        self.batch_size = check_positive_int(batch_size, "batch_size")
        self.noise = bool(noise)
        self.step_size_tolerance = _check_tolerance(step_size_tolerance)
        self.privacy = as_privacy(privacy, clip_norm)
        self.preconditioner = preconditioning.as_preconditioner(preconditioner)
        preconditioning.check_combination(self.preconditioner, step_size=self.step_size,
                                          privacy=self.privacy)

    #: ``fm.sample`` passes ``run_request``: thin / burn_in "auto", the budget of "auto" h
    supports_run_request = True

    def sample_local(self, model, federation, *, init, num_samples, burn_in, thin, chains,
                     seed, progress, **options):
        request = _run_request(options, num_samples, burn_in, thin, chains)
        if self.privacy is not None:
            private.check_settings(self, request)
        preconditioning.check_run_request(self.preconditioner, request)
        run_options = split_run_options(options, "SGLD")
        flat_model = model.flatten(init)
        data = federation.concatenated()
        info = {"step_size": describe_step_size(self.step_size), "batch_size": self.batch_size,
                "preconditioner": preconditioning.describe_preconditioner(self.preconditioner)}
        step_size, thin, burn_in = self.step_size, request.thin, request.burn_in
        if step_size == "auto" or request.any_auto:
            # the set-up's key, and one client holding every row: the pooled estimator's noise
            key = rng.fold_in_compiled(rng.seed_key(seed), 2**20 + 1)
            pooled = ConcatenatedData(data=data.data, offsets=data.offsets[:1],
                                      sizes=jnp.sum(data.sizes, dtype=jnp.int32)[None])
            resolved = setup.resolve_sgld(
                setup.InProcessClients(flat_model, federation, pooled, flat_model.ravel(init),
                                       key, self.batch_size, info,
                                       noise_key=rng.fold_in_compiled(key, 7), num_clients=1),
                step_size, self.step_size_tolerance, self.name, request)
            step_size = resolved.step_size
            thin, burn_in = resolved.run_length or (thin, burn_in)
        steps = plan = None
        if self.privacy is not None:
            plan = private.sgld_plan(
                self.privacy, int(np.sum(federation.sizes)), self.batch_size, float(step_size),
                chains, thin, burn_in, federation.num_clients, num_samples)
            steps = private.private_steps(plan[0], flat_model.dtype)
        step = sgld.build_kernel(
            flat_model, data, self.batch_size, as_schedule(step_size), self.noise,
            private=steps, preconditioner=self.preconditioner)
        return self._run_within_plan(
            num_samples, plan, step=step,
            initial_state=sgld.init(flat_model.ravel(init), self.preconditioner),
            flat_model=flat_model, federation=federation, burn_in=burn_in, thin=thin,
            chains=chains, seed=seed, progress=progress, label="SGLD", info=info,
            client_aware=False, run_options=run_options)


class DSGLD(_LangevinAlgorithm):
    """Distributed SGLD (FSGLD equations (3)-(4)): a chain handed between clients.

    Each round the scheduler draws client s with probability f_s (the
    federation's ``weights``); the chain takes ``local_steps`` updates there
    with the estimator ``grad log p(theta) + N_s/(f_s m) grad log p(x_s^(m)|theta)``,
    then moves on. Every chain has its own client sequence.

    Parameters
    ----------
    step_size:
        h > 0 (paper convention) or a schedule.
    batch_size:
        Minibatch size m within a client, an upper bound: a client with N_s <= m rows uses
        each of them once (its exact gradient), and the estimator divides by min(m, N_s),
        so it stays unbiased (``fedmcmc.minibatch``).
    local_steps:
        Updates per visit before the chain is handed on.
    step_size_tolerance:
        ``"auto"``'s bound on the minibatch-noise and discretisation ratios (default 0.05).
    control_variates:
        The estimator with control variates (``estimators.dsgld_gradient_with_control_variates``):
        ``"global"`` (or ``True``) anchors every client at the mode of the product of the
        clients' Laplace fits, ``"client"`` each client at its own Laplace mode (nothing new
        leaves the client), ``False`` none. ``None`` (default): with ``step_size="auto"``
        the set-up measures none and the global anchor from the clients' noise statistics
        and keeps the anchor if it allows more than twice the h of none (a control variate
        costs a second gradient per row; client anchors lost to the global one wherever
        measured, ``step_size.candidate_variates``); with a numeric h, none.
    client_selection:
        The scheduler's f_s. ``"proportional"``: the federation's ``weights`` (N_s / N by
        default); ``"variance"``: chosen to lower the estimator's noise
        (``step_size.variance_weights``; the estimator divides by the same f_s, so it stays
        unbiased). ``None`` (default): with ``step_size="auto"``, ``"variance"`` when it
        allows at least 1.25x the step size of ``"proportional"``, else the latter; with a
        numeric h, ``"proportional"``. Weights the user gave the federation are always used
        as given.
    privacy:
        ``(epsilon, delta)`` or :class:`fedmcmc.Privacy`: a differentially private run
        (:mod:`fedmcmc.privacy`, :mod:`fedmcmc.langevin.private`): each client's rows
        protected from everyone its chain state reaches, per-example gradients clipped,
        ``result.info["privacy"]`` per client. Needs a numeric h; on a message-passing
        engine each client clips and adds its noise in its own visit (an in-memory federation, failure
        policy ``"stop"``).
    clip_norm:
        With ``privacy``: C, the bound on every per-example gradient's norm (default 1.0).
    preconditioner:
        ``None`` (default), ``"rmsprop"`` or :class:`fedmcmc.RMSPropPreconditioner`: pSGLD's
        diagonal preconditioning (Li et al., 2016; :mod:`fedmcmc.langevin.preconditioning`,
        which states the bias of the term it drops), its running average V handed from client
        to client with the position. Needs a numeric h or a schedule, integer ``thin`` and
        ``burn_in``; no ``privacy``, control variates or ``client_selection="variance"``.
        Keep ``local_steps`` well below ``1 / (1 - decay)`` on non-IID clients.
    """

    name = "DSGLD"
    #: the hand-off protocol (:meth:`handoff_protocol`) on a message-passing engine (Ray:
    #: client endpoints in actors, ``fedmcmc.engines.ray_engine``)
    message_passing = True
    #: one message per visit of a chain to a client (``fedmcmc.engines.engine.PATTERNS``)
    message_pattern = "handoff"
    #: ``fm.sample`` passes ``run_request``: thin / burn_in "auto", the budget of "auto" h
    supports_run_request = True

    def __init__(self, step_size, batch_size: int, local_steps: int, *, noise: bool = True,
                 step_size_tolerance: float = step_size_module.DEFAULT_TOLERANCE,
                 control_variates: Any = None, client_selection: Optional[str] = None,
                 privacy: Any = None, clip_norm: Optional[float] = None,
                 preconditioner: Any = None):
        self.privacy = as_privacy(privacy, clip_norm)
        self.step_size = _check_step_size(step_size)
        self.batch_size = check_positive_int(batch_size, "batch_size")
        self.local_steps = check_positive_int(local_steps, "local_steps")
        self.noise = bool(noise)
        self.step_size_tolerance = _check_tolerance(step_size_tolerance)
        if not any(control_variates is option for option in (None, True, False)) and \
                control_variates not in ("global", "client"):
            raise ValueError(f"control_variates must be 'global' (or True), 'client', False or "
                             f"None (automatic), got {control_variates!r}")
        self.control_variates = control_variates
        if client_selection not in (None, "proportional", "variance"):
            raise ValueError(f"client_selection must be 'proportional', 'variance' or None "
                             f"(automatic), got {client_selection!r}")
        self.client_selection = client_selection
        self.preconditioner = preconditioning.as_preconditioner(preconditioner)
        preconditioning.check_combination(
            self.preconditioner, step_size=self.step_size, privacy=self.privacy,
            control_variates=control_variates, client_selection=client_selection)

    def _variates_kind(self) -> Optional[str]:
        """The control variates asked for: "global", "client", "none", or None (automatic)."""
        if self.control_variates is None:
            return None
        if self.control_variates is True:
            return "global"
        if self.control_variates is False:
            return "none"
        return self.control_variates

    def handoff_protocol(self, settings: Optional["_Settings"] = None,
                         run_request: Optional[run_length.RunRequest] = None,
                         private_noise=None) -> DSGLDProtocol:
        """This algorithm as a hand-off protocol (what the clients and the server of the Ray
        engine run; ``fedmcmc.langevin.handoff``). ``settings``: the resolved ones
        (:meth:`_resolve`: a numeric h, the control variates' anchor, f_s), else the
        constructor's, with ``"auto"`` and the variance reduction resolved by the protocol's
        set-up from the clients' replies (``handoff.ClientSetup``), and with ``run_request``
        thin / burn_in ``"auto"`` too."""
        setup = None if settings is not None else self._client_setup()
        settings = settings or _Settings(step_size=self.step_size)
        anchor = None if settings.variates is None else np.asarray(settings.variates.anchor)
        return DSGLDProtocol(settings.step_size, self.batch_size, self.local_steps, self.noise,
                             self.divergence_threshold, anchor=anchor,
                             client_weights=settings.client_weights, setup=setup,
                             run_request=run_request, preconditioner=self.preconditioner,
                             private=private_noise)

    def _client_setup(self) -> Optional[ClientSetup]:
        """What the protocol's server resolves from the clients' replies when no resolved
        settings are given (data that stay on the clients): ``"auto"``, the control variates
        and f_s, if any of them is asked for."""
        if not self._needs_driver_setup():
            return None
        return ClientSetup(tolerance=self.step_size_tolerance,
                           control_variates=self._variates_kind(),
                           client_selection=self.client_selection)

    def _setup_options(self) -> setup.SetupOptions:
        """What the set-up (:mod:`fedmcmc.langevin.setup`) reads of this configuration:
        what to choose from the clients' noise statistics, if anything."""
        return setup.SetupOptions(name=self.name, step_size=self.step_size,
                                  local_steps=self.local_steps, choice=self._client_setup())

    def _in_process_clients(self, flat_model, federation, data, weights, key, theta0,
                            info) -> setup.InProcessClients:
        """The set-up's statistics of the federation's clients, computed here."""
        return setup.InProcessClients(flat_model, federation, data, theta0, key,
                                      self.batch_size, info, weights=weights)

    def _resolve(self, flat_model, federation, data, weights, key, theta0, info,
                 request: Optional[run_length.RunRequest] = None) -> _Settings:
        """The run's settings (:func:`fedmcmc.langevin.setup.resolve_dsgld` on the clients'
        statistics computed here): ``"auto"``, the control variates and f_s resolved
        (``info`` says what was chosen), the run lengths from the Laplace fit, made for them
        alone when ``request`` asks for ``"auto"`` with a given h."""
        clients = self._in_process_clients(flat_model, federation, data, weights, key, theta0,
                                           info)
        resolved = setup.resolve_dsgld(clients, self._setup_options(), request)
        return _Settings(step_size=resolved.step_size,
                         variates=clients.control_variates(resolved.anchor),
                         client_weights=resolved.client_weights, center=resolved.center,
                         precision=resolved.precision, run_length=resolved.run_length)

    def _kernel(self, flat_model, data, weights, settings: _Settings, private=None):
        return dsgld.build_kernel(
            flat_model, data, _weights_of(settings, weights), self.batch_size, self.local_steps,
            as_schedule(settings.step_size), self.noise, control_variates=settings.variates,
            private=private, preconditioner=self.preconditioner,
        )

    def _check_auto_surrogate(self) -> None:
        """Settings "auto" cannot resolve (FSGLD: surrogate='sgld' without its step size)."""

    def _needs_driver_setup(self) -> bool:
        return (self.step_size == "auto" or self._variates_kind() not in (None, "none")
                or self.client_selection == "variance")

    def check_run_lengths(self, burn_in, thin) -> None:
        """Refuse run lengths the algorithm cannot use (``ValueError``); default: none."""

    def sample_distributed(self, model, federation, engine, *, init, num_samples, burn_in,
                           thin, chains, seed, progress, **options):
        """The hand-off protocol (:meth:`handoff_protocol`, ``fedmcmc.langevin.handoff``) on
        ``engine``'s client endpoints (:func:`fedmcmc.engines.handoff.sample_handoff`)."""
        self.check_run_lengths(burn_in, thin)
        request = _run_request(options, num_samples, burn_in, thin, chains)
        if self.privacy is not None:
            private.check_settings(self, request)
            self._check_private()
            private.check_distributed(self, federation,
                                      engine.session_options(options, self.name))
        preconditioning.check_run_request(self.preconditioner, request)
        info = {"step_size": describe_step_size(self.step_size),
                "batch_size": self.batch_size,
                "preconditioner": preconditioning.describe_preconditioner(self.preconditioner)}
        if self.privacy is not None:
            return self._sample_distributed_privately(
                model, federation, engine, init=init, num_samples=num_samples,
                burn_in=burn_in, thin=thin, chains=chains, seed=seed, progress=progress,
                info=info, **options)
        if not self._needs_driver_setup() and not request.any_auto:
            protocol = self.handoff_protocol(run_request=request)
        elif federation.is_deferred:
            # data that stay on the clients: the protocol's set-up asks each client for
            # its statistics (a few floats each) and chooses with the in-process set-up's
            # functions, so the h, anchor, f_s and run lengths are the in-process ones
            self._check_auto_surrogate()
            protocol = self.handoff_protocol(run_request=request)
        else:
            # "auto" (and the control variates) resolved by the driver from the federation
            # it holds, by the in-process engine's computation (each client's statistics
            # of its own estimator): the same h, surrogates and anchor, hence the same draws
            flat_model = model.flatten(init)
            theta0 = flat_model.ravel(init)
            settings = self._resolve(
                flat_model, federation, federation.concatenated(),
                jnp.asarray(federation.weights, dtype=jnp.float32),
                setup_key(seed), theta0, info, request)
            thin, burn_in = self._run_length(request, settings, theta0, info)
            info["step_size"] = describe_step_size(settings.step_size)
            info["setup_by"] = "driver"
            protocol = self.handoff_protocol(settings)
        return sample_handoff(
            protocol, model, federation, engine, init=init, num_samples=num_samples,
            burn_in=burn_in, thin=thin, chains=chains, seed=seed, progress=progress,
            info=info, **options,
        )

    def _sample_distributed_privately(self, model, federation, engine, *, init, num_samples,
                                      burn_in, thin, chains, seed, progress, info, **options):
        """A private run through the hand-off protocol: the in-process run's plan (given h,
        the federation's f_s and row counts; :mod:`fedmcmc.langevin.private`), each client's
        a_s and C sent with its parameters, the run accounted as made (``local_steps`` per
        visit a chain started), or the draws the budget affords."""
        flat_model = model.flatten(init)
        settings = self._private_settings(flat_model, federation, flat_model.ravel(init), info)
        plan = private.federated_plan(
            self.privacy, np.asarray(federation.sizes), np.asarray(federation.weights),
            self.batch_size, float(settings.step_size), self.local_steps, chains, thin,
            burn_in, num_samples)
        protocol = self.handoff_protocol(settings, private_noise=private.private_noise(plan[0]))

        def run(draws):
            return sample_handoff(
                protocol, model, federation, engine, init=init, num_samples=draws,
                burn_in=burn_in, thin=thin, chains=chains, seed=seed, progress=progress,
                info=dict(info), **options)

        return self._within_budget(num_samples, plan, run, self._steps_made)

    def _steps_made(self, result, draws) -> list:
        """A hand-off run's private updates per client, as accounted: ``local_steps`` for
        every visit a chain started."""
        return [v * self.local_steps for v in result.info["visits_per_client"]]

    def sample_local(self, model, federation, *, init, num_samples, burn_in, thin, chains,
                     seed, progress, **options):
        self.check_run_lengths(burn_in, thin)
        request = _run_request(options, num_samples, burn_in, thin, chains)
        if self.privacy is not None:
            private.check_settings(self, request)
            self._check_private()
        preconditioning.check_run_request(self.preconditioner, request)
        run_options = split_run_options(options, self.name)
        flat_model = model.flatten(init)
        data = federation.concatenated()
        weights = device_array(federation.weights, np.float32)
        theta0 = flat_model.ravel(init)
        info = {
            "step_size": describe_step_size(self.step_size),
            "batch_size": self.batch_size,
            "local_steps": self.local_steps,
            "num_clients": federation.num_clients,
            "preconditioner": preconditioning.describe_preconditioner(self.preconditioner),
        }
        if self.privacy is None:
            settings = self._resolve(flat_model, federation, data, weights, setup_key(seed),
                                     theta0, info, request)
        else:
            settings = self._private_settings(flat_model, federation, theta0, info)
        thin, burn_in = self._run_length(request, settings, theta0, info)
        steps = plan = None
        if self.privacy is not None:
            plan = private.federated_plan(
                self.privacy, np.asarray(federation.sizes), np.asarray(federation.weights),
                self.batch_size, float(settings.step_size), self.local_steps, chains, thin,
                burn_in, num_samples)
            steps = private.private_steps(plan[0], flat_model.dtype)
        step = self._kernel(flat_model, data, weights, settings, private=steps)
        # accounted as made: local_steps for every visit a chain started
        return self._run_within_plan(
            num_samples, plan, self._steps_made,
            step=step,
            initial_state=dsgld.init(theta0, federation.num_clients, self.preconditioner),
            flat_model=flat_model, federation=federation, burn_in=burn_in, thin=thin,
            chains=chains, seed=seed, progress=progress, label=self.name, info=info,
            client_aware=True, run_options=run_options)

    def _check_private(self) -> None:
        """Settings a private run refuses beyond the family's (FSGLD: fitted surrogates)."""

    def _private_settings(self, flat_model, federation, theta0, info) -> "_Settings":
        """A private run's settings: the given h and the federation's f_s (nothing read from
        the rows before the run; :func:`.private.check_settings` refused the rest)."""
        return _Settings(step_size=self.step_size)

    def _run_length(self, request, settings: _Settings, theta0, info) -> tuple:
        """thin and burn_in: those the set-up resolved, else as asked (``"auto"`` without a
        set-up refused: :func:`fedmcmc.langevin.setup.resolve_run_length`)."""
        length = settings.run_length
        if length is None and settings.center is None:
            length = setup.resolve_run_length(request, settings.step_size, None, None, theta0,
                                              self.name, info)
        return length or (request.thin, request.burn_in)


class FSGLD(DSGLD):
    """Federated SGLD (CG-DSGLD): DSGLD plus conducive gradients (FSGLD eq. (5)-(7), Algorithm 1).

    Every client fits a Gaussian surrogate q_s of its likelihood on its own
    data and sends it once; during a visit to client s the estimator adds
    ``alpha * (grad log q(theta) - (1/f_s) grad log q_s(theta))``, which keeps
    it unbiased and removes the drift towards the client's local posterior
    that makes DSGLD sample a mixture when ``local_steps`` is large.

    Parameters
    ----------
    step_size, batch_size, local_steps:
        As for :class:`DSGLD`.
    surrogate:
        ``"laplace"`` (default), ``"exact"`` (likelihoods Gaussian in theta),
        ``"sgld"`` (the paper's recipe), or precomputed natural parameters
        ``(precision, shift)`` of shapes ``(S, d[, d])`` and ``(S, d)``.
    alpha:
        Exploration constant of Remark 1 (equation (7)); 1 is the paper's method.
    trust_radius:
        The safeguard against the divergence of conducive gradients far from
        the surrogates' modes (see below). Outside a region of this radius
        around the mode ``m`` of prior x prod_s q_s (distance in its precision
        metric), a conducive term that pushes the chain away from ``m`` is cut
        until the drift no longer does. ``"auto"`` (default) puts the radius
        at the 1 - 1e-4 quantile of the discretised chain's distance to ``m``
        (the chi-square quantile widened by the measured minibatch noise);
        ``None`` switches the safeguard off.
    alpha_warmup:
        Iterations over which alpha ramps linearly from 0 at the start of the
        run (default 0: no ramp). It must end within burn-in.
    diagonal:
        Diagonal surrogate precisions; ``None`` chooses diagonal above 500
        parameters.
    surrogate_draws, surrogate_burn_in, surrogate_step_size:
        The ``"sgld"`` surrogate's K draws (3000 in the paper), burn-in and
        step size (default: ``step_size``).
    step_size_tolerance, control_variates, client_selection:
        As for :class:`DSGLD` (the noise they measure is that of FSGLD's estimator,
        conducive gradient included). Under ``step_size="auto"`` each client's conducive
        gradient is also weighted by how well its surrogate predicts the client's gradient
        at the draws where the noise is measured: 1 unless the surrogate predicts worse than
        zero (then its least-squares weight, often 0; the estimator stays unbiased;
        ``info["conducive_weights"]``, ``langevin.step_size.conducive_weights``).
    privacy, clip_norm:
        As for :class:`DSGLD`; a private FSGLD needs precomputed surrogates
        ``(precision, shift)`` (treated as public) and ``trust_radius=None``.
    preconditioner:
        As for :class:`DSGLD`; V averages FSGLD's whole estimate, conducive gradient included
        (which removes the client drifts a long visit would adapt G to), and
        ``trust_radius="auto"`` widens the radius by an upper bound of the preconditioned
        chain's noise inflation (``preconditioning.trust_radius_widening``).

    Far from the surrogates' modes
    ------------------------------
    During a visit to client s the estimator's curvature is
    ``(N_s/f_s) H_s(theta) - P_s/f_s + sum_r P_r``. Where the client's true
    curvature H_s is much smaller than at the point where P_s was fitted (a
    log link far from the data, a saturated logistic), ``-P_s/f_s`` wins and
    the chain is repelled exponentially for the whole visit: measured on a
    Poisson regression with 8 non-IID clients started at zero, 3 of 16 chains
    reach 1e10 within 40 iterations. Ramping alpha during burn-in only delays
    it (the chain diverges right after the ramp). Damping conducive gradients
    by distance alone fails the other way: far from the posterior they are
    what pulls the chain in (section 5.1), and damping them there leaves the
    chain in DSGLD's mixture of local posteriors. The safeguard therefore
    keeps the conducive term whenever it pulls the chain towards the
    posterior and cuts it only where it pushes outward and wins, and only
    outside the trust region: inside it the estimator is exactly FSGLD's and
    unbiased (Lemma 1), and the stationary law is unchanged wherever plain
    FSGLD is stable. See ``tests/langevin/test_fsgld_robustness.py``.
    """

    name = "FSGLD"
    divergence_advice = ", or keep FSGLD's trust_radius safeguard on"

    def __init__(
        self,
        step_size,
        batch_size: int,
        local_steps: int,
        *,
        surrogate: Any = "laplace",
        alpha: float = 1.0,
        alpha_warmup: int = 0,
        diagonal: Optional[bool] = None,
        surrogate_draws: int = 3000,
        surrogate_burn_in: int = 1000,
        surrogate_step_size: Optional[float] = None,
        trust_radius: Any = "auto",
        noise: bool = True,
        step_size_tolerance: float = step_size_module.DEFAULT_TOLERANCE,
        control_variates: Any = None,
        client_selection: Optional[str] = None,
        privacy: Any = None,
        clip_norm: Optional[float] = None,
        preconditioner: Any = None,
    ):
        super().__init__(step_size, batch_size, local_steps, noise=noise,
                         step_size_tolerance=step_size_tolerance,
                         control_variates=control_variates, client_selection=client_selection,
                         privacy=privacy, clip_norm=clip_norm, preconditioner=preconditioner)
        if isinstance(surrogate, str):
            if surrogate not in ("exact", "laplace", "sgld"):
                raise ValueError(
                    f"surrogate must be 'exact', 'laplace', 'sgld' or (precision, shift), got {surrogate!r}"
                )
        elif not (isinstance(surrogate, tuple) and len(surrogate) == 2):
            raise ValueError("surrogate must be a name or a (precision, shift) pair")
        self.surrogate = surrogate
        self.alpha = check_nonnegative_float(alpha, "alpha")
        self.alpha_warmup = check_nonnegative_int(alpha_warmup, "alpha_warmup")
        self.diagonal = diagonal
        self.surrogate_draws = check_positive_int(surrogate_draws, "surrogate_draws")
        self.surrogate_burn_in = check_nonnegative_int(surrogate_burn_in, "surrogate_burn_in")
        if surrogate_step_size is not None:
            check_positive_float(surrogate_step_size, "surrogate_step_size")
        self.surrogate_step_size = surrogate_step_size
        if trust_radius not in ("auto", None):
            trust_radius = check_positive_float(trust_radius, "trust_radius")
        self.trust_radius = trust_radius

    def fit_surrogates(self, model, federation, init, seed: int = 0):
        """The clients' surrogates (what each client sends once), as natural parameters."""
        flat_model = model.flatten(init)
        return self._fit(flat_model, federation, flat_model.ravel(init), setup_key(seed))

    def _fit(self, flat_model, federation, theta0, key):
        if not isinstance(self.surrogate, str):
            return surrogate_module.as_surrogates(self.surrogate, flat_model.dim,
                                                  federation.num_clients)
        clients = setup.InProcessClients(flat_model, federation, None, theta0, key,
                                         self.batch_size, {})
        return clients.fit_surrogates(self._surrogate_fit())[0]

    def _surrogate_fit(self) -> setup.SurrogateFit:
        """How the clients fit their surrogates (``"sgld"``: its h, default ``step_size``)."""
        step = self.surrogate_step_size
        if self.surrogate == "sgld" and step is None:
            self._check_auto_surrogate()
            step = self.step_size if not callable(self.step_size) else float(self.step_size(0))
        return setup.SurrogateFit(
            kind=self.surrogate, diagonal=self.diagonal, step_size=step, batch_size=self.batch_size,
            draws=self.surrogate_draws, burn_in=self.surrogate_burn_in)

    def _check_auto_surrogate(self) -> None:
        if self.step_size == "auto" and self.surrogate == "sgld" and \
                self.surrogate_step_size is None:
            raise ValueError(
                "surrogate='sgld' with step_size='auto' needs surrogate_step_size (the local "
                "SGLD chains' h): the automatic h is chosen from the surrogates themselves")

    def check_run_lengths(self, burn_in, thin) -> None:
        if not (run_length.is_auto(burn_in) or run_length.is_auto(thin)):
            fsgld.check_alpha_warmup(self.alpha_warmup, burn_in, thin)

    def _run_length(self, request, settings, theta0, info) -> tuple:
        thin, burn_in = super()._run_length(request, settings, theta0, info)
        fsgld.check_alpha_warmup(self.alpha_warmup, burn_in, thin)
        return thin, burn_in

    #: minibatch draws per client for the automatic trust radius
    radius_probes_per_client = setup.RADIUS_PROBES_PER_CLIENT

    def _kernel(self, flat_model, data, weights, settings: _Settings, private=None):
        return fsgld.build_kernel(
            flat_model, data, _weights_of(settings, weights), self.batch_size, self.local_steps,
            as_schedule(settings.step_size), settings.surrogates, settings.global_surrogate,
            fsgld.alpha_schedule(self.alpha, self.alpha_warmup), self.noise,
            settings.trust_region, control_variates=settings.variates, private=private,
            preconditioner=self.preconditioner,
        )

    def _check_private(self) -> None:
        refuse = privacy_module.refuse
        refuse(isinstance(self.surrogate, str), self.name,
               f"surrogate={self.surrogate!r}: surrogates fitted from the clients' rows are "
               "released once, outside the accounted steps; give precomputed (precision, "
               "shift) (e.g. from public data), which the accountant treats as public")
        refuse(self.trust_radius is not None, self.name,
               f"trust_radius={self.trust_radius!r}: the trust region's damping reads the "
               "minibatch gradient (the update is then no Gaussian mechanism on the clipped "
               "sum); give trust_radius=None")

    def _private_settings(self, flat_model, federation, theta0, info) -> "_Settings":
        """The given surrogates and h; no trust region, no control variates (refused)."""
        surrogates = surrogate_module.as_surrogates(self.surrogate, flat_model.dim,
                                                    federation.num_clients)
        info.update(surrogate="given", surrogate_diagonal=surrogates.diagonal, alpha=self.alpha,
                    alpha_warmup=self.alpha_warmup, trust_radius=None,
                    surrogate_messages=message_counts.setup(federation.num_clients, 1),
                    surrogate_floats=2 * federation.num_clients * surrogates.floats_per_client)
        return _Settings(step_size=self.step_size, surrogates=surrogates,
                         global_surrogate=surrogate_module.product(surrogates))

    def handoff_protocol(self, settings: Optional["_Settings"] = None,
                         run_request: Optional[run_length.RunRequest] = None,
                         private_noise=None) -> FSGLDProtocol:
        """This algorithm as a hand-off protocol (``fedmcmc.langevin.handoff``). Without
        ``settings`` the clients fit their own surrogates and the server sets the trust radius
        from their replies; with the resolved ones (:meth:`_resolve`) the protocol runs the
        numeric h, the surrogates the set-up fitted (given to the clients), the trust radius
        and the control variates' anchor. ``run_request``: thin / burn_in ``"auto"`` resolved by
        the protocol's set-up (from the product of the surrogates)."""
        if settings is None:
            settings, surrogates, radius = (_Settings(step_size=self.step_size), self.surrogate,
                                            self.trust_radius)
            setup = self._client_setup()
        else:
            radius = None if settings.trust_region is None else float(
                settings.trust_region.radius)
            surrogates = (np.asarray(settings.surrogates.precision),
                          np.asarray(settings.surrogates.shift))
            setup = None
        anchor = None if settings.variates is None else np.asarray(settings.variates.anchor)
        return FSGLDProtocol(
            settings.step_size, self.batch_size, self.local_steps, surrogate=surrogates,
            alpha=self.alpha, alpha_warmup=self.alpha_warmup, diagonal=self.diagonal,
            surrogate_draws=self.surrogate_draws, surrogate_burn_in=self.surrogate_burn_in,
            surrogate_step_size=self.surrogate_step_size, trust_radius=radius,
            radius_probes_per_client=self.radius_probes_per_client, noise=self.noise,
            divergence_threshold=self.divergence_threshold, anchor=anchor,
            client_weights=settings.client_weights, setup=setup, run_request=run_request,
            preconditioner=self.preconditioner, private=private_noise)

    def _setup_options(self) -> setup.SetupOptions:
        """DSGLD's, with FSGLD's surrogates and alpha; in process the given h is checked
        against the clients' noise whatever is asked (the statistics cost no message), so
        ``choice`` is always given."""
        return setup.SetupOptions(
            name=self.name, step_size=self.step_size, local_steps=self.local_steps,
            choice=ClientSetup(tolerance=self.step_size_tolerance,
                               control_variates=self._variates_kind(),
                               client_selection=self.client_selection),
            alpha=self.alpha, alpha_warmup=self.alpha_warmup, surrogate=self.surrogate,
            fit=self._surrogate_fit() if isinstance(self.surrogate, str) else None,
            diagonal=self.diagonal)

    def _in_process_clients(self, flat_model, federation, data, weights, key, theta0, info):
        return setup.InProcessClients(flat_model, federation, data, theta0, key,
                                      self.batch_size, info, weights=weights,
                                      radius_probes=self.radius_probes_per_client)

    def _resolve(self, flat_model, federation, data, weights, key, theta0, info,
                 request: Optional[run_length.RunRequest] = None) -> "_Settings":
        """The run's settings (:func:`fedmcmc.langevin.setup.resolve_fsgld` on the clients'
        statistics computed here): surrogates (re-expanded at the global mode under
        ``"auto"``), ``"auto"`` or the check of a given h, the control variates, f_s, the run
        lengths and the trust region (:func:`fedmcmc.langevin.setup.auto_trust_radius`)."""
        clients = self._in_process_clients(flat_model, federation, data, weights, key, theta0,
                                           info)
        given = None
        if not isinstance(self.surrogate, str):
            given = surrogate_module.as_surrogates(self.surrogate, flat_model.dim,
                                                   federation.num_clients)
        resolved = setup.resolve_fsgld(clients, self._setup_options(), request,
                                       measure_noise=True, surrogates=given)
        surrogates, center, metric = resolved.surrogates, resolved.center, resolved.precision
        global_surrogate = surrogate_module.product(surrogates)
        weights = _weights_of(_Settings(resolved.step_size,
                                        client_weights=resolved.client_weights), weights)
        radius = setup.trust_radius(
            clients, self.trust_radius, weights, self.alpha, surrogates, global_surrogate, center,
            resolved.step_size, preconditioned_rows=(
                None if self.preconditioner is None else int(np.sum(federation.sizes))))
        trust_region = None if radius is None else fsgld.TrustRegion(
            center=center, precision=metric, radius=radius)
        return _Settings(step_size=resolved.step_size,
                         variates=clients.control_variates(resolved.anchor),
                         surrogates=surrogates, global_surrogate=global_surrogate,
                         trust_region=trust_region, client_weights=resolved.client_weights,
                         center=center, precision=metric, run_length=resolved.run_length)
