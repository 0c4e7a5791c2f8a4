"""Server-side preparation: federated Newton (mode, Laplace reference), control-variate anchors.

Each Newton round every worker sends the gradient and Hessian of its own
potential at the current point (d + d^2 floats); the server adds the prior's,
takes a damped (Levenberg-Marquardt) step and broadcasts the new point.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["federated_newton", "worker_gradients"]


def worker_gradients(flat_model, padded, theta):
    """``(M, d)`` gradients of the workers' data potentials ``-sum log p(x_i | theta)``."""

    def one(data_m, mask_m):
        return -jax.grad(lambda th: flat_model.log_likelihood_sum(th, data_m, mask_m))(theta)

    return jax.vmap(one)(padded.data, padded.mask)


def federated_newton(flat_model, padded, theta0, max_rounds=200, tol=1e-12):
    """Mode of the posterior and the Hessian of ``U = -log posterior`` there.

    Returns ``(mode, hessian, rounds)``.
    """

    def potential(th):
        def one(data_m, mask_m):
            return -flat_model.log_likelihood_sum(th, data_m, mask_m)

        return jnp.sum(jax.vmap(one)(padded.data, padded.mask)) - flat_model.log_prior(th)

    value_grad_hess = jax.jit(lambda th: (potential(th), jax.grad(potential)(th), jax.hessian(potential)(th)))
    value = jax.jit(potential)
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
            x_new = x - jnp.asarray(step)
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
