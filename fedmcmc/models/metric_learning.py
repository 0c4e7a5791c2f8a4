"""Bayesian metric learning (Yang, Jin, Sukthankar 2007; FSGLD section 5.2).

The metric is A = sum_k gamma_k v_k v_k^T over the top-K eigenvectors v_k of the
(centred) pooled inputs' covariance, so for a pair

    ||x_i - x_j||_A^2 = sum_k gamma_k ((x_i - x_j)^T v_k)^2.

**Likelihood convention.** The paper writes Ber(1 / (1 + exp(y_ij (||.||_A^2 - mu))))
with y_ij in {0, 1}, which taken literally gives probability 1/2 to every
dissimilar pair. We use Yang et al.'s intended reading: a pair is similar with
probability

    P(y_ij = 1 | x_i, x_j, gamma, mu) = sigmoid(-(||x_i - x_j||_A^2 - mu)) = sigmoid(mu - d_A),

so pairs closer than the threshold mu are likely similar;
log p(y | .) = y log sigmoid(mu - d_A) + (1 - y) log sigmoid(d_A - mu).

Prior: gamma ~ N(0, prior_scale_gamma^2 I) (the paper's diagonal Gaussian,
relaxing gamma > 0), mu ~ N(prior_mean_mu, prior_scale_mu^2).

Data: :func:`metric_learning_pairs` builds the paper's federation of similar /
dissimilar pairs from labelled inputs, with no class shared between clients.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..federation import Federation
from ..model import Model
from ._common import LOG_2PI, positive_float, positive_int
from ..rng import numpy_generator

__all__ = ["metric_learning", "metric_learning_pairs", "top_eigenvectors"]


def top_eigenvectors(inputs: Any, num_components: int) -> np.ndarray:
    """(D, K) matrix of the top-K eigenvectors of the covariance of ``inputs`` (N, D)."""
    x = np.asarray(inputs, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"inputs must be an (N, D) matrix, got shape {x.shape}")
    num_components = positive_int(num_components, "num_components")
    if num_components > x.shape[1]:
        raise ValueError(
            f"num_components={num_components} exceeds the input dimension {x.shape[1]}"
        )
    centred = x - x.mean(axis=0)
    values, vectors = np.linalg.eigh(centred.T @ centred / max(x.shape[0] - 1, 1))
    order = np.argsort(values)[::-1][:num_components]
    return vectors[:, order]


def metric_learning(
    inputs: Any = None,
    *,
    num_components: int = 5,
    eigenvectors: Any = None,
    prior_scale_gamma: float = 1.0,
    prior_scale_mu: float = 10.0,
    prior_mean_mu: float = 0.0,
) -> Model:
    """Bayesian metric learning model (FSGLD section 5.2).

    Parameters: ``{"gamma": (K,), "mu": ()}``.
    Example: ``{"xi": (D,), "xj": (D,), "y": ()}`` with y = 1 for a similar
    pair, 0 for a dissimilar one.

    Give either ``inputs`` (N, D) -- the pooled inputs whose top
    ``num_components`` eigenvectors define A, as in the paper -- or the
    ``eigenvectors`` (D, K) directly. ``attributes["eigenvectors"]`` keeps them.
    """
    if eigenvectors is None:
        if inputs is None:
            raise ValueError("metric_learning needs inputs (N, D) or eigenvectors (D, K)")
        vectors = top_eigenvectors(inputs, num_components)
    else:
        vectors = np.asarray(eigenvectors, dtype=np.float64)
        if vectors.ndim != 2:
            raise ValueError(f"eigenvectors must be a (D, K) matrix, got shape {vectors.shape}")
    k = vectors.shape[1]
    s_gamma = positive_float(prior_scale_gamma, "prior_scale_gamma")
    s_mu = positive_float(prior_scale_mu, "prior_scale_mu")
    m_mu = float(prior_mean_mu)
    v = jnp.asarray(vectors, jnp.float32)
    prior_norm = float(-(k + 1) * 0.5 * LOG_2PI - k * np.log(s_gamma) - np.log(s_mu))

    def log_prior(params):
        return (
            -0.5 * jnp.sum(params["gamma"] ** 2) / s_gamma**2
            - 0.5 * (params["mu"] - m_mu) ** 2 / s_mu**2
            + prior_norm
        )

    def distance(params, xi, xj):
        projected = (xi - xj) @ v
        return jnp.sum(params["gamma"] * projected**2, axis=-1)

    def log_likelihood(params, example):
        margin = params["mu"] - distance(params, example["xi"], example["xj"])
        y = example["y"]
        return y * jax.nn.log_sigmoid(margin) + (1.0 - y) * jax.nn.log_sigmoid(-margin)

    def init(key=None):
        return {"gamma": jnp.zeros((k,), jnp.float32), "mu": jnp.asarray(m_mu, jnp.float32)}

    return Model(
        log_prior,
        log_likelihood,
        name="metric_learning",
        eigenvectors=vectors,
        distance=distance,
        init=init,
    )


def _pairs(rng, rows, labels, num_similar, num_dissimilar):
    """Index pairs (i, j), i != j, within ``rows``: similar = same label."""
    y = labels[rows]
    classes, counts = np.unique(y, return_counts=True)
    eligible = counts >= 2
    if num_similar > 0 and not np.any(eligible):
        raise ValueError("no class has two examples: cannot make similar pairs")
    if num_dissimilar > 0 and classes.size < 2:
        raise ValueError("only one class: cannot make dissimilar pairs")
    first, second = [], []
    # Similar pairs: class chosen in proportion to its size (among classes with >= 2 rows).
    weights = np.where(eligible, counts, 0).astype(np.float64)
    per_class = rng.multinomial(num_similar, weights / weights.sum()) if num_similar else np.zeros(
        classes.size, dtype=np.int64
    )
    for c, m in zip(classes, per_class):
        if m == 0:
            continue
        members = rows[y == c]
        pos_i = rng.integers(0, members.size, size=m)
        pos_j = (pos_i + rng.integers(1, members.size, size=m)) % members.size
        first.append(members[pos_i])
        second.append(members[pos_j])
    # Dissimilar pairs: rejection on the second element's class.
    i = rng.choice(rows, size=num_dissimilar)
    j = rng.choice(rows, size=num_dissimilar)
    same = labels[i] == labels[j]
    while np.any(same):
        j[same] = rng.choice(rows, size=int(same.sum()))
        same = labels[i] == labels[j]
    first.append(i)
    second.append(j)
    target = np.concatenate([np.ones(num_similar), np.zeros(num_dissimilar)]).astype(np.float32)
    return np.concatenate(first), np.concatenate(second), target


def metric_learning_pairs(
    inputs: Any,
    labels: Any,
    *,
    num_clients: int = 10,
    pairs_per_client: int = 1000,
    num_test_pairs: int = 1000,
    test_fraction: float = 0.2,
    seed: Any = 0,
    weights: Any = "uniform",
):
    """FSGLD section 5.2 data: a federation of similar/dissimilar pairs in which no
    class is shared between clients, and a held-out test set of pairs.

    The examples are split at random into training (1 - ``test_fraction``) and
    test rows. The classes are dealt out to ``num_clients`` clients without
    overlap (``fm.partition.by_label(..., disjoint=True)`` style); client s gets
    ``pairs_per_client`` pairs from its own training rows, half similar (same
    class) and half dissimilar. ``num_test_pairs`` pairs (half each) are drawn
    from the test rows of all classes. Paper: 26 isolet classes, 10 clients of
    1,000 pairs, 1,000 test pairs.

    Returns ``(federation, test_pairs, train_inputs)``: pair pytrees are
    ``{"xi": (P, D), "xj": (P, D), "y": (P,)}``; ``train_inputs`` are the
    training rows, whose eigenvectors define A in :func:`metric_learning`.
    """

    x = np.asarray(inputs, dtype=np.float32)
    y = np.asarray(labels)
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise ValueError(
            f"inputs must be (N, D) and labels (N,), got {x.shape} and {y.shape}"
        )
    rng = numpy_generator(seed)
    num_clients = positive_int(num_clients, "num_clients")
    pairs_per_client = positive_int(pairs_per_client, "pairs_per_client")
    if pairs_per_client < 2:
        raise ValueError("pairs_per_client must be at least 2 (one similar, one dissimilar)")
    num_test_pairs = positive_int(num_test_pairs, "num_test_pairs")
    if not 0.0 < float(test_fraction) < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    classes = np.unique(y)
    if 2 * num_clients > classes.size:
        raise ValueError(
            f"num_clients={num_clients}: each client needs at least 2 classes of its own for "
            f"dissimilar pairs, but there are only {classes.size} classes"
        )
    n = x.shape[0]
    order = rng.permutation(n)
    num_test = int(round(test_fraction * n))
    test_rows, train_rows = np.sort(order[:num_test]), np.sort(order[num_test:])
    groups = np.array_split(classes[rng.permutation(classes.size)], num_clients)

    def build(i, j, target):
        return {"xi": x[i], "xj": x[j], "y": target}

    clients = []
    for group in groups:
        rows = train_rows[np.isin(y[train_rows], group)]
        half = pairs_per_client // 2
        clients.append(build(*_pairs(rng, rows, y, pairs_per_client - half, half)))
    half = num_test_pairs // 2
    test = build(*_pairs(rng, test_rows, y, num_test_pairs - half, half))
    uniform = np.full(num_clients, 1.0 / num_clients) if weights == "uniform" else weights
    federation = Federation(
        clients,
        weights=uniform,
        names=["classes_" + "-".join(str(c) for c in group.tolist()) for group in groups],
    )
    return federation, test, x[train_rows]
