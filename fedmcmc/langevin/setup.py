"""The set-up of SGLD, DSGLD and FSGLD before sampling, written once for every engine.

``step_size="auto"`` (or the check of a given h), the control variates, the client selection
(``step_size.choose_settings``), FSGLD's surrogates (re-expanded at the global mode under
``"auto"``, ``surrogates.expand_at_global_mode``) and trust radius (``fsgld.auto_trust_radius``)
and ``thin`` / ``burn_in="auto"`` (``fedmcmc.run_length.resolve``) are chosen here from
statistics every client computes on its own rows, a few floats each (``step_size.py``'s module
docstring). The set-up asks for them through one small interface, :class:`ClientStatistics`
("ask every client for its statistic X"), with two implementations:

* :class:`InProcessClients`: the federation's rows are in this process (``engine="local"``, or
  the driver of a message-passing run that holds them): each statistic is mapped over the
  clients of the whole federation's layout;
* :class:`MessagePassingClients`: the rows stay on the clients (``Federation.from_loaders`` on
  Ray): each statistic is a message to every client (:class:`~fedmcmc.protocols.ServerSide`'s
  ``ask``), answered by the client-side methods of ``fedmcmc.langevin.handoff``.

Both compute a client's statistic with the same function on the same keys (the in-process
one on the federation's layout, a client on its one-client layout), so the choices and the
draws are the same on every engine; :func:`resolve_dsgld`, :func:`resolve_fsgld`,
:func:`auto_trust_radius` and :func:`resolve_run_length` are what both paths call.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .. import messages as message_counts
from .. import rng
from .. import run_length
from .. import surrogates as surrogate_module
from ..arrays import device_array
from ..cache import jit_with_constants_as_arguments
from ..protocols import ServerSide
from . import fsgld
from . import step_size as step_size_module
from .estimators import ControlVariates, estimator_moments, unscaled_noise

__all__ = ["setup_key", "ClientSetup", "SurrogateFit", "SetupOptions", "Resolved", "Settings",
           "ClientStatistics", "InProcessClients", "MessagePassingClients", "resolve_sgld",
           "resolve_dsgld", "resolve_fsgld", "choose_noise_settings", "NoiseSettings",
           "weigh_conducive_gradients", "trust_radius",
           "auto_trust_radius",
           "resolve_run_length", "weights_of"]

#: minibatch draws per client for the automatic trust radius
RADIUS_PROBES_PER_CLIENT = 64
#: the stream of the trust radius' estimator moments: ``fold_in(set-up key, TRUST_STREAM)``
#: (client s: ``fold_in`` of it by s)
TRUST_STREAM = 7


def setup_key(seed: int):
    """The root of every set-up stream of a run (surrogate fits, noise statistics, trust
    radius moments): ``fold_in(key(seed), 2**20)``, the same on every engine."""
    return rng.fold_in_compiled(rng.seed_key(seed), 2**20)


class ClientSetup(NamedTuple):
    """What the set-up chooses from the clients' noise statistics (``step_size="auto"``,
    ``control_variates``, ``client_selection``); the algorithm's ``step_size`` is ``"auto"`` or
    the h to check."""

    tolerance: float
    control_variates: Optional[str]  # "global", "client", "none", or None (automatic)
    client_selection: Optional[str]  # "proportional", "variance", or None (automatic)


class SurrogateFit(NamedTuple):
    """How FSGLD's clients fit their surrogates (``surrogates.fit_surrogates``): ``kind``
    (``"exact"``, ``"laplace"``, ``"sgld"``), the diagonal switch and the ``"sgld"`` fit's h,
    minibatch, draws and burn-in."""

    kind: str
    diagonal: Optional[bool]
    step_size: Any = None
    batch_size: Optional[int] = None
    draws: int = 3000
    burn_in: int = 1000


class SetupOptions(NamedTuple):
    """What the set-up reads of a DSGLD / FSGLD configuration. ``choice``: what to choose
    from the clients' noise statistics (``None``: nothing, the given h, anchor and f_s);
    FSGLD's ``alpha``, ``surrogate`` (its name, or given ``(precision, shift)``) and ``fit``."""

    name: str
    step_size: Any
    local_steps: int
    choice: Optional[ClientSetup]
    alpha: Optional[float] = None
    alpha_warmup: int = 0
    surrogate: Any = None
    fit: Optional[SurrogateFit] = None
    diagonal: Optional[bool] = None  # FSGLD: of the Laplace fits that find the clients' modes


class Resolved(NamedTuple):
    """What the set-up chose: the step size the kernel runs, the control variates' anchor
    ((d,) shared, (S, d) per client, ``None``: none; as the clients' statistics returned it),
    the scheduler's f_s when it chose them, the Laplace fit of the posterior it built (centre
    and precision: the run lengths' curvature; ``None``: none made), the run's (thin,
    burn_in) when ``"auto"`` was resolved (else ``None``), and FSGLD's surrogates (with the
    per-client conducive weights of :func:`weigh_conducive_gradients` applied, which
    ``surrogates_weighted`` says: the clients then need the server's copy)."""

    step_size: Any
    anchor: Any = None
    client_weights: Optional[np.ndarray] = None
    center: Any = None
    precision: Any = None
    run_length: Optional[tuple] = None
    surrogates: Any = None
    surrogates_weighted: bool = False  # FSGLD: the set-up weighted some conducive gradient


class Settings(NamedTuple):
    """A Langevin run's resolved settings (``"auto"``, control variates, FSGLD's surrogates
    and trust region), what the in-process kernel and the Ray protocol are both built from."""

    step_size: Any
    variates: Any = None  # estimators.ControlVariates or None
    surrogates: Any = None  # FSGLD: surrogates.GaussianSurrogates
    global_surrogate: Any = None  # FSGLD: surrogates.ProductSurrogate
    trust_region: Any = None  # FSGLD: fsgld.TrustRegion or None
    client_weights: Any = None  # the scheduler's f_s when the set-up chose them, else None
    center: Any = None  # the Laplace fit of the posterior the set-up built (its centre and
    precision: Any = None  # precision: the relaxation time of thin/burn_in="auto"), or None
    run_length: Optional[tuple] = None  # (thin, burn_in) the set-up resolved, or None


def weights_of(settings: Settings, federation_weights):
    """The f_s a kernel runs with: the set-up's choice, else the federation's."""
    if settings.client_weights is None:
        return federation_weights
    return jnp.asarray(settings.client_weights, dtype=jnp.float32)


# ----------------------------------------------------------------------------- the interface
class ClientStatistics:
    """Ask every client for a statistic of its own rows (the set-up's one interface).

    Attributes: ``flat_model``, ``theta0`` (the chains' flat start, a device array),
    ``num_clients``, ``weights`` (the federation's f_s as the clients scale their estimators,
    float32), ``weights_given`` (whether the user gave them), ``info`` (the run's
    ``Result.info``) and ``setup_by`` (what ``info["setup_by"]`` records when the statistics
    chose the settings, or ``None``).
    """

    flat_model: Any
    theta0: Any
    num_clients: int
    weights: Any
    weights_given: bool
    info: Dict[str, Any]
    setup_by: Optional[str] = None

    def laplace_fits(self, diagonal: Optional[bool]) -> tuple:
        """Every client's Laplace fit (``surrogates.fit_laplace``: its log likelihood and 1/S
        of the prior) and mode: ``(GaussianSurrogates, modes (S, d))``."""
        raise NotImplementedError

    def fit_surrogates(self, fit: SurrogateFit) -> tuple:
        """FSGLD's surrogates, each fitted by its client: ``(GaussianSurrogates, modes)``,
        ``modes`` the clients' Laplace modes when the fit found them, else ``None``."""
        raise NotImplementedError

    def record_surrogates(self, surrogates, seconds: float) -> None:
        """Record in ``info`` the set-up messages of the surrogates, the same on every engine
        (each client sends (P_s, b_s) once, the server sends q back: part of
        ``info["messages"]``, :mod:`fedmcmc.messages`), and where no session times the set-up
        (in-process), its time. ``seconds``: the time it took."""
        num_clients = self.num_clients
        self.info.update(
            surrogate_messages=message_counts.setup(num_clients, 1),
            surrogate_floats=2 * num_clients * surrogates.floats_per_client)

    def taylor(self, center, diagonal: bool):
        """Every client's second-order expansion of its log likelihood at ``center`` (one
        Newton round of ``surrogates.expand_at_global_mode``), as ``GaussianSurrogates``."""
        raise NotImplementedError

    def noise(self, anchor, center, precision, surrogates=None, alpha=None):
        """Every client's noise statistics of the unscaled part of its estimator
        (``estimators.unscaled_noise`` at the points ``step_size.noise_points`` of the Laplace
        fit ``(center, precision)``), with control variates at ``anchor`` (``None``: none) and
        FSGLD's ``-alpha grad log q_s`` when ``surrogates`` are given: a
        ``step_size.ClientNoise``."""
        raise NotImplementedError

    def estimator_moments(self, weights, alpha, surrogates, global_surrogate, center,
                          clients: Sequence[int]) -> tuple:
        """The d + 1 moments of the FSGLD estimator of every client of ``clients`` at
        ``center`` (``estimators.estimator_moments``) with f_s ``weights``, the clients'
        surrogates ``surrogates`` (``None``: each client's own fit, where the client keeps it)
        and their product ``global_surrogate``: ``(means (S, d), second (S,))``."""
        raise NotImplementedError


class InProcessClients(ClientStatistics):
    """The statistics of clients whose rows are in this process: each mapped over the clients
    of the federation's layout (``data``, the padded rows for the gradients), with the keys a
    client computes on its own (``key``: the set-up key; ``noise_key``: the noise
    statistics')."""

    def __init__(self, flat_model, federation, data, theta0, key, batch_size: int, info,
                 weights=None, noise_key=None, num_clients: Optional[int] = None,
                 radius_probes: int = RADIUS_PROBES_PER_CLIENT):
        self.flat_model = flat_model
        self.federation = federation
        self.data = data
        self.theta0 = theta0
        self.key = key
        self.batch_size = int(batch_size)
        self.radius_probes = int(radius_probes)
        self.info = info
        self.num_clients = federation.num_clients if num_clients is None else num_clients
        self.weights = weights
        self.weights_given = bool(federation.weights_given)
        self.noise_key = noise_key  # None: fold_in(key, NOISE_STREAM), made when first used
        # the control variates of every anchor measured (by identity): the kernel runs the
        # chosen one's, not a second computation of it
        self._variates: Dict[int, tuple] = {}

    def laplace_fits(self, diagonal):
        return surrogate_module.fit_laplace(self.flat_model, self.federation, self.theta0,
                                            diagonal, with_modes=True)

    def fit_surrogates(self, fit: SurrogateFit):
        if fit.kind == "laplace":
            return surrogate_module.fit_laplace(self.flat_model, self.federation, self.theta0,
                                                fit.diagonal, with_modes=True)
        return surrogate_module.fit_surrogates(
            fit.kind, self.flat_model, self.federation, self.theta0, self.key,
            diagonal=fit.diagonal, step_size=fit.step_size, batch_size=fit.batch_size,
            draws=fit.draws, burn_in=fit.burn_in), None

    def record_surrogates(self, surrogates, seconds):
        super().record_surrogates(surrogates, seconds)
        self.info["surrogate_fit_time"] = seconds

    def taylor(self, center, diagonal):
        return surrogate_module.taylor_surrogates(self.flat_model, self.federation, center,
                                                  diagonal)

    def control_variates(self, anchor) -> Optional[ControlVariates]:
        """The control variates at ``anchor`` (each client's full-data gradient there)."""
        if anchor is None:
            return None
        if id(anchor) not in self._variates:
            anchor_array = jnp.asarray(anchor)
            self._variates[id(anchor)] = (anchor, ControlVariates(
                anchor=anchor_array,
                anchor_gradients=_anchor_gradients(self.flat_model, self.federation,
                                                   anchor_array)))
        return self._variates[id(anchor)][1]

    def noise(self, anchor, center, precision, surrogates=None, alpha=None):
        conducive = None
        if surrogates is not None:  # FSGLD's part of r_s: -alpha grad log q_s
            def surrogate_part(client):
                return (alpha, surrogates.precision[client], surrogates.shift[client])

            conducive = surrogate_part
        if self.noise_key is None:
            self.noise_key = rng.fold_in_compiled(self.key, step_size_module.NOISE_STREAM)
        return _client_noise(self.flat_model, self.data, self.num_clients, self.batch_size,
                             center, precision, self.noise_key, self.control_variates(anchor),
                             conducive)

    def estimator_moments(self, weights, alpha, surrogates, global_surrogate, center, clients):
        flat_model, data, batch_size = self.flat_model, self.data, self.batch_size
        probes = self.radius_probes

        # the key is an argument, not a constant: another seed is the same program
        @jit_with_constants_as_arguments
        def every_client(clients, key):
            def moments(client):
                base = rng.fold_in(key, TRUST_STREAM)  # traced here: an eager fold_in compiles
                return estimator_moments(
                    flat_model, data, client, weights[client], batch_size, alpha,
                    surrogates, global_surrogate, center, rng.fold_in(base, client), probes)

            return jax.lax.map(moments, clients)

        return every_client(np.asarray(clients, dtype=np.int32), self.key)


class MessagePassingClients(ClientStatistics):
    """The statistics of clients that keep their rows: each a message to every client
    (``server.ask``), answered by the protocol's client-side methods (``client_laplace``,
    ``client_fit_surrogate``, ``client_taylor``, ``client_noise``,
    ``client_estimator_moments`` of ``fedmcmc.langevin.handoff``), each computed with the key
    the in-process set-up gives that client."""

    setup_by = "clients"

    def __init__(self, server: ServerSide):
        self.server = server
        self.flat_model = server.flat_model
        self.theta0 = device_array(server.theta0)
        self.num_clients = server.num_clients
        self.info = server.info
        # the federation's f_s as the in-process set-up has them (float32)
        self.weights = np.asarray(server.weights, np.float32)
        self.weights_given = bool(server.weights_given)

    @staticmethod
    def _stacked(replies):
        """The clients' ``(P_s, b_s, ...)`` replies as ``GaussianSurrogates``."""
        return surrogate_module.GaussianSurrogates(
            precision=device_array(np.stack([np.asarray(reply[0]) for reply in replies])),
            shift=device_array(np.stack([np.asarray(reply[1]) for reply in replies])))

    def laplace_fits(self, diagonal):
        theta0 = np.asarray(self.server.theta0)
        fits = self.server.ask("laplace", lambda s: (theta0, diagonal), None)
        return self._stacked(fits), np.stack([np.asarray(m) for _, _, m in fits])

    def fit_surrogates(self, fit: SurrogateFit):
        # each client fits as its copy of the protocol says (the same settings as ``fit``)
        theta0 = np.asarray(self.server.theta0)
        return self._stacked(self.server.ask("fit_surrogate", lambda s: (theta0,), None)), None

    def taylor(self, center, diagonal):
        center = np.asarray(center)
        return self._stacked(self.server.ask("taylor", lambda s: (center, diagonal), None))

    def noise(self, anchor, center, precision, surrogates=None, alpha=None):
        key = rng.fold_in_compiled(setup_key(self.server.seed), step_size_module.NOISE_STREAM)
        center_array = np.asarray(center)
        points = np.asarray(step_size_module.noise_points(center, precision, key))
        anchor = None if anchor is None else np.asarray(anchor)

        def arguments(client):
            own = None if anchor is None else (anchor if anchor.ndim == 1 else anchor[client])
            conducive = None if surrogates is None else (
                np.float32(alpha), np.asarray(surrogates.precision[client]),
                np.asarray(surrogates.shift[client]))
            return own, center_array, points, conducive

        replies = self.server.ask("noise", arguments, None)
        return step_size_module.ClientNoise(
            within=np.stack([reply[0] for reply in replies]),
            means=np.stack([reply[1] for reply in replies]),
            prediction=None if surrogates is None else np.array(
                [[float(value) for value in reply[2:6]] for reply in replies]))

    def estimator_moments(self, weights, alpha, surrogates, global_surrogate, center, clients):
        center_array = np.asarray(center)
        # a client uses the surrogate it fitted; given ones are sent (it has none yet)
        own = None if surrogates is None else (np.asarray(surrogates.precision),
                                               np.asarray(surrogates.shift))

        def arguments(client):
            shared = (float(weights[client]), global_surrogate, center_array)
            return shared if own is None else shared + ((own[0][client], own[1][client]),)

        replies = self.server.ask("estimator_moments", arguments, list(clients))
        return (np.stack([np.asarray(m) for m, _ in replies]),
                np.array([v for _, v in replies]))


# ----------------------------------------------------------------------------- in-process programs
def _client_noise(flat_model, data, num_clients: int, batch_size: int, center, precision, key,
                  variates=None, conducive=None):
    """Every client's noise statistics of the unscaled part of its own estimator
    (``estimators.unscaled_noise``, key ``fold_in(key, s)``, at the points
    ``step_size.noise_points``), mapped over the clients of ``data``: d + d^2 floats (or
    d + 1 above ``FULL_MOMENTS_MAX_DIM``) per client, what each client computes on Ray.
    ``conducive(client) -> (alpha, P_s, b_s)`` or ``None`` (with it, each surrogate's
    prediction statistics too). Returns ``step_size.ClientNoise``."""
    full = flat_model.dim <= step_size_module.FULL_MOMENTS_MAX_DIM
    points = step_size_module.noise_points(center, precision, key)

    # lax.map over the clients, as over the points and probes inside (step_size.client_noise);
    # the key and the points are arguments, not constants: another seed is the same program
    @jit_with_constants_as_arguments
    def every_client(clients, key, points):
        def one(client):
            return unscaled_noise(
                flat_model, data, client, batch_size, jnp.asarray(center), points,
                rng.fold_in(key, client), step_size_module.NOISE_PROBES_PER_CLIENT, full,
                variates, None if conducive is None else conducive(client))

        return jax.lax.map(one, clients)

    statistics = every_client(np.arange(num_clients, dtype=np.int32), key, points)
    return step_size_module.ClientNoise(
        within=np.asarray(statistics[0]), means=np.asarray(statistics[1]),
        prediction=None if conducive is None else np.asarray(statistics[2]))


def _anchor_gradients(flat_model, federation, anchor):
    """Each client's full-data log-likelihood gradient at ``anchor`` (the control variates'
    G_s; ``anchor`` (d,) shared or (S, d) each client's own), computed from its own rows
    (vmapped over the padded clients)."""
    padded = federation.padded()
    anchor = jnp.asarray(anchor)
    anchors = jnp.broadcast_to(anchor, (federation.num_clients, anchor.shape[-1]))

    # the rows are arguments of the compiled program, not constants of it (closed over, they
    # were embedded in its text and folded by XLA for seconds on large federations)
    @jax.jit
    def gradients(anchors, rows, mask):
        return jax.vmap(flat_model.grad_log_likelihood_sum)(anchors, rows, mask)

    return gradients(anchors, padded.data, padded.mask)


# ----------------------------------------------------------------------------- the set-up
def resolve_run_length(request: Optional[run_length.RunRequest], step_size, center, precision,
                       theta0, name: str, info: dict) -> Optional[tuple]:
    """``(thin, burn_in)`` of the run (``fedmcmc.run_length.resolve``) from the relaxation
    time of the step the kernel runs, ``2 / (h lambda_min(P))`` with P the Laplace precision
    the set-up built (``step_size.relaxation_time``), and the chains' initial offset from its
    centre (``step_size.initial_offset``); recorded in ``info``. ``None`` when there is nothing
    to resolve (no ``request``, or no Laplace fit: a given h and integer run lengths);
    ``"auto"`` without a fit or with a schedule is refused (``ValueError``)."""
    if request is None:
        return None
    if center is None or callable(step_size):
        if request.any_auto:
            argument = "thin" if request.auto_thin else "burn_in"
            why = ("a constant step size (a schedule's h changes during the run)"
                   if callable(step_size) else "the Laplace fit of the set-up")
            raise ValueError(f"{argument}='auto' needs {why}; give {argument} as an integer")
        return None
    length = run_length.resolve(
        request, step_size_module.relaxation_time(step_size, precision),
        step_size_module.initial_offset(theta0, center, precision), name=name, info=info)
    return (length.thin, length.burn_in)


def choose_noise_settings(clients: ClientStatistics, options: SetupOptions, center, precision,
                          modes: Callable[[], Any], surrogates=None,
                          request: Optional[run_length.RunRequest] = None) -> tuple:
    """``"auto"`` or the check of a given h (``step_size.py``), the control variates and the
    client selection, from the clients' noise statistics of their own estimator
    (``step_size.ClientNoise``: its unscaled part r_s, so any f_s can be evaluated), measured
    for every candidate anchor (``step_size.candidate_variates``) and chosen by
    ``step_size.choose_settings``.

    ``surrogates``: FSGLD's (its part of r_s is ``-alpha grad log q_s``), else ``None``.
    ``modes()``: the clients' Laplace modes (the anchors of ``control_variates="client"``).
    ``request``: the run's length as asked (the budget of an ``"auto"`` h). Under ``"auto"``
    FSGLD's conducive gradients are weighted per client first
    (:func:`weigh_conducive_gradients`). Returns :class:`NoiseSettings` (h, the chosen anchor
    or ``None``, f_s or ``None``, the surrogates the run uses)."""
    choice = options.choice
    kinds = step_size_module.candidate_variates(choice.control_variates,
                                                isinstance(options.step_size, str))
    anchors = {"none": None, "global": center,
               "client": modes() if "client" in kinds else None}
    noises = {kind: clients.noise(anchors[kind], center, precision, surrogates, options.alpha)
              for kind in kinds}
    if surrogates is not None and options.step_size == "auto" and options.alpha:
        surrogates, noises = weigh_conducive_gradients(surrogates, noises, center,
                                                       options.alpha, options.name,
                                                       clients.info)
    kind, client_weights, step_size = step_size_module.choose_settings(
        noises, np.asarray(precision), np.asarray(clients.weights, np.float64),
        step_size=options.step_size, tolerance=choice.tolerance,
        local_steps=options.local_steps, selection=choice.client_selection,
        weights_given=clients.weights_given, name=options.name, info=clients.info,
        request=request,
        offset=step_size_module.initial_offset(clients.theta0, center, precision))
    if clients.setup_by is not None:
        clients.info["setup_by"] = clients.setup_by
    if client_weights is not None:
        client_weights = np.asarray(client_weights, np.float64)
    return NoiseSettings(step_size, anchors[kind], client_weights, surrogates)


class NoiseSettings(NamedTuple):
    """What :func:`choose_noise_settings` chose: the h, the control variates' anchor (or
    ``None``), f_s (or ``None``) and FSGLD's surrogates with their conducive weights applied
    (``None`` for DSGLD)."""

    step_size: Any
    anchor: Any
    client_weights: Optional[np.ndarray]
    surrogates: Any = None


def weigh_conducive_gradients(surrogates, noises, center, alpha: float, name: str,
                              info: dict) -> tuple:
    """FSGLD's per-client conducive weights (``step_size.conducive_weights``: a surrogate that
    predicts its client's gradient at the Laplace draws worse than predicting nothing is
    damped to its least-squares weight, often 0), applied to the surrogates
    (``(w_s P_s, w_s b_s)``: the estimator's ``alpha (grad log q - grad log q_s / f_s)``
    with q_s's weight w_s, still unbiased) and to the noise statistics the clients measured at
    weight 1 (the within-client noise does not depend on a deterministic term; the means at
    the centre move by ``alpha (1 - w_s) grad log q_s(centre)``), without asking the clients
    again. The statistics of the first anchor measured decide. ``info`` records
    ``conducive_weights`` and ``surrogate_prediction_error`` (per client, the squared error of
    grad log q_s over that of predicting zero); a :class:`~fedmcmc.surrogates.
    SurrogatePredictionWarning` names the clients damped. Returns ``(surrogates, noises)``."""
    first = next(iter(noises.values()))
    weights, errors = step_size_module.conducive_weights(first.prediction)
    info.update(conducive_weights=weights.tolist(),
                surrogate_prediction_error=errors.tolist())
    if np.all(weights == 1.0):
        return surrogates, noises
    precision = np.asarray(surrogates.precision, np.float64)
    shift = np.asarray(surrogates.shift, np.float64)
    center = np.asarray(center, np.float64)
    at_center = shift - (precision * center if precision.ndim == 2
                         else np.einsum("sij,j->si", precision, center))
    moved = {kind: noise._replace(means=np.asarray(noise.means, np.float64) + alpha * (
        1.0 - weights)[:, None] * at_center) for kind, noise in noises.items()}
    scale = weights.reshape((-1,) + (1,) * (precision.ndim - 1))
    dtype = surrogates.shift.dtype
    weighted = surrogate_module.GaussianSurrogates(
        precision=device_array(precision * scale, dtype),
        shift=device_array(shift * weights[:, None], dtype))
    surrogate_module.warn_poor_prediction(name, weights, errors)
    return weighted, moved


def resolve_sgld(clients: InProcessClients, step_size, tolerance: float, name: str,
                 request: Optional[run_length.RunRequest]) -> Resolved:
    """SGLD's set-up on the pooled rows (``clients``: one client holding every row, its
    set-up key ``fold_in(key(seed), 2**20 + 1)``): the posterior's curvature from per-client
    Laplace fits (``laplace_fits``: the product of ``clients.federation``'s), ``"auto"`` from
    the pooled estimator's noise at their mode (the prior's gradient, common to all draws,
    does not change it) with the budget of ``request``, and the run lengths."""
    center = precision = None
    theta0 = clients.theta0
    if step_size == "auto" or request.any_auto:
        laplace = surrogate_module.fit_surrogates("laplace", clients.flat_model,
                                                  clients.federation, theta0, clients.key)
        center, precision = surrogate_module.laplace_of_product(clients.flat_model, laplace,
                                                                theta0)
    if step_size == "auto":
        noise = clients.noise(None, center, precision)
        covariance = step_size_module.noise_covariance([1.0], noise.within, noise.means)
        step_size = step_size_module.resolve_step_size(
            "auto", tolerance, np.asarray(precision), covariance, name, clients.info,
            request=request,
            offset=step_size_module.initial_offset(theta0, center, precision))
    return Resolved(step_size=step_size, center=center, precision=precision,
                    run_length=resolve_run_length(request, step_size, center, precision,
                                                  theta0, name, clients.info))


def resolve_dsgld(clients: ClientStatistics, options: SetupOptions,
                  request: Optional[run_length.RunRequest]) -> Resolved:
    """DSGLD's set-up: the product of the clients' Laplace fits when ``"auto"`` settings or
    run lengths need the posterior's curvature, the settings chosen from the clients' noise
    statistics (``options.choice``; :func:`choose_noise_settings`), and the run lengths."""
    choice = options.choice
    step_size_module.check_selection(None if choice is None else choice.client_selection,
                                     clients.weights_given)
    step_size, anchor, client_weights = options.step_size, None, None
    center = precision = None
    if choice is not None or (request is not None and request.any_auto):
        laplace, modes = clients.laplace_fits(None)
        center, precision = surrogate_module.laplace_of_product(clients.flat_model, laplace,
                                                                clients.theta0)
    if choice is not None:
        step_size, anchor, client_weights, _ = choose_noise_settings(
            clients, options, center, precision, lambda: modes, None, request)
    return Resolved(step_size=step_size, anchor=anchor, client_weights=client_weights,
                    center=center, precision=precision,
                    run_length=resolve_run_length(request, step_size, center, precision,
                                                  clients.theta0, options.name, clients.info))


def resolve_fsgld(clients: ClientStatistics, options: SetupOptions,
                  request: Optional[run_length.RunRequest], *, measure_noise: bool,
                  surrogates=None) -> Resolved:
    """FSGLD's set-up: the clients' surrogates (``surrogates`` when given, else each client
    fits its own), under ``"auto"`` with Laplace surrogates re-expanded at the global mode by
    Newton rounds of the clients' expansions; the Laplace fit of prior x q (when the noise or
    the run lengths need it); the settings chosen from the clients' noise statistics of the
    FSGLD estimator (``measure_noise``: also the check of a given h, where the statistics
    cost no message); the run lengths. The trust radius is :func:`auto_trust_radius`, asked
    with the f_s the run uses."""
    started = time.perf_counter()
    choice = options.choice
    step_size_module.check_selection(None if choice is None else choice.client_selection,
                                     clients.weights_given)
    modes = None
    weighted = False
    if surrogates is None:
        surrogates, modes = clients.fit_surrogates(options.fit)
    theta0 = clients.theta0
    if options.step_size == "auto" and options.surrogate == "laplace":
        # "auto" re-expands the clients' Laplace surrogates at the global mode (a few
        # Newton rounds, d + d^2 floats per client each): on small, heterogeneous clients
        # local-mode surrogates leave large client offsets, hence minibatch-like noise
        diagonal = surrogates.diagonal
        surrogates, _ = surrogate_module.expand_at_global_mode(
            clients.flat_model, None, surrogates, theta0,
            expand=lambda center: clients.taylor(center, diagonal))
        clients.info["surrogate_expanded_at_global_mode"] = True
    clients.info.update(
        surrogate=options.surrogate if isinstance(options.surrogate, str) else "given",
        surrogate_diagonal=surrogates.diagonal, alpha=options.alpha,
        alpha_warmup=options.alpha_warmup)
    clients.record_surrogates(surrogates, time.perf_counter() - started)
    step_size, anchor, client_weights = options.step_size, None, None
    center = precision = None
    if measure_noise or request is not None:
        center, precision = surrogate_module.laplace_of_product(clients.flat_model, surrogates,
                                                                theta0)
    if measure_noise:
        def client_modes():
            if modes is not None:
                return modes
            return clients.laplace_fits(options.diagonal)[1]

        chosen = choose_noise_settings(clients, options, center, precision, client_modes,
                                       surrogates, request)
        step_size, anchor, client_weights = chosen[:3]
        weighted = chosen.surrogates is not surrogates
        surrogates = chosen.surrogates
    return Resolved(step_size=step_size, anchor=anchor, client_weights=client_weights,
                    center=center, precision=precision, surrogates=surrogates,
                    surrogates_weighted=weighted,
                    run_length=resolve_run_length(request, step_size, center, precision,
                                                  theta0, options.name, clients.info))


def auto_trust_radius(clients: ClientStatistics, weights, alpha: float, surrogates,
                      global_surrogate, center, step_size,
                      kept: Optional[Sequence[int]] = None,
                      preconditioned_rows: Optional[int] = None) -> float:
    """``trust_radius="auto"`` (``fsgld.auto_trust_radius``): the chi-square quantile widened
    by the estimator's noise at the centre, tr C. Each client s of ``kept`` (default: all)
    computes the d + 1 moments of its own estimator (``estimators.estimator_moments``, key
    ``fold_in(fold_in(set-up key, 7), s)``) and tr C follows from them, with the f_s
    ``weights`` as the clients scaled their estimator (float32), renormalised over ``kept``
    after a drop. ``preconditioned_rows``: N of a pSGLD chain (its widening's upper bound,
    ``fsgld.auto_trust_radius``), ``None`` when not preconditioned."""
    if kept is None:
        kept = range(clients.num_clients)
    kept = np.asarray(list(kept))
    means, second = clients.estimator_moments(weights, alpha, surrogates, global_surrogate,
                                              center, kept.tolist())
    share = np.asarray(np.asarray(weights, np.float32), np.float64)[kept]
    if len(kept) < np.shape(weights)[0]:
        share = share / share.sum()
    trace = fsgld.noise_trace_from_moments(share, means, second)
    h = step_size if not callable(step_size) else float(step_size(0))
    return fsgld.auto_trust_radius(clients.flat_model.dim, h, trace, preconditioned_rows)


def trust_radius(clients: ClientStatistics, radius, weights, alpha: float, surrogates,
                 global_surrogate, center, step_size,
                 kept: Optional[Sequence[int]] = None,
                 preconditioned_rows: Optional[int] = None) -> Optional[float]:
    """FSGLD's trust radius: ``None`` (the safeguard off), the given one, or ``"auto"``
    (:func:`auto_trust_radius` of the clients of ``kept``, with the f_s ``weights`` the run
    uses); recorded in ``info["trust_radius"]``."""
    if radius == "auto":
        radius = auto_trust_radius(clients, weights, alpha, surrogates, global_surrogate,
                                   center, step_size, kept, preconditioned_rows)
    clients.info["trust_radius"] = radius
    return radius
