"""Rate bounds for Poisson thinning (Appendix A; model bounds of Appendix F).

A worker's rate along the path is bounded by ``(a + b t)_+`` with ``a`` read
off the gradient at the anchor point and ``b`` from a bound on the Hessian of
its potential (Appendix A):

* ``q``: elementwise, ``|d_ij U_m(x)| <= q_ij`` for all x (F.2: ``sum_i |xi_i xi_i^T| / 4``);
* ``l``: spectral, ``||grad^2 U_m(x)||_2 <= l`` (F.3: (nu+1)/nu sum (1 + y^2)).

Both are kept (one derived from the other when only one is given) and the
tighter slope is used. For the Boomerang the whitened bound
``||L^T H L||_2 <= l_w`` (Sigma = L L^T) is what matters.

Models supply bounds through ``fm.Model(..., **attributes)``:

``hessian_bound``
    ``example -> scalar`` (spectral) or ``(d, d)`` (elementwise) bound on the
    Hessian of ``-log p(example | theta)``; a worker sums it over its rows.
``prior_hessian_bound``
    scalar or ``(d, d)`` array bounding the Hessian of ``-log prior``.
``curvature_bound``, ``prior_curvature_bound``
    ``example -> (d, d)`` and a ``(d, d)`` array: positive semi-definite ``B`` with
    ``0 <= grad^2 (-log p(example | theta)) <= B`` (resp. of ``-log prior``) in the Loewner
    order for all theta: a log-concave likelihood of bounded curvature (logistic
    ``x x^T / 4``, linear-Gaussian ``x x^T / sigma^2``). The elementwise ``|H| <= q`` loses
    the signs of ``H``'s entries, and whitened by a correlated reference ``|| |L|^T q |L| ||``
    can be tens of times ``||L^T H L||`` (issue 48: 25-34x on the benchmark's real
    federations). With both, and ``hessian_bound``, the Boomerang's whitened bound is
    :func:`whitened_curvature_bounds`'s.
``quadratic_potential``
    ``True`` when prior and likelihood are Gaussian in theta: rates are exactly
    affine and event times are drawn by inversion, without thinning (F.1).
``zigzag_slope_bound``, ``slope_horizon``
    ``(theta, v, horizon, example) -> (d,)``: per-coordinate slope bounds of one
    example's Zig-Zag rate valid on ``[0, horizon]`` (F.4's log-Gaussian Cox bound).
``worker_coordinates``
    ``example -> (d,)`` 0/1 mask of the coordinates an example depends on;
    a worker holds the union over its rows (Remark 3.1).

Without any of these an *automatic* bound is used: ``safety * |grad^2 U_m(x_0)|``
(plus a small floor) at the initial point. It is not guaranteed, so it is
checked at every proposed event (as every bound is) and doubled when violated.
"""

from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp

from ..cache import jit_with_constants_as_arguments

__all__ = ["spectral_norm", "whitened_bound", "worker_hessian_bounds", "prior_hessian_bounds",
           "worker_curvature_bounds", "whitened_curvature_bounds", "loewner_matrix"]


def spectral_norm(matrix) -> float:
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim == 0:
        return float(abs(m))
    return float(np.linalg.norm(m, 2))


def whitened_bound(q, l, chol) -> float:
    """``min(|| |L|^T q |L| ||_2, ||Sigma||_2 l)``: bounds ``||L^T H L||_2`` when ``|H| <= q``, ``||H|| <= l``."""
    absl = np.abs(np.asarray(chol, dtype=np.float64))
    sigma_norm = spectral_norm(np.asarray(chol) @ np.asarray(chol).T)
    return min(spectral_norm(absl.T @ np.asarray(q, dtype=np.float64) @ absl), sigma_norm * float(l))


def as_bound_pair(bound, d):
    """A scalar (spectral) or matrix (elementwise) bound -> (q, l)."""
    b = np.asarray(bound, dtype=np.float64)
    if b.ndim == 0:
        if not (np.isfinite(b) and b >= 0):
            raise ValueError(f"hessian bounds must be finite and non-negative, got {b}")
        return np.full((d, d), float(b)), float(b)
    if b.shape != (d, d):
        raise ValueError(f"a matrix Hessian bound must have shape ({d}, {d}), got {b.shape}")
    if not (np.all(np.isfinite(b)) and np.all(b >= 0)):
        raise ValueError("hessian bounds must be finite and non-negative")
    return b, spectral_norm(b)


def _summed_over_rows(padded, bound_fn):
    """``(summed (M, ...), shape)``: a per-example function summed over each worker's rows."""
    # one example's shapes (no eager indexing: each would compile a program of its own)
    example = jax.tree_util.tree_map(
        lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf)[2:], leaf.dtype), padded.data)
    shape = jax.eval_shape(bound_fn, example).shape

    def summed_over_rows(data, mask):  # (M, ...): each worker's bound summed over its rows
        per_example = jax.vmap(jax.vmap(bound_fn))(data)  # (M, n, ...)
        return jnp.sum(per_example * mask.reshape(mask.shape + (1,) * len(shape)), axis=1)

    # one compiled program (not op by op), shared by runs of the same shapes
    summed = np.asarray(jit_with_constants_as_arguments(summed_over_rows)(padded.data,
                                                                          padded.mask),
                        dtype=np.float64)
    return summed, shape


def worker_hessian_bounds(flat_model, padded, bound_fn, d):
    """Per-worker ``(q (M, d, d), l (M,))`` from a per-example bound ``example -> scalar | (d, d)``."""
    summed, shape = _summed_over_rows(padded, bound_fn)
    if len(shape) == 0:
        return np.broadcast_to(summed[:, None, None], (summed.shape[0], d, d)).copy(), summed
    if tuple(shape) != (d, d):
        raise ValueError(f"model.hessian_bound must return a scalar or a ({d}, {d}) array, got {shape}")
    if np.any(summed < 0):
        raise ValueError("model.hessian_bound returned negative entries")
    return summed, np.array([spectral_norm(s) for s in summed])


def loewner_matrix(bound, d, name) -> np.ndarray:
    """A ``(d, d)`` positive semi-definite Loewner bound, a scalar ``c`` meaning ``c I``
    (``ValueError`` naming ``name`` else)."""
    b = np.asarray(bound, dtype=np.float64)
    if b.ndim == 0:
        b = float(b) * np.eye(d)
    if b.shape != (d, d) or not np.all(np.isfinite(b)):
        raise ValueError(f"{name} must be a finite ({d}, {d}) matrix, got shape {b.shape}")
    # (tolerances relative to the largest entry: float32 rows summed)
    tol = 1e-5 * np.abs(b).max()
    if not np.allclose(b, b.T, rtol=0.0, atol=tol):
        raise ValueError(f"{name} must be symmetric")
    if np.linalg.eigvalsh(0.5 * (b + b.T))[0] < -tol:
        raise ValueError(f"{name} must be positive semi-definite")
    return 0.5 * (b + b.T)


def worker_curvature_bounds(padded, curvature_fn, d) -> np.ndarray:
    """Per-worker ``B_m (M, d, d)``: the per-example Loewner bound ``curvature_fn`` summed over
    the worker's rows (``0 <= grad^2 U_m <= B_m``)."""
    summed, shape = _summed_over_rows(padded, curvature_fn)
    if tuple(shape) != (d, d):
        raise ValueError(f"model.curvature_bound must return a ({d}, {d}) array, got {shape}")
    return np.stack([loewner_matrix(b, d, "model.curvature_bound (summed over rows)")
                     for b in summed])


def whitened_curvature_bounds(curvature, chol, whitened, reference_share):
    """Bounds ``lw_m`` on ``||L^T grad^2 V_m L||_2`` for ``V_m = U_m - c_m U_ref`` (U_ref the
    Boomerang's reference potential, whitened Hessian I), from Loewner bounds
    ``0 <= grad^2 U_m <= B_m`` (``curvature (M, d, d)``) and the elementwise bound's
    whitening ``whitened (M,)`` (:func:`whitened_bound`, also a bound on the largest eigenvalue of
    ``L^T grad^2 U_m L``).

    ``0 <= L^T grad^2 U_m L <= u_m I`` with ``u_m = min(lambda_max(L^T B_m L), whitened_m)``, so
    ``L^T grad^2 V_m L`` lies between ``-c_m I`` and ``(u_m - c_m) I``: its norm is at most
    ``max(c_m, u_m - c_m)``. The triangle inequality (what an elementwise bound allows) gives
    ``u_m + c_m``: at the mode of a posterior that the reference fits, ``u_m`` is about
    ``c_m`` and the bound here about half of it (issue 48). ``reference_share (M,)``: the
    ``c_m`` (zeros: the bound on ``U_m`` alone)."""
    chol = np.asarray(chol, dtype=np.float64)
    upper = np.array([np.linalg.eigvalsh(chol.T @ b @ chol)[-1] for b in curvature])
    upper = np.minimum(np.maximum(upper, 0.0), np.asarray(whitened, np.float64))
    share = np.asarray(reference_share, np.float64)
    return np.maximum(share, upper - share)


def auto_worker_bounds(flat_model, padded, theta0, safety):
    """Automatic bound: ``safety * |Hessian of U_m at theta0|`` plus a floor, per worker."""

    def hess(data_m, mask_m):
        return jax.hessian(lambda th: -flat_model.log_likelihood_sum(th, data_m, mask_m))(theta0)

    # a program shared by runs of the same shapes (theta0 is an argument, not a constant)
    h = np.abs(np.asarray(jit_with_constants_as_arguments(jax.vmap(hess))(padded.data,
                                                                           padded.mask),
                          dtype=np.float64))
    return _floor(h, safety)


def _floor(h, safety):
    d = h.shape[-1]
    scale = np.maximum(h.max(axis=(-2, -1), keepdims=True), 1e-3)
    q = safety * (h + 1e-3 * scale * np.eye(d))
    if q.ndim == 2:
        return q, spectral_norm(q)
    return q, np.array([spectral_norm(m) for m in q])


def prior_hessian_bounds(flat_model, model, theta0, safety, auto):
    """``(q0, l0, exact_hessian_used)`` for ``U_0 = -log prior``."""
    d = flat_model.dim
    given = model.attributes.get("prior_hessian_bound")
    if given is not None and not auto:
        q, l = as_bound_pair(given, d)
        return q, l
    prior_hessian = jax.hessian(lambda th: -flat_model.log_prior(th))
    h = np.abs(np.asarray(jit_with_constants_as_arguments(prior_hessian)(theta0),
                          dtype=np.float64))
    if model.attributes.get("quadratic_potential"):
        return h, spectral_norm(h)
    if not np.any(h):
        return np.zeros((d, d)), 0.0  # flat prior: no events from U_0
    return _floor(h, safety)
