"""``step_size="auto"`` for SGLD, DSGLD and FSGLD: h from what the clients report.

The papers' update is ``theta' = theta + (h/2) v(theta) + sqrt(h) xi`` with ``v`` an unbiased
estimate of the log-posterior gradient (FSGLD equations (1), (3), (5)). Near the mode, with
posterior precision ``P`` and estimator noise covariance ``C``, one step adds the injected
noise ``h I`` and the minibatch noise ``(h/2)^2 C``; when ``C`` and ``P`` share eigenvectors
the chain's stationary covariance is, to first order in h,

    Sigma = P^{-1} (I + (h/4) C) (I - (h/4) P)^{-1}

(the Gaussian case of ``tests/langevin/test_langevin_posterior.py``, where it is checked exactly). So

* ``(h/4) lambda_max(C)``: the ratio of minibatch noise to injected noise, the relative
  inflation of the posterior variance it causes (``info["minibatch_noise_ratio"]``);
* ``(h/4) lambda_max(P)``: the discretisation's relative error (``info["discretisation_ratio"]``);
* ``4 / (h lambda_min(P))``: the integrated autocorrelation time of the slowest direction,
  i.e. the expected iterations per effective draw (``info["iterations_per_effective_draw"]``).

``"auto"`` takes the largest h that keeps both ratios at most ``tolerance`` (default 0.05:
posterior variances within about 5 %, standard deviations within about 2.5 %, plus what
non-Gaussianity adds), so the chain mixes as fast as that accuracy allows.

The budget (``fm.sample``'s ``max_iterations``, :mod:`fedmcmc.run_length`): given the run's
length as asked (a ``RunRequest``), :func:`resolve_step_size` keeps that h unless the run
cannot afford its relaxation time ``2 / (h lambda_min(P))`` (:func:`relaxation_time`); then
``run_length.budget_step_size`` raises it, up to the accuracy ceiling (predicted variance
inflation ``minibatch_noise_ratio + discretisation_ratio`` = ``run_length.BUDGET_TOLERANCE``),
further only to make one relaxation time in ``max_iterations``, never past the stability
ceiling ``h lambda_max(P) = 2`` (:func:`budget_ceilings`); ``info`` records the exact h, the
h used, the reason and the predicted variance inflation, and a ``RunLengthWarning`` is raised.

Inputs, computed where the data are (a few floats per client, never rows):

* the curvature ``P``: the Laplace fit of prior x prod_s q_s from the clients' Gaussian
  surrogates (FSGLD's own; for SGLD/DSGLD Laplace fits made for the purpose);
* the noise: each client's within-client covariance of its own estimator, averaged over
  draws of that Laplace fit (:func:`client_noise`), and its estimator's mean ``m_s`` at
  the fit's centre (d + d^2 floats; the trace instead of the matrix above
  :data:`FULL_MOMENTS_MAX_DIM` parameters). With ``f_s`` the scheduler's probabilities,
  ``C_within = sum_s f_s Cov_s`` and ``C_between = sum_s f_s (m_s - m)(m_s - m)^T``.
  A chain that stays ``K = local_steps`` updates on a client sees the client's offset
  ``m_s - m`` K times in a row, so the between-client part counts K times:
  ``C = C_within + K C_between`` (conservative: it ignores the chain's relaxation within a
  visit). For FSGLD the conducive gradients remove most of ``C_between``; for DSGLD on
  heterogeneous clients it dominates, which is why DSGLD's automatic h is small.
"""

from __future__ import annotations

import functools
import warnings
from typing import Dict, List, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import rng
from .. import run_length
from ..callsite import user_stacklevel

__all__ = [
    "FULL_MOMENTS_MAX_DIM",
    "DEFAULT_TOLERANCE",
    "StepSizeChoice",
    "laplace_points",
    "client_noise",
    "noise_covariance",
    "ClientNoise",
    "conducive_weights",
    "PREDICTION_STANDARD_ERRORS",
    "scaled_noise_covariance",
    "variance_weights",
    "VARIANCE_WEIGHTS_FLOOR",
    "choose_step_size",
    "predict",
    "StepSizeWarning",
    "NOISE_PROBES_PER_CLIENT",
    "NOISE_POINTS_PER_CLIENT",
    "NOISE_STREAM",
    "noise_points",
    "check_selection",
    "candidate_variates",
    "choose_settings",
    "resolve_step_size",
    "relaxation_time",
    "initial_offset",
    "budget_ceilings",
    "STABILITY_DISCRETISATION_RATIO",
]

#: above this many parameters clients send the trace of their second moment, not the matrix
FULL_MOMENTS_MAX_DIM = 200
#: default bound on both the minibatch-noise and the discretisation ratio
DEFAULT_TOLERANCE = 0.05
#: minibatch draws per client for the estimator moments of "auto" and of the h check
NOISE_PROBES_PER_CLIENT = 64
#: Laplace draws per client at which the within-client noise is measured
NOISE_POINTS_PER_CLIENT = 16
#: the noise statistics' key: ``fold_in(set-up key, NOISE_STREAM)`` (client s: ``fold_in`` of it by s)
NOISE_STREAM = 11
#: client_selection="variance" keeps f_s >= this fraction of the size-proportional N_s / N
VARIANCE_WEIGHTS_FLOOR = 0.25
#: the budget never raises an "auto" h past this discretisation ratio (h/4) lambda_max(P):
#: h lambda_max = 2, half the stability limit h lambda_max < 4 of the stiffest direction
STABILITY_DISCRETISATION_RATIO = 0.5


class StepSizeChoice(NamedTuple):
    """An h and what it implies (see the module docstring)."""

    step_size: float
    minibatch_noise_ratio: float  # (h/4) lambda_max(C)
    discretisation_ratio: float  # (h/4) lambda_max(P)
    iterations_per_effective_draw: float  # 4 / (h lambda_min(P))

    def info(self) -> dict:
        return {
            "step_size": float(self.step_size),
            "minibatch_noise_ratio": float(self.minibatch_noise_ratio),
            "discretisation_ratio": float(self.discretisation_ratio),
            "iterations_per_effective_draw": float(self.iterations_per_effective_draw),
        }


@functools.partial(jax.jit, static_argnames="count")
def laplace_points(center, precision, key, count: int):
    """``count`` draws of N(center, precision^{-1}): where the noise is measured (the noise of
    an estimator with control variates vanishes at the centre itself)."""
    normals = rng.normal(key, (count,) + center.shape, center.dtype)
    if precision.ndim == 1:
        return center + normals / jnp.sqrt(precision)
    factor = jnp.linalg.cholesky(precision)
    return center + jax.scipy.linalg.solve_triangular(factor.T, normals.T, lower=False).T


def client_noise(estimate, center, points, key, probes: int, full: bool, surrogate=None):
    """One client's noise statistics from its own minibatches: the within-client covariance
    of its estimator, averaged over ``points`` (half the outer product of the difference of
    two independent estimates at the same point: unbiased), (d, d) when ``full`` else its
    trace; and the estimator's mean at ``center`` over ``probes`` draws (for the spread
    between clients). ``estimate(theta, key) -> (d,)``.

    ``surrogate = (alpha, grad_log_q)``, FSGLD's conducive part ``-alpha grad log q_s`` of
    ``estimate``: also how well ``grad log q_s`` predicts the client's gradient g at the
    points, ``(sum_k <g1_k, g2_k>, sum_k <(g1_k + g2_k)/2, c_k>, sum_k |c_k|^2)`` over the
    points' two independent gradient estimates g1, g2 (the pair of the covariance, with the
    conducive part added back) and c_k = grad log q_s there: unbiased for
    ``sum_k |g_k|^2``, ``sum_k <g_k, c_k>`` and ``sum_k |c_k|^2``, whatever the minibatch
    noise; and ``sum_k e_k^2`` of the points' excess errors ``e_k = |c_k|^2 - 2 <g_k, c_k>``
    (their spread: :func:`conducive_weights`' standard error). Returns ``(within, mean)``,
    with ``surrogate`` ``(within, mean, prediction (4,))``."""
    key_pairs, key_center = rng.split_key(key)

    def pair(point_and_key):
        theta, pair_key = point_and_key
        first, second = rng.split_key(pair_key)
        difference = estimate(theta, first) - estimate(theta, second)
        if full:
            return 0.5 * jnp.outer(difference, difference)
        return 0.5 * jnp.sum(difference * difference)

    # lax.map, not vmap, over the points and the probes: the same values, about as fast, and
    # compiled in about half the time (vmapped minibatch gathers and gradients inside the
    # engines' vmap over clients are slow to compile; bench_startup --families FSGLD-auto)
    within = jnp.mean(jax.lax.map(pair, (points, rng.split_key(key_pairs, points.shape[0]))),
                      axis=0)
    mean = jnp.mean(jax.lax.map(lambda k: estimate(center, k),
                                rng.split_key(key_center, probes)), axis=0)
    if surrogate is None:
        return within, mean
    alpha, grad_log_q = surrogate

    def predicted(point_and_key):
        # the same pairs as the covariance's (same keys), in a map of their own
        theta, pair_key = point_and_key
        first, second = rng.split_key(pair_key)
        conducive = grad_log_q(theta)
        one = estimate(theta, first) + alpha * conducive
        two = estimate(theta, second) + alpha * conducive
        cross = jnp.sum(0.5 * (one + two) * conducive)
        surrogate = jnp.sum(conducive * conducive)
        excess = surrogate - 2.0 * cross  # the point's |g - c|^2 - |g|^2, unbiased
        return jnp.stack([jnp.sum(one * two), cross, surrogate, excess * excess])

    prediction = jnp.sum(jax.lax.map(
        predicted, (points, rng.split_key(key_pairs, points.shape[0]))), axis=0)
    return within, mean, prediction


def noise_covariance(weights, within, means, local_steps: int = 1):
    """``C = C_within + local_steps * C_between`` from the clients' statistics (module docstring).

    ``within``: (S, d, d) covariances, or (S,) traces (then a multiple of the identity whose
    largest eigenvalue bounds the true one by the trace); ``means``: (S, d) at the centre."""
    w = np.asarray(weights, np.float64)
    w = w / w.sum()
    means = np.asarray(means, np.float64)
    within = np.asarray(within, np.float64)
    offsets = means - w @ means
    dim = means.shape[1]
    if within.ndim == 3:
        between = np.einsum("s,si,sj->ij", w, offsets, offsets)
        return np.einsum("s,sij->ij", w, within) + local_steps * between
    between_trace = float(w @ np.sum(offsets * offsets, axis=1))
    return np.eye(dim) * max(float(w @ within) + local_steps * between_trace, 0.0)


class ClientNoise(NamedTuple):
    """Each client's statistics of the *unscaled* part of its estimator, ``r_s`` (the estimator
    is ``a(theta) + r_s(theta) / f_s``, with ``a`` the same for every client: the prior's
    gradient, and FSGLD's ``alpha grad log q``; ``r_s`` the client's minibatch gradient, with
    its control variates, minus FSGLD's ``alpha grad log q_s``). Nothing in it depends on
    f_s, so the noise of any choice of f_s follows (:func:`scaled_noise_covariance`)."""

    within: np.ndarray  # (S, d, d) covariance of r_s, averaged over Laplace draws; or (S,) traces
    means: np.ndarray  # (S, d): E r_s at the Laplace centre
    # FSGLD: (S, 4) how well each surrogate predicts its client's gradient at the Laplace
    # draws (client_noise's ``prediction``; :func:`conducive_weights`), else None
    prediction: Optional[np.ndarray] = None


#: a surrogate's conducive gradient is weighted down only when it predicts its client's
#: gradient worse than zero by more than this many standard errors (:func:`conducive_weights`)
PREDICTION_STANDARD_ERRORS = 3.0


def conducive_weights(prediction, points: int = NOISE_POINTS_PER_CLIENT) -> tuple:
    """Each client's weight on its conducive gradient, from how well its surrogate predicts
    its gradient where the chain will be (FSGLD's ``step_size="auto"``).

    ``prediction`` (S, 4): per client, over the Laplace draws theta_k of the posterior fit
    (where the noise is measured), unbiased estimates of ``G = sum_k |g_k|^2``,
    ``X = sum_k <g_k, c_k>`` and ``Q = sum_k |c_k|^2``, g_k the client's log-likelihood
    gradient and c_k = grad log q_s(theta_k) (:func:`client_noise`). With weight w the
    conducive term leaves the client the offset g - w c, whose squared size over the draws,
    ``G - 2 w X + w^2 Q``, is what enters the between-client noise (module docstring); the
    estimator stays unbiased for any per-client w (Lemma 1: the server's ``sum_s w_s
    grad log q_s`` cancels the clients' terms in expectation).

    The rule: a surrogate keeps w = 1, the paper's estimator, unless it predicts worse than
    predicting nothing (error at w = 1 above that at w = 0: ``Q - 2X > 0``) by more than
    :data:`PREDICTION_STANDARD_ERRORS` standard errors of ``Q - 2X`` over the ``points``
    draws (a client's minibatch gradients are noisy: on the benchmark's log-concave
    federations the plain comparison damped 3 of 65 and 1 of 60 clients by chance); then it
    gets the w in [0, 1] with the smallest error, ``clip(X / Q, 0, 1)`` (below 1/2, often 0:
    its conducive gradient switched off). Non-finite statistics give 0. ``prediction`` (S, 4)
    also holds ``sum_k e_k^2`` of the draws' excess errors (:func:`client_noise`).
    Returns ``(weights (S,), relative prediction errors (G - 2X + Q) / G (S,))``."""
    prediction = np.asarray(prediction, np.float64)
    squared, cross, surrogate, excess_squares = prediction.T
    finite = np.all(np.isfinite(prediction), axis=1)
    excess = surrogate - 2.0 * cross
    with np.errstate(divide="ignore", invalid="ignore"):
        least_squares = np.clip(np.where(surrogate > 0, cross / surrogate, 1.0), 0.0, 1.0)
        relative = (squared - 2.0 * cross + surrogate) / squared
        # the standard error of the sum over the points from their spread
        spread = np.maximum(excess_squares - excess * excess / points, 0.0) / (points - 1)
        standard_error = np.sqrt(points * spread)
    worse = excess > PREDICTION_STANDARD_ERRORS * standard_error
    weights = np.where(worse, least_squares, 1.0)
    weights = np.where(finite, weights, 0.0)
    return weights, np.where(finite, relative, np.inf)


def scaled_noise_covariance(weights, noise: ClientNoise, local_steps: int = 1):
    """:func:`noise_covariance` of the estimator ``a + r_s / f_s`` for the probabilities
    ``weights`` (f_s), from the unscaled statistics: ``Cov_s = W_s / f_s^2`` and
    ``m_s = a + mu_s / f_s`` (``a`` cancels in the spread between clients)."""
    w = np.asarray(weights, np.float64)
    w = w / w.sum()
    within = np.asarray(noise.within, np.float64)
    scale = 1.0 / w ** 2
    within = within * scale.reshape((-1,) + (1,) * (within.ndim - 1))
    return noise_covariance(w, within, np.asarray(noise.means, np.float64) / w[:, None],
                            local_steps)


def variance_weights(noise: ClientNoise, proportional, local_steps: int = 1,
                     floor: float = VARIANCE_WEIGHTS_FLOOR) -> np.ndarray:
    """Client selection probabilities f_s that lower the estimator's noise (issue 15).

    The scheduler's f_s is free as long as the estimator divides by the same f_s (it stays
    unbiased). With the unscaled statistics ``W_s``, ``mu_s`` (:class:`ClientNoise`) the trace
    of ``C = C_within + K C_between`` is ``sum_s (tr W_s + K |mu_s|^2) / f_s - K |sum_s mu_s|^2``,
    which is smallest for ``f_s* proportional to sqrt(tr W_s + K |mu_s|^2)`` (Cauchy-Schwarz),
    the importance-sampling rule: a client is visited as often as its share of the noise.
    Returned: ``(1 - floor) f* + floor * proportional``, so that no client falls below
    ``floor`` times its size-proportional share (``proportional``: N_s / N). A client's term
    in the estimator, its minibatch gradient and its curvature ``H_s / f_s`` during a visit,
    then grows at most ``1 / floor`` times against the default, which keeps the chain within
    the stability margin ``"auto"`` leaves (the discretisation ratio is at most the tolerance,
    0.05 by default, against a limit of 1)."""
    if not 0.0 < floor <= 1.0:
        raise ValueError(f"floor must be in (0, 1], got {floor}")
    proportional = np.asarray(proportional, np.float64)
    proportional = proportional / proportional.sum()
    within = np.asarray(noise.within, np.float64)
    traces = within if within.ndim == 1 else np.trace(within, axis1=1, axis2=2)
    means = np.asarray(noise.means, np.float64)
    share = np.sqrt(np.maximum(traces, 0.0) + local_steps * np.sum(means * means, axis=1))
    if not np.all(np.isfinite(share)) or share.sum() <= 0:
        return proportional
    weights = (1.0 - floor) * share / share.sum() + floor * proportional
    return weights / weights.sum()


def _extreme_eigenvalues(matrix) -> tuple:
    matrix = np.asarray(matrix, np.float64)
    if matrix.ndim == 1:
        return float(np.min(matrix)), float(np.max(matrix))
    if not np.all(np.isfinite(matrix)):
        # no eigenvalues of a matrix with inf/nan (LAPACK fails to converge): infinite, which
        # choose_step_size turns into an error naming step_size='auto'
        return float("nan"), float("inf")
    values = np.linalg.eigvalsh(0.5 * (matrix + matrix.T))
    return float(values[0]), float(values[-1])


def predict(step_size: float, precision, covariance) -> StepSizeChoice:
    """What ``step_size`` implies for a posterior of ``precision`` and estimator noise
    ``covariance`` (module docstring)."""
    low, high = _extreme_eigenvalues(precision)
    _, noise = _extreme_eigenvalues(covariance)
    h = float(step_size)
    return StepSizeChoice(
        step_size=h,
        minibatch_noise_ratio=h * max(noise, 0.0) / 4.0,
        discretisation_ratio=h * high / 4.0,
        iterations_per_effective_draw=4.0 / (h * low) if low > 0 else float("inf"),
    )


def choose_step_size(precision, covariance, tolerance: float = DEFAULT_TOLERANCE) -> StepSizeChoice:
    """The largest h whose minibatch-noise and discretisation ratios are at most ``tolerance``.

    ``precision``: the posterior's (d, d) or diagonal (d,) Laplace precision; ``covariance``:
    the estimator's noise (:func:`noise_covariance`)."""
    _, high = _extreme_eigenvalues(precision)
    _, noise = _extreme_eigenvalues(covariance)
    scale = max(high, noise, np.finfo(np.float64).tiny)
    if not np.isfinite(scale):
        raise ValueError(
            "step_size='auto': the clients' curvature or gradient noise is not finite; "
            "check the model and init, or give step_size a number"
        )
    return predict(4.0 * tolerance / scale, precision, covariance)


def step_for_ratio(choice: StepSizeChoice, ratio: float = 1.0) -> Optional[float]:
    """The h at which the minibatch-noise ratio of ``choice`` equals ``ratio``."""
    if choice.minibatch_noise_ratio <= 0:
        return None
    return choice.step_size * ratio / choice.minibatch_noise_ratio


# ----------------------------------------------------------------------------- the set-up's choices
# One decision logic for every engine: ``fedmcmc.langevin.setup`` asks the clients for their
# statistics (mapped over the federation's layout in process, or each computed by its client
# on Ray: ``setup.InProcessClients``, ``setup.MessagePassingClients``) and gives these
# functions the same replies either way.


class StepSizeWarning(UserWarning):
    """A given step size lets minibatch noise dominate the injected noise."""


def noise_points(center, precision, key):
    """The :data:`NOISE_POINTS_PER_CLIENT` draws of the Laplace fit (center, precision) at which
    every client measures its within-client noise, from ``fold_in(key, 2**16)`` (client s
    measures with ``fold_in(key, s)``)."""
    center = jnp.asarray(center)
    return laplace_points(center, jnp.asarray(precision, center.dtype),
                          rng.fold_in_compiled(key, 2**16), NOISE_POINTS_PER_CLIENT)


def check_selection(selection: Optional[str], weights_given: bool) -> None:
    """``client_selection="variance"`` chooses f_s; weights the user gave cannot be kept too."""
    if selection == "variance" and weights_given:
        raise ValueError(
            "client_selection='variance' chooses f_s itself, but the federation has "
            "weights given by the user; drop one of the two")


def candidate_variates(requested: Optional[str], automatic: bool) -> List[str]:
    """The control-variate anchors whose noise the clients measure: the one asked for
    ("global", "client" or "none"), or, automatic (``None`` under ``step_size="auto"``),
    none and the global anchor. Client anchors lost to the global one wherever measured
    (docs/guide/step-sizes.md, the set-up's h with each forced: FSGLD on Exam by school 468x
    against 9.9x the step size of none, on Contraception by district 246x against 3.6x;
    DSGLD 1.08x / 1.35x against 1.08x / 1.30x): at the global posterior a client's own mode
    is far from theta for heterogeneous clients, and the noise of a control variate grows
    with |theta - theta*|."""
    if requested or not automatic:
        return [requested or "none"]
    return ["none", "global"]


def choose_settings(noises: Dict[str, ClientNoise], precision, proportional, *, step_size,
                    tolerance: float, local_steps: int, selection: Optional[str],
                    weights_given: bool, name: str, info: dict,
                    request: Optional[run_length.RunRequest] = None,
                    offset: Optional[float] = None):
    """``"auto"`` or the check of a given h, the control variates and the client selection,
    from the clients' noise statistics of the unscaled part of their estimator (one
    :class:`ClientNoise` per candidate anchor of :func:`candidate_variates`).

    Automatic choices (``None``, under ``step_size="auto"``): the anchor and f_s
    ("variance" or the federation's ``proportional``) that allow the largest h, a control
    variate only if it more than doubles h (it costs a second gradient per row), "variance"
    only if it gives at least 1.25x. ``info`` records what was chosen. ``request`` and
    ``offset`` (the run's length as asked, the chains' initial offset in posterior sds):
    the budget of an ``"auto"`` h (:func:`resolve_step_size`), applied to the anchor and f_s
    chosen. Returns ``(anchor kind, f_s or None, h)``."""
    proportional = np.asarray(proportional, np.float64)
    precision = np.asarray(precision)
    automatic = isinstance(step_size, str)
    if selection is None:
        selection = None if automatic and not weights_given else "proportional"

    def choose(noise):
        """(f_s or None, h under "auto", every candidate's h) for one anchor's statistics."""
        candidates = {"proportional": None}
        if selection in (None, "variance"):
            candidates["variance"] = variance_weights(noise, proportional, local_steps)
        steps = {label: choose_step_size(
            precision, scaled_noise_covariance(proportional if f is None else f, noise,
                                               local_steps), tolerance).step_size
            for label, f in candidates.items()}
        if selection is None:
            label = "variance" if steps["variance"] / steps["proportional"] >= 1.25 \
                else "proportional"
        else:
            label = selection
        return candidates[label], steps[label], steps

    kinds = list(noises)
    chosen = {kind: choose(noises[kind]) for kind in kinds}
    if len(kinds) > 1:
        plain = chosen["none"][1]
        info["control_variates_step_gain"] = {
            k: chosen[k][1] / plain for k in kinds if k != "none"}
        best = max(kinds[1:], key=lambda k: chosen[k][1])
        kind = best if chosen[best][1] > 2.0 * plain else "none"
    else:
        kind = kinds[0]
    client_weights, _, steps = chosen[kind]
    if "variance" in steps:
        info["client_selection_step_gain"] = steps["variance"] / steps["proportional"]
    info["control_variates"] = False if kind == "none" else kind
    info["client_selection"] = "proportional" if client_weights is None else "variance"
    if client_weights is not None:
        info["client_weights"] = client_weights.tolist()
    covariance = scaled_noise_covariance(
        proportional if client_weights is None else client_weights, noises[kind], local_steps)
    h = resolve_step_size(step_size, tolerance, precision, covariance, name, info,
                          request=request, offset=offset)
    return kind, client_weights, h


def relaxation_time(step_size, precision) -> Optional[float]:
    """The relaxation time, in iterations, of the slowest direction of the chain with step
    ``step_size`` on a posterior of ``precision``: ``2 / (h lambda_min(P))`` (half the
    :attr:`StepSizeChoice.iterations_per_effective_draw` of :func:`predict`;
    :mod:`fedmcmc.run_length`). ``None`` for a schedule (its h changes during the run)."""
    if callable(step_size) or isinstance(step_size, str):
        return None
    low, _ = _extreme_eigenvalues(precision)
    if not low > 0:
        return float("inf")
    return 2.0 / (float(step_size) * low)


def initial_offset(theta0, center, precision) -> float:
    """How far the chains start from the posterior, in posterior sds along the Laplace fit
    (``center``, ``precision``: (d, d) or diagonal (d,)): ``sqrt((theta0 - m)^T P (theta0 - m))``,
    what ``burn_in="auto"`` needs (:func:`fedmcmc.run_length.burn_in_relaxations`)."""
    offset = np.asarray(theta0, np.float64) - np.asarray(center, np.float64)
    precision = np.asarray(precision, np.float64)
    if precision.ndim == 1:
        squared = float(np.sum(precision * offset * offset))
    else:
        squared = float(offset @ precision @ offset)
    return float(np.sqrt(max(squared, 0.0)))


def budget_ceilings(precision, covariance) -> tuple:
    """The two ceilings of the budget rule (:func:`fedmcmc.run_length.budget_step_size`) for
    an ``"auto"`` h: the accuracy ceiling, the h at which the predicted variance inflation
    ``minibatch_noise_ratio + discretisation_ratio`` of :func:`predict` (both linear in h)
    reaches :data:`fedmcmc.run_length.BUDGET_TOLERANCE`; and the stability ceiling, the h
    whose discretisation ratio is :data:`STABILITY_DISCRETISATION_RATIO`
    (``h lambda_max(P) = 2``)."""
    _, high = _extreme_eigenvalues(precision)
    _, noise = _extreme_eigenvalues(covariance)
    high = max(high, np.finfo(np.float64).tiny)
    inflation_per_h = (max(noise, 0.0) + high) / 4.0
    accuracy = run_length.BUDGET_TOLERANCE / inflation_per_h
    stability = 4.0 * STABILITY_DISCRETISATION_RATIO / high
    return accuracy, stability


def resolve_step_size(step_size, tolerance, precision, covariance, name: str, info: dict, *,
                      request: Optional[run_length.RunRequest] = None,
                      offset: Optional[float] = None):
    """Resolve ``"auto"`` or check a given h (a warning when minibatch noise dominates);
    record the choice in ``info``; returns the h the kernel uses (or the schedule).

    ``"auto"`` with ``request`` (the run's length as asked; ``offset``: the chains' initial
    offset in posterior sds) obeys the budget (:func:`fedmcmc.run_length.budget_step_size`,
    ceilings :func:`budget_ceilings`, relaxation time :func:`relaxation_time`): the h that
    meets ``tolerance`` is kept unless the run cannot afford its relaxation time; then it is
    raised as the rule says, with a :class:`~fedmcmc.run_length.RunLengthWarning`.
    ``info`` records the exact h (``step_size_exact``), the h used (``step_size``) and its
    ratios, ``step_size_budget_reason`` (``None`` when kept) and the predicted variance
    inflation at the h used (``predicted_variance_inflation``)."""
    if isinstance(step_size, str):
        choice = choose_step_size(precision, covariance, tolerance)
        exact = choice.step_size
        used, reason = exact, None
        if request is not None:
            accuracy, stability = budget_ceilings(precision, covariance)
            used, reason = run_length.budget_step_size(
                exact, lambda h: relaxation_time(h, precision), request,
                accuracy_ceiling=accuracy, stability_ceiling=stability,
                initial_offset=offset)
            choice = predict(used, precision, covariance)
        inflation = choice.minibatch_noise_ratio + choice.discretisation_ratio
        info.update(choice.info(), step_size_auto=True, step_size_tolerance=tolerance,
                    step_size_exact=float(exact), step_size_budget_reason=reason,
                    predicted_variance_inflation=float(inflation))
        if reason is not None:
            run_length.warn_step_raised(
                name, tolerance, exact, used, reason, inflation,
                relaxation_time(used, precision),
                f" (minibatch noise {choice.minibatch_noise_ratio:.3g}, discretisation "
                f"{choice.discretisation_ratio:.3g})")
        return used
    if callable(step_size):
        return step_size
    choice = predict(step_size, precision, covariance)
    info.update({k: v for k, v in choice.info().items() if k != "step_size"})
    if choice.minibatch_noise_ratio > 1:
        better = step_for_ratio(choice, tolerance)
        warnings.warn(
            f"{name}: step_size={step_size:g} makes minibatch noise {choice.minibatch_noise_ratio:.3g}x "
            f"the injected noise (posterior variances inflated about that much); "
            f"step_size={better:.3g} brings the ratio to {tolerance:g}, or pass step_size='auto'",
            StepSizeWarning, stacklevel=user_stacklevel())
    if choice.discretisation_ratio >= 1:
        # (h/4) lambda_max(P) >= 1: h lambda_max >= 4, past the stability limit of the
        # discretised dynamics along the stiffest direction; no safeguard on the conducive
        # term can hold such a chain (the data term alone makes it explode)
        stable = 4.0 * step_size / (4.0 * choice.discretisation_ratio)
        warnings.warn(
            f"{name}: step_size={step_size:g} gives (h/4) lambda_max = "
            f"{choice.discretisation_ratio:.3g} for the posterior's largest curvature: above "
            f"the stability limit h < 4 / lambda_max = {stable:.3g}, the chain will likely "
            f"diverge; pass "
            f"step_size='auto' or a step below {stable:.3g}",
            StepSizeWarning, stacklevel=user_stacklevel())
    return step_size
