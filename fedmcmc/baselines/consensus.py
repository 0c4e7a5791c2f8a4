"""Consensus Monte Carlo (Scott, Blocker, Bonassi, Chipman, George, McCulloch, "Bayes and
big data: the consensus Monte Carlo algorithm", International Journal of Management
Science and Engineering Management 11 (2016) 78-88) as functional pieces.

With S clients the posterior factorises into subposteriors

    p(theta | x) ∝ prod_s p(x_s | theta) p(theta)^(1/S).

Each client samples its own subposterior p(x_s | theta) p(theta)^(1/S) with NUTS
(BlackJAX), tuned by Stan-style window adaptation during warm-up, and sends its draws to
the server once; the server combines the g-th draws of the clients by precision-weighted
averaging

    theta_g = (sum_s W_s)^(-1) sum_s W_s theta_{s,g},   W_s = Sigma_s^(-1),

with Sigma_s the covariance of client s's subposterior. When every subposterior is Gaussian
(Gaussian likelihoods and prior) the combined draws are exactly distributed as the posterior
for the exact W_s; with estimated W_s the error vanishes as the number of draws grows.

``weighting="stein"`` (ConsensusMC's default) estimates W_s with Stein's identity: for
any (smooth, decaying) subposterior p_s, E[grad log p_s(theta) (theta - mu_s)^T] = -I, so with
K_s = -(1/n) sum_g grad log p_s(theta_g) (theta_g - theta_bar_s)^T (E[K_s] = I) and C_s the
draws' covariance (1/n), W_s = sym(K_s C_s^-1) estimates Sigma_s^-1. For a Gaussian
subposterior with precision Q_s, grad log p_s = -Q_s (theta - m_s) and K_s = Q_s C_s
exactly, so W_s = Q_s whatever the draws: the weights carry no Monte Carlo error, where the
inverse sample covariance (``weighting="precision"``) has a relative error of about
sqrt(d / n) that moves the combined mean (most where small clients have wide
subposteriors). Each client computes its W_s from its own kept draws and the gradients of
its subposterior there (:func:`client_weights`) and sends d^2 floats once (with the
weights of :data:`ERROR_SPLITS` halvings of its draws, for :func:`combination_error`). A
client whose W_s is not positive definite or ill-conditioned (far from Gaussian, too few
draws) uses the inverse sample covariance instead, and the run warns naming it.
``weighting="diagonal"`` uses the marginal variances only (a cheaper variant
for high dimensions) and ``"equal"`` the plain average (W_s = I). (Formulas are written
out rather than cited by equation number: only the paper's abstract and first page could
be consulted when this was written.)

The clients' data are stacked and padded to the largest client (``Federation.padded``)
with a 0/1 mask, so a client's log density sums over its own rows only. The warm-up runs
one client after the other through one compiled program (:func:`build_chains_warmup`, which
each client's endpoint runs on ``engine="ray"``: vmapped over clients, the adaptation rounded
differently and the two engines' draws drifted apart); the transitions of every client of a
chain are vmapped in one compiled program (the NUTS trees of all clients are built together:
each iteration costs the slowest client's tree) and round exactly as one client's.

Step-size convention: NUTS's own (BlackJAX's leapfrog step), not the Langevin one.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..arrays import device_array
from ..federation import PaddedData
from ..model import FlatModel

__all__ = [
    "COMBINATION_ERROR_WARNING",
    "CombinationWarning",
    "combination_error",
    "SubposteriorStates",
    "subposterior_log_density",
    "build_client_warmup",
    "build_chains_warmup",
    "build_warmup",
    "build_client_transition",
    "untuned_states",
    "build_kernel",
    "combine",
    "ClientWeights",
    "build_client_gradients",
    "stein_precision",
    "client_weights",
    "stack_client_weights",
]

WEIGHTINGS = ("stein", "precision", "diagonal", "equal")

#: random halvings of a client's draws behind the predicted combination error
#: (:func:`combination_error`; with ``"stein"`` each client computes its halves' weights)
ERROR_SPLITS = 8


class SubposteriorStates(NamedTuple):
    """The NUTS states and tuned parameters of every client of one chain (leading axis S)."""

    position: jax.Array  # (S, d)
    logdensity: jax.Array  # (S,)
    logdensity_grad: jax.Array  # (S, d)
    step_size: jax.Array  # (S,)
    inverse_mass_matrix: jax.Array  # (S, d) diagonal
    divergences: jax.Array  # (S,) int32 divergent transitions so far (after warm-up)
    acceptance: jax.Array  # (S,) sum of the NUTS acceptance rates so far


def subposterior_log_density(flat_model: FlatModel, num_clients: int) -> Callable:
    """``(theta, data_s, mask_s) -> (1/S) log p(theta) + sum_i mask_i log p(x_i | theta)``."""

    def log_density(theta, data, mask):
        return flat_model.log_prior(theta) / num_clients + flat_model.log_likelihood_sum(
            theta, data, mask)

    return log_density


def build_client_warmup(flat_model: FlatModel, num_clients: int, num_steps: int,
                        target_acceptance_rate: float = 0.8) -> Callable:
    """``(key, data_s, mask_s, theta0) -> (NUTS state, step size, inverse mass)``: one
    client's window adaptation (diagonal mass matrix, step size) of NUTS on its subposterior
    p(x_s | theta) p(theta)^(1/S), ``num_steps`` steps from ``theta0``, on its own rows
    (``mask_s``: 1 on its rows, 0 on padding)."""
    import blackjax
    from blackjax.adaptation.base import get_filter_adapt_info_fn

    log_density = subposterior_log_density(flat_model, num_clients)

    def one(key, data, mask, theta0):
        target = lambda theta: log_density(theta, data, mask)  # noqa: E731
        adaptation = blackjax.window_adaptation(
            blackjax.nuts, target, target_acceptance_rate=target_acceptance_rate,
            adaptation_info_fn=get_filter_adapt_info_fn())
        (state, parameters), _ = adaptation.run(key, theta0, num_steps=num_steps)
        return state, parameters["step_size"], parameters["inverse_mass_matrix"]

    return one


def build_chains_warmup(flat_model: FlatModel, num_clients: int, num_steps: int,
                        target_acceptance_rate: float = 0.8) -> Callable:
    """``(keys (chains,), client, data_s, mask_s, theta0) -> (position, logdensity,
    logdensity_grad, step_size, inverse_mass)``, each with a leading chain axis: client
    ``client``'s warm-up (:func:`build_client_warmup`) of every chain, chain c with
    ``split(keys[c], S)[client]``; compiled. The in-process engine calls it once per client
    and every client's endpoint calls it on its own rows: the same program, so the same
    numbers (the warm-up vmapped over clients rounds differently)."""
    one = build_client_warmup(flat_model, num_clients, num_steps, target_acceptance_rate)

    def chain(key, client, data, mask, theta0):
        state, step_size, inverse_mass = one(jax.random.split(key, num_clients)[client], data,
                                             mask, theta0)
        return (state.position, state.logdensity, state.logdensity_grad,
                jnp.asarray(step_size, theta0.dtype), inverse_mass)

    return jax.jit(jax.vmap(chain, in_axes=(0, None, None, None, None)))


def build_warmup(flat_model: FlatModel, padded: PaddedData, num_steps: int,
                 target_acceptance_rate: float = 0.8) -> Callable:
    """``(keys (chains,), theta0 (d,)) -> SubposteriorStates`` with leading axes (chains, S):
    :func:`build_chains_warmup` on every client's subposterior, one client after the other;
    client s's warm-up of chain c uses ``split(keys[c], S)[s]``."""
    num_clients = int(padded.mask.shape[0])
    warm = build_chains_warmup(flat_model, num_clients, num_steps, target_acceptance_rate)

    # each client's rows are cut, and the clients' results stacked, on the host: the warm-up
    # is the only compiled program (no eager slice, stack or zeros of its own)
    rows = jax.tree_util.tree_map(np.asarray, padded.data)
    mask = np.asarray(padded.mask)

    def warmup(keys, theta0):
        parts = [warm(keys, np.int32(s), jax.tree_util.tree_map(lambda leaf: leaf[s], rows),
                      mask[s], theta0) for s in range(num_clients)]
        position, logdensity, grad, step_size, inverse_mass = (
            device_array(np.stack([np.asarray(part[i]) for part in parts], axis=1))
            for i in range(5))
        chains = keys.shape[0]
        return SubposteriorStates(
            position=position,
            logdensity=logdensity,
            logdensity_grad=grad,
            step_size=step_size,
            inverse_mass_matrix=inverse_mass,
            divergences=device_array(np.zeros((chains, num_clients), np.int32)),
            acceptance=device_array(np.zeros((chains, num_clients), theta0.dtype)),
        )

    return warmup


def untuned_states(flat_model: FlatModel, padded: PaddedData, theta0: jax.Array,
                   step_size: float) -> SubposteriorStates:
    """Every client at ``theta0`` with step size ``step_size`` and an identity mass matrix
    (no warm-up)."""
    num_clients = int(padded.mask.shape[0])
    log_density = subposterior_log_density(flat_model, num_clients)
    value_and_grad = jax.vmap(jax.value_and_grad(log_density), in_axes=(None, 0, 0))
    values, grads = value_and_grad(theta0, padded.data, padded.mask)
    return SubposteriorStates(
        position=jnp.broadcast_to(theta0, (num_clients,) + theta0.shape),
        logdensity=values,
        logdensity_grad=grads,
        step_size=jnp.full((num_clients,), step_size, theta0.dtype),
        inverse_mass_matrix=jnp.ones((num_clients,) + theta0.shape, theta0.dtype),
        divergences=jnp.zeros((num_clients,), jnp.int32),
        acceptance=jnp.zeros((num_clients,), theta0.dtype),
    )


def build_client_transition(flat_model: FlatModel, num_clients: int,
                            max_num_doublings: int = 10) -> Callable:
    """``(key, position, logdensity, grad, step_size, inverse_mass, data_s, mask_s) ->
    (NUTS state, divergent, acceptance rate)``: one NUTS transition of one client's chain
    on its subposterior, on its own rows."""
    import blackjax
    from blackjax.mcmc.hmc import HMCState

    log_density = subposterior_log_density(flat_model, num_clients)
    nuts = blackjax.nuts.build_kernel()

    def one(key, position, logdensity, grad, step_size, inverse_mass, data, mask):
        target = lambda theta: log_density(theta, data, mask)  # noqa: E731
        state, info = nuts(key, HMCState(position, logdensity, grad), target, step_size,
                           inverse_mass, max_num_doublings=max_num_doublings)
        return state, info.is_divergent, info.acceptance_rate

    return one


def build_kernel(flat_model: FlatModel, padded: PaddedData, max_num_doublings: int = 10
                 ) -> Callable:
    """``step(key, states) -> states``: one NUTS transition (:func:`build_client_transition`)
    of every client's chain on its subposterior (client s uses ``split(key, S)[s]``)."""
    num_clients = int(padded.mask.shape[0])
    one = build_client_transition(flat_model, num_clients, max_num_doublings)

    def step(key: jax.Array, states: SubposteriorStates) -> SubposteriorStates:
        keys = jax.random.split(key, num_clients)
        new, divergent, acceptance = jax.vmap(one)(
            keys, states.position, states.logdensity, states.logdensity_grad, states.step_size,
            states.inverse_mass_matrix, padded.data, padded.mask)
        return states._replace(
            position=new.position,
            logdensity=new.logdensity,
            logdensity_grad=new.logdensity_grad,
            divergences=states.divergences + divergent.astype(jnp.int32),
            acceptance=states.acceptance + acceptance.astype(states.acceptance.dtype),
        )

    return step


def build_client_gradients(flat_model: FlatModel, num_clients: int) -> Callable:
    """``(draws (n, d), data_s, mask_s) -> (n, d)``: grad log p_s at each of a client's draws,
    p_s its subposterior (:func:`subposterior_log_density`) on its own rows; compiled (the
    rows are arguments: every client runs the same program, on either engine), 64 draws at a
    time (memory: 64 x the client's rows)."""
    gradient = jax.grad(subposterior_log_density(flat_model, num_clients))

    def client_gradients(draws, data, mask):
        return jax.lax.map(lambda theta: gradient(theta, data, mask), draws, batch_size=64)

    return jax.jit(client_gradients)


#: the largest condition number a Stein weight W_s may have before the client falls back
STEIN_MAX_CONDITION = 1e10


def stein_precision(draws: np.ndarray, gradients: np.ndarray) -> tuple:
    """``(W_s (d, d), ok)``: the Stein estimate of a subposterior's precision,
    W_s = sym(K_s C_s^-1) with K_s = -(1/n) sum_g grad_g (theta_g - theta_bar)^T and C_s the
    draws' covariance (1/n), sym(A) = (A + A^T) / 2 (see the module docstring). ``ok`` is
    False when W_s is not finite, not positive definite or has a condition number above
    :data:`STEIN_MAX_CONDITION`; W_s is then the inverse sample covariance (1/(n-1)), the
    ``"precision"`` weight. ``draws``, ``gradients``: (n, d), n > d."""
    draws = np.asarray(draws, dtype=np.float64)
    gradients = np.asarray(gradients, dtype=np.float64)
    n = draws.shape[0]
    centred = draws - draws.mean(axis=0)
    covariance = centred.T @ centred / n
    stein = -(gradients.T @ centred) / n  # K_s
    with np.errstate(all="ignore"):
        try:
            weight = np.linalg.solve(covariance, stein.T).T  # K_s C_s^-1 (C_s symmetric)
        except np.linalg.LinAlgError:
            weight = np.full_like(covariance, np.nan)
        weight = 0.5 * (weight + weight.T)
        ok = bool(np.all(np.isfinite(weight)))
        if ok:
            eigenvalues = np.linalg.eigvalsh(weight)
            ok = bool(eigenvalues[0] > 0
                      and eigenvalues[-1] <= STEIN_MAX_CONDITION * eigenvalues[0])
    if ok:
        return weight, True
    return np.linalg.inv(np.atleast_2d(np.cov(draws, rowvar=False))), False


class ClientWeights(NamedTuple):
    """What a client sends up once with ``weighting="stein"`` (:func:`client_weights`)."""

    weight: np.ndarray  # (d, d) W_s from all its kept draws
    halves: object  # (ERROR_SPLITS, 2, d, d) W_s of each halving's two halves, or None
    stein: bool  # False: W_s is the inverse sample covariance (the Stein weight was unusable)


def client_weights(draws: np.ndarray, gradients: np.ndarray, splits: int = ERROR_SPLITS,
                   seed: int = 0) -> ClientWeights:
    """A client's Stein weight (:func:`stein_precision`) from its kept draws ``(n, d)`` (every
    chain, chain after chain) and its subposterior's gradients there, and the weights of the
    two halves of ``splits`` random halvings (the halvings :func:`combination_error` makes:
    the same generator, so the same on every client; ``None`` when it predicts no error from
    so few draws). d^2 (1 + 2 splits) floats."""
    draws = np.asarray(draws, dtype=np.float64)
    gradients = np.asarray(gradients, dtype=np.float64)
    total, dim = draws.shape
    weight, stein = stein_precision(draws, gradients)
    halves = None
    if total >= 2 * (dim + 2):
        generator = np.random.default_rng(seed)
        half = total // 2
        halves = np.empty((splits, 2, dim, dim))
        for split in range(splits):
            order = generator.permutation(total)
            for side, part in enumerate((order[:half], order[half:2 * half])):
                halves[split, side] = stein_precision(draws[part], gradients[part])[0]
    return ClientWeights(weight, halves, stein)


def stack_client_weights(replies) -> tuple:
    """``(weights (S, d, d), half_weights (splits, 2, S, d, d) or None, fallback_clients)``
    from the clients' :class:`ClientWeights`, in client order; ``fallback_clients``: the
    clients whose Stein weight was unusable (they sent the inverse sample covariance)."""
    weights = np.stack([np.asarray(reply.weight) for reply in replies])
    halves = None
    if all(reply.halves is not None for reply in replies):
        halves = np.stack([np.asarray(reply.halves) for reply in replies], axis=2)
    fallback = [client for client, reply in enumerate(replies) if not reply.stein]
    return weights, halves, fallback


def combine(draws: np.ndarray, weighting: str = "precision", weights=None) -> tuple:
    """The consensus draws theta_g = (sum_s W_s)^(-1) sum_s W_s theta_{s,g}.

    ``draws``: (chains, n, S, d) the g-th draw of every client of every chain. The weights
    W_s are estimated from all of client s's draws (every chain), or are ``weights``
    ``(S, d, d)`` when given (with ``weighting="stein"`` they must be: the clients' Stein
    weights, :func:`client_weights`). Returns ``(combined (chains, n, d), weights (S, d, d))``.
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    draws = np.asarray(draws, dtype=np.float64)
    chains, n, num_clients, dim = draws.shape
    per_client = draws.transpose(2, 0, 1, 3).reshape(num_clients, chains * n, dim)
    if weights is not None:
        weights = np.asarray(weights, dtype=np.float64)
        if weights.shape != (num_clients, dim, dim):
            raise ValueError(f"weights: expected shape {(num_clients, dim, dim)}, got "
                             f"{weights.shape}")
    elif weighting == "stein":
        raise ValueError("weights: weighting='stein' needs the clients' Stein weights "
                         "(consensus.client_weights), which need their gradients")
    elif weighting == "equal":
        weights = np.broadcast_to(np.eye(dim), (num_clients, dim, dim)).copy()
    elif weighting == "diagonal":
        variances = per_client.var(axis=1, ddof=1)
        weights = np.stack([np.diag(1.0 / v) for v in variances])
    else:
        weights = np.stack([np.linalg.inv(np.atleast_2d(np.cov(x, rowvar=False)))
                            for x in per_client])
    total = weights.sum(axis=0)
    weighted = np.einsum("sij,cnsj->cni", weights, draws)
    combined = np.linalg.solve(total, weighted.reshape(-1, dim).T).T.reshape(chains, n, dim)
    return combined, weights


#: the predicted error of the combined mean (posterior sds) above which a run warns
COMBINATION_ERROR_WARNING = 0.05


class CombinationWarning(UserWarning):
    """The consensus combination's mean is predicted to be off by more than
    :data:`COMBINATION_ERROR_WARNING` posterior sds because its weights W_s are estimated
    from the clients' draws (invisible to R-hat and ESS)."""


def combination_error(draws: np.ndarray, weighting: str = "precision", splits: int = ERROR_SPLITS,
                      seed: int = 0, weights=None, half_weights=None) -> np.ndarray:
    """The sd of the combined mean's error due to the weights W_s estimated from draws, per
    coordinate and in units of the combined draws' sd (0 for ``"equal"``).

    The combined mean is (sum_s W_s)^-1 sum_s W_s m_s (m_s: client s's mean). Each of
    ``splits`` random halvings of every client's draws gives two weight estimates from n/2
    draws each, applied to the same m_s: their combined means differ by e_A - e_B, two
    independent errors of twice the variance of the n-draw estimate's (it is proportional
    to 1/n), so the error variance of the n-draw weights is E[(mu_A - mu_B)^2] / 4.
    ``draws``: (chains, n, S, d). With ``weighting="stein"`` the weights are the clients'
    (``weights`` (S, d, d) and ``half_weights`` (splits, 2, S, d, d), the halves' weights of
    :func:`client_weights`, whose halvings are these): the combination's own weights."""
    draws = np.asarray(draws, dtype=np.float64)
    chains, n, num_clients, dim = draws.shape
    if weighting == "equal" or chains * n < 2 * (dim + 2):
        return np.zeros(dim)
    if weighting == "stein" and (weights is None or half_weights is None):
        raise ValueError("half_weights: weighting='stein' predicts its error from the "
                         "clients' weights of halves of their draws (consensus.client_weights)")
    per_client = draws.transpose(2, 0, 1, 3).reshape(num_clients, chains * n, dim)
    means = per_client.mean(axis=1)
    combined, _ = combine(draws, weighting, weights)
    sd = np.maximum(combined.reshape(-1, dim).std(axis=0), np.finfo(np.float64).tiny)
    generator = np.random.default_rng(seed)
    squared = np.zeros(dim)
    half = (chains * n) // 2
    for split in range(splits):
        order = generator.permutation(chains * n)
        centres = []
        for side, part in enumerate((order[:half], order[half:2 * half])):
            if weighting == "stein":
                part_weights = np.asarray(half_weights[split, side], dtype=np.float64)
            else:
                halves = per_client[:, part][None].transpose(0, 2, 1, 3)  # (1, n/2, S, d)
                _, part_weights = combine(halves, weighting)
            centres.append(np.linalg.solve(part_weights.sum(axis=0),
                                           np.einsum("sij,sj->i", part_weights, means)))
        squared += (centres[0] - centres[1]) ** 2
    return np.sqrt(squared / splits / 4.0) / sd
