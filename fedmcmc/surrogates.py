"""Gaussian surrogates q_s of each client's likelihood p(x_s | theta) (FSGLD section 3.1).

Each client fits its surrogate on its own data only and sends it to the server
once, as Gaussian *natural parameters*::

    log q_s(theta) = -1/2 theta^T P_s theta + b_s^T theta + const,
    grad log q_s(theta) = b_s - P_s theta,

with precision ``P_s`` (full ``(d, d)`` or diagonal ``(d,)``) and linear term
``b_s = P_s mu_s``. Natural parameters need no inversion, so a singular client
likelihood (fewer examples than parameters, a flat direction) is represented
exactly. The global surrogate q = prod_s q_s has precision sum_s P_s and linear
term sum_s b_s: it is precomputed once, so grad log q costs one matrix-vector
product whatever the number of clients (``../shared/papers/README.md``).

Three fitting methods, all run vmapped over clients in one compiled call:

``"exact"``
    For likelihoods that are Gaussian in theta (Gaussian mean, linear
    regression): the log likelihood is quadratic, so its second-order Taylor
    expansion at any point is exact. Checked: if the Hessian differs between
    two points, a ``ValueError`` says to use ``"laplace"``.
``"laplace"``
    Second-order Taylor expansion of log p(x_s | theta) at the client's mode
    (found with optax L-BFGS on log p(x_s | theta) + (1/S) log p(theta); the
    prior share keeps the optimisation well posed when the client likelihood
    alone has no mode, e.g. separable logistic data). The Hessian is projected
    onto the positive semi-definite cone; diagonal for large parameter counts.
``"sgld"``
    The paper's recipe: SGLD on the client's local target, then a Gaussian fit
    (mean and covariance) of ``K`` draws (default 3000); the prior share's
    curvature is removed from the fitted precision.

Any surrogate keeps the FSGLD estimator unbiased (Lemma 1); the fit only
changes its variance.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .callsite import user_stacklevel
from . import rng
from .federation import Federation
from .minibatch import likelihood_gradient, some_client_smaller, take_minibatch
from .model import FlatModel

__all__ = [
    "GaussianSurrogates",
    "ProductSurrogate",
    "fit_surrogates",
    "product",
    "grad_log_surrogate",
    "matvec",
    "taylor_surrogates",
    "expand_at_global_mode",
    "SurrogatePredictionWarning",
]


class GaussianSurrogates(NamedTuple):
    """Per-client natural parameters: ``precision`` (S, d, d) or (S, d); ``shift`` (S, d)."""

    precision: jax.Array
    shift: jax.Array

    @property
    def diagonal(self) -> bool:
        return self.precision.ndim == 2

    @property
    def floats_per_client(self) -> int:
        return int(np.prod(self.precision.shape[1:]) + self.shift.shape[1])

    def means(self) -> jax.Array:
        """Surrogate means P_s^+ b_s (pseudo-inverse where P_s is singular)."""
        if self.diagonal:
            return jnp.where(self.precision > 0, self.shift / jnp.where(self.precision > 0, self.precision, 1.0), 0.0)
        return jax.vmap(lambda p, b: jnp.linalg.pinv(p, hermitian=True) @ b)(self.precision, self.shift)


class ProductSurrogate(NamedTuple):
    """The global surrogate q = prod_s q_s in natural parameters."""

    precision: jax.Array  # (d, d) or (d,)
    shift: jax.Array  # (d,)


@jax.jit  # one program (eagerly, each sum compiles its own)
def product(surrogates: GaussianSurrogates) -> ProductSurrogate:
    """q = prod_s q_s: precisions and linear terms add."""
    return ProductSurrogate(
        precision=jnp.sum(surrogates.precision, axis=0), shift=jnp.sum(surrogates.shift, axis=0)
    )


# Up to this size a matrix-vector product is written as a multiply-and-sum, which XLA fuses
# with the rest of the update; a dot is a separate library call on CPU (~0.3-0.5 us each,
# the larger part of a small model's conducive term). Beyond it the library GEMV wins
# (measured once with d = 8-400 in a one-off script: the sum form was 5x slower at d = 100).
FUSED_MATVEC_MAX_DIM = 32


def matvec(matrix, vector):
    """``matrix @ vector`` in the form fastest for its size (see FUSED_MATVEC_MAX_DIM)."""
    if matrix.shape[-1] <= FUSED_MATVEC_MAX_DIM:
        return jnp.sum(matrix * vector, axis=-1)
    return matrix @ vector


def grad_log_surrogate(precision: jax.Array, shift: jax.Array, theta: jax.Array) -> jax.Array:
    """grad log N(theta) in natural parameters: b - P theta (P full or diagonal)."""
    if precision.ndim == 1:
        return shift - precision * theta
    return shift - matvec(precision, theta)


# --------------------------------------------------------------------------- helpers


def _project_psd(matrix: jax.Array, floor: float = 0.0) -> jax.Array:
    """Symmetrise and clip eigenvalues below ``floor`` (non-convex likelihoods)."""
    matrix = 0.5 * (matrix + matrix.T)
    values, vectors = jnp.linalg.eigh(matrix)
    return (vectors * jnp.maximum(values, floor)) @ vectors.T


def _client_objective(flat_model: FlatModel, num_clients: int):
    def objective(theta, data, mask):
        return -(
            flat_model.log_likelihood_sum(theta, data, mask)
            + flat_model.log_prior(theta) / num_clients
        )

    return objective


def _find_modes(flat_model, padded, theta0, num_clients, iterations):
    """Per-client mode of log p(x_s|theta) + (1/S) log p(theta) by optax L-BFGS."""
    return _modes_program(flat_model, int(num_clients), int(iterations), theta0, padded.data,
                          padded.mask)


# The fits are compiled programs of module-level functions whose configuration (the flat
# model, hashed by its Model and parameter structure, and plain numbers) is static: a process
# that fits again with the same model and shapes (a Ray actor hosting several clients, a test
# suite, a sweep) reuses the traced program instead of tracing a new closure every call.
@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _modes_program(flat_model, num_clients, iterations, theta0, data, mask):
    import optax

    # one jitted objective for all of L-BFGS's call sites (its step and the line search's
    # branches differentiate it several times): traced once, its derivatives' jaxprs cached
    objective = jax.jit(_client_objective(flat_model, num_clients))

    def one_client(data, mask):
        fun = lambda theta: objective(theta, data, mask)  # noqa: E731
        optimizer = optax.lbfgs()
        value_and_grad = optax.value_and_grad_from_state(fun)

        def body(carry, _):
            theta, state = carry
            value, grad = value_and_grad(theta, state=state)
            updates, state = optimizer.update(
                grad, state, theta, value=value, grad=grad, value_fn=fun
            )
            theta = optax.apply_updates(theta, updates)
            return (theta, state), None

        (theta, _), _ = jax.lax.scan(body, (theta0, optimizer.init(theta0)), None, length=iterations)
        return theta

    # one client after the other (lax.map), not vmapped: vmapping L-BFGS's line-search loops
    # costs several times the tracing (batching rules of while and cond), and clients that
    # converge early would run as long as the slowest
    return jax.lax.map(lambda client: one_client(*client), (data, mask))


def _hessian_of_likelihood(flat_model, theta, data, mask, diagonal):
    fun = lambda t: flat_model.log_likelihood_sum(t, data, mask)  # noqa: E731
    if not diagonal:
        return jax.hessian(fun)(theta)
    grad = jax.grad(fun)

    def hvp_diag(index):
        basis = jnp.zeros_like(theta).at[index].set(1.0)
        return jax.jvp(grad, (theta,), (basis,))[1][index]

    return jax.lax.map(hvp_diag, jnp.arange(theta.shape[0]))


def _taylor_surrogate(flat_model, anchors, padded, diagonal, floor=0.0):
    """Natural parameters of the 2nd-order expansion of log p(x_s|theta) at ``anchors``."""
    precision, shift = _taylor_program(flat_model, bool(diagonal), float(floor), anchors,
                                       padded.data, padded.mask)
    return GaussianSurrogates(precision=precision, shift=shift)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _taylor_program(flat_model, diagonal, floor, anchors, data, mask):
    def one_client(theta, data, mask):
        grad = flat_model.grad_log_likelihood_sum(theta, data, mask)
        hessian = _hessian_of_likelihood(flat_model, theta, data, mask, diagonal)
        if diagonal:
            precision = jnp.maximum(-hessian, floor)
            shift = grad + precision * theta
        else:
            precision = _project_psd(-hessian, floor)
            shift = grad + precision @ theta
        return precision, shift

    return jax.vmap(one_client)(anchors, data, mask)


def _resolve_diagonal(diagonal: Optional[bool], dim: int) -> bool:
    if diagonal is None:
        return dim > 500
    return bool(diagonal)


# --------------------------------------------------------------------------- fitting


def fit_exact(flat_model: FlatModel, federation: Federation, theta0: jax.Array, diagonal=None):
    """Closed-form surrogates for likelihoods quadratic in theta (exact Gaussian factors)."""
    diagonal = _resolve_diagonal(diagonal, flat_model.dim)
    padded = federation.padded()
    num_clients = federation.num_clients
    anchors = jnp.broadcast_to(theta0, (num_clients, flat_model.dim))
    surrogates = _taylor_surrogate(flat_model, anchors, padded, diagonal=False)
    # Quadratic check: the Hessian must be the same at a second, distant point.
    probe = anchors + 1.0 + jnp.abs(anchors)
    second = _taylor_surrogate(flat_model, probe, padded, diagonal=False)
    scale = jnp.max(jnp.abs(surrogates.precision)) + 1e-12
    if not bool(
        jnp.allclose(surrogates.precision, second.precision, atol=1e-5 * scale, rtol=1e-4)
    ) or not bool(jnp.allclose(surrogates.shift, second.shift, atol=1e-4 * (jnp.max(jnp.abs(surrogates.shift)) + scale), rtol=1e-3)):
        raise ValueError(
            "surrogate='exact' needs a likelihood that is Gaussian in the parameters "
            "(quadratic log likelihood, e.g. a Gaussian mean or linear regression); this "
            "model's Hessian changes with theta. Use surrogate='laplace' or 'sgld'."
        )
    if diagonal:
        surrogates = GaussianSurrogates(
            precision=jnp.diagonal(surrogates.precision, axis1=1, axis2=2),
            shift=surrogates.shift,
        )
    return surrogates


def laplace_of_product(flat_model: FlatModel, surrogates: GaussianSurrogates, theta0: jax.Array):
    """Mode and precision of prior x prod_s q_s: the server's cheap Gaussian guess of the posterior.

    The prior enters through its second-order expansion at ``theta0``; the
    linear system is solved with the PSD-projected total precision, whose eigenvalues are
    floored at the prior's smallest curvature (``-`` its Hessian at ``theta0``, when positive):
    on a non-log-concave posterior (a neural network; surrogates expanded where the
    likelihood curves upward) a direction the data leave flat or curving the wrong way is
    taken to be as wide as the prior says, never infinitely wide, so the relaxation time
    ``2 / (h lambda_min)`` of ``step_size="auto"`` and ``thin="auto"`` stays finite and the
    Laplace draws of the noise measurement stay finite (issue 45: FSGLD's "auto" on the
    Table 1 MLP met zero precisions and failed with non-finite moments). For a log-concave
    likelihood the floor changes nothing (Weyl: every eigenvalue is already above it).
    Returns ``(mode, precision)`` (precision diagonal when the surrogates are). One compiled
    program (run op by op, the prior's Hessian alone compiled dozens of small ones).
    """
    return _laplace_of_product(flat_model, surrogates, theta0)


@functools.partial(jax.jit, static_argnums=0)  # the flat model is hashable (frozen dataclass)
def _laplace_of_product(flat_model: FlatModel, surrogates: GaussianSurrogates, theta0):
    total = product(surrogates)
    prior_grad = flat_model.grad_log_prior(theta0)
    prior_hessian = jax.hessian(flat_model.log_prior)(theta0)
    if surrogates.diagonal:
        # the data's curvature clipped at zero, then the prior's: (for total >= 0 and a
        # log-concave prior the same floats as max(total - prior_hessian, 0))
        precision = jnp.maximum(
            jnp.maximum(total.precision, 0.0) - jnp.diagonal(prior_hessian), 0.0)
        shift = total.shift + prior_grad - jnp.diagonal(prior_hessian) * theta0
        mode = jnp.where(precision > 0, shift / jnp.where(precision > 0, precision, 1.0), theta0)
        return mode, precision
    prior_floor = jnp.maximum(jnp.linalg.eigvalsh(-0.5 * (prior_hessian + prior_hessian.T))[0],
                              0.0)
    precision = _project_psd(total.precision - prior_hessian, prior_floor)
    shift = total.shift + prior_grad - prior_hessian @ theta0
    return jnp.linalg.lstsq(precision, shift)[0], precision


def fit_laplace(
    flat_model: FlatModel,
    federation: Federation,
    theta0: jax.Array,
    diagonal=None,
    iterations: int = 200,
    with_modes: bool = False,
):
    """Laplace surrogates: Taylor expansion of each client's log likelihood at its mode
    (the mode of ``p(x_s|theta) p(theta)^(1/S)``, found on the client by L-BFGS).

    ``with_modes``: also return the modes, (S, d) (the anchors of
    ``control_variates="client"``): ``(surrogates, modes)``.
    """
    diagonal = _resolve_diagonal(diagonal, flat_model.dim)
    padded = federation.padded()
    modes = _find_modes(flat_model, padded, theta0, federation.num_clients, iterations)
    finite = np.isfinite(np.asarray(modes)).all(axis=1)  # NumPy: no program to compile
    if not finite.all():
        bad = np.nonzero(~finite)[0].tolist()
        raise ValueError(
            f"surrogate='laplace': the mode search diverged on clients {bad}; "
            "use surrogate='sgld' or a better-conditioned model"
        )
    surrogates = _taylor_surrogate(flat_model, modes, padded, diagonal)
    return (surrogates, modes) if with_modes else surrogates


def taylor_surrogates(flat_model: FlatModel, federation: Federation, anchor: jax.Array,
                      diagonal: bool) -> GaussianSurrogates:
    """Every client's second-order expansion of its log likelihood at the one point
    ``anchor`` (d,), on its own rows: one round of :func:`expand_at_global_mode` (a client
    on Ray runs it on a federation of its own rows only)."""
    anchors = jnp.broadcast_to(anchor, (federation.num_clients,) + jnp.shape(anchor))
    return _taylor_surrogate(flat_model, anchors, federation.padded(), diagonal)


def expand_at_global_mode(flat_model: FlatModel, federation: Optional[Federation],
                          surrogates: GaussianSurrogates, theta0: jax.Array, rounds: int = 3,
                          expand=None):
    """Surrogates re-expanded at the *global* mode (used by FSGLD's ``step_size="auto"``).

    Laplace surrogates are expansions at each client's own mode; for a client with a
    handful of rows that mode is far from the global posterior, and there its q_s no
    longer matches the client's gradient: the conducive term then leaves an offset of
    order (1/f_s) x that mismatch during the client's visits. Here the server finds the
    mode of prior x prod_s q_s (:func:`laplace_of_product`), sends it to the clients, and
    each client replaces q_s by the second-order expansion of its log likelihood at that
    point (d + d^2 floats back); ``rounds`` such rounds are a distributed Newton method
    on the global posterior. At the final mode every client's q_s matches its gradient
    and curvature, so the conducive term cancels the client offsets there to first order.

    ``expand(center) -> GaussianSurrogates``: the clients' expansions at ``center``
    (default: :func:`taylor_surrogates` of ``federation``; on Ray each client computes its
    own). Returns ``(surrogates, mode)``.
    """
    diagonal = surrogates.diagonal
    if expand is None:
        def expand(center):
            return taylor_surrogates(flat_model, federation, center, diagonal)

    center, precision = laplace_of_product(flat_model, surrogates, theta0)
    for _ in range(int(rounds)):
        expanded, curved_up = _curving_down(expand(center), center)
        new_center, new_precision = laplace_of_product(flat_model, expanded, center)
        # checked where the expansions may not be the likelihood's curvature: some client's
        # curved upward, or they are diagonal (the off-diagonal curvature they drop can make
        # the likelihood curve upward unseen: on a ReLU network a weight's own second
        # derivative is the Gauss-Newton term, never negative, so a diagonal expansion never
        # "curves up"). Full expansions of a log-concave federation are never checked.
        unverified = bool(curved_up) or diagonal
        if unverified and not _within_reach(new_center - center, precision):
            # a Newton step past the Gaussian's reach: the quadratic model is wrong there
            # (a non-log-concave posterior: on the Table 1 MLP at 30 x 2,000 rows the first
            # diagonal step went from |theta| 17 to 145 and the rounds after to 3e7 and
            # infinity); keep the last round's
            break
        surrogates, center, precision = expanded, new_center, new_precision
    return surrogates, center


#: a Newton round of :func:`expand_at_global_mode` is kept when its step is within this
#: quantile of the chi-square distance of the current Laplace fit (d degrees of freedom)
NEWTON_REACH_QUANTILE = 1.0 - 1e-4


def _within_reach(step, precision) -> bool:
    """Whether ``step`` is finite and within the :data:`NEWTON_REACH_QUANTILE` quantile of
    the distance sqrt(step^T P step) of draws of N(., P^{-1}). (Checked only where some
    client's expansion curved upward or the expansions are diagonal: a log-concave
    federation's full expansions are all kept.)"""
    from scipy.stats import chi2

    step = np.asarray(step, np.float64)
    if not np.all(np.isfinite(step)):
        return False
    precision = np.asarray(precision, np.float64)
    squared = (float(np.sum(precision * step * step)) if precision.ndim == 1
               else float(step @ precision @ step))
    return squared <= chi2.ppf(NEWTON_REACH_QUANTILE, step.size)


@jax.jit
def _curving_down(surrogates: GaussianSurrogates, center) -> GaussianSurrogates:
    """Expansions at ``center`` with their curvature made non-negative (negative diagonal
    entries set to zero, negative eigenvalues of a full precision clipped at zero), the
    linear term moved so that each q_s keeps its gradient at ``center``
    (``b_s' = b_s + (P_s' - P_s) center``). On a non-log-concave likelihood (a ReLU network)
    a client's expansion curves upward in some directions; a Newton step on them then
    jumps without bound (issue 45, the Table 1 MLP at 30 clients x 2,000 rows: the global
    mode went to 5e19, where every client's curvature is zero, and FSGLD's "auto" failed
    with non-finite noise). A log-concave client's expansion is returned as it is.
    Returns ``(surrogates, whether any curvature was floored)``."""
    precision, shift = surrogates
    if surrogates.diagonal:
        floored = jnp.maximum(precision, 0.0)
        return (GaussianSurrogates(precision=floored,
                                   shift=shift + (floored - precision) * center),
                jnp.any(precision < 0))

    def one(matrix):
        lowest = jnp.linalg.eigvalsh(0.5 * (matrix + matrix.T))[0]
        return jnp.where(lowest < 0, _project_psd(matrix), matrix), lowest < 0

    floored, curved_up = jax.vmap(one)(precision)
    return (GaussianSurrogates(precision=floored,
                               shift=shift + jnp.einsum("sij,j->si", floored - precision, center)),
            jnp.any(curved_up))


def fit_sgld(
    flat_model: FlatModel,
    federation: Federation,
    theta0: jax.Array,
    key: jax.Array,
    step_size: float,
    batch_size: int,
    draws: int = 3000,
    burn_in: int = 1000,
    diagonal=None,
    iterations: int = 200,
):
    """The paper's surrogates: SGLD on each client's local target, Gaussian fit of ``draws`` draws.

    Each client runs SGLD (paper convention: theta + h/2 v + N(0, h)) on
    log p(x_s|theta) + (1/S) log p(theta), started at its mode, and fits the
    mean and covariance of its draws; the prior share's curvature at the mean
    is subtracted from the fitted precision so that q_s approximates the
    likelihood factor alone.
    """
    diagonal = _resolve_diagonal(diagonal, flat_model.dim)
    padded = federation.padded()
    num_clients = federation.num_clients
    modes = _find_modes(flat_model, padded, theta0, num_clients, iterations)
    may_be_smaller = some_client_smaller(federation.sizes, batch_size)
    # ``key``: one key, split over the clients (client s gets split(key, S)[s]), or already one
    # key per client (shape (S,): a distributed client passes its own, so that it fits the
    # very surrogate the in-process engine fits for it)
    keys = key if jnp.shape(key) == (num_clients,) else jax.random.split(key, num_clients)
    precision, shift, mixing = _sgld_fit_program(
        flat_model, num_clients, float(step_size), int(batch_size), int(burn_in), int(draws),
        bool(diagonal), bool(may_be_smaller), keys, modes, padded.data, padded.mask,
        padded.sizes)
    if not (np.isfinite(np.asarray(precision)).all() and np.isfinite(np.asarray(shift)).all()):
        raise ValueError(
            "surrogate='sgld': the local SGLD run diverged; lower surrogate_step_size"
        )
    _warn_if_unmixed(np.asarray(mixing), draws)
    return GaussianSurrogates(precision=precision, shift=shift)


@functools.partial(jax.jit, static_argnums=tuple(range(8)))
def _sgld_fit_program(flat_model, num_clients, step_size, batch_size, burn_in, draws, diagonal,
                      may_be_smaller, keys, starts, data, mask, sizes):
    """:func:`fit_sgld`'s compiled part: every client's SGLD run and Gaussian fit, vmapped."""

    def one_client(client_key, start, data, mask, size):
        def grad_estimate(theta, key):
            # the library's one minibatch rule (fedmcmc.minibatch): at most batch_size rows,
            # every row once for a client that has no more
            minibatch = take_minibatch(rng.uniform(key, (batch_size,)), data, 0, size,
                                       may_be_smaller)
            return flat_model.grad_log_prior(theta) / num_clients + likelihood_gradient(
                flat_model, theta, minibatch)

        def step(theta, key):
            key_batch, key_noise = rng.split_key(key)
            noise = rng.normal(key_noise, theta.shape, theta.dtype)
            theta = theta + 0.5 * step_size * grad_estimate(theta, key_batch) + jnp.sqrt(step_size) * noise
            return theta, theta

        keys = rng.split_key(client_key, burn_in + draws)
        _, samples = jax.lax.scan(step, start, keys)
        samples = samples[burn_in:]
        mean = jnp.mean(samples, axis=0)
        mixing = _median_ar1_ess(samples, mean)
        prior_curvature = -jax.hessian(flat_model.log_prior)(mean) / num_clients
        if diagonal:
            variance = jnp.var(samples, axis=0) + 1e-12
            precision = jnp.maximum(1.0 / variance - jnp.diagonal(prior_curvature), 0.0)
            return precision, precision * mean, mixing
        covariance = jnp.cov(samples.T).reshape(mean.shape[0], mean.shape[0])
        covariance = covariance + 1e-10 * jnp.eye(mean.shape[0]) * jnp.trace(covariance)
        precision = _project_psd(jnp.linalg.inv(covariance) - prior_curvature)
        return precision, precision @ mean, mixing

    return jax.vmap(one_client)(keys, starts, data, mask, sizes)


#: below this median effective sample size (of ``draws``) a client's SGLD surrogate is flagged
SGLD_MIN_ESS = 10.0


class SurrogateMixingWarning(UserWarning):
    """A client's SGLD surrogate was fitted from a chain that did not mix."""


def _median_ar1_ess(samples: jax.Array, mean: jax.Array) -> jax.Array:
    """Median over coordinates of K (1 - rho) / (1 + rho), rho the lag-1 autocorrelation of
    the K draws: the effective sample size of an AR(1) chain with that autocorrelation."""
    centred = samples - mean
    variance = jnp.mean(centred * centred, axis=0) + 1e-30
    rho = jnp.mean(centred[1:] * centred[:-1], axis=0) / variance
    rho = jnp.clip(rho, -0.999, 0.999999)
    return jnp.median(samples.shape[0] * (1.0 - rho) / (1.0 + rho))


def _warn_if_unmixed(median_ess: np.ndarray, draws: int) -> None:
    """Warn when clients' SGLD chains mixed poorly. The fitted precision is then set by the
    chain's length rather than by the likelihood (an unmixed chain of K steps of size h
    spreads about sqrt(h K) whatever the target: precision x h x K ~ 9 measured on FSGLD's
    Table 1 MLP: ``fedmcmc reproduce fsgld-table1``), and FSGLD's conducive term,
    which multiplies differences of these precisions by 1/f_s, can dominate the estimator
    and repel the chain."""
    poor = np.nonzero(median_ess < SGLD_MIN_ESS)[0]
    if poor.size:
        shown = ", ".join(f"client {int(s)}: {median_ess[s]:.1f}" for s in poor[:5])
        warnings.warn(
            f"surrogate='sgld': the local SGLD chains of {poor.size} of {median_ess.size} "
            f"client(s) mixed poorly (median effective sample size of {draws} draws: {shown}"
            f"{', ...' if poor.size > 5 else ''}); their fitted precisions then measure the "
            "chain's length rather than the likelihood. Raise surrogate_draws or "
            "surrogate_step_size, or use surrogate='laplace'.",
            SurrogateMixingWarning, stacklevel=user_stacklevel())


class SurrogatePredictionWarning(UserWarning):
    """FSGLD's ``step_size="auto"`` damped or switched off the conducive gradient of clients
    whose surrogate predicts their gradient worse than predicting nothing
    (``langevin.step_size.conducive_weights``)."""


def warn_poor_prediction(name: str, weights, errors) -> None:
    """Say which clients' conducive gradients the set-up weighted below 1, with their
    surrogates' relative prediction errors (``weights``, ``errors``: per client)."""
    weights, errors = np.asarray(weights), np.asarray(errors)
    damped = np.nonzero(weights < 1.0)[0]
    if not damped.size:
        return
    shown = ", ".join(f"client {int(s)}: weight {weights[s]:.2g} (error {errors[s]:.3g})"
                      for s in damped[:5])
    warnings.warn(
        f"{name}: the surrogates of {damped.size} of {weights.size} client(s) predict their "
        f"client's gradient at draws of the posterior's Laplace fit worse than predicting "
        f"nothing (squared error over that of zero above 1: {shown}"
        f"{', ...' if damped.size > 5 else ''}); their conducive gradients are weighted down "
        "(info['conducive_weights']; the estimator stays unbiased). Common on "
        "non-log-concave posteriors (neural networks), where a Laplace fit at a client's mode "
        "says little about its gradient elsewhere.",
        SurrogatePredictionWarning, stacklevel=user_stacklevel())


def fit_surrogates(
    kind: str,
    flat_model: FlatModel,
    federation: Federation,
    theta0: jax.Array,
    key: Optional[jax.Array] = None,
    *,
    diagonal: Optional[bool] = None,
    step_size: Optional[float] = None,
    batch_size: Optional[int] = None,
    draws: int = 3000,
    burn_in: int = 1000,
    iterations: int = 200,
) -> GaussianSurrogates:
    """Fit one Gaussian surrogate per client by ``kind`` in {"exact", "laplace", "sgld"}."""
    if kind == "exact":
        return fit_exact(flat_model, federation, theta0, diagonal)
    if kind == "laplace":
        return fit_laplace(flat_model, federation, theta0, diagonal, iterations)
    if kind == "sgld":
        if key is None or step_size is None or batch_size is None:
            raise ValueError("surrogate='sgld' needs key, step_size and batch_size")
        return fit_sgld(
            flat_model, federation, theta0, key, step_size, batch_size, draws, burn_in,
            diagonal, iterations,
        )
    raise ValueError(f"surrogate must be one of 'exact', 'laplace', 'sgld', got {kind!r}")


def as_surrogates(value: Any, dim: int, num_clients: int) -> GaussianSurrogates:
    """Validate user-supplied surrogates (a GaussianSurrogates or a (precision, shift) pair)."""
    precision, shift = value
    precision = jnp.asarray(precision)
    shift = jnp.asarray(shift)
    if shift.shape != (num_clients, dim) or precision.shape not in (
        (num_clients, dim),
        (num_clients, dim, dim),
    ):
        raise ValueError(
            f"surrogate: expected precision of shape ({num_clients}, {dim}[, {dim}]) and shift "
            f"({num_clients}, {dim}), got {precision.shape} and {shift.shape}"
        )
    return GaussianSurrogates(precision=precision, shift=shift)
