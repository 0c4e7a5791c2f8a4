"""The paper's example models with their rate bounds attached (Appendix F, E.1), and data generators.

Each ``*_model`` returns an :class:`fedmcmc.Model` whose attributes carry what
the PDMP samplers use (see :mod:`.bounds`); each ``*_data`` returns a list of
client data pytrees ready for :class:`fedmcmc.Federation`.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..model import Model

__all__ = [
    "gaussian_model", "gaussian_data", "gaussian_posterior",
    "logistic_model", "logistic_data",
    "ar1_model", "ar1_data",
    "lgcp_model", "lgcp_data", "grid_precision",
    "split_by_projection",
]


# ------------------------------------------------------------ F.1 Gaussian
def gaussian_model(likelihood_cov, prior_mean=None, prior_cov=None) -> Model:
    """Observations ``y_i ~ N(x, S)`` with prior ``x ~ N(m0, S0)`` (flat if ``prior_cov`` is None).

    The posterior is Gaussian, so ``U`` is quadratic and every Zig-Zag/BPS rate is
    affine along the path (F.1): ``quadratic_potential=True`` selects exact
    inversion. ``hessian_bound`` (``|S^{-1}|`` per example) and ``prior_hessian_bound``
    serve the Boomerang (and ``bound='hessian'``).
    """
    s = np.asarray(likelihood_cov, dtype=np.float64)
    d = s.shape[0]
    p_lik = np.linalg.inv(s)
    p_lik_j = jnp.asarray(p_lik)
    if prior_cov is None:
        p0 = np.zeros((d, d))
        m0 = np.zeros(d)
    else:
        p0 = np.linalg.inv(np.asarray(prior_cov, dtype=np.float64))
        m0 = np.zeros(d) if prior_mean is None else np.asarray(prior_mean, dtype=np.float64)
    p0_j, m0_j = jnp.asarray(p0), jnp.asarray(m0)

    def log_prior(x):
        r = x - m0_j
        return -0.5 * r @ (p0_j @ r)

    def log_likelihood(x, y):
        r = y - x
        return -0.5 * r @ (p_lik_j @ r)

    abs_p = jnp.asarray(np.abs(p_lik))
    return Model(
        log_prior, log_likelihood, name="gaussian",
        quadratic_potential=True,
        hessian_bound=lambda y: abs_p,
        prior_hessian_bound=np.abs(p0),
        curvature_bound=lambda y: p_lik_j, prior_curvature_bound=p0,  # Loewner: the Hessians
        likelihood_precision=p_lik, prior_precision=p0, prior_mean=m0,
    )


def gaussian_posterior(model: Model, clients: Sequence) -> tuple:
    """Exact posterior ``(mean, cov)`` of :func:`gaussian_model` given the clients' data."""
    a = model.attributes
    y = np.concatenate([np.asarray(c) for c in clients], axis=0)
    precision = a["prior_precision"] + y.shape[0] * a["likelihood_precision"]
    cov = np.linalg.inv(precision)
    mean = cov @ (a["prior_precision"] @ a["prior_mean"] + a["likelihood_precision"] @ y.sum(axis=0))
    return mean, cov


def gaussian_data(seed: int, n: int, mean, cov) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.multivariate_normal(np.asarray(mean, float), np.asarray(cov, float), size=n)


def split_by_projection(data, num_workers: int, direction=None) -> List:
    """Non-IID split: sort rows by a projection and cut into ``num_workers`` contiguous blocks."""
    leaves = jax.tree_util.tree_leaves(data)
    first = np.asarray(leaves[0])
    flat = first.reshape(first.shape[0], -1)
    w = np.ones(flat.shape[1]) if direction is None else np.asarray(direction, float)
    order = np.argsort(flat @ w, kind="stable")
    blocks = np.array_split(order, num_workers)
    return [jax.tree_util.tree_map(lambda leaf: np.asarray(leaf)[b], data) for b in blocks]


# ------------------------------------------------------- F.2 logistic regression
def logistic_model(prior_scale: float = 1.0) -> Model:
    """Logistic regression (F.2, equation (12)) with prior N(0, prior_scale^2 I).

    Data rows ``{"x": xi (d,), "y": eta in {0, 1}}``. The Hessian of one row's
    potential is ``xi xi^T / (4 cosh^2(xi^T x / 2))`` (F.2, written there with
    ``cosh(x^T xi)``; the factor is ``sigma(z)(1 - sigma(z)) <= 1/4``), bounded
    elementwise by ``|xi xi^T| / 4``.
    """
    inv_var = 1.0 / float(prior_scale) ** 2

    def log_prior(w):
        return -0.5 * inv_var * jnp.sum(w * w)

    def log_likelihood(w, row):
        z = row["x"] @ w
        return row["y"] * z - jax.nn.softplus(z)

    def hessian_bound(row):
        return jnp.abs(jnp.outer(row["x"], row["x"])) / 4.0

    def curvature_bound(row):  # Loewner: 0 <= Hessian <= xi xi^T / 4
        return jnp.outer(row["x"], row["x"]) / 4.0

    return Model(log_prior, log_likelihood, name="logistic", hessian_bound=hessian_bound,
                 prior_hessian_bound=inv_var, curvature_bound=curvature_bound,
                 prior_curvature_bound=inv_var, prior_scale=float(prior_scale))


def logistic_data(seed: int, n: int, d: int, num_workers: int = 1, non_iid: bool = False):
    """Synthetic data as in Section 6.2: ``xi = (1, N(0, I_{d-1}))``, true x ~ N(0, I).

    Returns ``(clients, true_x)``. ``non_iid=True`` sorts rows by their second covariate.
    """
    rng = np.random.default_rng(seed)
    xi = np.concatenate([np.ones((n, 1)), rng.standard_normal((n, d - 1))], axis=1)
    true_x = rng.standard_normal(d)
    p = 1.0 / (1.0 + np.exp(-xi @ true_x))
    eta = (rng.uniform(size=n) < p).astype(np.float64)
    data = {"x": xi, "y": eta}
    if non_iid and d > 1:
        clients = split_by_projection(data, num_workers, direction=np.eye(d)[1])
    else:
        idx = np.array_split(rng.permutation(n), num_workers)
        clients = [{"x": xi[i], "y": eta[i]} for i in idx]
    return clients, true_x


# ------------------------------------------------------- F.3 AR(1), Student-t noise
def ar1_model(nu: float = 3.0, prior_scale: Optional[float] = None) -> Model:
    """AR(1) ``Y_k = c + x Y_{k-1} + eps_k``, eps ~ Student-t(nu) (Section 6.3, F.3).

    Parameters ``{"x": (), "c": ()}`` (flattened in the order (c, x)); data rows ``{"prev": y_{k-1}, "next": y_k}``
    (every transition of every observed trajectory). ``h(z) = (nu+1)/2 log(1 + z^2/nu)``
    and ``|h''| <= (nu+1)/nu`` give the per-row elementwise Hessian bound
    ``(nu+1)/nu |(1, y)(1, y)^T|`` in the flat order (c, x) (F.3; its spectral norm ``(nu+1)/nu (1 + y^2)`` is below
    the paper's ``(1 + y)^2`` form). The prior is flat (as in the paper) unless ``prior_scale``.
    (F.3's bound on ``|h'|`` should read ``(nu+1)/(2 sqrt(nu))``; it is not used here.)
    """
    nu = float(nu)
    inv_var = 0.0 if prior_scale is None else 1.0 / float(prior_scale) ** 2

    def log_prior(p):
        return -0.5 * inv_var * (p["x"] ** 2 + p["c"] ** 2)

    def log_likelihood(p, row):
        z = p["x"] * row["prev"] + p["c"] - row["next"]
        return -0.5 * (nu + 1.0) * jnp.log1p(z * z / nu)

    def hessian_bound(row):
        # flat parameter order is that of ravel_pytree: sorted keys, (c, x)
        u = jnp.stack([jnp.ones_like(row["prev"]), jnp.abs(row["prev"])])
        return (nu + 1.0) / nu * jnp.outer(u, u)

    return Model(log_prior, log_likelihood, name="ar1_student_t", hessian_bound=hessian_bound,
                 prior_hessian_bound=inv_var, nu=nu)


def ar1_data(seed: int, num_series: int, length: int, x: float = 0.5, c: float = 0.2,
             nu: float = 3.0, num_workers: int = 1):
    """``num_series`` trajectories of ``length`` steps (from Y_0 = 0), split by series over workers."""
    rng = np.random.default_rng(seed)
    y = np.zeros((num_series, length + 1))
    for k in range(1, length + 1):
        y[:, k] = c + x * y[:, k - 1] + rng.standard_t(nu, size=num_series)
    blocks = np.array_split(np.arange(num_series), num_workers)
    return [{"prev": y[b, :-1].reshape(-1), "next": y[b, 1:].reshape(-1)} for b in blocks]


# ------------------------------------------------------- F.4 / E.1 log-Gaussian Cox
def grid_precision(side: int, alpha: float = 0.1, beta: float = 1.0) -> np.ndarray:
    """``P = beta (I - alpha A)`` with A the adjacency of the side x side grid (E.1)."""
    d = side * side
    a = np.zeros((d, d))
    for i in range(side):
        for j in range(side):
            k = i * side + j
            if i + 1 < side:
                a[k, k + side] = a[k + side, k] = 1.0
            if j + 1 < side:
                a[k, k + 1] = a[k + 1, k] = 1.0
    return beta * (np.eye(d) - alpha * a)


def lgcp_model(side: int, alpha: float = 0.1, beta: float = 1.0, horizon: float = 0.5) -> Model:
    """Log-Gaussian Cox process on a side x side grid (E.1, F.4).

    Parameter: the flat latent field x (d = side^2). Data rows
    ``{"cell": k, "y": count}``: ``log p(y | x) = y x_k - exp(x_k)``. The server holds the
    Gaussian prior ``U_0 = (beta/2) x^T (I - alpha A) x``. Bounds (F.4): on
    ``[0, horizon]`` the Zig-Zag rate of coordinate k, ``(v_k (exp(x_k + v_k t) - y_k))_+``,
    is below the affine function with slope ``(exp(x_k + h) - exp(x_k)) / h`` (v_k = +1,
    convex: chord) or ``exp(x_k)`` (v_k = -1: tangent). Each row touches one coordinate
    (``worker_coordinates``), so workers hold only their block (Remark 3.1).
    """
    d = side * side
    p = grid_precision(side, alpha, beta)
    p_j = jnp.asarray(p)

    def log_prior(x):
        return -0.5 * x @ (p_j @ x)

    def log_likelihood(x, row):
        xk = x[row["cell"]]
        return row["y"] * xk - jnp.exp(xk)

    def zigzag_slope_bound(x, v, h, row):
        k = row["cell"]
        xk, vk = x[k], v[k]
        up = (jnp.exp(xk + h) - jnp.exp(xk)) / h
        slope = jnp.where(vk > 0, up, jnp.exp(xk))
        return jax.nn.one_hot(k, d, dtype=x.dtype) * slope

    def worker_coordinates(row):
        return jax.nn.one_hot(row["cell"], d)

    return Model(log_prior, log_likelihood, name="lgcp", zigzag_slope_bound=zigzag_slope_bound,
                 slope_horizon=float(horizon), worker_coordinates=worker_coordinates,
                 prior_hessian_bound=np.abs(p), prior_precision=p)


def lgcp_data(seed: int, side: int, alpha: float = 0.1, beta: float = 1.0, num_workers: int = 4,
              offset: float = 1.0):
    """A field x ~ N(offset, P^{-1}), counts y ~ Poisson(exp(x)); cells split into spatial
    blocks (quadrants for 4 workers, Figure 6; horizontal bands otherwise). Returns ``(clients, x)``."""
    rng = np.random.default_rng(seed)
    p = grid_precision(side, alpha, beta)
    x = offset + np.linalg.cholesky(np.linalg.inv(p)) @ rng.standard_normal(side * side)
    y = rng.poisson(np.exp(x)).astype(np.float64)
    cells = np.arange(side * side)
    rows, cols = cells // side, cells % side
    if num_workers == 4:
        block = (rows >= side // 2) * 2 + (cols >= side // 2)
    else:
        block = np.minimum(rows * num_workers // side, num_workers - 1)
    clients = [{"cell": cells[block == m].astype(np.int32), "y": y[block == m]}
               for m in range(num_workers)]
    return clients, x
