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

What the rule does not see: FA-LD's client drift between averages (many local steps on
heterogeneous clients bias the chain, not slow it) and minibatch or quantisation noise
(they inflate the variance a little, not the relaxation). The Laplace fit is made only when
an ``"auto"`` run length is asked for, so runs with given lengths are unchanged.

ConsensusMC (NUTS on each subposterior, one combination): its draws are nearly independent
NUTS draws, so ``thin="auto"`` is 1 transition per draw; ``burn_in="auto"`` is its NUTS
warm-up default (``num_warmup`` when given, else ``ConsensusMC.default_warmup``
transitions; :meth:`fedmcmc.ConsensusMC.warmup_steps`).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import numpy as np

from .. import run_length
from .. import surrogates as surrogate_module
from ..arrays import device_array
from ..federation import Federation
from ..model import Model

__all__ = ["Curvature", "curvature", "in_process_laplace", "client_laplace",
           "combine_client_laplace", "relaxation_time", "initial_offset", "wants_fit", "resolve_run",
           "consensus_run", "fit_floats"]


class Curvature(NamedTuple):
    """The Laplace fit of the posterior: centre m, precision P and its extreme eigenvalues."""

    center: np.ndarray  # (d,)
    precision: np.ndarray  # (d, d), or (d,) when the fits are diagonal
    lambda_min: float
    lambda_max: float

    def info(self) -> dict:
        return {"laplace_lambda_min": float(self.lambda_min),
                "laplace_lambda_max": float(self.lambda_max)}


def curvature(center, precision) -> Curvature:
    """A :class:`Curvature` from the Laplace fit's centre and precision."""
    center = np.asarray(center, np.float64)
    precision = np.asarray(precision, np.float64)
    if precision.ndim == 1:
        values = np.sort(precision)
    else:
        values = np.linalg.eigvalsh(0.5 * (precision + precision.T))
    return Curvature(center, precision, float(values[0]), float(values[-1]))


def in_process_laplace(flat_model, federation: Federation, theta0) -> Curvature:
    """The per-client Laplace fits of every client (vmapped here) combined with the prior."""
    fits = surrogate_module.fit_laplace(flat_model, federation, theta0)
    center, precision = surrogate_module.laplace_of_product(flat_model, fits, theta0)
    return curvature(center, precision)


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
    return curvature(center, precision)


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


def wants_fit(thin, burn_in) -> bool:
    """Whether the run needs the Laplace fit: an ``"auto"`` run length."""
    return run_length.is_auto(thin) or run_length.is_auto(burn_in)


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
