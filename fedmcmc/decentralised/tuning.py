"""``step_size``, ``beta`` and ``gamma`` = ``"auto"`` for DULA and GT-DULA, and the bias they bound.

Where the network average's bias comes from
-------------------------------------------
At stationarity the network average of GT-DULA does not drift on average:
``E[w_bar_{k+1} - w_bar_k] = -alpha n E[d_bar_k] = -alpha E[sum_i grad E_i(w_i)] = 0``
(the tracking invariant, section 3, gives ``d_bar = (1/n) sum_i g_hat_i``). The posterior
satisfies the same identity at one point per draw, ``E_pi[sum_i grad E_i(theta)] = 0``. The
difference is that agent ``i`` evaluates its gradient at its own ``w_i``, which wanders
around ``w_bar`` with the consensus covariance ``C_i`` (noise ``sqrt(2 alpha n)`` is injected
into every agent, and the mixing ``W_beta`` removes the disagreement at rate ``beta lambda_2``
per iteration). Expanding to second order about the global mode ``m``, with ``A_i`` the
local Hessians, ``A = sum_i A_i`` and ``T_i`` the third derivatives of the local energies,
the stationary mean of ``w_bar`` sits at ::

    E[w_bar] - E_pi[theta]
        ~ (mu_lin - m) - A^{-1} (1/2) sum_i T_i[Cov(w_i) + (E w_i - m)(E w_i - m)^T - Sigma]

where ``mu_lin`` is the stationary mean of the linearised recursion (``m`` for GT-DULA;
DULA's heterogeneity offset otherwise) and ``Sigma = A^{-1}``. The first term is DULA's
first-order bias; the second is the one GT-DULA keeps: zero when the local energies are
quadratic (no ``T_i``), growing with the spread, i.e. with ``alpha n`` and with
``1 / (beta lambda_2)``. It is a network effect rather than a heterogeneity effect: the same
rows dealt into 60 random groups of the districts' sizes are predicted the same bias, 20
agents of three districts each a fifth of it (``benchmarks/bench_gtdula_bias.py``).
On the Bangladesh contraception survey split by its 60 districts (ring, beta = gamma = 0.3)
the prediction for the (age/10)^2 coefficient is -0.19 posterior sd at alpha = 2e-5 against
-0.24 measured (4 chains x 400,000 iterations), and -0.07 at alpha = 5e-6 against -0.015
(4 x 1.6M); the paper's bias O_GT of Theorem 2 likewise grows with alpha and shrinks with
beta, with constants (Lipschitz and log-Sobolev) too loose to evaluate here.

``Cov(w_i)`` and ``E w_i`` come from the exact stationary law of the recursion linearised
at ``m`` (:func:`fedmcmc.decentralised.diagnostics.stationary_distribution`, a discrete
Lyapunov equation of size ``(2n - 1) d``); ``T_i[M]`` is computed where agent ``i``'s data
are, as ``sum_k lambda_k T_i[u_k, u_k]`` over the eigenpairs of ``M`` (forward-over-forward
derivatives of the local gradient: ``d`` floats per agent in the reply).

The choice
----------
* ``beta = 1 / lambda_n``: the largest consensus step for which ``W_beta = I - beta L`` has
  no negative eigenvalue (no disagreement mode oscillates), within Condition 1's
  ``beta <= min(1, n / lambda_n)``; on the complete graph ``W_beta`` averages exactly.
* ``gamma = min(beta, 1 / lambda_2, 1 / lambda_n)``: Condition 1's largest tracking step
  (Theorem 4: a larger gamma lowers the gradient error's bias).
* ``step_size``: the largest alpha for which the predicted bias of every coordinate is at
  most ``tolerance`` posterior sd and the linearised stationary sds are within
  ``sd_tolerance`` (default 5%) of the Laplace sds, found by a few Lyapunov solves.

Time scales (:mod:`fedmcmc.run_length`)
---------------------------------------
* The network average is a Langevin chain with ``h = 2 alpha`` on the posterior (the
  tracking invariant above), so its slowest direction relaxes in
  :func:`relaxation_time` ``R = 2 / (h lambda_min(A)) = 1 / (alpha lambda_min(A))``
  iterations (``Prediction.iterations_per_effective_draw`` is ``2 R``, the AR(1)'s
  integrated autocorrelation time for ``R`` much larger than 1).
* The agents' disagreement (and GT-DULA's trackers') is removed by ``W_beta``
  (``W_gamma``) at rate ``beta lambda_2`` (``gamma lambda_2``) per iteration:
  :func:`consensus_time` ``1 / (min(beta, gamma) lambda_2)`` iterations.
* When the sparse graph forces alpha tiny the run may not afford ``R``: the budget rule
  (``run_length.budget_step_size``) may raise alpha up to :func:`budget_ceiling`, the
  largest alpha whose predicted ``|bias|`` is at most ``(1 + BUDGET_TOLERANCE) x
  tolerance`` posterior sd and whose predicted variance inflation ``|sd ratio^2 - 1|`` is
  at most ``BUDGET_TOLERANCE`` (25 %: sd ratios in [0.866, 1.118]) in every coordinate,
  and never past :func:`stability_ceiling` (the agents' steps ``alpha n A_i`` stable, with
  a margin of about 2).

What the agents report (a few floats each, computed where the data are): their local
energy's gradient and Hessian at the current point during the Newton rounds that find
the global mode (``d + d^2`` floats per round), the third-derivative contraction above
(``d`` floats per trial step size), and, with minibatches, the covariance of their
minibatch gradient at the mode (``d^2`` floats).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..arrays import device_array
from ..cache import jit_with_constants_as_arguments
from ..federation import PaddedData
from ..model import Model
from . import diagnostics
from .graphs import Topology

__all__ = [
    "LocalTerms",
    "Prediction",
    "AutoSettings",
    "local_terms_fn",
    "global_mode",
    "choose_beta",
    "choose_gamma",
    "predict",
    "choose_step_size",
    "relaxation_time",
    "consensus_time",
    "initial_offset",
    "stability_ceiling",
    "budget_ceiling",
    "MAX_ORACLE_SIZE",
]

#: the exact Lyapunov oracle is solved when (2 n - 1) d is at most this (O(size^3) work)
MAX_ORACLE_SIZE = 600


class LocalTerms(NamedTuple):
    """What every agent reports at a point ``theta`` (float64, agents on the leading axis)."""

    energy: np.ndarray  # (n,) E_i(theta)
    gradient: np.ndarray  # (n, d) grad E_i(theta)
    hessian: np.ndarray  # (n, d, d) Hessian of E_i at theta


class Prediction(NamedTuple):
    """The linearised stationary law at one ``(step_size, beta, gamma)`` and the bias it implies."""

    step_size: float
    bias: np.ndarray  # (d,) predicted E[w_bar] - posterior mean
    bias_in_sd: np.ndarray  # (d,) bias / Laplace sd
    sd_ratio: np.ndarray  # (d,) linearised stationary sd of w_bar / Laplace sd
    consensus_error: float  # E[(1/n) sum_i ||w_i - w_bar||^2]
    spectral_radius: float
    iterations_per_effective_draw: float  # 1 / (alpha lambda_min(A)) x 2 (AR(1) time)


class AutoSettings(NamedTuple):
    step_size: float
    beta: float
    gamma: Optional[float]
    mode: np.ndarray  # (d,) global mode m
    laplace_cov: np.ndarray  # (d, d) A^{-1}
    prediction: Optional[Prediction]
    newton_rounds: int


# --------------------------------------------------------------- agents' replies
def _float64(tree):
    """Floating leaves as float64 device arrays (call under ``jax.enable_x64``), converted on
    the host: an eager conversion compiles a small program per shape in a new process."""
    def convert(leaf):
        leaf = np.asarray(leaf)
        return device_array(leaf, np.float64 if np.issubdtype(leaf.dtype, np.floating) else None)

    return jax.tree_util.tree_map(convert, tree)


def local_terms_fn(model: Model, init: Any, padded: PaddedData, batch_size: Optional[int] = None):
    """The agents' replies, each one compiled float64 call over all agents (``vmap``).

    Returns ``(terms, third, minibatch_noise)``:

    * ``terms(theta) -> LocalTerms``: E_i, grad E_i and its Hessian at ``theta`` with
      ``E_i(w) = -log p(X_i | w) - (1/n) log p(w)`` (section 2).
    * ``third(theta, directions (n, k, d), weights (n, k)) -> (n, d)``:
      ``sum_k weights_ik T_i[u_ik, u_ik]``, the third derivative of E_i contracted twice.
    * ``minibatch_noise(theta) -> (n, d, d)``: the covariance of agent i's minibatch
      gradient estimate (``m`` rows with replacement, scaled by M_i / m, as
      :func:`fedmcmc.decentralised.kernels.local_gradient_fn` draws them):
      ``(M_i^2 / m) Cov_rows(grad log p(x | theta))``; zero for agents with at most m rows
      and when ``batch_size`` is None.
    """
    with jax.enable_x64(True):
        flat_model = model.flatten(_float64(init))
        data = _float64(padded.data)
        mask = device_array(padded.mask, np.float64)
        sizes = device_array(padded.sizes, np.float64)
    n = int(padded.mask.shape[0])

    def energy(theta, agent_data, agent_mask):
        return (-flat_model.log_likelihood_sum(theta, agent_data, agent_mask)
                - flat_model.log_prior(theta) / n)

    # (jit_with_constants_as_arguments: the agents' rows are arguments, so another data set
    # of the same shapes is the same program)
    @jit_with_constants_as_arguments
    def _terms(theta):
        one = lambda d, w: (energy(theta, d, w), jax.grad(energy)(theta, d, w),  # noqa: E731
                            jax.hessian(energy)(theta, d, w))
        return jax.vmap(one)(data, mask)

    @jit_with_constants_as_arguments
    def _third(theta, directions, weights):
        def one(agent_data, agent_mask, u, w):
            gradient = lambda t: jax.grad(energy)(t, agent_data, agent_mask)  # noqa: E731

            def along(v):
                hvp = lambda t: jax.jvp(gradient, (t,), (v,))[1]  # noqa: E731
                return jax.jvp(hvp, (theta,), (v,))[1]

            return jnp.einsum("k,kd->d", w, jax.vmap(along)(u))

        return jax.vmap(one)(data, mask, directions, weights)

    @jit_with_constants_as_arguments
    def _noise(theta):
        def one(agent_data, agent_mask, size):
            row_grads = jax.vmap(
                jax.grad(lambda t, row: flat_model.log_likelihood(t, row)), in_axes=(None, 0)
            )(theta, agent_data)
            row_grads = row_grads * agent_mask[:, None]
            mean = jnp.sum(row_grads, 0) / size
            centred = (row_grads - mean) * agent_mask[:, None]
            cov = centred.T @ centred / size
            scale = jnp.where(size > batch_size, size**2 / batch_size, 0.0)
            return scale * cov

        return jax.vmap(one)(data, mask, sizes)

    def terms(theta) -> LocalTerms:
        with jax.enable_x64(True):
            e, g, h = _terms(jnp.asarray(theta, jnp.float64))
            return LocalTerms(np.asarray(e), np.asarray(g), np.asarray(h))

    def third(theta, directions, weights) -> np.ndarray:
        with jax.enable_x64(True):
            return np.asarray(_third(jnp.asarray(theta, jnp.float64),
                                     jnp.asarray(directions, jnp.float64),
                                     jnp.asarray(weights, jnp.float64)))

    def minibatch_noise(theta) -> Optional[np.ndarray]:
        if batch_size is None:
            return None
        with jax.enable_x64(True):
            return np.asarray(_noise(jnp.asarray(theta, jnp.float64)))

    return terms, third, minibatch_noise


def global_mode(terms, theta0: np.ndarray, max_rounds: int = 50, tolerance: float = 1e-10):
    """The mode of sum_i E_i by damped Newton rounds on the agents' summed replies.

    Each round every agent reports (E_i, grad E_i, Hessian) at the current point; the sum is
    what a network average (or a server) computes. A step that raises the summed energy is
    halved. Returns ``(mode, terms at the mode, rounds)``; raises ``ValueError`` if the
    summed Hessian is not positive definite at the end (no Laplace approximation).
    """
    theta = np.asarray(theta0, np.float64)
    current = terms(theta)
    rounds = 1
    for _ in range(max_rounds):
        gradient = current.gradient.sum(0)
        hessian = current.hessian.sum(0)
        try:
            step = np.linalg.solve(hessian + 1e-12 * np.eye(hessian.shape[0]), gradient)
        except np.linalg.LinAlgError:
            step = gradient / max(np.abs(np.diag(hessian)).max(), 1.0)
        decrement = float(gradient @ step)
        if np.isfinite(decrement) and abs(decrement) < tolerance:
            break
        energy = current.energy.sum()
        scale = 1.0
        for _ in range(30):
            candidate = terms(theta - scale * step)
            rounds += 1
            if np.isfinite(candidate.energy.sum()) and candidate.energy.sum() <= energy + 1e-12:
                break
            scale *= 0.5
        theta = theta - scale * step
        current = candidate
    precision = current.hessian.sum(0)
    eigenvalues = np.linalg.eigvalsh(0.5 * (precision + precision.T))
    if not np.all(np.isfinite(eigenvalues)) or eigenvalues.min() <= 0:
        raise ValueError(
            "step_size='auto' needs the summed Hessian of the agents' energies to be positive "
            f"definite at the global mode (smallest eigenvalue {eigenvalues.min():.3g}): give "
            "step_size, beta and gamma as numbers"
        )
    return theta, current, rounds


# ------------------------------------------------------------------- the choice
def choose_beta(topo: Topology) -> float:
    """beta = 1 / lambda_n (no oscillating disagreement mode), within Condition 1."""
    return float(min(1.0, topo.n / topo.lambda_n, 1.0 / topo.lambda_n))


def choose_gamma(topo: Topology, beta: float) -> float:
    """gamma = min(beta, 1 / lambda_2, 1 / lambda_n): Condition 1's largest, no oscillation."""
    return float(min(beta, 1.0 / topo.lambda_2, 1.0 / topo.lambda_n))


def _per_direction_law(A_blocks, b_blocks, mode, precision, laplacian, step_size, beta, gamma,
                       gradient_noise):
    """The linearised stationary law when the full oracle is too large: one oracle of size
    2n - 1 per eigendirection u_j of A, with agent i's curvature u_j^T A_i u_j and the
    couplings between directions dropped (exact when the A_i share A's eigenvectors)."""
    n, dim = A_blocks.shape[0], A_blocks.shape[1]
    _, basis = np.linalg.eigh(precision)
    offsets = np.zeros((n, dim))
    variances = np.zeros((n, dim))
    average_var = np.zeros(dim)
    average_mean = np.zeros(dim)
    consensus, radius = 0.0, 0.0
    for j in range(dim):
        u = basis[:, j]
        a = np.einsum("i,nij,j->n", u, A_blocks, u)[:, None, None]
        b = (b_blocks @ u)[:, None]
        noise = None
        if gradient_noise is not None:
            noise = np.einsum("i,nij,j->n", u, gradient_noise, u)[:, None, None]
        law = diagnostics.stationary_distribution(
            diagnostics.QuadraticProblem(A=a, b=b), laplacian, step_size, beta, gamma,
            gradient_noise=noise)
        offsets += np.outer(law.mean - mode @ u, u)
        variances[:, j] = np.diag(law.cov)
        average_var[j] = float(law.average_cov[0, 0])
        average_mean += float(law.average_mean[0]) * u
        consensus += float(law.consensus_error)
        radius = max(radius, float(law.spectral_radius))
    blocks = np.einsum("ij,nj,kj->nik", basis, variances, basis)
    average_cov = (basis * average_var) @ basis.T
    return offsets, blocks, average_mean, average_cov, consensus, radius


def predict(
    mode: np.ndarray,
    at_mode: LocalTerms,
    third,
    laplacian: np.ndarray,
    step_size: float,
    beta: float,
    gamma: Optional[float],
    gradient_noise: Optional[np.ndarray] = None,
) -> Prediction:
    """Predicted bias and sds of the network average (module docstring) at one setting."""
    A_blocks = at_mode.hessian
    n, dim = A_blocks.shape[0], A_blocks.shape[1]
    b_blocks = np.einsum("nij,j->ni", A_blocks, mode) - at_mode.gradient
    precision = A_blocks.sum(0)
    laplace_cov = np.linalg.inv(precision)
    laplace_cov = 0.5 * (laplace_cov + laplace_cov.T)
    laplace_sd = np.sqrt(np.diag(laplace_cov))
    if (2 * n - 1) * dim <= MAX_ORACLE_SIZE:
        law = diagnostics.stationary_distribution(
            diagnostics.QuadraticProblem(A=A_blocks, b=b_blocks), laplacian, step_size, beta,
            gamma, gradient_noise=gradient_noise)
        offsets = law.mean.reshape(n, dim) - mode  # E w_i - m
        blocks = np.stack(
            [law.cov[i * dim:(i + 1) * dim, i * dim:(i + 1) * dim] for i in range(n)])
        average_mean, average_cov = law.average_mean, law.average_cov
        consensus, radius = float(law.consensus_error), float(law.spectral_radius)
    else:
        offsets, blocks, average_mean, average_cov, consensus, radius = _per_direction_law(
            A_blocks, b_blocks, mode, precision, laplacian, step_size, beta, gamma,
            gradient_noise)
    excess = blocks + np.einsum("ni,nj->nij", offsets, offsets) - laplace_cov[None]
    weights, directions = np.linalg.eigh(0.5 * (excess + np.swapaxes(excess, 1, 2)))
    contraction = third(mode, np.swapaxes(directions, 1, 2), weights)  # (n, d)
    second_order = -np.linalg.solve(precision, 0.5 * contraction.sum(0))
    bias = (average_mean - mode) + second_order
    sd_ratio = np.sqrt(np.diag(average_cov)) / laplace_sd
    slowest = float(np.linalg.eigvalsh(precision).min())
    return Prediction(
        step_size=float(step_size),
        bias=bias,
        bias_in_sd=bias / laplace_sd,
        sd_ratio=sd_ratio,
        consensus_error=consensus,
        spectral_radius=radius,
        iterations_per_effective_draw=float(2.0 / (step_size * slowest)),
    )


def choose_step_size(
    mode: np.ndarray,
    at_mode: LocalTerms,
    third,
    laplacian: np.ndarray,
    beta: float,
    gamma: Optional[float],
    tolerance: float,
    sd_tolerance: float = 0.05,
    gradient_noise: Optional[np.ndarray] = None,
    max_solves: int = 12,
) -> Prediction:
    """The largest alpha whose predicted |bias| <= ``tolerance`` sd and |sd ratio - 1| <=
    ``sd_tolerance`` in every coordinate (both errors grow about linearly in alpha, so each
    trial rescales alpha by the worst ratio of error to tolerance; at most ``max_solves``
    Lyapunov solves). Starts at 0.1 / lambda_max(A), where the centralised ULA's variance is
    inflated by about 2.5%."""
    precision = at_mode.hessian.sum(0)
    largest = float(np.linalg.eigvalsh(precision).max())
    ceiling = 0.5 / largest  # never above: ULA on the average needs alpha lambda_max < 2
    alpha = 0.1 / largest
    accepted: Optional[Prediction] = None
    for _ in range(max_solves):
        try:
            trial = predict(mode, at_mode, third, laplacian, alpha, beta, gamma, gradient_noise)
        except ValueError:  # unstable linearised recursion
            alpha *= 0.25
            continue
        worst = max(
            float(np.max(np.abs(trial.bias_in_sd))) / tolerance,
            float(np.max(np.abs(trial.sd_ratio - 1.0))) / sd_tolerance,
        )
        if worst <= 1.0:
            if accepted is None or trial.step_size > accepted.step_size:
                accepted = trial
            if worst >= 0.8 or alpha >= ceiling:
                break
        factor = 0.9 / max(worst, 1e-12)
        alpha = min(alpha * float(np.clip(factor, 0.05, 10.0)), ceiling)
    if accepted is None:
        raise ValueError(
            "step_size='auto' found no step size meeting the bias tolerance "
            f"({tolerance:g} posterior sd) in {max_solves} trials; give step_size as a number"
        )
    return accepted


# ------------------------------------------------------------ time scales, budget
def relaxation_time(step_size: float, precision: np.ndarray) -> float:
    """Iterations in which the network average's slowest direction forgets its past by a
    factor e: ``1 / (alpha lambda_min(A))`` (module docstring: a Langevin chain with
    ``h = 2 alpha``, ``run_length``'s ``R = 2 / (h lambda_min)``)."""
    slowest = float(np.linalg.eigvalsh(0.5 * (precision + precision.T)).min())
    return float(1.0 / (float(step_size) * slowest))


def consensus_time(lambda_2: float, beta: float, gamma: Optional[float] = None) -> float:
    """Iterations in which the slowest disagreement mode of the agents' samples (and of
    GT-DULA's trackers) shrinks by a factor e: ``1 / (min(beta, gamma) lambda_2)``
    (``W_beta = I - beta L`` multiplies it by ``1 - beta lambda_2`` per iteration)."""
    rate = float(beta) if gamma is None else min(float(beta), float(gamma))
    return float(1.0 / (rate * float(lambda_2)))


def initial_offset(theta0: np.ndarray, mode: np.ndarray, precision: np.ndarray) -> float:
    """The chains' start in posterior sds along the Laplace fit,
    ``sqrt((theta0 - m)^T A (theta0 - m))`` (``run_length.resolve``'s ``initial_offset``)."""
    offset = np.asarray(theta0, np.float64) - np.asarray(mode, np.float64)
    return float(np.sqrt(max(float(offset @ precision @ offset), 0.0)))


def stability_ceiling(local_hessians: np.ndarray) -> float:
    """The largest alpha the budget rule may use: ``min(0.5 / lambda_max(A),
    0.5 / (n max_i lambda_max(A_i)))``. The first is :func:`choose_step_size`'s own ceiling
    (ULA on the average needs ``alpha lambda_max < 2``); the second is the agents': agent
    ``i`` steps by ``alpha n A_i``, and the linearised recursion becomes unstable near
    ``alpha n max_i lambda_max(A_i) = 0.85`` for GT-DULA and 1 to 1.6 for DULA (measured on
    the three real federations of ``tests/real_federations.py`` on the ring: exact spectral
    radius of the recursion, :func:`fedmcmc.decentralised.diagnostics.stationary_distribution`),
    long before the average's limit (``0.5 / lambda_max(A)`` is 1.7 to 4 times past it)."""
    blocks = np.asarray(local_hessians, np.float64)
    n = blocks.shape[0]
    symmetric = 0.5 * (blocks + np.swapaxes(blocks, 1, 2))
    agent = float(np.linalg.eigvalsh(symmetric).max())
    average = float(np.linalg.eigvalsh(symmetric.sum(0)).max())
    return float(min(0.5 / average, 0.5 / (n * agent)))


def _budget_excess(prediction: Prediction, tolerance: float, budget_tolerance: float) -> float:
    """The worst ratio of predicted error to the budget's tolerance (<= 1: within it)."""
    bias = float(np.max(np.abs(prediction.bias_in_sd))) / ((1.0 + budget_tolerance) * tolerance)
    inflation = float(np.max(np.abs(prediction.sd_ratio ** 2 - 1.0))) / budget_tolerance
    return max(bias, inflation)


def budget_ceiling(
    mode: np.ndarray,
    at_mode: LocalTerms,
    third,
    laplacian: np.ndarray,
    beta: float,
    gamma: Optional[float],
    tolerance: float,
    exact: Prediction,
    budget_tolerance: float,
    gradient_noise: Optional[np.ndarray] = None,
    max_solves: int = 8,
) -> Prediction:
    """The accuracy ceiling of the budget rule: the largest alpha (at least ``exact``'s,
    at most :func:`stability_ceiling`) whose predicted ``|bias|`` is at most
    ``(1 + budget_tolerance) x tolerance`` posterior sd and whose predicted variance
    inflation ``|sd ratio^2 - 1|`` is at most ``budget_tolerance`` in every coordinate
    (both errors grow about linearly in alpha: each trial rescales alpha by the worst ratio
    of error to tolerance; an unstable linearised recursion halves the way back; at most
    ``max_solves`` Lyapunov solves). Returns the prediction at that alpha."""
    upper = stability_ceiling(at_mode.hessian)
    accepted = exact
    excess = _budget_excess(exact, tolerance, budget_tolerance)
    if excess > 1.0 or exact.step_size >= upper:
        return exact
    alpha = min(exact.step_size * 0.95 / max(excess, 1e-12), upper)
    for _ in range(max_solves):
        if alpha <= accepted.step_size * 1.01:
            break
        try:
            trial = predict(mode, at_mode, third, laplacian, alpha, beta, gamma, gradient_noise)
            stable = trial.spectral_radius < 1.0
        except ValueError:  # unstable linearised recursion
            stable = False
        if not stable:
            upper = alpha
            alpha = float(np.sqrt(accepted.step_size * alpha))
            continue
        excess = _budget_excess(trial, tolerance, budget_tolerance)
        if excess <= 1.0:
            accepted = trial
            if excess >= 0.8 or alpha >= upper:
                break
            alpha = min(alpha * 0.95 / max(excess, 1e-12), upper)
        else:
            upper = alpha
            alpha = max(accepted.step_size, min(alpha * 0.95 / excess,
                                                float(np.sqrt(accepted.step_size * alpha))))
    return accepted
