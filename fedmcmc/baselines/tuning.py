"""``thin="auto"`` and ``burn_in="auto"`` of FA-LD and QLSD (issue 44), from the posterior's
curvature and the step size, and ConsensusMC's ``"auto"`` run lengths.

FA-LD and QLSD are Langevin chains in the project's convention ``theta + (h/2) v + N(0, h I)``
(``h = step_size``; the papers' eta and gamma are h/2, see :mod:`fedmcmc.baselines.fald` and
:mod:`fedmcmc.baselines.qlsd`), and ``thin`` counts ITERATIONS:

* FA-LD / VR-FALD*: one iteration is one local step of every participating client; the
  average sum_s a_s theta_s of the clients' chains (what a draw is) then moves by
  ``(h/2) sum_s a_s g_s + N(0, h I)`` (the noise scales sigma_s are chosen so: ``fald.py``),
  a Langevin step of size h on the global posterior;
* QLSD / QLSD++: one iteration is one server step ``theta + (h/2) sum_s C(H_s) + N(0, h I)``.

So the step of one iteration is ``h_eff = h`` for both, and the slowest direction of the
posterior (precision ``P``, smallest eigenvalue ``lambda_min``) relaxes as an AR(1) of
coefficient ``1 - h lambda_min / 2``: the relaxation time is

    R = 2 / (h lambda_min(P))   iterations

(:mod:`fedmcmc.run_length`, which turns R into ``thin`` and ``burn_in``). ``P`` is the
precision of the Laplace fit of the posterior made from per-client Laplace fits
(:func:`fedmcmc.surrogates.fit_laplace`, each client's log likelihood expanded at the mode of
``p(x_s | theta) p(theta)^(1/S)``), combined with the prior
(:func:`fedmcmc.surrogates.laplace_of_product`), the curvature the Langevin family's
``"auto"`` uses. In process the fits are vmapped over the clients; on ``engine="ray"`` each
client fits its own rows where they are (:func:`client_laplace`: d^2 + d floats up) and the
server combines them. The chains' initial offset (``burn_in="auto"``) is measured along the
same fit, ``sqrt((theta0 - m)^T P (theta0 - m))`` with ``m`` its centre.

Minibatch and quantisation noise inflate the variance a little, not the relaxation: they
enter ``step_size="auto"`` (:func:`choose_step_size`, :func:`noise_covariance`), not R.
FA-LD's client drift between averages (many local steps on heterogeneous clients) biases
the chain, not slows it: :func:`drift_bias` predicts it from the same fits and
:func:`resolve` reports it (``info["predicted_drift_bias_sd"]``, :class:`ClientDriftWarning`).
The Laplace fit is made only when something is ``"auto"``, so runs with given numbers are
unchanged.

ConsensusMC (NUTS on each subposterior, one combination): its draws are nearly independent
NUTS draws, so ``thin="auto"`` is 1 transition per draw; ``burn_in="auto"`` is its NUTS
warm-up default (``num_warmup`` when given, else ``ConsensusMC.default_warmup``
transitions; :meth:`fedmcmc.ConsensusMC.warmup_steps`).
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple, Optional

import numpy as np

from .. import run_length
from ..callsite import user_stacklevel
from .. import surrogates as surrogate_module
from ..arrays import device_array
from ..federation import Federation
from ..model import Model

__all__ = ["Curvature", "curvature", "in_process_laplace", "client_laplace",
           "combine_client_laplace", "relaxation_time", "initial_offset", "wants_fit", "resolve_run",
           "consensus_run", "fit_floats", "ClientDriftWarning", "drift_bias",
           "DRIFT_BIAS_WARNING"]


class Curvature(NamedTuple):
    """The Laplace fit of the posterior: centre m, precision P and its extreme eigenvalues,
    and the clients' own fits (natural parameters P_s, b_s of their log likelihoods)."""

    center: np.ndarray  # (d,)
    precision: np.ndarray  # (d, d), or (d,) when the fits are diagonal
    lambda_min: float
    lambda_max: float
    client_precisions: Optional[np.ndarray] = None  # (S, d, d) or (S, d)
    client_shifts: Optional[np.ndarray] = None  # (S, d)

    def info(self) -> dict:
        return {"laplace_lambda_min": float(self.lambda_min),
                "laplace_lambda_max": float(self.lambda_max)}


def _extreme_eigenvalues(matrix) -> tuple:
    matrix = np.asarray(matrix, np.float64)
    if matrix.ndim == 1:
        return float(np.min(matrix)), float(np.max(matrix))
    values = np.linalg.eigvalsh(0.5 * (matrix + matrix.T))
    return float(values[0]), float(values[-1])


def curvature(center, precision, fits=None) -> Curvature:
    """A :class:`Curvature` from the Laplace fit's centre and precision (and the clients'
    ``fits``, a :class:`~fedmcmc.surrogates.GaussianSurrogates`)."""
    low, high = _extreme_eigenvalues(precision)
    clients = (None, None) if fits is None else (np.asarray(fits.precision, np.float64),
                                                 np.asarray(fits.shift, np.float64))
    return Curvature(np.asarray(center, np.float64), np.asarray(precision, np.float64),
                     low, high, *clients)


def in_process_laplace(flat_model, federation: Federation, theta0) -> Curvature:
    """The per-client Laplace fits of every client (vmapped here) combined with the prior."""
    fits = surrogate_module.fit_laplace(flat_model, federation, theta0)
    center, precision = surrogate_module.laplace_of_product(flat_model, fits, theta0)
    return curvature(center, precision, fits)


def client_laplace(context, theta0):
    """Client side (``engine="ray"``): this client's Laplace fit on its own rows, as
    :func:`fedmcmc.surrogates.fit_laplace` makes it for the whole federation (the mode of its
    log likelihood plus 1/S of the log prior): replies ``(P_s, b_s)``."""
    prior, num_clients = context.model.log_prior, context.num_clients
    share = Model(log_prior=lambda params: prior(params) / num_clients,
                  log_likelihood=context.model.log_likelihood)
    flat_share = share.flatten(context.init)
    fitted = surrogate_module.fit_laplace(flat_share, Federation([context.raw_data]),
                                          device_array(np.asarray(theta0)))
    return np.asarray(fitted.precision)[0], np.asarray(fitted.shift)[0]


def combine_client_laplace(flat_model, replies, theta0) -> Curvature:
    """Server side (``engine="ray"``): the clients' ``(P_s, b_s)`` combined with the prior."""
    fits = surrogate_module.GaussianSurrogates(
        precision=device_array(np.stack([np.asarray(p) for p, _ in replies])),
        shift=device_array(np.stack([np.asarray(b) for _, b in replies])))
    center, precision = surrogate_module.laplace_of_product(
        flat_model, fits, device_array(np.asarray(theta0)))
    return curvature(center, precision, fits)


def relaxation_time(step_size: float, fit: Curvature) -> float:
    """R = 2 / (h lambda_min(P)) iterations (module docstring); inf for a flat direction."""
    if not fit.lambda_min > 0 or not math.isfinite(fit.lambda_min):
        return math.inf
    return 2.0 / (float(step_size) * fit.lambda_min)


def initial_offset(theta0, fit: Curvature) -> Optional[float]:
    """The start's distance from the fit's centre in posterior sds,
    sqrt((theta0 - m)^T P (theta0 - m)); None when not finite."""
    delta = np.asarray(theta0, np.float64) - fit.center
    if fit.precision.ndim == 1:
        squared = float(np.sum(fit.precision * delta ** 2))
    else:
        squared = float(delta @ fit.precision @ delta)
    offset = math.sqrt(max(squared, 0.0))
    return offset if math.isfinite(offset) else None


def wants_fit(thin, burn_in, step_size=None) -> bool:
    """Whether the run needs the Laplace fit: an ``"auto"`` run length or step size."""
    return any(run_length.is_auto(value) for value in (thin, burn_in, step_size))


def resolve_run(name: str, request: Optional[run_length.RunRequest], thin, burn_in,
                num_samples: int, chains: int, step_size: float, fit: Optional[Curvature],
                theta0, info: dict):
    """``(thin, burn_in)`` as integers: ``"auto"`` resolved by :func:`fedmcmc.run_length.resolve`
    from R = 2 / (h lambda_min) (``fit``: None when no ``"auto"`` was asked for), the values
    used recorded in ``info``. ``request``: ``fm.sample``'s (None when the algorithm's
    ``sample`` is called directly: the default budget)."""
    if request is None:
        if not wants_fit(thin, burn_in):
            return int(thin), int(burn_in)
        request = run_length.RunRequest(num_samples=num_samples, burn_in=burn_in, thin=thin,
                                        chains=chains)
    relaxation, offset = None, None
    if fit is not None:
        info.update(fit.info())
        relaxation = relaxation_time(step_size, fit)
        offset = initial_offset(theta0, fit)
        if not math.isfinite(relaxation):
            raise ValueError(
                f"thin/burn_in='auto': {name}'s Laplace fit of the posterior has a flat "
                f"direction (smallest curvature {fit.lambda_min:.3g}), so no relaxation time "
                "can be predicted; give thin and burn_in as integers (or a proper prior)")
    length = run_length.resolve(request._replace(thin=thin, burn_in=burn_in), relaxation,
                                offset, name=name, info=info)
    return length.thin, length.burn_in


def consensus_run(thin, burn_in, num_warmup,
                  default_warmup: int, info: dict):
    """ConsensusMC's ``(thin, burn_in)``: ``thin="auto"`` is 1; ``burn_in="auto"`` is the
    NUTS warm-up default: ``default_warmup`` draws of warm-up when ``num_warmup`` is None
    (ConsensusMC warms up for ``burn_in x thin`` transitions), else 0 draws discarded after
    the ``num_warmup`` transitions. Records ``thin``, ``burn_in``, ``thin_auto``,
    ``burn_in_auto`` in ``info`` (the run needs no prediction: ``fm.sample``'s request has
    nothing more to add)."""
    thin_auto, burn_in_auto = run_length.is_auto(thin), run_length.is_auto(burn_in)
    if thin_auto:
        thin = 1
    if burn_in_auto:
        burn_in = 0 if num_warmup is not None else int(math.ceil(default_warmup / thin))
    info.update(thin=int(thin), burn_in=int(burn_in), thin_auto=thin_auto,
                burn_in_auto=burn_in_auto)
    return int(thin), int(burn_in)


def fit_floats(dim: int, diagonal: bool) -> int:
    """Floats one client sends for its Laplace fit: P_s (d^2, or d diagonal) and b_s (d)."""
    return (dim if diagonal else dim * dim) + dim


# ----------------------------------------------------------------------------- step_size="auto"

#: the bound on the discretisation and minibatch-noise ratios of ``step_size="auto"``; the
#: Langevin family's ``fedmcmc.langevin.step_size.DEFAULT_TOLERANCE`` (the families import
#: nothing of each other; a test checks the two agree)
DEFAULT_TOLERANCE = 0.05
#: the stability ceiling of the budget rule: ``(h/4) lambda_max = 0.5``, h lambda_max = 2
STABILITY_DISCRETISATION_RATIO = 0.5


class StepPrediction(NamedTuple):
    """What a step size h implies for FA-LD / QLSD near the posterior's mode (module
    docstring of :func:`noise_covariance`)."""

    step_size: float
    discretisation_ratio: float  # (h/4) lambda_max(P)
    minibatch_noise_ratio: float  # (h/4) lambda_max(C)
    local_discretisation_ratio: Optional[float]  # FA-LD, local_steps > 1: (h/4) max_s lambda_max(A_s)

    def info(self) -> dict:
        out = {"step_size": float(self.step_size),
               "discretisation_ratio": float(self.discretisation_ratio),
               "minibatch_noise_ratio": float(self.minibatch_noise_ratio)}
        if self.local_discretisation_ratio is not None:
            out["local_discretisation_ratio"] = float(self.local_discretisation_ratio)
        return out


def noise_covariance(flat_model, fit: Curvature, sizes, weights, batch_size: int, *,
                     clients_per_round: Optional[int] = None, local_steps: int = 1,
                     quantiser_variance: float = 0.0) -> np.ndarray:
    """The predicted covariance C of the gradient noise of one iteration's direction
    (the sum the server steps with, ``v`` in ``theta + (h/2) v + N(0, h I)``), near the
    Laplace fit's centre m, from the clients' fits alone (no further message):

    * minibatch noise, by the information identity: client s's estimator
      ``(n_s / m) sum_j grad log p(x_j | theta)`` (m rows with replacement) has covariance
      ``(n_s^2 / m) Var_row`` and the rows' score outer products average to the observed
      information per row, ``P_s / n_s``: ``C_s <= (n_s / m) P_s`` for ``n_s > m``, 0 for a
      client that uses all its rows. FA-LD's average and QLSD's sum both carry sum_s C_s.
      (An upper bound for the variance-reduced variants, whose control variates remove most
      of it.)
    * FA-LD with partial participation: K clients drawn with probabilities f_s, client s's
      direction g_s = grad log p + (1/f_s) grad log p(x_s | .), at m
      ``grad log p(m) + (b_s - P_s m) / f_s``; the draw adds ``(1/K) sum_s f_s g_s g_s^T``,
      held for ``local_steps`` iterations (counted that many times, conservatively);
    * QLSD's quantiser, ``E||C(v) - v||^2 <= omega ||v||^2`` per client
      (``quantiser_variance`` = omega): at most ``omega sum_s (||H_s(m)||^2 + tr C_s)`` in
      any direction, H_s(m) = f_s grad log p(m) + b_s - P_s m.
    """
    if fit.client_precisions is None:
        raise ValueError("noise_covariance needs the clients' Laplace fits")
    sizes = np.asarray(sizes, np.float64)
    weights = np.asarray(weights, np.float64)
    dim = fit.center.shape[0]
    precisions = fit.client_precisions
    if precisions.ndim == 2:  # diagonal fits
        precisions = np.stack([np.diag(p) for p in precisions])
    factor = np.where(sizes > batch_size, sizes / float(batch_size), 0.0)
    covariance = np.einsum("s,sij->ij", factor, precisions)
    prior_gradient = np.asarray(flat_model.grad_log_prior(
        device_array(fit.center.astype(np.dtype(flat_model.dtype)))), np.float64)
    likelihood_at_center = fit.client_shifts - np.einsum("sij,j->si", precisions, fit.center)
    if clients_per_round is not None:
        directions = prior_gradient[None, :] + likelihood_at_center / weights[:, None]
        between = np.einsum("s,si,sj->ij", weights, directions, directions)
        covariance = covariance + local_steps * between / float(clients_per_round)
    if quantiser_variance > 0:
        sent = weights[:, None] * prior_gradient[None, :] + likelihood_at_center
        traces = factor * np.einsum("sii->s", precisions)
        bound = quantiser_variance * float(np.sum(np.sum(sent ** 2, axis=1) + traces))
        covariance = covariance + bound * np.eye(dim)
    return 0.5 * (covariance + covariance.T)


def local_curvature(fit: Curvature, weights, prior_precision) -> float:
    """FA-LD's stiffest local chain: max_s lambda_max(A_s), A_s = P_prior + P_s / f_s the
    curvature of client s's local direction (``prior_precision``: minus the prior's Hessian
    at the centre, (d, d))."""
    precisions = fit.client_precisions
    if precisions.ndim == 2:
        precisions = np.stack([np.diag(p) for p in precisions])
    weights = np.asarray(weights, np.float64)
    local = precisions / weights[:, None, None] + np.asarray(prior_precision)[None]
    return float(max(_extreme_eigenvalues(a)[1] for a in local))


def predict(step_size: float, fit: Curvature, covariance, local: Optional[float] = None
            ) -> StepPrediction:
    """The ratios of ``step_size`` (:class:`StepPrediction`)."""
    h = float(step_size)
    _, noise = _extreme_eigenvalues(covariance)
    return StepPrediction(h, h * fit.lambda_max / 4.0, h * max(noise, 0.0) / 4.0,
                          None if local is None else h * local / 4.0)


def choose_step_size(name: str, fit: Curvature, covariance, tolerance: float,
                     request: Optional[run_length.RunRequest], theta0, info: dict,
                     local: Optional[float] = None) -> float:
    """``step_size="auto"``: the largest h whose discretisation ratio ``(h/4) lambda_max(P)``
    and minibatch-noise ratio ``(h/4) lambda_max(C)`` are at most ``tolerance`` (the
    Langevin family's rule), then the budget rule (:func:`fedmcmc.run_length.budget_step_size`:
    raised only when the run cannot afford the relaxation time 2 / (h lambda_min), never past
    a predicted variance inflation of :data:`fedmcmc.run_length.BUDGET_TOLERANCE` unless
    ``max_iterations`` would not make one relaxation time, never past the stability ceiling
    ``h lambda_max = 2``, for FA-LD with ``local_steps > 1`` also ``h max_s lambda_max(A_s) = 2``,
    ``local`` being that largest local curvature). Records ``step_size``, ``step_size_exact``,
    ``step_size_budget_reason``, the ratios and ``predicted_variance_inflation`` in ``info``
    and warns :class:`~fedmcmc.run_length.RunLengthWarning` when the budget raised h."""
    _, noise = _extreme_eigenvalues(covariance)
    scale = max(fit.lambda_max, noise, np.finfo(np.float64).tiny)
    if not math.isfinite(scale) or not fit.lambda_min > 0:
        raise ValueError(
            f"step_size='auto': {name}'s Laplace fit of the posterior is not usable (curvature "
            f"from {fit.lambda_min:.3g} to {fit.lambda_max:.3g}, gradient noise {noise:.3g}); "
            "give step_size a number")
    exact = 4.0 * tolerance / scale
    stiffest = max(fit.lambda_max, local or 0.0)
    stability = 4.0 * STABILITY_DISCRETISATION_RATIO / stiffest
    exact = min(exact, stability)
    accuracy = run_length.BUDGET_TOLERANCE / ((max(noise, 0.0) + fit.lambda_max) / 4.0)
    used, reason = run_length.budget_step_size(
        exact, lambda h: relaxation_time(h, fit), request, accuracy_ceiling=accuracy,
        stability_ceiling=stability, initial_offset=initial_offset(theta0, fit))
    choice = predict(used, fit, covariance, local)
    inflation = choice.discretisation_ratio + choice.minibatch_noise_ratio
    info.update(choice.info(), step_size_auto=True, step_size_tolerance=float(tolerance),
                step_size_exact=float(exact), step_size_budget_reason=reason,
                predicted_variance_inflation=float(inflation))
    if reason is not None:
        run_length.warn_step_raised(name, tolerance, exact, used, reason, inflation,
                                    relaxation_time(used, fit))
    return float(used)


def prior_precision(flat_model, center) -> np.ndarray:
    """Minus the log prior's Hessian at ``center``, (d, d)."""
    import jax

    point = device_array(np.asarray(center).astype(np.dtype(flat_model.dtype)))
    return -np.asarray(jax.hessian(flat_model.log_prior)(point), np.float64)


#: FA-LD's predicted client-drift bias (posterior sds) above which the set-up warns
DRIFT_BIAS_WARNING = 0.1


class ClientDriftWarning(UserWarning):
    """FA-LD's local steps on heterogeneous clients are predicted to bias the chain's mean
    by more than :data:`DRIFT_BIAS_WARNING` posterior sds (no run length fixes it)."""


def drift_bias(flat_model, fit: Curvature, weights, step_size: float, local_steps: int
               ) -> float:
    """FA-LD's heterogeneity bias (Plassier et al.) predicted on the clients' Laplace fits,
    in posterior sds (the largest over coordinates).

    Client s's local direction is, on its fit, linear: g_s(theta) = c_s - A_s theta with
    A_s = P_0 + P_s / f_s and c_s = grad log p(m) + P_0 m + b_s / f_s (P_0: minus the
    prior's Hessian at the centre m). A round of L local steps from theta moves its mean to
    M_s theta + (I - M_s) A_s^-1 c_s, M_s = (I - h A_s / 2)^L, and the average's mean has
    the fixed point theta_L = (I - sum_s f_s M_s)^-1 sum_s f_s (I - M_s) A_s^-1 c_s, whereas
    the posterior's is theta_1 = P^-1 sum_s f_s c_s (L = 1 gives it exactly)."""
    precisions = fit.client_precisions
    if precisions.ndim == 2:
        precisions = np.stack([np.diag(p) for p in precisions])
    weights = np.asarray(weights, np.float64)
    dim = fit.center.shape[0]
    prior = prior_precision(flat_model, fit.center)
    prior_gradient = np.asarray(flat_model.grad_log_prior(
        device_array(fit.center.astype(np.dtype(flat_model.dtype)))), np.float64)
    identity = np.eye(dim)
    kept = np.zeros((dim, dim))
    target = np.zeros(dim)
    total, pulls = np.zeros((dim, dim)), np.zeros(dim)
    for f, p_s, b_s in zip(weights, precisions, fit.client_shifts):
        a_s = prior + p_s / f
        c_s = prior_gradient + prior @ fit.center + b_s / f
        m_s = np.linalg.matrix_power(identity - 0.5 * step_size * a_s, int(local_steps))
        kept += f * m_s
        target += f * (identity - m_s) @ np.linalg.lstsq(a_s, c_s, rcond=None)[0]
        total += f * a_s
        pulls += f * c_s
    biased = np.linalg.lstsq(identity - kept, target, rcond=None)[0]
    exact = np.linalg.lstsq(total, pulls, rcond=None)[0]
    covariance = np.linalg.pinv(total, hermitian=True)
    sd = np.sqrt(np.maximum(np.diag(covariance), np.finfo(np.float64).tiny))
    bias = float(np.max(np.abs(biased - exact) / sd))
    return bias if math.isfinite(bias) else math.inf


def resolve(name: str, *, step_size, tolerance: float, fit: Optional[Curvature], flat_model,
            sizes, weights, batch_size: int, request, thin, burn_in, num_samples: int,
            chains: int, theta0, info: dict, clients_per_round: Optional[int] = None,
            local_steps: int = 1, quantiser_variance: float = 0.0,
            client_drift: bool = False) -> tuple:
    """``(h, thin, burn_in)`` of an FA-LD / QLSD run, every ``"auto"`` resolved from the
    Laplace ``fit`` (None when nothing is ``"auto"``) and recorded in ``info``:
    ``step_size="auto"`` first (:func:`choose_step_size`, with the noise of
    :func:`noise_covariance`), then the run lengths from its relaxation time
    (:func:`resolve_run`). A given h is kept, and its ratios recorded when the fit was made.
    ``client_drift`` (FA-LD with ``local_steps > 1``, no control variates): the predicted
    drift bias at the h used is recorded (``predicted_drift_bias_sd``) and a
    :class:`ClientDriftWarning` raised above :data:`DRIFT_BIAS_WARNING`."""
    if request is None and wants_fit(thin, burn_in, step_size):
        request = run_length.RunRequest(num_samples=num_samples, burn_in=burn_in, thin=thin,
                                        chains=chains)
    h = step_size
    if fit is not None:
        covariance = noise_covariance(flat_model, fit, sizes, weights, batch_size,
                                      clients_per_round=clients_per_round,
                                      local_steps=local_steps,
                                      quantiser_variance=quantiser_variance)
        local = None
        if local_steps > 1:
            local = local_curvature(fit, weights, prior_precision(flat_model, fit.center))
        if run_length.is_auto(step_size):
            h = choose_step_size(name, fit, covariance, tolerance, request, theta0, info, local)
        else:
            info.update({key: value for key, value in predict(h, fit, covariance, local)
                         .info().items() if key != "step_size"})
    if fit is not None and client_drift and local_steps > 1:
        bias = drift_bias(flat_model, fit, weights, float(h), local_steps)
        info["predicted_drift_bias_sd"] = bias
        if bias > DRIFT_BIAS_WARNING:
            warnings.warn(
                f"{name}: {local_steps} local steps between averages on these clients are "
                f"predicted to bias the chain's mean by {bias:.3g} posterior sd (client drift, "
                f"Plassier et al.; from the clients' Laplace fits at h={float(h):.3g}): no run "
                "length removes it. Use variance_reduction=True (VR-FALD*), fewer local_steps "
                "or a smaller step_size", ClientDriftWarning, stacklevel=user_stacklevel())
    thin, burn_in = resolve_run(name, request, thin, burn_in, num_samples, chains, h, fit,
                                theta0, info)
    return float(h), thin, burn_in
