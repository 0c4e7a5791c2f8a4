"""Server-side preparation: federated Newton (mode, Laplace reference), control-variate anchors.

Each Newton round every worker sends the gradient and Hessian of its own
potential at the current point (d + d^2 floats); the server adds the prior's,
takes a damped (Levenberg-Marquardt) step and broadcasts the new point.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from ..cache import jit_with_constants_as_arguments
from .bounds import auto_worker_bounds, whitened_bound, worker_hessian_bounds

__all__ = ["federated_newton", "newton", "potential_programs", "worker_gradients",
           "worker_newton_terms", "worker_summaries", "LocalWorkers"]


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
                     chol=None, x_star=None, coordinates_fn=None):
    """What each worker computes from its own data before sampling (stacked over the
    workers of ``padded``; a distributed worker calls it on its own data alone):

    * ``q (M, d, d)``, ``l (M,)``: bounds on the Hessian of its potential (Appendix A) --
      from the model's per-example ``hessian_bound`` (``mode="hessian"``), estimated at
      ``theta0`` times ``safety`` (``"estimate"``), or zero (``"exact"``, ``"custom"``);
    * ``lw (M,)``: the bound whitened by the Boomerang reference (``chol``: its Cholesky factor);
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
    ``_FedPDMP.build`` asks of them. ``distributed.RemoteWorkers`` answers the same
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


def newton(value_grad_hess, value, theta0, max_rounds=200, tol=1e-12):
    """Damped Newton on a potential given by oracles ``value_grad_hess(x) -> (U, grad, Hess)``
    and ``value(x) -> U`` (each a sum over the workers plus the prior).

    Returns ``(mode, hessian at the mode, rounds)``.
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
    return x, np.asarray(h, dtype=np.float64), rounds


def federated_newton(flat_model, padded, theta0, max_rounds=200, tol=1e-12):
    """Mode of the posterior and the Hessian of ``U = -log posterior`` there (in process).

    Returns ``(mode, hessian, rounds)``.
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
