"""The set-up of a Fed-PDMC run, before its chain loop: what :func:`build_sampler` makes of
an algorithm's options, the model and the federation (the same on every engine; the
workers' answers come from :class:`LocalWorkers` in process, or by messages on a
distributed engine, ``distributed.RemoteWorkers``).

* the rate bound (:func:`resolve_bound`: exact, the model's Hessian or slope bound, an
  estimate) and the workers' bounds, coordinates and control-variate gradients
  (:func:`worker_summaries`, Appendix A, Remarks 3.1 and 4.3);
* the federated Newton (:func:`newton`; the mode and Laplace fit of the Boomerang's
  reference, :func:`gaussian_reference`, of the control variates and of the run lengths):
  each Newton round every worker sends the gradient and Hessian of its own potential at the
  current point (d + d^2 floats); the server adds the prior's, takes a damped
  (Levenberg-Marquardt) step and broadcasts the new point;
* ``sample_interval="auto"`` / ``burn_in="auto"`` (:func:`resolve_run_length`, from the
  predicted relaxation time of :mod:`.relaxation`);
* the thinning (per worker or by superposition) and the gradient layout (padded or not);
* the kernel of :mod:`.federated` and the chains' initial states (:class:`BuiltSampler`).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import rng, run_length
from ..arrays import device_array
from ..cache import jit_with_constants_as_arguments
from ..callsite import user_stacklevel
from ..federation import UNPADDED_ABOVE_PADDING
from . import federated, relaxation
from .bounds import (auto_worker_bounds, prior_hessian_bounds, whitened_bound,
                     whitened_curvature_bounds, worker_curvature_bounds, loewner_matrix,
                     worker_hessian_bounds)
from .single import make_reference
from .zigzag import ZigZagSpec

__all__ = ["federated_newton", "newton", "NewtonResult", "NEWTON_CONVERGED_DECREMENT",
           "resolve_control_variates", "potential_programs", "worker_gradients",
           "worker_newton_terms", "worker_summaries", "LocalWorkers", "BuiltSampler",
           "build_sampler", "resolve_bound", "gaussian_reference", "resolve_run_length",
           "summed_slope_bound", "unpadded_workers_data_grad",
           "EXACT_UNPADDED_ABOVE_PADDING"]


def worker_gradients(flat_model, padded, theta):
    """``(M, d)`` gradients of the workers' data potentials ``-sum log p(x_i | theta)``."""

    def one(data_m, mask_m):
        return -jax.grad(lambda th: flat_model.log_likelihood_sum(th, data_m, mask_m))(theta)

    return jax.vmap(one)(padded.data, padded.mask)


def worker_newton_terms(flat_model, padded, theta):
    """``(g (M, d), H (M, d, d))``: every worker's data-potential gradient and Hessian at
    ``theta`` (what a worker sends in a Newton round), for the relaxation-time prediction
    (:mod:`.relaxation`)."""

    def one(th, data_m, mask_m):
        def potential(point):
            return -flat_model.log_likelihood_sum(point, data_m, mask_m)

        return jax.grad(potential)(th), jax.hessian(potential)(th)

    g, h = jit_with_constants_as_arguments(
        lambda th: jax.vmap(one, in_axes=(None, 0, 0))(th, padded.data, padded.mask))(theta)
    return np.asarray(g, np.float64), np.asarray(h, np.float64)


def worker_summaries(flat_model, padded, *, mode, safety, theta0, hessian_bound=None,
                     chol=None, x_star=None, coordinates_fn=None, curvature_bound=None,
                     reference_rows=None):
    """What each worker computes from its own data before sampling (stacked over the
    workers of ``padded``; a distributed worker calls it on its own data alone):

    * ``q (M, d, d)``, ``l (M,)``: bounds on the Hessian of its potential (Appendix A) --
      from the model's per-example ``hessian_bound`` (``mode="hessian"``), estimated at
      ``theta0`` times ``safety`` (``"estimate"``), or zero (``"exact"``, ``"custom"``);
    * ``lw (M,)``: the bound whitened by the Boomerang reference (``chol``: its Cholesky factor)
      of the worker's potential, which holds ``-n_m / reference_rows`` of the reference
      potential when ``reference_rows`` (N) is given (``prior="server"``/``"worker"``); with the
      model's Loewner ``curvature_bound`` (``mode="hessian"``) the tighter
      :func:`.bounds.whitened_curvature_bounds`;
    * ``coords (M, d)``: the coordinates its potential depends on (Remark 3.1);
    * ``g_ref (M, d)``: its gradient at the control-variate point ``x_star`` (Remark 4.3).
    """
    d = flat_model.dim
    M = padded.mask.shape[0]
    if mode == "hessian":
        q, l = worker_hessian_bounds(flat_model, padded, hessian_bound, d)
    elif mode == "estimate":
        q, l = auto_worker_bounds(flat_model, padded, theta0, safety)
    else:
        q, l = np.zeros((M, d, d)), np.zeros(M)
    if chol is not None:
        lw = np.array([whitened_bound(q[m], l[m], chol) for m in range(M)])
        share = np.zeros(M)
        if reference_rows is not None:  # n_m / N of -U_ref (whitened Hessian: I)
            share = np.asarray(padded.mask, np.float64).sum(axis=1) / float(reference_rows)
        if curvature_bound is not None and mode == "hessian":
            lw = whitened_curvature_bounds(worker_curvature_bounds(padded, curvature_bound, d),
                                           chol, lw, share)
        else:
            lw = lw + share
    else:
        lw = np.zeros(M)
    g_ref = np.zeros((M, d))
    if x_star is not None:
        g_ref = np.asarray(worker_gradients(flat_model, padded, x_star), np.float64)
    coords = np.ones((M, d))
    if coordinates_fn is not None:
        per_row = jax.vmap(jax.vmap(coordinates_fn))(padded.data)
        coords = np.asarray(jnp.max(per_row * padded.mask[..., None], axis=1) > 0, np.float64)
    return np.asarray(q, np.float64), np.asarray(l, np.float64), lw, coords, g_ref


class LocalWorkers:
    """In-process access to the workers (all their data in this process): what
    :func:`build_sampler` asks of them. ``distributed.RemoteWorkers`` answers the same
    questions by messages."""

    def __init__(self, flat_model, padded, sizes):
        self.flat_model = flat_model
        self.padded = padded
        self.sizes = np.asarray(sizes, np.float64)
        self.num_workers = len(self.sizes)
        self.data = padded.data
        self.mask = padded.mask
        self._newton_cache = {}

    def newton(self, theta0):
        """Federated Newton from ``theta0`` (once per point: the Boomerang's reference, the
        control variates and the relaxation time share it)."""
        key = np.asarray(theta0, np.float64).tobytes()
        if key not in self._newton_cache:
            self._newton_cache[key] = federated_newton(self.flat_model, self.padded, theta0)
        return self._newton_cache[key]

    def worker_terms(self, theta):
        """Every worker's data-potential gradient and Hessian at ``theta``."""
        return worker_newton_terms(self.flat_model, self.padded, jnp.asarray(theta, jnp.float64))

    def summaries(self, **kwargs):
        return worker_summaries(self.flat_model, self.padded, **kwargs)


#: the federated Newton has found the mode when its last Newton decrement ``g^T H^{-1} g``
#: (about twice ``U(x) - U(mode)``) is below this (``NewtonResult.converged``)
NEWTON_CONVERGED_DECREMENT = 1e-6


class NewtonResult(NamedTuple):
    """What :func:`newton` returns."""

    mode: Any  # the last point (the mode when converged)
    hessian: Any  # (d, d) Hessian of U there
    rounds: int  # Newton rounds made (each: every worker's gradient and Hessian)
    converged: bool  # the last Newton decrement is below NEWTON_CONVERGED_DECREMENT


def newton(value_grad_hess, value, theta0, max_rounds=200, tol=1e-12):
    """Damped Newton on a potential given by oracles ``value_grad_hess(x) -> (U, grad, Hess)``
    and ``value(x) -> U`` (each a sum over the workers plus the prior).

    Returns a :class:`NewtonResult` ``(mode, hessian at the mode, rounds, converged)``.
    """
    x = jnp.asarray(theta0, jnp.float64)
    damping = 1e-3
    rounds = 0
    u, g, h = value_grad_hess(x)
    d = x.shape[0]
    for _ in range(max_rounds):
        rounds += 1
        hs = np.asarray(h)
        gs = np.asarray(g)
        scale = max(np.max(np.abs(np.diag(hs))), 1e-12)
        accepted = False
        for _ in range(30):
            step = np.linalg.solve(hs + damping * scale * np.eye(d), gs)
            x_new = jnp.asarray(np.asarray(x) - step)  # on the host: no eager program
            u_new = value(x_new)
            if np.isfinite(float(u_new)) and float(u_new) <= float(u) + 1e-12 * abs(float(u)):
                accepted = True
                break
            damping *= 10.0
        if not accepted:
            break
        x = x_new
        damping = max(damping / 10.0, 1e-12)
        u, g, h = value_grad_hess(x)
        # Converged when the Newton decrement g^T H^{-1} g is negligible (a damped step can be
        # tiny far from the mode, so the step length is no criterion).
        try:
            decrement = float(np.asarray(g) @ np.linalg.solve(np.asarray(h), np.asarray(g)))
        except np.linalg.LinAlgError:
            decrement = np.inf
        if 0 <= decrement < tol:
            break
    try:
        decrement = float(np.asarray(g) @ np.linalg.solve(np.asarray(h), np.asarray(g)))
    except np.linalg.LinAlgError:
        decrement = np.inf
    converged = bool(np.isfinite(decrement) and 0 <= decrement < NEWTON_CONVERGED_DECREMENT)
    return NewtonResult(x, np.asarray(h, dtype=np.float64), rounds, converged)


def federated_newton(flat_model, padded, theta0, max_rounds=200, tol=1e-12):
    """Mode of the posterior and the Hessian of ``U = -log posterior`` there (in process).

    Returns a :class:`NewtonResult`.
    """

    def potential(th):
        def one(data_m, mask_m):
            return -flat_model.log_likelihood_sum(th, data_m, mask_m)

        return jnp.sum(jax.vmap(one)(padded.data, padded.mask)) - flat_model.log_prior(th)

    return newton(*potential_programs(potential), theta0, max_rounds, tol)


def potential_programs(potential):
    """``(value_grad_hess, value)``, the compiled programs :func:`newton` calls, of a potential
    ``theta -> U`` (the pooled one in process, a worker's own or the prior's on the distributed
    engines). What ``potential`` closes over (the rows) is an argument of the programs
    (``fm.cache.jit_with_constants_as_arguments``): another data set of these shapes, or
    another run in the process, the same programs."""
    value_grad_hess = jit_with_constants_as_arguments(
        lambda th: (potential(th), jax.grad(potential)(th), jax.hessian(potential)(th)))
    return value_grad_hess, jit_with_constants_as_arguments(potential)


def summed_slope_bound(per_example_bound):
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


def unpadded_workers_data_grad(flat_model, padded, sizes, reference_share=None, exact=False):
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


class BuiltSampler(NamedTuple):
    """What :func:`build_sampler` returns: the federated kernel, ready to run."""

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



def resolve_bound(algorithm, model, is_zigzag):
    """``(mode, quadratic)``: the rate bound ``algorithm.bound`` names (``"auto"`` resolved
    from the model's attributes: exact event times for a quadratic potential with linear
    dynamics, else its ``hessian_bound``, its ``zigzag_slope_bound`` (Zig-Zag), or an
    estimate), checked against what the model supplies (``ValueError``)."""
    attrs = model.attributes
    quadratic = bool(attrs.get("quadratic_potential", False))
    linear = algorithm.spec.linear
    mode = algorithm.bound
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


def resolve_control_variates(algorithm, workers_access, theta0, info):
    """``(control_variates, x_star)``: whether the rates are shifted by Remark 4.3's control
    variates (``True``, ``False`` or the reference point given) and the point they are
    centred at (``None`` when off or given). Records ``info["control_variates"]`` (on or off)
    and ``info["control_variates_reason"]``.

    ``control_variates="auto"`` (the default) turns them on where they are valid and can
    help: the shift ``s_m = grad U_m(x*) - w_m grad U(x*)`` is a constant per worker, so
    every rate bound of :mod:`.bounds` stays a bound of the shifted rate (each re-reads its
    intercept from the shifted gradient at its anchor, and its slope bounds the increment
    of the rate, which a constant does not change: Hessian bounds, the estimate, exact affine
    rates and Zig-Zag slope bounds alike), and the shifts sum to zero, so the target is
    unchanged whatever ``x*``. They help when the posterior sits near ``x*``, where every
    shifted gradient is small: ``x*`` is the federated Newton's mode (the one the Boomerang's
    reference and the run lengths use), taken only when Newton converged and the Hessian of
    ``U`` there is positive definite (a mode, the posterior log-concave enough around it).
    They stay off, with the reason recorded, when Newton does not converge or the Hessian
    is not positive definite there; with ``privacy`` (Theorem 5.1's sensitivity is that of
    the unshifted rates: the shift of every worker depends on every worker's rows); and on a
    distributed engine that drops failed workers (``on_client_failure="drop"``: the
    remaining shifts would no longer sum to zero).
    """
    cv = algorithm.control_variates
    if cv is False:
        info["control_variates"] = False
        info["control_variates_reason"] = "control_variates=False given"
        return False, None
    if not (isinstance(cv, str) and cv == "auto"):
        info["control_variates"] = True
        if cv is True:
            x_star, _, rounds, _ = workers_access.newton(theta0)
            info["control_variate_rounds"] = rounds
            info["control_variates_reason"] = "control_variates=True given"
            return True, x_star
        info["control_variates_reason"] = "reference point given"
        return cv, None

    def off(reason):
        info["control_variates"] = False
        info["control_variates_reason"] = "auto: off, " + reason
        return False, None

    if algorithm.privacy is not None:
        return off("privacy=(epsilon, delta) is set (Theorem 5.1 bounds the sensitivity of the "
                   "unshifted rates; the shift depends on every worker's rows)")
    if getattr(workers_access, "drops_workers", False):
        return off("on_client_failure='drop' (the remaining workers' shifts would no longer "
                   "sum to zero)")
    x_star, hess, rounds, converged = workers_access.newton(theta0)
    info["control_variate_rounds"] = rounds
    if not converged:
        return off(f"the federated Newton did not converge in {rounds} rounds (no mode to "
                   "centre the rates at)")
    hess = np.asarray(hess, np.float64)
    eigenvalues = np.linalg.eigvalsh(0.5 * (hess + hess.T)) if np.all(np.isfinite(hess)) \
        else np.array([np.nan])
    # positive definite to the precision of the float64 eigenvalues (a flat direction's
    # eigenvalue comes out as +-1e-16 of the largest)
    if not (np.all(np.isfinite(eigenvalues))
            and eigenvalues.min() > 1e-10 * max(np.abs(eigenvalues).max(), 1e-300)):
        return off("the Hessian of the potential at the federated Newton's point is not "
                   f"positive definite (smallest eigenvalue {eigenvalues.min():.3g})")
    info["control_variates"] = True
    info["control_variates_reason"] = (
        f"auto: on (the federated Newton converged in {rounds} rounds to a mode with a "
        "positive definite Hessian; every rate bound holds for the shifted rates)")
    return True, x_star


def gaussian_reference(reference, flat_model, newton, theta0, info):
    """The Boomerang's Gaussian reference N(mu, Sigma) (``None`` without one: Zig-Zag, BPS):
    ``reference="laplace"``: the posterior's mode and inverse Hessian, ``newton(theta0)`` (the
    federated Newton); or the pair ``(mean, cov)`` given. Records ``info["reference_mean"]``
    (and ``info["laplace_rounds"]``)."""
    if reference is None:
        return None
    d = flat_model.dim
    if isinstance(reference, str):
        mode, hess, rounds, _ = newton(theta0)
        info["laplace_rounds"] = rounds
        cov = np.linalg.inv(0.5 * (hess + hess.T))
        if not np.all(np.linalg.eigvalsh(cov) > 0):
            raise ValueError("reference='laplace': the Hessian at the mode is not positive "
                             "definite; pass reference=(mean, cov)")
        mean = np.asarray(mode)
    else:
        mean = np.asarray(reference[0], dtype=np.float64)
        cov = np.asarray(reference[1], dtype=np.float64)
        if mean.shape != (d,) or cov.shape != (d, d):
            raise ValueError(f"reference must be (mean of shape ({d},), cov of shape ({d}, {d}))")
        if not np.all(np.linalg.eigvalsh(0.5 * (cov + cov.T)) > 0):
            raise ValueError("reference cov must be positive definite")
    info["reference_mean"] = mean.tolist()
    return make_reference(mean, cov)


def resolve_run_length(algorithm, workers_access, theta0, info, *, run_request, burn_in,
                       num_samples, chains, prior_grad, reference, ref_share, g_ref, g_ref0,
                       control_variates, coords):
    """``(sample_interval, burn_in)`` with ``"auto"`` resolved (``pdmp/algorithms.py``'s module
    docstring).

    The posterior's Laplace fit comes from the federated Newton (the one the Boomerang's
    reference and the control variates use: computed once), every worker's gradient and
    Hessian at its centre from one more round of Newton terms; they are composed into
    the gradients the rates see (prior shares, the Boomerang's reference shares, the
    control-variate shifts) and :func:`.relaxation.predict` turns them into ``R``."""
    d = theta0.shape[0]
    M = workers_access.num_workers
    sizes = workers_access.sizes
    mode, hess, rounds, _ = workers_access.newton(theta0)
    mode = np.asarray(mode, np.float64)
    precision = 0.5 * (np.asarray(hess, np.float64) + np.asarray(hess, np.float64).T)
    info.setdefault("laplace_rounds", rounds)
    if not np.all(np.isfinite(precision)) or np.linalg.eigvalsh(precision).min() <= 0:
        raise ValueError(
            f"sample_interval='auto' / burn_in='auto': {algorithm.name} predicts the relaxation "
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
    prior_worker = algorithm.prior != "split"
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
        algorithm.spec.name, mode, precision,
        relaxation.WorkerTerms(g=g_hold, H=h_hold, coords=holder_coords),
        refresh_rate=algorithm.refresh_rate, rho=algorithm.rho, num_workers=M,
        reference_chol=None if reference is None else np.asarray(reference.chol))
    R = prediction.relaxation_time
    if not math.isfinite(R) or R <= 0:
        raise ValueError(
            f"sample_interval='auto' / burn_in='auto': {algorithm.name} with "
            f"refresh_rate={algorithm.refresh_rate:g} predicts no finite relaxation time (it "
            "needs refresh_rate > 0 to be ergodic); give refresh_rate > 0")
    offset = relaxation.initial_offset(theta0, mode, precision)
    auto_interval = run_length.is_auto(algorithm.sample_interval)
    interval = R if auto_interval else float(algorithm.sample_interval)
    request = run_request
    if request is None:
        request = run_length.RunRequest(num_samples=int(num_samples or 1), burn_in=burn_in,
                                        thin=1, chains=chains)
    # draws are the units (thin does not apply); the burn_in build was given
    request = request._replace(thin=1, burn_in=burn_in)

    def burn_in_for(interval_):
        return run_length.resolve(request, R / interval_, offset, name=algorithm.name,
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
            f"{algorithm.name}: {asked}{wanted_interval:.3g} ({'one relaxation time' if auto_interval else 'given'}) "
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
                               offset, name=algorithm.name, info=info)
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


def build_sampler(algorithm, model, federation, init, *, burn_in=0, chains=1, seed=0,
                  skeleton_size=0, init_jitter=0.0, rate_diagnostics=True,
                  workers_access=None, with_protocol=False, num_samples=None,
                  run_request=None):
    """The federated kernel for this model and federation, without running it (call
    under ``jax.enable_x64(True)``). Returns a :class:`BuiltSampler`; its
    ``draw_step(key, state)`` advances one chain by ``sample_interval`` (what
    :func:`run_chains` vmaps).

    ``workers_access`` answers what the server asks of the workers (Newton terms, bounds
    and the other per-worker summaries): :class:`LocalWorkers` (default, all data
    in this process) or ``distributed.RemoteWorkers`` (messages). With ``with_protocol=True``
    it also carries the :class:`~.federated.FedProtocol` pieces, the ``PriorPart`` and
    the ``Workers`` (the distributed run composes them).

    ``sample_interval="auto"`` or ``burn_in="auto"`` (with ``run_request``, a
    :class:`fedmcmc.run_length.RunRequest`) are resolved here (:func:`resolve_run_length`);
    ``config.sample_interval`` and ``config.burn_in`` hold the values used."""
    spec = algorithm.spec
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
    info: dict = {"num_workers": M, "prior_placement": algorithm.prior}

    mode, quadratic = resolve_bound(algorithm, model, is_zigzag)
    info["bound"] = mode
    on_violation = algorithm.on_bound_violation or ("error" if mode in ("hessian", "custom") else "enlarge")
    info["on_bound_violation"] = on_violation
    q0, l0 = prior_hessian_bounds(flat_model, model, theta0, algorithm.safety,
                                  auto=(mode == "estimate"))

    reference = gaussian_reference(algorithm.reference, flat_model,
                                   workers_access.newton, theta0, info)
    # The Boomerang's rates use grad(U - U_ref), U_ref the reference potential; the
    # correction -U_ref is held exactly once in total. prior="split": worker m holds
    # alpha_m (U_0 - U_ref). Otherwise U_0's own proposer holds U_0 alone and data worker
    # m holds -n_m/N U_ref (ref_share): held whole by the prior's proposer, -U_ref cancels
    # the data workers' gradients in the sum but not in the positive parts of the rates,
    # and far from mu_ref the extra reflections keep the Boomerang on its initial orbit
    # for hundreds of time units (issue 3: trajectory sd ~3x too large).
    ref_share = None
    if reference is not None and algorithm.prior != "split":
        ref_share = sizes / sizes.sum()
    ref_precision = None
    # the Boomerang's whitened bounds from the model's Loewner bounds (0 <= Hessian <= B), where
    # it gives them with its Hessian bounds: bounds.whitened_curvature_bounds (issue 48)
    curvature = attrs.get("curvature_bound") if mode == "hessian" else None
    prior_curvature = attrs.get("prior_curvature_bound") if mode == "hessian" else None
    lw0_floor = 0.0
    if reference is not None:
        lw0 = whitened_bound(q0, l0, reference.chol)
        if prior_curvature is not None:
            lw0 = float(whitened_curvature_bounds(
                loewner_matrix(prior_curvature, d, "model.prior_curvature_bound")[None],
                reference.chol, [lw0], [0.0])[0])
        if ref_share is None:
            # prior="split": worker m holds U_m + alpha_m (U_0 - U_ref), whose whitened Hessian
            # is at most u_m + alpha_m (u_0 + 1) in norm (triangle inequality); when both
            # parts are known positive semi-definite it lies between -alpha_m I and
            # (u_m + alpha_m (u_0 - 1)) I: max(alpha_m, lw_m + alpha_m lw0) with lw0 = u_0 - 1
            # and the floor 1 (FedConfig's anchors take the maximum)
            if curvature is not None and prior_curvature is not None:
                lw0, lw0_floor = lw0 - 1.0, 1.0
            else:
                lw0 = lw0 + 1.0
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
    # "auto": on where valid (resolve_control_variates records the choice and its reason).
    cv, x_star = resolve_control_variates(algorithm, workers_access, theta0, info)
    g_ref0 = np.zeros(d)
    if cv is not False:
        if cv is not True:  # the reference point given
            x_star = jnp.asarray(cv, jnp.float64)
            if x_star.shape != (d,):
                raise ValueError(f"control_variates reference point must have shape ({d},)")
        g_ref0 = np.asarray(prior_grad(x_star))
        info["control_variate_point"] = np.asarray(x_star).tolist()
    centre_distance = None  # the Boomerang's constant orbit bound (BoomerangSpec.anchor)
    if cv is not False and reference is not None:
        centre_distance = float(np.linalg.norm(np.linalg.solve(
            np.asarray(reference.chol), np.asarray(x_star, np.float64) - np.asarray(reference.mean))))

    # What each worker computes on its own data: Hessian bounds of its data potential
    # (Appendix A), whitened for the Boomerang, its coordinates (Remark 3.1) and its
    # gradient at the control-variate point.
    q, l, lw, coords, g_ref = workers_access.summaries(
        mode=mode, safety=1.0 if quadratic else algorithm.safety, theta0=theta0,
        hessian_bound=attrs.get("hessian_bound"),
        chol=None if reference is None else reference.chol, x_star=x_star,
        coordinates_fn=attrs.get("worker_coordinates"), curvature_bound=curvature,
        reference_rows=None if ref_share is None else n_total)
    if ref_share is not None and cv is not False:  # the workers' potentials hold -n_m/N U_ref
        g_ref = g_ref - np.outer(ref_share, np.asarray(ref_precision @ (x_star - reference.mean)))
    prior_part = federated.PriorPart(
        q=device_array(q0), l=device_array(l0), lw=device_array(lw0),
        g_ref=device_array(g_ref0), g_total_ref=device_array(g_ref.sum(axis=0) + g_ref0),
        lw_floor=device_array(lw0_floor))
    info["coordinates_per_worker"] = coords.sum(axis=1).astype(int).tolist()

    # Distributed workers keep their data and bounds (q is None on the server).
    workers = federated.Workers(
        data=workers_access.data,
        mask=None if workers_access.mask is None else device_array(workers_access.mask, np.float64),
        coords=device_array(coords), q=None if q is None else device_array(q),
        l=device_array(l), lw=device_array(lw),  # the reference share included
        rho=device_array(np.full((M,), algorithm.rho, np.float64)),
        cv_weight=device_array(sizes / sizes.sum()), g_ref=device_array(g_ref))

    workers_data_grad = None
    if isinstance(workers_access, LocalWorkers):
        workers_data_grad = unpadded_workers_data_grad(
            flat_model, workers_access.padded, sizes,
            None if ref_share is None else (ref_precision, reference.mean, n_total),
            exact=(mode == "exact"))
    # rows a thinning pass evaluates: the padded layout, or every worker's own rows
    info["gradient_layout"] = "padded" if workers_data_grad is None else "unpadded"

    sample_interval = algorithm.sample_interval
    if run_length.is_auto(sample_interval) or run_length.is_auto(burn_in):
        sample_interval, burn_in = resolve_run_length(
            algorithm, workers_access, theta0, info, run_request=run_request, burn_in=burn_in,
            num_samples=num_samples, chains=chains, prior_grad=prior_grad,
            reference=reference, ref_share=ref_share, g_ref=g_ref, g_ref0=g_ref0,
            control_variates=cv is not False, coords=coords)

    thinning = algorithm.thinning
    if thinning == "auto":  # the same law either way; superposition needs the data here
        thinning = "superposition" if isinstance(workers_access, LocalWorkers) else "per_worker"
    if thinning == "superposition" and not isinstance(workers_access, LocalWorkers):
        raise ValueError("thinning='superposition' runs in-process only (engine='local'); "
                         "a distributed engine thins on every worker: use thinning="
                         "'per_worker' or 'auto'")
    info["thinning"] = "exact" if mode == "exact" else thinning

    custom_slope, horizon = None, float("inf")
    if mode == "custom":
        custom_slope = summed_slope_bound(attrs["zigzag_slope_bound"])
        horizon = float(attrs.get("slope_horizon", 0.5))

    cfg = federated.FedConfig(
        spec=spec, dim=d, num_workers=M, prior_worker=algorithm.prior != "split",
        exact=(mode == "exact"), data_grad=data_grad, prior_grad=prior_grad,
        workers_data_grad=workers_data_grad, custom_slope=custom_slope, horizon=horizon,
        refresh_rate=algorithm.refresh_rate,
        redistribution_rate=algorithm.redistribution_rate, control_variates=cv is not False,
        reference=reference, max_thinning=algorithm.max_thinning,
        max_iterations_per_draw=algorithm.max_events_per_draw, skeleton_size=skeleton_size,
        sample_interval=float(sample_interval), burn_in=int(burn_in),
        rate_diagnostics=rate_diagnostics, has_excess=algorithm.rho > 0, thinning=thinning,
        centre_distance=centre_distance)
    init_fn, _, draw_step, protocol = federated.build(cfg, workers, prior_part,
                                                      with_protocol=True)

    from_reference = reference is not None and getattr(algorithm, "start", "init") == "reference"
    if reference is not None:
        info["start"] = "reference" if from_reference else "init"

    def initial_states(key, theta0):
        k_init, k_jit, k_run = rng.split_key(key, 3)
        starts = jnp.broadcast_to(theta0, (chains, d))
        if from_reference:  # FedBoomerang(start="reference"): a draw of N(mu, Sigma) per chain
            normal = jax.random.normal(rng.fold_in(k_jit, 1), (chains, d), jnp.float64)
            starts = reference.mean + normal @ jnp.asarray(reference.chol).T
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

