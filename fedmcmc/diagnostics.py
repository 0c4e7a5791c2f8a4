"""Diagnostics of draws: convergence (ESS, R-hat) and distances between two sets of draws.

Every function takes draws as

* a :class:`fedmcmc.Result` (its flat draws),
* a :class:`fedmcmc.reference.ReferencePosterior` (its draws),
* a numpy array of shape ``(chains, draws, dim)``, ``(draws, dim)`` or ``(draws,)``.

Convergence figures need the chain axis: ``ess`` and ``rhat`` read a 2-D array
as ``(chains, draws)`` of one scalar, the ArviZ convention. Distances pool the
chains and read a 2-D array as ``(draws, dim)``.

>>> import fedmcmc as fm
>>> fm.diagnostics.ess(result)                      # bulk ESS per coordinate (ArviZ's)
>>> fm.diagnostics.wasserstein_marginal(result, reference)   # W1 per coordinate
>>> fm.diagnostics.compare(result, reference)        # every distance in one dict
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

__all__ = [
    "bias_estimate",
    "ess",
    "ess_tail",
    "rhat",
    "wasserstein_marginal",
    "wasserstein_joint",
    "gaussian_kl",
    "kl_gaussian_fit",
    "mmd",
    "compare",
]


# ----------------------------------------------------------------- coercion


def _chains(draws: Any) -> np.ndarray:
    """(chains, draws, dim) float64 array."""
    if hasattr(draws, "flat_samples"):
        array = np.asarray(draws.flat_samples(), dtype=np.float64)
    elif hasattr(draws, "draws") and not isinstance(draws, np.ndarray):
        array = np.asarray(draws.draws, dtype=np.float64)[None]
    else:
        array = np.asarray(draws, dtype=np.float64)
        if array.ndim == 1:
            array = array[None, :, None]
        elif array.ndim == 2:
            array = array[:, :, None]
        elif array.ndim != 3:
            raise ValueError(
                f"draws must have shape (chains, draws, dim), (chains, draws) or (draws,), got {array.shape}"
            )
    return array


def _pooled(draws: Any, argument: str = "draws") -> np.ndarray:
    """(n, dim) float64 array with non-finite rows dropped (diverged chains are NaN)."""
    if hasattr(draws, "flat_samples"):
        array = np.asarray(draws.flat_samples(), dtype=np.float64)
        array = array.reshape(-1, array.shape[-1])
    elif hasattr(draws, "draws") and not isinstance(draws, np.ndarray):
        array = np.asarray(draws.draws, dtype=np.float64)
    else:
        array = np.asarray(draws, dtype=np.float64)
        if array.ndim == 1:
            array = array[:, None]
        elif array.ndim == 3:
            array = array.reshape(-1, array.shape[-1])
        elif array.ndim != 2:
            raise ValueError(
                f"{argument} must have shape (draws, dim) or (chains, draws, dim), got {array.shape}"
            )
    array = array[np.all(np.isfinite(array), axis=1)]
    if array.shape[0] < 2:
        raise ValueError(f"{argument} needs at least 2 finite draws, got {array.shape[0]}")
    return array


def _pair(x: Any, y: Any):
    a, b = _pooled(x, "x"), _pooled(y, "y")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"x and y have different dimensions: {a.shape[1]} and {b.shape[1]}")
    return a, b


def _subsample(array: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    if array.shape[0] <= size:
        return array
    return array[np.sort(rng.choice(array.shape[0], size=size, replace=False))]


# -------------------------------------------------------------- convergence


def ess(draws: Any, method: str = "bulk") -> np.ndarray:
    """Effective sample size per coordinate (ArviZ ``az.ess``, rank-normalised ``"bulk"`` by default).

    The default ``"bulk"`` is computed here, ArviZ's numbers without importing ArviZ (about
    1.3 s in a new process); other methods go through ArviZ. Returns an array of shape
    ``(dim,)``.
    """
    array = _chains(draws)
    if method == "bulk":
        return np.array([_bulk_ess(array[:, :, i]) for i in range(array.shape[2])])
    import arviz as az

    return np.array([float(az.ess(array[:, :, i], method=method)) for i in range(array.shape[2])])


def ess_tail(draws: Any) -> np.ndarray:
    """Tail effective sample size per coordinate (ArviZ ``az.ess(method="tail")``): the smaller
    of the ESS of the 5% and 95% quantile indicators on split chains, ArviZ's numbers without
    importing ArviZ. Returns an array of shape ``(dim,)``."""
    array = _chains(draws)
    return np.array([_tail_ess(array[:, :, i]) for i in range(array.shape[2])])


def rhat(draws: Any, method: str = "rank") -> np.ndarray:
    """Split R-hat per coordinate (ArviZ ``az.rhat``); values near 1 mean the chains agree.

    The default ``"rank"`` (the larger of the rank-normalised bulk and folded split R-hats)
    is computed here, ArviZ's numbers without importing ArviZ; other methods go through
    ArviZ. Needs at least 2 chains of 4 draws (else nan). Returns an array of shape ``(dim,)``.
    """
    array = _chains(draws)
    if method == "rank":
        return np.array([_rank_rhat(array[:, :, i]) for i in range(array.shape[2])])
    import arviz as az

    return np.array([float(az.rhat(array[:, :, i], method=method)) for i in range(array.shape[2])])


# --------------------------------------------------------------- distances


def wasserstein_marginal(x: Any, y: Any) -> np.ndarray:
    """1-Wasserstein distance between the empirical marginals of every coordinate.

    Exact for empirical distributions of any sizes (``scipy.stats.wasserstein_distance``).
    Returns an array of shape ``(dim,)``.
    """
    from scipy.stats import wasserstein_distance

    a, b = _pair(x, y)
    return np.array([wasserstein_distance(a[:, i], b[:, i]) for i in range(a.shape[1])])


def wasserstein_joint(x: Any, y: Any, max_points: int = 1000, seed: int = 0) -> float:
    """1-Wasserstein distance between the joint empirical distributions (Euclidean cost).

    Between two empirical distributions with the same number m of equally
    weighted points the optimal transport plan is a permutation, so W1 is the
    mean cost of the optimal assignment (``scipy.optimize.linear_sum_assignment``):
    exact for the subsamples. Both sets are subsampled without replacement to
    ``m = min(len(x), len(y), max_points)`` points (O(m^3) time); the result is
    the exact W1 between those subsamples, which overestimates the population W1
    by the finite-sample term (of order m^(-1/dim)).
    """
    from scipy.optimize import linear_sum_assignment
    from scipy.spatial.distance import cdist

    a, b = _pair(x, y)
    rng = np.random.default_rng(seed)
    m = int(min(a.shape[0], b.shape[0], max_points))
    a, b = _subsample(a, m, rng), _subsample(b, m, rng)
    cost = cdist(a, b)
    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].mean())


def gaussian_kl(mean0, cov0, mean1, cov1) -> float:
    """KL( N(mean0, cov0) || N(mean1, cov1) ) in nats, closed form."""
    mean0, mean1 = np.atleast_1d(np.asarray(mean0, float)), np.atleast_1d(np.asarray(mean1, float))
    cov0, cov1 = np.atleast_2d(np.asarray(cov0, float)), np.atleast_2d(np.asarray(cov1, float))
    d = mean0.shape[0]
    chol1 = np.linalg.cholesky(cov1)
    solve = np.linalg.solve
    inv_cov1_cov0 = solve(chol1.T, solve(chol1, cov0))
    diff = solve(chol1, mean1 - mean0)
    sign0, logdet0 = np.linalg.slogdet(cov0)
    logdet1 = 2.0 * np.sum(np.log(np.diag(chol1)))
    if sign0 <= 0:
        raise ValueError("cov0 must be positive definite")
    return float(0.5 * (np.trace(inv_cov1_cov0) + diff @ diff - d + logdet1 - logdet0))


def _fit(array: np.ndarray):
    mean = array.mean(axis=0)
    cov = np.atleast_2d(np.cov(array, rowvar=False))
    # A tiny jitter keeps degenerate fits (a chain stuck at one point) finite.
    cov = cov + 1e-12 * np.eye(cov.shape[0]) * max(np.trace(cov) / cov.shape[0], 1e-300)
    return mean, cov


def kl_gaussian_fit(x: Any, y: Any) -> float:
    """KL between Gaussians fitted (mean, covariance) to x and to y: KL(N_x || N_y), in nats.

    Exact when both are Gaussian; otherwise a second-moment summary.
    """
    a, b = _pair(x, y)
    return gaussian_kl(*_fit(a), *_fit(b))


def mmd(x: Any, y: Any, bandwidth: Optional[float] = None, max_points: int = 2000,
        seed: int = 0) -> float:
    """Maximum mean discrepancy with a Gaussian kernel ``exp(-|u - v|^2 / (2 l^2))``.

    The square root of the (non-negative, biased) V-statistic of MMD^2 on
    subsamples of at most ``max_points`` points each. ``bandwidth`` l defaults to
    the median pairwise distance of the pooled subsamples (median heuristic).
    """
    from scipy.spatial.distance import cdist

    a, b = _pair(x, y)
    rng = np.random.default_rng(seed)
    a, b = _subsample(a, max_points, rng), _subsample(b, max_points, rng)
    if bandwidth is None:
        both = np.concatenate([a, b])
        probe = _subsample(both, 1000, rng)
        distances = cdist(probe, probe)
        bandwidth = float(np.median(distances[np.triu_indices_from(distances, k=1)]))
        bandwidth = bandwidth if bandwidth > 0 else 1.0
    elif not bandwidth > 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth!r}")
    gamma = 1.0 / (2.0 * bandwidth**2)
    kxx = np.exp(-gamma * cdist(a, a, "sqeuclidean")).mean()
    kyy = np.exp(-gamma * cdist(b, b, "sqeuclidean")).mean()
    kxy = np.exp(-gamma * cdist(a, b, "sqeuclidean")).mean()
    return float(np.sqrt(max(kxx + kyy - 2.0 * kxy, 0.0)))


def _kl_or_none(a: np.ndarray, b: np.ndarray) -> Optional[float]:
    """KL of Gaussian fits, or None when a fitted covariance is singular (more
    coordinates than draws)."""
    if a.shape[0] <= a.shape[1] or b.shape[0] <= b.shape[1]:
        return None
    try:
        value = kl_gaussian_fit(a, b)
    except (np.linalg.LinAlgError, ValueError):
        return None
    return value if np.isfinite(value) else None


def compare(x: Any, reference: Any, max_points: int = 1000, seed: int = 0) -> Dict[str, Any]:
    """Every distance between draws ``x`` and ``reference`` draws, as plain Python numbers.

    Keys: ``w1_marginal`` (list per coordinate), ``w1_marginal_mean``, ``w1_joint``,
    ``kl_gaussian`` (None when a Gaussian fit is singular), ``mmd``, ``mean_abs_error`` (max over coordinates of ``|mean
    difference|``), ``sd_rel_error`` (max over coordinates of ``|sd_x / sd_ref - 1|``).
    """
    a, b = _pair(x, reference)
    w1 = wasserstein_marginal(a, b)
    sd_ref = b.std(axis=0)
    return {
        "w1_marginal": w1.tolist(),
        "w1_marginal_mean": float(w1.mean()),
        "w1_joint": wasserstein_joint(a, b, max_points=max_points, seed=seed),
        "kl_gaussian": _kl_or_none(a, b),
        "mmd": mmd(a, b, max_points=max_points, seed=seed),
        "mean_abs_error": float(np.max(np.abs(a.mean(axis=0) - b.mean(axis=0)))),
        "sd_rel_error": float(np.max(np.abs(a.std(axis=0) / np.where(sd_ref > 0, sd_ref, 1.0) - 1.0))),
    }


# ----------------------------------------------- effective sample size, without ArviZ
#
# Every decentralised run reports its bias estimate with a Monte Carlo standard error, and
# importing ArviZ (matplotlib, pandas, xarray, scipy.stats) took 1.3 s of a DULA run's 2.3 s
# in a new process. These compute ArviZ's ``ess(method="bulk")``, ``rhat(method="rank")`` and
# ``mcse(method="mean")`` for one scalar's ``(chains, draws)`` array (Vehtari, Gelman,
# Simpson, Carpenter and Buerkner 2021, "Rank-normalization, folding, and localization: an
# improved R-hat": split chains, rank normalisation, folding, Geyer's initial monotone
# sequence); tests/core/test_diagnostics.py checks them against ArviZ.


def _split_chains(values: np.ndarray) -> np.ndarray:
    """(C, N) -> (2C, N // 2): each chain's first and last halves (the middle draw of an odd
    N left out)."""
    half = values.shape[1] // 2
    return np.concatenate([values[:, :half], values[:, values.shape[1] - half:]], axis=0)


def _autocovariance(values: np.ndarray) -> np.ndarray:
    """Each row's autocovariance at lags 0 .. N-1 (divided by N), by FFT."""
    n = values.shape[1]
    centred = values - values.mean(axis=1, keepdims=True)
    length = 1 << int(2 * n - 1).bit_length()  # a power of 2 >= 2N: no circular overlap
    spectrum = np.fft.rfft(centred, n=length, axis=1)
    return np.fft.irfft(spectrum * np.conjugate(spectrum), n=length, axis=1)[:, :n] / n


def _ess_of_chains(values: np.ndarray) -> float:
    """The multi-chain effective sample size of (C, N) (the paper's equations 10-11): the
    autocorrelations combined over chains, summed in pairs while the pairs stay positive and
    made monotone (Geyer's initial monotone sequence)."""
    chains, n = values.shape
    if np.max(values) - np.min(values) < np.finfo(float).resolution:
        return float(values.size)  # constant: every draw counts (ArviZ's convention)
    autocovariance = _autocovariance(values)
    mean_within = autocovariance[:, 0].mean() * n / (n - 1.0)
    variance_plus = mean_within * (n - 1.0) / n
    if chains > 1:
        variance_plus += np.var(values.mean(axis=1), ddof=1)
    rho = np.zeros(n)
    rho[0] = even = 1.0
    rho[1] = odd = 1.0 - (mean_within - autocovariance[:, 1].mean()) / variance_plus
    lag = 1
    while lag < n - 3 and even + odd > 0.0:
        even = 1.0 - (mean_within - autocovariance[:, lag + 1].mean()) / variance_plus
        odd = 1.0 - (mean_within - autocovariance[:, lag + 2].mean()) / variance_plus
        if even + odd >= 0:
            rho[lag + 1], rho[lag + 2] = even, odd
        lag += 2
    last = lag - 2
    if even > 0:
        rho[last + 1] = even
    lag = 1
    while lag <= last - 2:  # monotone: no pair larger than the pair before it
        if rho[lag + 1] + rho[lag + 2] > rho[lag - 1] + rho[lag]:
            rho[lag + 1] = rho[lag + 2] = (rho[lag - 1] + rho[lag]) / 2.0
        lag += 2
    total = chains * n
    tau = -1.0 + 2.0 * np.sum(rho[:last + 1]) + np.sum(rho[last + 1:last + 2])
    tau = max(tau, 1.0 / np.log10(total))
    return float("nan") if np.isnan(rho).any() else float(total / tau)


def _average_ranks(flat: np.ndarray) -> np.ndarray:
    """Ranks 1..S of ``flat``, ties given their average rank."""
    order = np.argsort(flat, kind="mergesort")
    ordered = flat[order]
    new_value = np.r_[True, ordered[1:] != ordered[:-1]]
    starts = np.flatnonzero(new_value)  # first of each run of equal values
    ends = np.r_[starts[1:], flat.size]  # one past the last
    group = np.cumsum(new_value) - 1
    ranks = np.empty(flat.size)
    ranks[order] = 0.5 * (starts[group] + 1 + ends[group])
    return ranks


def _valid(values: np.ndarray, min_chains: int = 1) -> bool:
    return (values.shape[0] >= min_chains and values.shape[1] >= 4
            and bool(np.all(np.isfinite(values))))


def _rank_normalised(values: np.ndarray) -> np.ndarray:
    """Normal scores of the pooled ranks: Phi^-1((r - 3/8) / (S + 1/4)) (the paper's
    equation 14)."""
    from scipy.special import ndtri

    ranks = _average_ranks(values.ravel()).reshape(values.shape)
    return ndtri((ranks - 3 / 8) / (values.size + 1 / 4))


def _bulk_ess(values: np.ndarray) -> float:
    """Bulk effective sample size of one scalar's (C, N) draws: of the rank-normalised split
    chains (the paper's section 3.1; ArviZ's ``ess(method="bulk")``)."""
    values = np.asarray(values, np.float64)
    if not _valid(values):
        return float("nan")
    return _ess_of_chains(_rank_normalised(_split_chains(values)))


def _tail_ess(values: np.ndarray) -> float:
    """Tail effective sample size of one scalar's (C, N) draws: the smaller ESS of the
    indicators ``draw <= q05`` and ``draw <= q95`` of the split chains (the paper's section
    4.3; ArviZ's ``ess(method="tail")``)."""
    values = np.asarray(values, np.float64)
    if not _valid(values):
        return float("nan")
    split = _split_chains(values)
    return min(_ess_of_chains((split <= np.quantile(values, probability)).astype(np.float64))
               for probability in (0.05, 0.95))


def _split_rhat(values: np.ndarray) -> float:
    """R-hat of (C, N) chains as given (the paper's equations 3-4): sqrt of the pooled
    variance estimate over the mean within-chain variance."""
    n = values.shape[1]
    between = n * np.var(values.mean(axis=1), ddof=1)
    within = np.mean(np.var(values, axis=1, ddof=1))
    with np.errstate(divide="ignore", invalid="ignore"):  # constant draws: nan, as ArviZ
        return float(np.sqrt((between / within + n - 1) / n))


def _rank_rhat(values: np.ndarray) -> float:
    """Rank-normalised split R-hat of one scalar's (C, N) draws: the larger of the bulk and
    the folded (|draw - median|, the tails) ones (the paper's section 4.2; ArviZ's
    ``rhat(method="rank")``)."""
    values = np.asarray(values, np.float64)
    if not _valid(values, min_chains=2):
        return float("nan")
    return _rank_rhat_of_split(_split_chains(values))


def _rank_rhat_of_split(split: np.ndarray) -> float:
    """:func:`_rank_rhat` of chains already split (also one chain's two halves: the split
    R-hat of a single chain, which ArviZ leaves nan)."""
    folded = np.abs(split - np.median(split))  # about the split draws' median, as ArviZ
    return max(_split_rhat(_rank_normalised(split)), _split_rhat(_rank_normalised(folded)))


def _mcse_mean(values: np.ndarray) -> float:
    """Monte Carlo standard error of the mean of one scalar's (C, N) draws: sd / sqrt(ESS of
    the split chains) (ArviZ's ``mcse(method="mean")``)."""
    values = np.asarray(values, np.float64)
    if not _valid(values):
        return float("nan")
    return float(np.std(values, ddof=1) / np.sqrt(_ess_of_chains(_split_chains(values))))


def bias_estimate(average: np.ndarray, global_gradient: np.ndarray,
                  laplace_cov: Optional[np.ndarray]) -> Optional[dict]:
    """The network average's bias estimated from the run alone (``info["bias_estimate"]``).

    Under the posterior the total energy's gradient has mean zero (E_pi[grad U] = 0, an
    integration by parts); at the network average it has mean about A (E[w_bar] - posterior
    mean) (second order in the spread, see :mod:`fedmcmc.decentralised.tuning`). So
    ``Sigma mean_k grad U(w_bar_k)`` estimates the bias, with ``Sigma`` the Laplace
    covariance (the draws' covariance when there is none), reported in posterior sds with
    its Monte Carlo standard error (ArviZ's ``mcse`` of the mean, from the effective sample
    size; computed by :func:`_mcse_mean` and :func:`_bulk_ess`, the same numbers without
    importing ArviZ). Needs ``gradient_error=True``
    (the engine evaluates every agent's full gradient at w_bar per kept draw).
    """
    chains, kept, dim = average.shape
    if kept < 20:
        return None
    covariance = laplace_cov
    if covariance is None:
        covariance = np.atleast_2d(np.cov(average.reshape(-1, dim), rowvar=False))
    sd = np.sqrt(np.diag(covariance))
    values = np.einsum("ij,ckj->cki", covariance, global_gradient.astype(np.float64)) / sd
    estimate = values.mean(axis=(0, 1))
    standard_error = np.asarray([_mcse_mean(values[:, :, j]) for j in range(dim)])
    ess = np.asarray([_bulk_ess(values[:, :, j]) for j in range(dim)])
    return {"in_sd": estimate.tolist(), "standard_error": standard_error.tolist(),
            "ess": ess.tolist()}


# ------------------------------------------------- the same figures, every coordinate at once
# fedmcmc.convergence checks every run: the loops above cost a few ms per coordinate, minutes
# for a neural network's parameters. These compute the same numbers (the tests compare them
# with the per-coordinate functions and with ArviZ) on a (dim, chains, draws) array, the Geyer
# truncation and monotone steps looping over lags with every coordinate in one array operation.


def _ess_batch(values: np.ndarray) -> np.ndarray:
    """:func:`_ess_of_chains` of every row of ``values`` (D, C, N)."""
    dim, chains, n = values.shape
    out = np.full(dim, np.nan)
    constant = (values.max(axis=(1, 2)) - values.min(axis=(1, 2))) < np.finfo(float).resolution
    centred = values - values.mean(axis=2, keepdims=True)
    length = 1 << int(2 * n - 1).bit_length()
    spectrum = np.fft.rfft(centred, n=length, axis=2)
    autocovariance = np.fft.irfft(spectrum * np.conjugate(spectrum), n=length, axis=2)[:, :, :n] / n
    mean_within = autocovariance[:, :, 0].mean(axis=1) * n / (n - 1.0)
    variance_plus = mean_within * (n - 1.0) / n
    if chains > 1:
        variance_plus = variance_plus + np.var(values.mean(axis=2), axis=1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho_all = 1.0 - (mean_within[:, None] - autocovariance.mean(axis=1)) / variance_plus[:, None]
    rho = np.zeros((dim, n))
    rho[:, 0] = 1.0
    if n > 1:
        rho[:, 1] = rho_all[:, 1]
    even = np.ones(dim)
    odd = rho_all[:, 1].copy() if n > 1 else np.zeros(dim)
    running = np.ones(dim, bool)
    final_lag = np.ones(dim, dtype=np.int64)
    lag = 1
    while lag < n - 3 and running.any():
        with np.errstate(invalid="ignore"):
            stopping = running & ~(even + odd > 0.0)
        final_lag[stopping] = lag
        running &= ~stopping
        if not running.any():
            break
        new_even, new_odd = rho_all[:, lag + 1], rho_all[:, lag + 2]
        even = np.where(running, new_even, even)
        odd = np.where(running, new_odd, odd)
        with np.errstate(invalid="ignore"):
            store = running & (new_even + new_odd >= 0)
        rho[store, lag + 1] = new_even[store]
        rho[store, lag + 2] = new_odd[store]
        lag += 2
    final_lag[running] = lag
    last = final_lag - 2
    rows = np.arange(dim)
    with np.errstate(invalid="ignore"):
        positive = even > 0
    rho[rows[positive], last[positive] + 1] = even[positive]
    lag = 1
    while lag <= last.max() - 2:
        before = rho[:, lag - 1] + rho[:, lag]
        with np.errstate(invalid="ignore"):
            fix = (lag <= last - 2) & (rho[:, lag + 1] + rho[:, lag + 2] > before)
        rho[fix, lag + 1] = rho[fix, lag + 2] = before[fix] / 2.0
        lag += 2
    total = chains * n
    cumulative = np.cumsum(rho, axis=1)
    summed = np.where(last >= 0, cumulative[rows, np.maximum(last, 0)], 0.0)
    following = np.where(last + 1 < n, rho[rows, np.minimum(last + 1, n - 1)], 0.0)
    tau = np.maximum(-1.0 + 2.0 * summed + following, 1.0 / np.log10(total))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(np.isnan(rho).any(axis=1), np.nan, total / tau)
    out[constant] = float(total)
    return out


def _rank_normalised_batch(values: np.ndarray) -> np.ndarray:
    """:func:`_rank_normalised` of every row of ``values`` (D, C, N)."""
    from scipy.special import ndtri

    flat = values.reshape(values.shape[0], -1)
    size = flat.shape[1]
    order = np.argsort(flat, axis=1)
    ordered = np.take_along_axis(flat, order, axis=1)
    position = np.broadcast_to(np.arange(size), flat.shape)
    starts_run = np.ones(flat.shape, bool)  # the first of each run of equal values
    starts_run[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    ends_run = np.ones(flat.shape, bool)  # the last of each run
    ends_run[:, :-1] = starts_run[:, 1:]
    starts = np.maximum.accumulate(np.where(starts_run, position, 0), axis=1)
    ends = np.minimum.accumulate(np.where(ends_run, position + 1, size)[:, ::-1], axis=1)[:, ::-1]
    ranks = np.empty(flat.shape)
    np.put_along_axis(ranks, order, 0.5 * (starts + 1 + ends), axis=1)  # ties: average rank
    return ndtri((ranks - 3 / 8) / (size + 1 / 4)).reshape(values.shape)


def _split_rhat_batch(values: np.ndarray) -> np.ndarray:
    n = values.shape[2]
    between = n * np.var(values.mean(axis=2), axis=1, ddof=1)
    within = np.mean(np.var(values, axis=2, ddof=1), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt((between / within + n - 1) / n)


def convergence_figures(draws: np.ndarray):
    """``(r_hat, ess_bulk, ess_tail)`` per coordinate of ``draws`` (chains, draws, dim): the
    rank-normalised split R-hat (one chain: of its two halves), ArviZ's bulk and tail ESS;
    nan where a coordinate has non-finite draws or there are fewer than 4 draws."""
    array = np.asarray(draws, np.float64)
    chains, count, dim = array.shape
    nan = np.full(dim, np.nan)
    if count < 4:
        return nan, nan.copy(), nan.copy()
    values = np.moveaxis(array, 2, 0)  # (D, C, N)
    finite = np.all(np.isfinite(values), axis=(1, 2))
    values = np.where(finite[:, None, None], values, 0.0)
    half = count // 2
    split = np.concatenate([values[:, :, :half], values[:, :, count - half:]], axis=1)
    folded = np.abs(split - np.median(split.reshape(dim, -1), axis=1)[:, None, None])
    r_hat = np.maximum(_split_rhat_batch(_rank_normalised_batch(split)),
                       _split_rhat_batch(_rank_normalised_batch(folded)))
    bulk = _ess_batch(_rank_normalised_batch(split))
    pooled = values.reshape(dim, -1)
    tail = np.minimum(*[
        _ess_batch((split <= np.quantile(pooled, probability, axis=1)[:, None, None])
                   .astype(np.float64)) for probability in (0.05, 0.95)])
    for figure in (r_hat, bulk, tail):
        figure[~finite] = np.nan
    return r_hat, bulk, tail
