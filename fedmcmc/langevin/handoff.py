"""DSGLD and FSGLD as hand-off protocols (``fedmcmc.protocols.HandoffProtocol``).

What runs where when the clients are separate processes (the Ray engine, or the
in-process transport that simulates it message for message):

* **client side** (its own data only): FSGLD's surrogate fit
  (:meth:`FSGLDProtocol.client_fit_surrogate`, the objective of
  ``fedmcmc.surrogates``: the client's log likelihood plus 1/S of the log prior)
  and the d + 1 moments of its estimator for ``trust_radius="auto"``
  (:meth:`FSGLDProtocol.client_estimator_moments`); every visit's updates, built
  from the in-process kernels (``dsgld.build_kernel``, ``fsgld.build_kernel``) on
  a one-client data layout, so the update rule is written once;
* **server side** (replies only): the product q of the surrogates, the Laplace
  centre and metric of prior x q, the trust radius from the clients' moments,
  and f_s, all recomputed over the remaining clients when one is dropped.

``step_size="auto"`` (and the control variates and client selection it chooses) and
``thin="auto"`` / ``burn_in="auto"`` with data that stay on the clients
(``Federation.from_loaders`` on Ray, ``setup=ClientSetup``, ``run_request``): the set-up of
``fedmcmc.langevin.setup``, the one the in-process engine runs, with each statistic asked of
its own client (``setup.MessagePassingClients``): each client's Laplace fit and mode
(:meth:`DSGLDProtocol.client_laplace`), FSGLD's Newton rounds at the global mode
(:meth:`FSGLDProtocol.client_taylor`), the noise statistics of its estimator for every
candidate anchor (:meth:`DSGLDProtocol.client_noise`, ``estimators.unscaled_noise``) and the
trust radius' moments, a few floats each. :meth:`DSGLDProtocol.prepare` returns what it chose
(and the run lengths, read by the engine with :meth:`DSGLDProtocol.run_length` before it
configures the clients).

A private run (``privacy=``; :mod:`fedmcmc.langevin.private`) is planned by the driver, which
gives the protocol each client's noise factor a_s and the clip norm C
(:class:`PrivateNoise`); each client receives its own with its parameters and builds its visit
with clipped per-example gradients, distinct rows and the inflated noise, as in process.

Keys are the in-process engine's, so both engines give the same draws (the
tests compare them).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Dict, List, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import rng
from .. import run_length
from .. import surrogates as surrogate_module
from ..arrays import device_array
from ..clipping import PrivateSteps
from ..federation import ConcatenatedData, Federation
from ..model import Model
from ..protocols import ClientContext, HandoffProtocol, ServerSide, UpdateStep
from ..schedules import as_schedule
from . import dsgld, fsgld
from . import setup as setup_module
from . import step_size as step_size_module
from .estimators import ControlVariates, estimator_moments, unscaled_noise
from .setup import ClientSetup, setup_key
from .sgld import noise_from_keys, run_updates

__all__ = ["DSGLDProtocol", "FSGLDProtocol", "ClientSetup", "HandoffSetup", "DSGLDParameters",
           "FSGLDParameters", "PrivateNoise", "setup_key"]


class PrivateNoise(NamedTuple):
    """A private run's noise (:mod:`fedmcmc.langevin.private`): the clip norm C and every
    client's factor a_s on its Langevin noise (``(S,)``), as the accountant planned them."""

    clip_norm: float
    noise_inflation: np.ndarray


class HandoffSetup(NamedTuple):
    """What :meth:`DSGLDProtocol.prepare` resolved on the server, returned (the protocol object
    is never changed): the step size the visits run (``"auto"`` resolved), the control
    variates' anchor ((d,) shared or (S, d) per client; ``None``: none), the scheduler's f_s
    when the set-up chose them, the run's (thin, burn_in) when it resolved ``"auto"`` ones, and
    FSGLD's surrogates (``surrogates_given``: the user gave them, or the set-up weighted
    their conducive gradients, so the server sends each
    client its own)."""

    step_size: Any
    anchor: Optional[np.ndarray] = None
    client_weights: Optional[np.ndarray] = None
    run_length: Optional[tuple] = None
    surrogates: Any = None
    surrogates_given: bool = False


class DSGLDParameters(NamedTuple):
    """A DSGLD client's update parameters (FSGLD equation (4) with optional control variates):
    f_s; the anchor theta*_s and, added by the client itself, its full-data gradient there;
    the step size when the server's set-up chose it (``None``: the protocol's own)."""

    weight: Any
    anchor: Any = None
    anchor_gradient: Any = None
    step_size: Any = None
    total_rows: Any = None  # N, the federation's rows: pSGLD's scale of V (None: none)
    noise_inflation: Any = None  # a private run's a_s (fedmcmc.langevin.private; None: none)


class FSGLDParameters(NamedTuple):
    """An FSGLD client's update parameters: DSGLD's, the global surrogate q (precision, shift),
    the client's own q_s (``precision``, ``shift``: sent when given, else the fit it keeps) and
    the trust region (centre, metric, radius; ``None``: none)."""

    weight: Any
    global_precision: Any
    global_shift: Any
    anchor: Any = None
    anchor_gradient: Any = None
    step_size: Any = None
    precision: Any = None
    shift: Any = None
    trust_center: Any = None
    trust_precision: Any = None
    trust_radius: Any = None
    total_rows: Any = None  # N, the federation's rows: pSGLD's scale of V (None: none)
    noise_inflation: Any = None  # a private run's a_s (fedmcmc.langevin.private; None: none)


#: the share models of :func:`_own_share`, one per (model, S), while the model lives: the
#: clients an actor hosts share one model object, hence one share model, hence (with the fits'
#: static flat model) one traced fit for all of them
_SHARE_MODELS: "weakref.WeakKeyDictionary[Model, Dict[int, Model]]" = weakref.WeakKeyDictionary()


def _share_model(model: Model, num_clients: int) -> Model:
    """``model`` with 1/S of its log prior (the same object for the same model and S)."""
    shares = _SHARE_MODELS.setdefault(model, {})
    if num_clients not in shares:
        prior = model.log_prior
        shares[num_clients] = Model(log_prior=lambda params: prior(params) / num_clients,
                                    log_likelihood=model.log_likelihood)
    return shares[num_clients]


@functools.partial(jax.jit, static_argnums=0)
def _full_gradient(flat_model, theta, rows):
    """grad log p(rows | theta), compiled once per model and shapes."""
    return flat_model.grad_log_likelihood_sum(theta, rows)


def _own_share(context: ClientContext):
    """The client's Laplace objective's model (its log likelihood plus 1/S of the log prior,
    S the number of clients, as ``surrogates.fit_laplace`` of the whole federation) and a
    federation of its own rows only."""
    share = _share_model(context.model, context.num_clients)
    # flattened at the run's initial pytree: a FlatModel depends on the parameter structure
    # only, and unravelling a flat position eagerly would compile small slicing programs
    flat_share = share.flatten(context.init)
    return flat_share, Federation([context.raw_data])


@functools.partial(jax.jit, static_argnums=1)
def _client_fit_key(root, num_clients: int, index):
    """``split(root, S)[index]`` as a batch of one key: the key the in-process fit gives
    client ``index`` (one compiled call instead of eager split and indexing)."""
    return jax.random.split(root, num_clients)[index][None]


def _own_layout(rows, size: int) -> ConcatenatedData:
    """A client's ``size`` rows in the kernels' one-client layout, inside a trace: offsets and
    sizes are NumPy constants, so the minibatch rule reads the size concretely (and the
    client is the Python int 0, indexing them)."""
    return ConcatenatedData(data=rows, offsets=np.zeros((1,), np.int32),
                            sizes=np.full((1,), size, np.int32))


# The client-side set-up programs below are module-level, with the model, the settings and the
# client's size static: traced once per model, settings and shapes, so the clients of one
# process (an actor hosting several, the in-process transport) share the trace, and those of
# one node the compiled program.


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _client_moments(flat_model, batch_size: int, alpha: float, probes: int, size: int, weight,
                    own, product, center, key, rows):
    """``estimators.estimator_moments`` of a client's ``size`` rows."""
    return estimator_moments(flat_model, _own_layout(rows, size), 0, weight, batch_size, alpha,
                             own, product, center, key, probes)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _client_noise_statistics(flat_model, batch_size: int, full: bool, size: int, center, points,
                             key, variates, conducive, rows):
    """``estimators.unscaled_noise`` of a client's ``size`` rows."""
    return unscaled_noise(flat_model, _own_layout(rows, size), 0, batch_size, center, points,
                          key, step_size_module.NOISE_PROBES_PER_CLIENT, full, variates,
                          conducive)


class DSGLDProtocol(HandoffProtocol):
    """DSGLD (FSGLD equations (3)-(4)): the position travels; a client's update uses the
    estimator (4) with its own minibatches and its f_s. With a ``preconditioner`` (pSGLD,
    ``preconditioning.py``) the carry is (theta, V): the running average travels with the
    chain, and the server sends every client N (``total_rows``), the scale of V."""

    name = "DSGLD"
    update_reads_only_rows = True  # _kernel reads the context's flat_model and data only

    def __init__(self, step_size, batch_size: int, local_steps: int, noise: bool = True,
                 divergence_threshold: float = 1e10, anchor=None, client_weights=None,
                 setup: Optional[ClientSetup] = None,
                 run_request: Optional[run_length.RunRequest] = None, preconditioner=None,
                 private: Optional[PrivateNoise] = None):
        self.setup = setup
        self.preconditioner = preconditioner
        # a private run (fedmcmc.langevin.private): C and every client's noise factor a_s,
        # chosen by the driver's accountant; each client gets its own a_s
        self.private = private
        # the run's length as asked ("auto" thin / burn_in resolved by prepare), or None
        self.run_request = run_request
        # anchor: (d,) shared by every client, or (S, d): each client's own
        self.anchor = None if anchor is None else np.asarray(anchor)
        # the scheduler's f_s when the set-up chose them (client_selection="variance")
        self.client_weights = None if client_weights is None else np.asarray(
            client_weights, np.float64)
        self.step_size = step_size
        # outside the compiled visit: it checks h ("auto": chosen by the set-up and sent to
        # the clients with their parameters)
        self.schedule = None if isinstance(step_size, str) else as_schedule(step_size)
        self.batch_size = int(batch_size)
        self.local_steps = int(local_steps)
        self.noise = bool(noise)
        self.divergence_threshold = float(divergence_threshold)

    def init_carry(self, position):
        """(theta,), or (theta, V) with a preconditioner (V zeros until the first update)."""
        if self.preconditioner is None:
            return (position,)
        return (position, np.zeros_like(position))

    def scheduler_weights(self, prepared: HandoffSetup, federation_weights):
        """The f_s the set-up chose (``client_selection``), else the federation's."""
        if prepared.client_weights is None:
            return federation_weights
        return prepared.client_weights

    # ------------------------------------------------------------------ control variates
    # With an ``anchor`` theta* (the global Laplace mode the driver's "auto" set-up chose, or
    # each client's own mode), each client computes its full-data gradient there once and
    # keeps it: the estimator of ``estimators.dsgld_gradient_with_control_variates`` then
    # runs on the client, and only theta* (d floats) travels.
    @staticmethod
    def _anchor_for(anchor, client: int):
        return anchor if anchor.ndim == 1 else anchor[client]

    @staticmethod
    def _anchor_gradient(context: ClientContext, anchor) -> np.ndarray:
        return np.asarray(_full_gradient(context.flat_model, np.asarray(anchor),
                                         context.data.data))

    def client_anchor_gradient(self, context: ClientContext, anchor) -> int:
        """grad log p(x_s | theta*) on this client's rows, kept here; replies the index."""
        context.store["anchor_gradient"] = self._anchor_gradient(context, anchor)
        return context.index

    # ------------------------------------------------------------------ set-up on the clients
    def client_laplace(self, context: ClientContext, theta0, diagonal):
        """This client's Laplace fit (``surrogates.fit_laplace`` on its own rows, with 1/S of
        the prior): replies ``(P_s, b_s, mode)``, d^2 + 2d floats (2d + d diagonal)."""
        flat_share, own = _own_share(context)
        fitted, modes = surrogate_module.fit_laplace(flat_share, own, device_array(theta0),
                                                     diagonal, with_modes=True)
        return (np.asarray(fitted.precision)[0], np.asarray(fitted.shift)[0],
                np.asarray(modes)[0])

    def client_noise(self, context: ClientContext, anchor, center, points, conducive):
        """This client's noise statistics of the unscaled part of its estimator
        (``estimators.unscaled_noise``) with control variates at ``anchor`` (``None``: none),
        FSGLD's ``conducive = (alpha, P_s, b_s)``: its within-client covariance averaged over
        ``points`` ((d, d), or its trace above ``step_size.FULL_MOMENTS_MAX_DIM``) and its
        mean at ``center`` (d), with ``conducive`` also its surrogate's prediction statistics
        (four scalars, ``step_size.client_noise``), with the key the in-process set-up gives
        this client."""
        variates = None
        if anchor is not None:
            variates = ControlVariates(
                anchor=device_array(anchor),
                anchor_gradients=device_array(self._anchor_gradient(context, anchor)[None]))
        if conducive is not None:
            conducive = tuple(device_array(value) for value in conducive)
        key = rng.fold_in_compiled(rng.fold_in_compiled(setup_key(context.seed),
                                                        step_size_module.NOISE_STREAM),
                                   context.index)
        full = context.flat_model.dim <= step_size_module.FULL_MOMENTS_MAX_DIM
        statistics = _client_noise_statistics(
            context.flat_model, self.batch_size, full, context.size, device_array(center),
            device_array(points), key, variates, conducive, context.data.data)
        within, mean = np.asarray(statistics[0]), np.asarray(statistics[1])
        if conducive is None:
            return within, mean
        # the surrogate's four prediction statistics as four scalars
        return (within, mean) + tuple(np.asarray(value) for value in np.asarray(statistics[2]))

    def _setup_options(self) -> setup_module.SetupOptions:
        """What the set-up (:mod:`fedmcmc.langevin.setup`) reads of this protocol; ``choice``:
        ``setup`` (``None``: the h, anchor and f_s given to the constructor)."""
        return setup_module.SetupOptions(name=self.name, step_size=self.step_size,
                                         local_steps=self.local_steps, choice=self.setup)

    def _chosen(self, resolved: setup_module.Resolved) -> HandoffSetup:
        """What :meth:`prepare` returns of the set-up's choices: the anchor and f_s it chose,
        or those given to the constructor when it chose nothing."""
        if self.setup is None:
            anchor, client_weights = self.anchor, self.client_weights
        else:
            anchor = None if resolved.anchor is None else np.asarray(resolved.anchor)
            client_weights = resolved.client_weights
        return HandoffSetup(step_size=resolved.step_size, anchor=anchor,
                            client_weights=client_weights, run_length=resolved.run_length)

    def _prepare_variates(self, server: ServerSide, anchor) -> None:
        if anchor is not None:
            server.ask("anchor_gradient", lambda s: (self._anchor_for(anchor, s),), None)
            server.info["control_variates"] = "global" if anchor.ndim == 1 else "client"

    @staticmethod
    def _variates(parameters):
        if parameters.anchor is None:
            return None
        return ControlVariates(anchor=parameters.anchor,
                               anchor_gradients=parameters.anchor_gradient[None])

    def _schedule(self, parameters):
        """The visit's h_t: the protocol's own, or the constant h the server's set-up chose
        (sent with the parameters, a traced float32 like the constant schedule's)."""
        if parameters.step_size is None:
            return self.schedule
        step_size = parameters.step_size
        return lambda t: jnp.full(jnp.shape(t), step_size, dtype=jnp.float32)

    def run_length(self, server: ServerSide, prepared: HandoffSetup, thin, burn_in) -> tuple:
        """The run's thin and burn_in: those :meth:`prepare` resolved, else as given."""
        if prepared.run_length is not None:
            return prepared.run_length
        return thin, burn_in

    def prepare(self, server: ServerSide) -> HandoffSetup:
        """The set-up of :func:`fedmcmc.langevin.setup.resolve_dsgld` on the clients' replies
        (:class:`~fedmcmc.langevin.setup.MessagePassingClients`): their Laplace fits when
        ``"auto"`` settings or run lengths need the posterior's curvature, the settings chosen
        from their noise statistics (``setup``), the run lengths; then the anchor gradients the
        clients keep. Returned as a :class:`HandoffSetup`."""
        resolved = setup_module.resolve_dsgld(setup_module.MessagePassingClients(server),
                                              self._setup_options(), self.run_request)
        chosen = self._chosen(resolved)
        self._prepare_variates(server, chosen.anchor)
        return chosen

    def _shared_entries(self, prepared: HandoffSetup, client: int,
                        server: Optional[ServerSide] = None) -> Dict[str, Any]:
        """Client ``client``'s anchor, the h the set-up chose (the clients' copy of the
        protocol says ``"auto"``, or the h it checked), and with a preconditioner N, the
        federation's rows (``server.sizes``)."""
        entries: Dict[str, Any] = {}
        if self.preconditioner is not None:
            entries["total_rows"] = np.float32(np.sum(server.sizes))
        if prepared.anchor is not None:
            entries["anchor"] = self._anchor_for(prepared.anchor, client)
        if self.setup is not None:
            entries["step_size"] = np.float32(prepared.step_size)
        if self.private is not None:
            entries["noise_inflation"] = np.float32(self.private.noise_inflation[client])
        return entries

    def _private_steps(self, parameters) -> Optional[PrivateSteps]:
        """The kernel's :class:`~fedmcmc.clipping.PrivateSteps` of this client (its a_s as
        the one entry of the one-client layout), or ``None``."""
        if self.private is None:
            return None
        return PrivateSteps(clip_norm=self.private.clip_norm,
                            noise_inflation=jnp.reshape(parameters.noise_inflation, (1,)))

    def client_parameters(self, server, prepared: HandoffSetup, weights, clients):
        return [DSGLDParameters(weight=np.float32(weights[s]),
                                **self._shared_entries(prepared, s, server))
                for s in clients]

    def complete_parameters(self, context, parameters):
        if parameters.anchor is not None:  # the client's own gradient at its anchor
            parameters = parameters._replace(anchor_gradient=context.store["anchor_gradient"])
        return parameters

    def _kernel(self, context: ClientContext, parameters: DSGLDParameters):
        return dsgld.build_kernel(
            context.flat_model, context.data, parameters.weight[None], self.batch_size,
            self.local_steps, self._schedule(parameters), self.noise,
            control_variates=self._variates(parameters), preconditioner=self.preconditioner,
            total_rows=parameters.total_rows, private=self._private_steps(parameters))

    def build_update(self, context, parameters):
        step = self._kernel(context, parameters)
        flat_model = context.flat_model

        def update(update_step: UpdateStep, carry):
            # the in-process kernel's random numbers, from the keys it splits off the
            # iteration's key (protocols.update_step); the scheduler's uniform is not needed:
            # the one client of this layout is client 0 whatever it is
            noises = noise_from_keys(np.float32(0.0), update_step.minibatch_key,
                                     update_step.noise_key, self.batch_size, flat_model.dim,
                                     flat_model.dtype)
            block = jax.tree_util.tree_map(lambda leaf: leaf[None], noises)
            state = dsgld.init(carry[0], 1)._replace(iteration=update_step.iteration)
            if self.preconditioner is None:
                return (run_updates(step, block, state).position,)
            state = run_updates(step, block, state._replace(square_average=carry[1]))
            return (state.position, state.square_average)

        return update


class FSGLDProtocol(DSGLDProtocol):
    """FSGLD (equations (5)-(7)): DSGLD plus the conducive gradient, from surrogates each
    client fits on its own data (or given ones), and the trust region around the mode of
    prior x q."""

    name = "FSGLD"

    def __init__(self, step_size, batch_size: int, local_steps: int, *, surrogate, alpha: float,
                 alpha_warmup: int, diagonal: Optional[bool], surrogate_draws: int,
                 surrogate_burn_in: int, surrogate_step_size: Optional[float], trust_radius,
                 radius_probes_per_client: int, noise: bool = True,
                 divergence_threshold: float = 1e10, anchor=None, client_weights=None,
                 setup: Optional[ClientSetup] = None,
                 run_request: Optional[run_length.RunRequest] = None, preconditioner=None,
                 private: Optional[PrivateNoise] = None):
        super().__init__(step_size, batch_size, local_steps, noise, divergence_threshold, anchor,
                         client_weights, setup, run_request, preconditioner, private)
        self.surrogate = surrogate
        self.alpha = float(alpha)
        self.alpha_warmup = int(alpha_warmup)
        self.diagonal = diagonal
        self.surrogate_draws = int(surrogate_draws)
        self.surrogate_burn_in = int(surrogate_burn_in)
        self.surrogate_step_size = surrogate_step_size
        self.trust_radius = trust_radius
        self.radius_probes_per_client = int(radius_probes_per_client)

    @staticmethod
    def _first_step_size(step_size) -> float:
        return float(step_size(0)) if callable(step_size) else float(step_size)

    # ------------------------------------------------------------------ client side
    def client_fit_surrogate(self, context: ClientContext, theta0):
        """Fit q_s on this client's data only and keep it; reply its natural parameters
        (P_s, b_s). The key is the one the in-process fit gives this client."""
        flat_share, own = _own_share(context)
        num_clients = context.num_clients
        options: Dict[str, Any] = {"diagonal": self.diagonal}
        if self.surrogate == "sgld":
            step = self.surrogate_step_size
            options.update(step_size=self._first_step_size(self.step_size) if step is None
                           else step,
                           batch_size=self.batch_size, draws=self.surrogate_draws,
                           burn_in=self.surrogate_burn_in)
        key = _client_fit_key(setup_key(context.seed), num_clients, np.int32(context.index))
        fitted = surrogate_module.fit_surrogates(
            self.surrogate, flat_share, own, device_array(theta0), key, **options)
        own = (np.asarray(fitted.precision)[0], np.asarray(fitted.shift)[0])
        context.store["surrogate"] = own
        return own

    def client_estimator_moments(self, context: ClientContext, weight: float, global_surrogate,
                                 center, own=None):
        """The d + 1 moments of this client's FSGLD estimator at ``center`` over
        ``radius_probes_per_client`` of its own minibatches (``estimators.estimator_moments``),
        with the key the in-process engine uses for this client. ``own``: its surrogate
        ``(P_s, b_s)`` when the user gave the surrogates (the server sends them: the client has
        none before it is configured), else the one it fitted."""
        precision, shift = context.store["surrogate"] if own is None else own
        key = rng.fold_in_compiled(rng.fold_in_compiled(setup_key(context.seed),
                                                        setup_module.TRUST_STREAM),
                                   context.index)
        # NumPy arguments: no eager program for a conversion or a new axis
        mean, second = _client_moments(
            context.flat_model, self.batch_size, self.alpha, self.radius_probes_per_client,
            context.size, np.float32(weight),
            surrogate_module.GaussianSurrogates(np.asarray(precision)[None],
                                                np.asarray(shift)[None]),
            surrogate_module.ProductSurrogate(np.asarray(global_surrogate[0]),
                                              np.asarray(global_surrogate[1])),
            np.asarray(center), key, context.data.data)
        return np.asarray(mean), float(second)

    def client_taylor(self, context: ClientContext, center, diagonal):
        """One Newton round of ``surrogates.expand_at_global_mode``: this client's expansion
        of its log likelihood at ``center`` (``surrogates.taylor_surrogates`` on its own rows),
        kept as its surrogate and replied, ``(P_s, b_s)``."""
        expanded = surrogate_module.taylor_surrogates(
            context.flat_model, Federation([context.raw_data]), device_array(center),
            bool(diagonal))
        own = (np.asarray(expanded.precision)[0], np.asarray(expanded.shift)[0])
        context.store["surrogate"] = own
        return own

    def _setup_options(self) -> setup_module.SetupOptions:
        return super()._setup_options()._replace(
            alpha=self.alpha, alpha_warmup=self.alpha_warmup, surrogate=self.surrogate,
            diagonal=self.diagonal)

    def complete_parameters(self, context, parameters):
        parameters = super().complete_parameters(context, parameters)
        if parameters.precision is not None:  # given surrogates: the server sends each its own
            context.store["surrogate"] = (parameters.precision, parameters.shift)
        elif "surrogate" in context.store:
            precision, shift = context.store["surrogate"]
            parameters = parameters._replace(precision=precision, shift=shift)
        else:
            raise ValueError("FSGLD client configured before its surrogate is known")
        return parameters

    # ------------------------------------------------------------------ server side
    def prepare(self, server: ServerSide):
        """The set-up of :func:`fedmcmc.langevin.setup.resolve_fsgld` on the clients' replies:
        the clients' surrogates (each fits its own, a reply of d + d^2 or 2d floats, or given
        by the user), and with ``setup`` (under ``"auto"`` re-expanded at the global mode)
        ``"auto"`` and the variance reduction chosen from the clients' noise statistics; the
        run lengths; then the anchor gradients the clients keep."""
        given = None
        if not isinstance(self.surrogate, str):
            given = surrogate_module.as_surrogates(self.surrogate, server.flat_model.dim,
                                                   server.num_clients)
        resolved = setup_module.resolve_fsgld(
            setup_module.MessagePassingClients(server), self._setup_options(),
            self.run_request, measure_noise=self.setup is not None, surrogates=given)
        # surrogates the set-up weighted (conducive_weights) are sent as given ones are
        chosen = self._chosen(resolved)._replace(
            surrogates=resolved.surrogates,
            surrogates_given=given is not None or resolved.surrogates_weighted)
        self._prepare_variates(server, chosen.anchor)
        return chosen

    def client_parameters(self, server, prepared: HandoffSetup, weights, clients):
        """f_s, q over ``clients`` and the trust region (``trust_radius="auto"``: from the
        clients' estimator moments, ``fsgld.auto_trust_radius``)."""
        surrogates, given = prepared.surrogates, prepared.surrogates_given
        kept = np.asarray(list(clients))
        # indexed on the host: a device array indexed by a NumPy array runs four eager
        # programs (index normalisation, gather), each compiled or loaded by the driver
        precisions, shifts = np.asarray(surrogates.precision), np.asarray(surrogates.shift)
        subset = surrogate_module.GaussianSurrogates(precision=device_array(precisions[kept]),
                                                     shift=device_array(shifts[kept]))
        product = surrogate_module.product(subset)
        global_surrogate = (np.asarray(product.precision), np.asarray(product.shift))
        center = metric = None
        if self.trust_radius is not None:  # the region's centre and metric: prior x q
            center, metric = surrogate_module.laplace_of_product(
                server.flat_model, subset, device_array(server.theta0))
        # "auto": the moments of the remaining clients (given surrogates sent with the request)
        radius = setup_module.trust_radius(
            setup_module.MessagePassingClients(server), self.trust_radius, weights, self.alpha,
            surrogates if given else None, global_surrogate, center,
            self._first_step_size(prepared.step_size), kept.tolist(),
            None if self.preconditioner is None else int(np.sum(server.sizes)))
        trust = None if radius is None else (np.asarray(center), np.asarray(metric),
                                             np.float32(radius))
        parameters: List[FSGLDParameters] = []
        for s in kept.tolist():
            entry: Dict[str, Any] = self._shared_entries(prepared, s, server)
            if given:
                entry.update(precision=precisions[s], shift=shifts[s])
            if trust is not None:
                entry.update(trust_center=trust[0], trust_precision=trust[1],
                             trust_radius=trust[2])
            parameters.append(FSGLDParameters(
                weight=np.float32(weights[s]), global_precision=global_surrogate[0],
                global_shift=global_surrogate[1], **entry))
        return parameters

    def run_length(self, server: ServerSide, prepared: HandoffSetup, thin, burn_in) -> tuple:
        thin, burn_in = super().run_length(server, prepared, thin, burn_in)
        if not (run_length.is_auto(thin) or run_length.is_auto(burn_in)):
            fsgld.check_alpha_warmup(self.alpha_warmup, burn_in, thin)
        return thin, burn_in

    def _kernel(self, context, parameters):
        trust = None
        if parameters.trust_center is not None:
            trust = fsgld.TrustRegion(center=parameters.trust_center,
                                      precision=parameters.trust_precision,
                                      radius=parameters.trust_radius)
        return fsgld.build_kernel(
            context.flat_model, context.data, parameters.weight[None], self.batch_size,
            self.local_steps, self._schedule(parameters),
            surrogate_module.GaussianSurrogates(parameters.precision[None],
                                                parameters.shift[None]),
            surrogate_module.ProductSurrogate(parameters.global_precision,
                                              parameters.global_shift),
            fsgld.alpha_schedule(self.alpha, self.alpha_warmup), self.noise, trust,
            control_variates=self._variates(parameters), preconditioner=self.preconditioner,
            total_rows=parameters.total_rows, private=self._private_steps(parameters))

