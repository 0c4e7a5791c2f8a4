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
:func:`teacher_classification_clients` FSGLD 5.3 / Table 1: stand-in for SUSY at      ``mlp_classifier(18)``
                                       the paper's tens of thousands of rows per
                                       client (:func:`teacher_classification_data`
                                       for one shard, e.g. the balanced test shard)
=====================================  ============================================  ======================

The AR(1) and log-Gaussian Cox generators live with their models in
:mod:`fedmcmc.pdmp.models` (re-exported as ``fm.models.ar1_data`` and
``fm.models.lgcp_data``).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional, Sequence, Tuple

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
    "Teacher",
    "teacher",
    "teacher_classification_data",
    "teacher_classification_clients",
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


# --------------------------------------------------------------------------- SUSY stand-in
#
# FSGLD section 5.3 (Table 1) trains an 18-18-8 ReLU MLP on 30 shards of SUSY (18 continuous
# features, balanced binary label: supersymmetric signal vs background). SUSY (5M rows) ships
# in no installable package, and the real data set the library can load offline in its place
# (MAGIC, 19,020 rows) leaves a few hundred rows per client, far from the paper's regime. The
# generator below keeps SUSY's shape of problem at any number of rows.


class Teacher(NamedTuple):
    """A fixed random labelling rule: logit(x) = sharpness * (sqrt(1 - linear_share) * e(x)
    + sqrt(linear_share) * l(x)) + bias with e(x) = (sum_k v_k abs(w_k . x) - even_mean) /
    even_sd (even in x, so uncorrelated with every linear function of a Gaussian x) and
    l(x) = u . x / linear_sd; ``bias`` makes P(y = 1) = 1/2. An 18-18-8 ReLU MLP
    represents it exactly (two first-layer units per ``abs(w_k . x)``, two for ``u . x``)."""

    w: np.ndarray  # (directions, num_features)
    v: np.ndarray  # (directions,)
    u: np.ndarray  # (num_features,)
    even_mean: float
    even_sd: float
    linear_sd: float
    linear_share: float
    sharpness: float
    bias: float

    def logit(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float64)
        even = (np.abs(x @ self.w.T) @ self.v - self.even_mean) / self.even_sd
        linear = (x @ self.u) / self.linear_sd
        return self.sharpness * (np.sqrt(1.0 - self.linear_share) * even
                                 + np.sqrt(self.linear_share) * linear) + self.bias

    def probability(self, x: np.ndarray) -> np.ndarray:
        """P(y = 1 | x) = sigmoid(logit(x)): the Bayes-optimal predictor."""
        return 1.0 / (1.0 + np.exp(-self.logit(x)))


def _teacher_options(num_features, directions, linear_share, sharpness, teacher_seed):
    num_features = positive_int(num_features, "num_features")
    directions = positive_int(directions, "directions")
    linear_share = float(linear_share)
    if not 0.0 <= linear_share <= 1.0:
        raise ValueError(f"linear_share must be in [0, 1], got {linear_share!r}")
    sharpness = positive_float(sharpness, "sharpness")
    if isinstance(teacher_seed, bool) or not isinstance(teacher_seed, (int, np.integer)):
        raise ValueError(f"teacher_seed must be an int, got {teacher_seed!r}")
    return num_features, directions, linear_share, sharpness, int(teacher_seed)


def teacher(
    num_features: int = 18,
    *,
    directions: int = 6,
    linear_share: float = 0.3,
    sharpness: float = 2.5,
    teacher_seed: int = 0,
) -> Teacher:
    """The :class:`Teacher` of :func:`teacher_classification_data` (deterministic in its
    arguments; its normalising constants and bias are computed once, from 200,000 draws of
    x ~ N(0, I) keyed by ``teacher_seed``)."""
    return _teacher(*_teacher_options(num_features, directions, linear_share, sharpness, teacher_seed))


@functools.lru_cache(maxsize=8)
def _teacher(num_features, directions, linear_share, sharpness, teacher_seed):
    rng = np.random.default_rng(np.random.SeedSequence([teacher_seed, 2**31 - 1]))
    w = rng.standard_normal((directions, num_features)) / np.sqrt(num_features)
    v = rng.choice([-1.0, 1.0], directions) * rng.uniform(0.5, 1.5, directions)
    u = rng.standard_normal(num_features) / np.sqrt(num_features)
    x = rng.standard_normal((200_000, num_features))
    even = np.abs(x @ w.T) @ v
    linear_sd = float(np.std(x @ u))
    base = Teacher(w, v, u, float(even.mean()), float(even.std()), linear_sd, linear_share,
                   sharpness, 0.0)
    logit = base.logit(x)
    lo, hi = -4.0 * sharpness, 4.0 * sharpness  # bisection: mean sigmoid(logit + b) = 1/2
    for _ in range(60):
        b = 0.5 * (lo + hi)
        if np.mean(1.0 / (1.0 + np.exp(-(logit + b)))) > 0.5:
            hi = b
        else:
            lo = b
    return base._replace(bias=0.5 * (lo + hi))


def teacher_classification_data(
    num_examples: int,
    *,
    positive_fraction: Optional[float] = None,
    num_features: int = 18,
    directions: int = 6,
    linear_share: float = 0.3,
    sharpness: float = 2.5,
    teacher_seed: int = 0,
    seed: Any = 0,
) -> dict:
    """Binary classification rows labelled by a fixed random teacher: the stand-in for SUSY
    in FSGLD section 5.3 (Table 1) at the paper's shard sizes.

    Why: the paper's shards hold tens of thousands of SUSY rows (18 continuous features,
    balanced signal/background label); SUSY is not installable offline, and MAGIC, the real
    physics data set the library can load, leaves about 335 rows per client for 30 clients,
    a regime where the paper's surrogate recipe does not work (``fsgld-table1``'s small-client
    table). This generator keeps the shape of SUSY's problem at any size: x ~ N(0, I) with
    ``num_features`` (default 18) continuous features, y ~ Bernoulli(sigmoid(logit(x))) with
    the :class:`Teacher`'s logit, a fixed random function of ``directions`` absolute values
    ``abs(w_k . x)`` (even in x: invisible to a linear model) plus a ``linear_share`` of its variance
    from a linear term. Defaults: Bayes accuracy about 0.80 and log-likelihood about -0.42
    (SUSY's best published classifiers: about 0.80 accuracy), best linear model about 0.65
    and -0.63; an 18-18-8 ReLU MLP represents the teacher exactly. Not SUSY: no physics, no
    heavy tails, independent Gaussian features.

    ``positive_fraction``: None draws labels from the teacher (balanced in expectation); a
    fraction pi gives exactly ``round(pi * num_examples)`` positives, drawn from the same
    joint distribution conditioned on the label (rows are generated until both labels are
    served), which is what subsampling a large data set by label does (FSGLD's Beta(a, b)
    label proportions, :func:`fm.partition.beta_proportions`). Deterministic in ``seed``
    and ``teacher_seed``; rows are made in blocks, so memory is O(num_examples).

    Returns ``{"x": (N, num_features) float32, "y": (N,) int32}``; model
    ``fm.models.mlp_classifier(num_features, 2)``.
    """
    num_examples = positive_int(num_examples, "num_examples")
    rule = teacher(num_features, directions=directions, linear_share=linear_share,
                   sharpness=sharpness, teacher_seed=teacher_seed)
    rng = numpy_generator(seed)
    d = rule.w.shape[1]
    if positive_fraction is None:
        x = rng.standard_normal((num_examples, d)).astype(np.float32)
        y = (rng.random(num_examples) < rule.probability(x)).astype(np.int32)
        return {"x": x, "y": y}
    fraction = float(positive_fraction)
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"positive_fraction must be in [0, 1], got {positive_fraction!r}")
    wanted = {1: int(round(fraction * num_examples))}
    wanted[0] = num_examples - wanted[1]
    x = np.empty((num_examples, d), np.float32)
    y = np.empty(num_examples, np.int32)
    filled = {0: 0, 1: 0}
    offset = {1: 0, 0: wanted[1]}  # positives first, then negatives; shuffled at the end
    block = max(4096, min(num_examples, 1 << 18))
    while filled[0] < wanted[0] or filled[1] < wanted[1]:
        xb = rng.standard_normal((block, d)).astype(np.float32)
        yb = (rng.random(block) < rule.probability(xb)).astype(np.int32)
        for label in (1, 0):
            take = xb[yb == label][: wanted[label] - filled[label]]
            start = offset[label] + filled[label]
            x[start:start + len(take)] = take
            y[start:start + len(take)] = label
            filled[label] += len(take)
    order = rng.permutation(num_examples)
    return {"x": x[order], "y": y[order]}


def teacher_classification_clients(
    proportions: Sequence[float],
    client_size: int = 50_000,
    *,
    seed: int = 0,
    **teacher_options: Any,
) -> Federation:
    """FSGLD section 5.3's label-imbalanced shards on the SUSY stand-in: client s holds
    ``client_size`` rows of :func:`teacher_classification_data` with exactly
    ``round(proportions[s] * client_size)`` positives (draw the proportions from
    Beta(100, 100) for the IID setting, Beta(0.5, 0.5) for the non-IID one). Each client's
    rows are generated on their own (key ``(seed, s)``), so a client's data do not depend on
    the number of clients or on the others' sizes; 30 clients of 50,000 rows take 108 MB
    (float32). ``teacher_options`` (``num_features``, ``directions``, ``linear_share``,
    ``sharpness``, ``teacher_seed``) are those of :func:`teacher_classification_data`;
    every client shares the teacher. f_s = 1/S."""
    proportions = np.asarray(proportions, np.float64)
    if proportions.ndim != 1 or proportions.size == 0 or np.any((proportions < 0) | (proportions > 1)):
        raise ValueError("proportions must be a non-empty sequence of fractions in [0, 1]")
    client_size = positive_int(client_size, "client_size")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an int, got {seed!r}")
    clients = [
        teacher_classification_data(
            client_size, positive_fraction=float(p), **teacher_options,
            seed=np.random.default_rng(np.random.SeedSequence([int(seed), s])))
        for s, p in enumerate(proportions)
    ]
    return Federation(clients, weights=np.full(proportions.size, 1.0 / proportions.size))
