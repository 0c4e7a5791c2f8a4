"""Synthetic data generators of the papers' experiments, next to their models.

Every generator takes ``seed`` (an int, ``None`` or a numpy Generator) and
returns numpy data (and a ready :class:`~fedmcmc.federation.Federation` where
the paper fixes the split).

=====================================  ============================================  ======================
generator                              paper setting                                 model
=====================================  ============================================  ======================
:func:`delayed_communication_data`     FSGLD 5.1: 10 clients x 200 from N(mu_s, I)   ``gaussian_mean(2)``
:func:`bernoulli_clients`              FSGLD Figure 1: 3 clients, means .1/.5/.9     ``bernoulli()``
:func:`gaussian_data`                  Fed-PDMC 6.1: N = 50, d = 10, mean 0.5        ``gaussian_mean(10, prior_cov=None)``
:func:`logistic_regression_data`       Fed-PDMC 6.2: N = 1000, d = 6, intercept      ``logistic_regression(6)``
:func:`poisson_regression_data`        issue 8: non-IID Poisson regression           ``poisson_regression(d)``
:func:`linear_regression_data`         FSGLD F.1 (synthetic stand-in)                ``linear_regression(d)``
=====================================  ============================================  ======================

The AR(1) and log-Gaussian Cox generators live with their models in
:mod:`fedmcmc.pdmp.models` (re-exported as ``fm.models.ar1_data`` and
``fm.models.lgcp_data``).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as np

from ..federation import Federation
from ..rng import numpy_generator
from ._common import positive_float, positive_int

__all__ = [
    "delayed_communication_data",
    "bernoulli_clients",
    "gaussian_data",
    "logistic_regression_data",
    "poisson_regression_data",
    "linear_regression_data",
]


def delayed_communication_data(
    seed: Any = 0,
    *,
    num_clients: int = 10,
    client_size: int = 200,
    dim: int = 2,
    half_width: float = 6.0,
    return_means: bool = False,
):
    """FSGLD section 5.1 ("heterogeneous shards and delayed communication").

    Client s holds ``client_size`` points from N(mu_s, I) with mu_s uniform on
    ``[-half_width, half_width]^dim`` (paper: 10 clients of 200 points, [-6, 6]^2).
    Returns a :class:`Federation` with f_s = 1/S; with ``return_means=True``,
    ``(federation, mus)`` with ``mus`` of shape ``(num_clients, dim)``.
    Model: ``fm.models.gaussian_mean(dim)`` (prior N(0, I), eq. 9).
    """
    rng = numpy_generator(seed)
    num_clients = positive_int(num_clients, "num_clients")
    client_size = positive_int(client_size, "client_size")
    dim = positive_int(dim, "dim")
    half_width = positive_float(half_width, "half_width")
    mus = rng.uniform(-half_width, half_width, size=(num_clients, dim))
    clients = [
        (mu + rng.standard_normal((client_size, dim))).astype(np.float32) for mu in mus
    ]
    federation = Federation(clients, weights=np.full(num_clients, 1.0 / num_clients))
    return (federation, mus) if return_means else federation


def bernoulli_clients(
    means: Sequence[float] = (0.1, 0.5, 0.9),
    client_size: int = 10,
    *,
    exact: bool = True,
    seed: Any = 0,
) -> Federation:
    """FSGLD Figure 1: clients of coin tosses with distinct means (30 tosses over 3 clients).

    ``exact=True``: client s has exactly ``round(means[s] * client_size)`` ones (in
    random order), so its empirical mean is the stated one; ``exact=False``:
    independent Bernoulli(means[s]) draws. Data leaves: float32 0/1 of shape
    ``(client_size,)``; f_s = 1/S. Model: ``fm.models.bernoulli()``.
    """
    rng = numpy_generator(seed)
    client_size = positive_int(client_size, "client_size")
    means = np.asarray(means, dtype=np.float64)
    if means.ndim != 1 or means.size == 0 or np.any((means < 0) | (means > 1)):
        raise ValueError(f"means must be a non-empty sequence of probabilities, got {means.tolist()}")
    clients = []
    for mean in means:
        if exact:
            ones = int(round(mean * client_size))
            x = np.concatenate([np.ones(ones), np.zeros(client_size - ones)])
            clients.append(rng.permutation(x).astype(np.float32))
        else:
            clients.append((rng.random(client_size) < mean).astype(np.float32))
    return Federation(clients, weights=np.full(means.size, 1.0 / means.size))


def gaussian_data(
    num_examples: int = 50, dim: int = 10, *, mean: Any = 0.5, scale: float = 1.0, seed: Any = 0
) -> np.ndarray:
    """Fed-PDMC section 6.1: N i.i.d. draws of N(mu_0, scale^2 I), mu_0 = (0.5, ..., 0.5).

    Returns an ``(num_examples, dim)`` float32 array. Model:
    ``fm.models.gaussian_mean(dim, prior_cov=None, noise_cov=scale**2)``; split
    with ``fm.partition.iid``.
    """
    rng = numpy_generator(seed)
    num_examples = positive_int(num_examples, "num_examples")
    dim = positive_int(dim, "dim")
    scale = positive_float(scale, "scale")
    mu = np.broadcast_to(np.asarray(mean, dtype=np.float64), (dim,))
    return (mu + scale * rng.standard_normal((num_examples, dim))).astype(np.float32)


def _design(rng, num_examples, dim, intercept, spread):
    x = spread * rng.standard_normal((num_examples, dim))
    if intercept:
        x[:, 0] = 1.0
    return x


def logistic_regression_data(
    num_examples: int = 1000,
    dim: int = 6,
    *,
    intercept: bool = True,
    true_params: Optional[Any] = None,
    seed: Any = 0,
) -> Tuple[dict, np.ndarray]:
    """Fed-PDMC section 6.2: N = 1000 synthetic observations, d = 6, first feature 1.

    Inputs are standard normal (column 0 set to 1 with ``intercept=True``), the
    true coefficients are standard normal unless given, and y ~ Bernoulli(sigmoid(x^T beta)).
    Returns ``({"x": (N, d) float32, "y": (N,) float32}, true_params)``.
    """
    rng = numpy_generator(seed)
    num_examples = positive_int(num_examples, "num_examples")
    dim = positive_int(dim, "dim")
    beta = rng.standard_normal(dim) if true_params is None else np.asarray(true_params, float)
    x = _design(rng, num_examples, dim, intercept, 1.0)
    p = 1.0 / (1.0 + np.exp(-(x @ beta)))
    y = (rng.random(num_examples) < p).astype(np.float32)
    return {"x": x.astype(np.float32), "y": y}, beta


def poisson_regression_data(
    num_examples: int = 2000,
    dim: int = 4,
    *,
    intercept: bool = True,
    true_params: Optional[Any] = None,
    spread: float = 0.5,
    seed: Any = 0,
) -> Tuple[dict, np.ndarray]:
    """Poisson regression data: x ~ N(0, spread^2) (column 0 = 1 with ``intercept``),
    beta ~ N(0, 0.5^2) unless given, y ~ Poisson(exp(x^T beta)).

    For issue 8's non-IID clients, split with ``fm.partition.by_key`` on, e.g.,
    ``np.digitize(x[:, 1], quantiles)`` or with ``fm.partition.dirichlet`` on ``y``.
    Returns ``({"x": (N, d), "y": (N,)}, true_params)`` (float32).
    """
    rng = numpy_generator(seed)
    num_examples = positive_int(num_examples, "num_examples")
    dim = positive_int(dim, "dim")
    spread = positive_float(spread, "spread")
    beta = 0.5 * rng.standard_normal(dim) if true_params is None else np.asarray(true_params, float)
    x = _design(rng, num_examples, dim, intercept, spread)
    y = rng.poisson(np.exp(x @ beta)).astype(np.float32)
    return {"x": x.astype(np.float32), "y": y}, beta


def linear_regression_data(
    num_examples: int = 1000,
    dim: int = 5,
    *,
    noise_std: float = 1.0,
    intercept: bool = True,
    true_params: Optional[Any] = None,
    seed: Any = 0,
) -> Tuple[dict, np.ndarray]:
    """Synthetic linear regression y = x^T beta + N(0, noise_std^2); x standard normal
    (column 0 = 1 with ``intercept``), beta standard normal unless given.
    Returns ``({"x": (N, d), "y": (N,)}, true_params)`` (float32).
    """
    rng = numpy_generator(seed)
    num_examples = positive_int(num_examples, "num_examples")
    dim = positive_int(dim, "dim")
    noise_std = positive_float(noise_std, "noise_std")
    beta = rng.standard_normal(dim) if true_params is None else np.asarray(true_params, float)
    x = _design(rng, num_examples, dim, intercept, 1.0)
    y = x @ beta + noise_std * rng.standard_normal(num_examples)
    return {"x": x.astype(np.float32), "y": y.astype(np.float32)}, beta
