"""Diagnostics of the decentralised samplers and the exact oracle for linear-Gaussian models.

* :func:`consensus_error`, :func:`gradient_error`, :func:`agent_draws` work on
  arrays of agents' states (numpy), e.g. ``result.info["agent_samples"]``.
* For a model whose local energies are quadratic,
  ``grad E_i(w) = A_i w - b_i`` (Gaussian likelihoods and prior, linear
  regression with known noise), the full-batch DULA and GT-DULA recursions
  are linear with additive Gaussian noise. Their stationary distribution is
  Gaussian with a covariance that solves a discrete Lyapunov equation
  (:func:`stationary_distribution`); from it follow the asymptotic KL of the
  network average to the posterior, the expected consensus error and the
  expected gradient error -- the "analytical" curves of the paper's
  Figures 1-2, and the tests' oracle.

The GT-DULA recursion is written in the coordinates (w, e) with
e = d - g_hat(w): then e_{k+1} = W_gamma e_k - gamma (L (x) I)(A w_k - b) and the
tracking invariant says sum_i e_i = 0, so e lives in the (n-1) d dimensional
subspace orthogonal to 1 (x) I; on it the recursion has no unit eigenvalue and
the Lyapunov equation has a unique solution.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

__all__ = [
    "consensus_error",
    "gradient_error",
    "agent_draws",
    "QuadraticProblem",
    "quadratic_terms",
    "gaussian_mean_problem",
    "gaussian_mean_minibatch_noise",
    "StationaryDistribution",
    "stationary_distribution",
    "gaussian_kl",
    "kl_trajectory",
]


# -------------------------------------------------------------- from draws
def consensus_error(agent_positions: np.ndarray) -> np.ndarray:
    """(1/n) sum_i ||w_i - w_bar||^2 over the agent axis -2 of ``(..., n, d)`` arrays."""
    x = np.asarray(agent_positions, dtype=np.float64)
    centred = x - x.mean(axis=-2, keepdims=True)
    return (centred**2).sum(axis=(-2, -1)) / x.shape[-2]


def gradient_error(trackers: np.ndarray, global_gradient: np.ndarray) -> np.ndarray:
    """||d - 1 (x) u_bar|| (section 4.3): trackers ``(..., n, d)``, u_bar ``(..., d)``."""
    d = np.asarray(trackers, dtype=np.float64)
    u = np.asarray(global_gradient, dtype=np.float64)[..., None, :]
    return np.sqrt(((d - u) ** 2).sum(axis=(-2, -1)))


def agent_draws(result, agent: Optional[int] = None):
    """The per-agent draws of a DULA/GT-DULA result: the pytree of
    ``(chains, num_samples, n_agents, *leaf_shape)`` arrays, or agent ``agent``'s
    ``(chains, num_samples, *leaf_shape)`` slice."""
    import jax

    tree = result.info["agent_samples"]
    if agent is None:
        return tree
    return jax.tree_util.tree_map(lambda leaf: np.asarray(leaf)[:, :, agent], tree)


# ---------------------------------------------------------- quadratic models
@dataclasses.dataclass(frozen=True)
class QuadraticProblem:
    """Local energies grad E_i(w) = A[i] w - b[i]; A: (n, d, d), b: (n, d)."""

    A: np.ndarray
    b: np.ndarray

    @property
    def n(self) -> int:
        return int(self.A.shape[0])

    @property
    def dim(self) -> int:
        return int(self.A.shape[1])

    def posterior(self):
        """The exact posterior N(mean, cov): precision sum_i A_i, mean = precision^{-1} sum_i b_i."""
        precision = self.A.sum(axis=0)
        cov = np.linalg.inv(precision)
        cov = 0.5 * (cov + cov.T)
        return cov @ self.b.sum(axis=0), cov


def quadratic_terms(model, federation, init) -> QuadraticProblem:
    """A_i (Hessian) and b_i of the local energies of a model whose log densities are quadratic.

    E_i(w) = -log p(X_i | w) - (1/n) log p(w), differentiated in float64 at w = 0
    (the Hessian is constant for such models; nothing checks that it is). One
    compiled program for all agents (``vmap`` over the padded layout).
    """
    import jax
    import jax.numpy as jnp

    with jax.enable_x64(True):
        as64 = lambda x: jnp.asarray(x, jnp.float64) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating) else jnp.asarray(x)  # noqa: E731
        flat_model = model.flatten(jax.tree_util.tree_map(as64, init))
        padded = federation.padded()
        data = jax.tree_util.tree_map(as64, padded.data)
        mask = jnp.asarray(padded.mask, jnp.float64)
        n = federation.num_clients
        theta0 = jnp.zeros(flat_model.dim, dtype=jnp.float64)

        def energy(theta, data, mask):
            return -flat_model.log_likelihood_sum(theta, data, mask) - flat_model.log_prior(theta) / n

        @jax.jit
        def terms(data, mask):
            hessian = jax.vmap(jax.hessian(energy), in_axes=(None, 0, 0))(theta0, data, mask)
            gradient = jax.vmap(jax.grad(energy), in_axes=(None, 0, 0))(theta0, data, mask)
            return hessian, -gradient

        A, b = terms(data, mask)
        return QuadraticProblem(A=np.asarray(A, np.float64), b=np.asarray(b, np.float64))


def gaussian_mean_problem(data: Sequence[np.ndarray], sigmas: Sequence[float], sigma_theta: float) -> QuadraticProblem:
    """The 1-D Gaussian problem of section 5.1: theta ~ N(0, sigma_theta^2),
    agent i's x ~ N(theta, sigma_i^2): A_i = M_i / sigma_i^2 + 1/(n sigma_theta^2),
    b_i = sum(x_i) / sigma_i^2."""
    n = len(data)
    A = np.array([[[len(x) / s**2 + 1.0 / (n * sigma_theta**2)]] for x, s in zip(data, sigmas)])
    b = np.array([[np.sum(x) / s**2] for x, s in zip(data, sigmas)])
    return QuadraticProblem(A=A, b=b)


def gaussian_mean_minibatch_noise(data: Sequence[np.ndarray], sigmas: Sequence[float], batch_size: int) -> np.ndarray:
    """(n, 1, 1) covariances of the minibatch noise of the section 5.1 estimator with m rows
    drawn with replacement (as ``batch_size`` does): (M_i^2 / m) var(x_i) / sigma_i^4, with
    var the population variance of agent i's data; 0 when m >= M_i (all rows are used)."""
    out = []
    for x, s in zip(data, sigmas):
        x = np.asarray(x, dtype=np.float64)
        size = x.shape[0]
        variance = 0.0 if batch_size >= size else size**2 / batch_size * x.var() / s**4
        out.append([[variance]])
    return np.asarray(out)


# ------------------------------------------------------------------- oracle
@dataclasses.dataclass(frozen=True)
class StationaryDistribution:
    """The stationary law of a full-batch DULA / GT-DULA run on a quadratic problem.

    ``mean``/``cov`` are those of the stacked agents (n d); ``average_*`` those of
    the network average w_bar; ``kl`` = KL(N(average) || posterior);
    ``consensus_error`` = E[(1/n) sum_i ||w_i - w_bar||^2];
    ``gradient_error_sq`` = E||d - 1 (x) u_bar||^2 (d = grad E_i(w_i) for DULA).
    ``spectral_radius`` < 1 is required for a stationary law to exist.
    """

    mean: np.ndarray
    cov: np.ndarray
    average_mean: np.ndarray
    average_cov: np.ndarray
    kl: float
    consensus_error: float
    gradient_error_sq: float
    spectral_radius: float


def gaussian_kl(mean_p, cov_p, mean_q, cov_q) -> float:
    """KL(N(mean_p, cov_p) || N(mean_q, cov_q))."""
    mean_p, mean_q = np.atleast_1d(mean_p), np.atleast_1d(mean_q)
    cov_p, cov_q = np.atleast_2d(cov_p), np.atleast_2d(cov_q)
    k = mean_p.shape[0]
    inv_q = np.linalg.inv(cov_q)
    diff = mean_q - mean_p
    _, logdet_p = np.linalg.slogdet(cov_p)
    _, logdet_q = np.linalg.slogdet(cov_q)
    return float(0.5 * (np.trace(inv_q @ cov_p) + diff @ inv_q @ diff - k + logdet_q - logdet_p))


def _orthonormal_complement_of_ones(n: int) -> np.ndarray:
    """V (n, n-1): orthonormal columns orthogonal to the all-ones vector."""
    q, _ = np.linalg.qr(np.column_stack([np.ones(n), np.eye(n)[:, : n - 1]]))
    return q[:, 1:]


def _recursion(problem: QuadraticProblem, laplacian: np.ndarray, step_size: float, beta: float,
               gamma: Optional[float], gradient_noise: Optional[np.ndarray] = None):
    """(F, c, Q, ...) of the recursion z_{k+1} = F z_k + c + noise, noise ~ N(0, Q).

    ``gradient_noise``: (n, d, d) covariances of additive, state-independent noise eps_i
    in the local gradient estimates (minibatches of a Gaussian-mean model). The estimate
    g_hat_k = A w_k - b + eps_k enters the w update of step k and, for GT-DULA, the
    e update (e_{k+1} = W_gamma e_k - gamma (L (x) I) g_hat_k) with the same eps_k.
    """
    import scipy.linalg  # here, not at import: `import fedmcmc` does without scipy

    A_blocks, b_blocks = np.asarray(problem.A, np.float64), np.asarray(problem.b, np.float64)
    n, dim = problem.n, problem.dim
    lap = np.asarray(laplacian, dtype=np.float64)
    if lap.shape != (n, n):
        raise ValueError(f"laplacian has shape {lap.shape}, expected ({n}, {n})")
    alpha = float(step_size)
    eye_d = np.eye(dim)
    A = scipy.linalg.block_diag(*A_blocks)
    b = b_blocks.reshape(-1)
    W_beta = np.kron(np.eye(n) - beta * lap, eye_d)
    L = np.kron(lap, eye_d)
    nd = n * dim
    if gamma is None:
        F = W_beta - alpha * n * A
        c = alpha * n * b
        G = np.eye(nd)
        U = None
    else:
        V = _orthonormal_complement_of_ones(n)
        U = np.kron(V, eye_d)
        W_gamma = np.kron(np.eye(n) - gamma * lap, eye_d)
        F = np.block(
            [
                [W_beta - alpha * n * A, -alpha * n * U],
                [-gamma * U.T @ L @ A, U.T @ W_gamma @ U],
            ]
        )
        c = np.concatenate([alpha * n * b, gamma * U.T @ L @ b])
        G = np.vstack([np.eye(nd), np.zeros((U.shape[1], nd))])
    Q = G @ (2 * alpha * n * np.eye(nd)) @ G.T
    if gradient_noise is not None:
        noise = np.asarray(gradient_noise, dtype=np.float64)
        if noise.shape != (n, dim, dim):
            raise ValueError(f"gradient_noise must have shape ({n}, {dim}, {dim}), got {noise.shape}")
        H = -alpha * n * np.eye(nd)
        if gamma is not None:
            H = np.vstack([H, -gamma * U.T @ L])
        Q = Q + H @ scipy.linalg.block_diag(*noise) @ H.T
    return F, c, Q, nd, A, U


def stationary_distribution(
    problem: QuadraticProblem,
    laplacian: np.ndarray,
    step_size: float,
    beta: float,
    gamma: Optional[float] = None,
    gradient_noise: Optional[np.ndarray] = None,
) -> StationaryDistribution:
    """Exact stationary distribution of full-batch DULA (``gamma=None``) or GT-DULA.

    The recursion z_{k+1} = F z_k + c + G xi_k, xi_k ~ N(0, 2 alpha n I) has
    stationary mean (I - F)^{-1} c and covariance S = F S F^T + G (2 alpha n) G^T,
    solved with ``scipy.linalg.solve_discrete_lyapunov``.

    ::

        DULA (3):      z = w, F = W_beta (x) I - alpha n A, c = alpha n b.
        GT-DULA (7-8): z = (w, y) with e = d - g_hat(w) = (V (x) I) y,
                       F = [[W_beta (x) I - alpha n A, -alpha n U],
                            [-gamma U^T (L (x) I) A,   U^T (W_gamma (x) I) U]],
                       c = (alpha n b, gamma U^T (L (x) I) b), U = V (x) I.

    ``gradient_noise`` (n, d, d): covariances of additive minibatch noise in the local
    gradient estimates (exact for Gaussian-mean models, see
    :func:`gaussian_mean_minibatch_noise`); None for full-batch gradients. For GT-DULA the
    gradient error then includes the noise of the tracked estimates; for DULA it is
    measured with exact local gradients, as ``fm.DULA`` records it.

    Raises ``ValueError`` if the recursion is unstable (spectral radius >= 1).
    """
    A_blocks, b_blocks = np.asarray(problem.A, np.float64), np.asarray(problem.b, np.float64)
    n, dim = problem.n, problem.dim
    alpha = float(step_size)
    eye_d = np.eye(dim)
    F, c, Q, nd, A, U = _recursion(problem, laplacian, step_size, beta, gamma, gradient_noise)
    radius = float(np.max(np.abs(np.linalg.eigvals(F))))
    if not radius < 1:
        raise ValueError(
            f"step_size={alpha:g}, beta={beta:g}"
            + (f", gamma={gamma:g}" if gamma is not None else "")
            + f": the recursion is unstable (spectral radius {radius:.6g} >= 1); no stationary law"
        )
    mean = np.linalg.solve(np.eye(F.shape[0]) - F, c)
    import scipy.linalg  # not at import (see _recursion)

    cov = scipy.linalg.solve_discrete_lyapunov(F, Q)
    cov = 0.5 * (cov + cov.T)

    # network average w_bar = P w
    P = np.zeros((dim, F.shape[0]))
    P[:, :nd] = np.kron(np.ones((1, n)) / n, eye_d)
    avg_mean, avg_cov = P @ mean, P @ cov @ P.T
    post_mean, post_cov = problem.posterior()
    kl = gaussian_kl(avg_mean, avg_cov, post_mean, post_cov)

    # consensus error: (1/n) ||(M (x) I) w||^2, M = I - 11^T/n
    C = np.zeros((nd, F.shape[0]))
    C[:, :nd] = np.kron(np.eye(n) - np.ones((n, n)) / n, eye_d)
    consensus = (np.trace(C @ cov @ C.T) + np.sum((C @ mean) ** 2)) / n

    # gradient error: d - 1 (x) u_bar with d = e + A w - b, u_bar = A_bar w_bar - b_bar
    A_bar = A_blocks.mean(axis=0)
    b_bar = b_blocks.mean(axis=0)
    H = np.zeros((nd, F.shape[0]))
    H[:, :nd] = A - np.kron(np.ones((n, 1)), A_bar) @ P[:, :nd]
    if gamma is not None:
        H[:, nd:] = U
    h = -b_blocks.reshape(-1) + np.kron(np.ones(n), b_bar)
    grad_err = float(np.trace(H @ cov @ H.T) + np.sum((H @ mean + h) ** 2))
    if gamma is not None and gradient_noise is not None:
        grad_err += float(sum(np.trace(c_i) for c_i in np.asarray(gradient_noise)))
    return StationaryDistribution(
        mean=mean[:nd],
        cov=cov[:nd, :nd],
        average_mean=avg_mean,
        average_cov=avg_cov,
        kl=kl,
        consensus_error=float(consensus),
        gradient_error_sq=grad_err,
        spectral_radius=radius,
    )


def kl_trajectory(
    problem: QuadraticProblem,
    laplacian: np.ndarray,
    step_size: float,
    beta: float,
    gamma: Optional[float] = None,
    init: Optional[np.ndarray] = None,
    iterations: int = 1000,
    every: int = 10,
    gradient_noise: Optional[np.ndarray] = None,
):
    """KL(law of w_bar_k || posterior) for k = 0, every, 2 every, ..., ``iterations``: the
    "analytical" curves of Figure 1(a), from the exact moment recursion
    m_{k+1} = F m_k + c, S_{k+1} = F S_k F^T + Q, every agent starting at ``init``
    (default 0) and, for GT-DULA, d_0 = g_hat_0 (e_0 = 0).

    Returns ``(ks, kl)`` arrays.
    """
    n, dim = problem.n, problem.dim
    F, c, Q, nd, _, _ = _recursion(problem, laplacian, step_size, beta, gamma, gradient_noise)
    start = np.zeros(dim) if init is None else np.asarray(init, np.float64).reshape(dim)
    mean = np.zeros(F.shape[0])
    mean[:nd] = np.tile(start, n)
    cov = np.zeros_like(F)
    P = np.zeros((dim, F.shape[0]))
    P[:, :nd] = np.kron(np.ones((1, n)) / n, np.eye(dim))
    post_mean, post_cov = problem.posterior()
    ks, kls = [], []
    for k in range(iterations + 1):
        if k % every == 0:
            avg_cov = P @ cov @ P.T
            if k == 0:
                kls.append(np.inf)  # a point mass
            else:
                kls.append(gaussian_kl(P @ mean, avg_cov, post_mean, post_cov))
            ks.append(k)
        mean = F @ mean + c
        cov = F @ cov @ F.T + Q
    return np.asarray(ks), np.asarray(kls)
