"""Partitioning: turn one data set into an :class:`fm.Federation <fedmcmc.Federation>`.

Every function takes ``data`` -- a pytree (an array, a tuple, a dict, ...) whose
leaves share a leading example axis of length N -- and returns a
:class:`~fedmcmc.federation.Federation` whose clients are row subsets of it.
Functions that split by class take ``labels``: an array of length N, or the name
of a leaf when ``data`` is a dict (``labels="y"``). Randomness comes from
``seed``: an ``int``, ``None`` or a :class:`numpy.random.Generator`.

No function ever returns an empty client: when a split is impossible a
``ValueError`` names the argument to change. Rows left out by a split (classes
assigned to no client, a Beta split limited by the rarer label) are simply
not used; the federation's ``total_size`` says how many were.

``weights`` is passed to the federation: ``None`` (f_s proportional to client
size), ``"uniform"`` (f_s = 1/S, as in all FSGLD experiments) or a sequence.
With ``return_indices=True`` each function also returns the list of row-index
arrays (into ``data``) of the clients.

Splits (FSGLD = ``../shared/papers/fsgld-cg-dsgld-early-version.md``):

* :func:`iid` -- random equal (or given) sizes.
* :func:`by_label` -- ``classes_per_client`` classes per client, optionally
  disjoint across clients (FSGLD section 5.2: "no overlap in the classes").
* :func:`dirichlet` -- per class, client shares ~ Dirichlet(alpha).
* :func:`beta_proportions` -- binary labels, client s holds a fraction
  pi_s ~ Beta(a, b) of positives (FSGLD section 5.3).
* :func:`dominant_label` -- client i holds ``major`` examples of class i and
  ``minor`` of every other class (GT-DULA MNIST: 4500 / 100).
* :func:`by_key` -- one client per value of a user key (site, cluster, block).

The FSGLD section 5.1 generator :func:`delayed_communication_data` lives in
:mod:`fedmcmc.models.synthetic` with the other paper generators and is
re-exported here.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Union

import jax
import numpy as np

from .algorithm import check_positive_float as _positive_float
from .algorithm import check_positive_int as _positive_int
from .federation import Federation
from .models.synthetic import delayed_communication_data as _synthetic_delayed_communication_data
from .rng import numpy_generator

PyTree = Any
Seed = Union[int, None, np.random.Generator]

__all__ = [
    "iid",
    "by_label",
    "dirichlet",
    "beta_proportions",
    "dominant_label",
    "by_key",
    "from_indices",
    "delayed_communication_data",
]


# --------------------------------------------------------------------------- helpers


def _num_rows(data: PyTree) -> int:
    leaves = jax.tree_util.tree_leaves(data)
    if not leaves:
        raise ValueError("data has no array leaves")
    lengths = set()
    for leaf in leaves:
        shape = np.shape(leaf)
        if len(shape) == 0:
            raise ValueError("data: every leaf needs a leading example axis, got a scalar")
        lengths.add(shape[0])
    if len(lengths) != 1:
        raise ValueError(
            f"data: the leaves' leading axes disagree ({sorted(lengths)}); "
            "every leaf must have one row per example"
        )
    n = lengths.pop()
    if n == 0:
        raise ValueError("data has no examples")
    return int(n)


def _take(data: PyTree, index: np.ndarray) -> PyTree:
    return jax.tree_util.tree_map(lambda leaf: np.asarray(leaf)[index], data)


def _labels(data: PyTree, labels: Any, n: int, argument: str = "labels") -> np.ndarray:
    if isinstance(labels, str):
        if not isinstance(data, dict) or labels not in data:
            raise ValueError(
                f"{argument}={labels!r} names no leaf of data (data must be a dict with that key)"
            )
        labels = data[labels]
    array = np.asarray(labels)
    if array.ndim != 1 or array.shape[0] != n:
        raise ValueError(f"{argument} must be a vector with one entry per example ({n}), got shape {array.shape}")
    return array


def _weights(weights: Any, num_clients: int):
    if weights is None:
        return None
    if isinstance(weights, str):
        if weights != "uniform":
            raise ValueError(f"weights must be None, 'uniform' or a sequence, got {weights!r}")
        return np.full(num_clients, 1.0 / num_clients)
    return weights


def from_indices(
    data: PyTree,
    indices: Sequence[np.ndarray],
    *,
    weights: Any = None,
    names: Optional[Sequence[str]] = None,
    return_indices: bool = False,
):
    """A federation whose client ``s`` holds rows ``indices[s]`` of ``data``."""
    n = _num_rows(data)
    indices = [np.asarray(index, dtype=np.int64) for index in indices]
    if not indices:
        raise ValueError("indices is empty: a federation needs at least one client")
    for s, index in enumerate(indices):
        if index.ndim != 1 or index.size == 0:
            raise ValueError(f"indices[{s}] is empty: every client needs at least one example")
        if index.min() < 0 or index.max() >= n:
            raise ValueError(f"indices[{s}] has rows outside 0..{n - 1}")
    federation = Federation(
        [_take(data, index) for index in indices],
        weights=_weights(weights, len(indices)),
        names=names,
    )
    return (federation, indices) if return_indices else federation


# --------------------------------------------------------------------------- splits


def iid(
    data: PyTree,
    num_clients: Optional[int] = None,
    *,
    sizes: Optional[Sequence[int]] = None,
    seed: Seed = 0,
    shuffle: bool = True,
    weights: Any = None,
    return_indices: bool = False,
):
    """Random IID split.

    With ``num_clients`` only, the (shuffled) rows are cut into ``num_clients``
    near-equal parts (sizes differ by at most one). With ``sizes``, client ``s``
    receives ``sizes[s]`` rows; ``sum(sizes)`` may be smaller than N (the rest
    is unused) but not larger. ``shuffle=False`` keeps the original row order
    (contiguous blocks).
    """
    n = _num_rows(data)
    rng = numpy_generator(seed)
    if sizes is None:
        if num_clients is None:
            raise ValueError("num_clients is required when sizes is not given")
        num_clients = _positive_int(num_clients, "num_clients")
        if num_clients > n:
            raise ValueError(
                f"num_clients={num_clients} is larger than the number of examples ({n}): "
                "some clients would be empty"
            )
        base, extra = divmod(n, num_clients)
        sizes_array = np.full(num_clients, base, dtype=np.int64)
        sizes_array[:extra] += 1
    else:
        sizes_array = np.asarray(sizes)
        if sizes_array.ndim != 1 or sizes_array.size == 0:
            raise ValueError(f"sizes must be a non-empty sequence of client sizes, got {sizes!r}")
        if not np.issubdtype(sizes_array.dtype, np.integer) or np.any(sizes_array < 1):
            raise ValueError(f"sizes must be positive integers (no empty client), got {list(np.ravel(sizes))}")
        if num_clients is not None and num_clients != sizes_array.size:
            raise ValueError(
                f"num_clients={num_clients} disagrees with len(sizes)={sizes_array.size}"
            )
        if sizes_array.sum() > n:
            raise ValueError(f"sizes sum to {int(sizes_array.sum())}, more than the {n} examples")
    order = rng.permutation(n) if shuffle else np.arange(n)
    bounds = np.concatenate([[0], np.cumsum(sizes_array)])
    indices = [order[bounds[s] : bounds[s + 1]] for s in range(sizes_array.size)]
    return from_indices(data, indices, weights=weights, return_indices=return_indices)


def by_label(
    data: PyTree,
    labels: Any,
    num_clients: int,
    classes_per_client: Optional[int] = None,
    *,
    disjoint: bool = False,
    seed: Seed = 0,
    weights: Any = None,
    return_indices: bool = False,
):
    """Each client holds the examples of a few classes only.

    ``disjoint=False`` (default; the "k shards per client" split): every client
    gets ``classes_per_client`` distinct classes, assigned round-robin over a
    random permutation of the classes so that all classes are used when
    ``num_clients * classes_per_client >= C``; the examples of a class are
    shuffled and divided equally among the clients holding it.

    ``disjoint=True`` (FSGLD section 5.2: no class shared between clients): the
    classes are shuffled and dealt out so no two clients share a class. With
    ``classes_per_client=None`` all C classes are used, ``C // num_clients`` or
    one more per client (26 letters over 10 clients: 6 clients with 3, 4 with
    2); otherwise each client gets exactly ``classes_per_client`` classes and
    the remaining ``C - num_clients * classes_per_client`` classes are unused.

    Clients are named after their classes (``federation.names``, e.g. ``"classes_3-7"``).
    """
    n = _num_rows(data)
    y = _labels(data, labels, n)
    rng = numpy_generator(seed)
    num_clients = _positive_int(num_clients, "num_clients")
    classes = np.unique(y)
    num_classes = classes.size
    if classes_per_client is not None:
        classes_per_client = _positive_int(classes_per_client, "classes_per_client")
        if classes_per_client > num_classes:
            raise ValueError(
                f"classes_per_client={classes_per_client} exceeds the number of classes ({num_classes})"
            )
    elif not disjoint:
        raise ValueError("classes_per_client is required unless disjoint=True")

    permuted = classes[rng.permutation(num_classes)]
    if disjoint:
        if classes_per_client is None:
            if num_clients > num_classes:
                raise ValueError(
                    f"num_clients={num_clients} exceeds the number of classes ({num_classes}): "
                    "disjoint classes would leave clients empty"
                )
            groups = np.array_split(permuted, num_clients)
        else:
            if num_clients * classes_per_client > num_classes:
                raise ValueError(
                    f"disjoint split needs num_clients * classes_per_client <= {num_classes} classes, "
                    f"got {num_clients} * {classes_per_client}"
                )
            groups = [
                permuted[s * classes_per_client : (s + 1) * classes_per_client]
                for s in range(num_clients)
            ]
        indices = [
            rng.permutation(np.flatnonzero(np.isin(y, group))) for group in groups
        ]
        held = [sorted(group.tolist()) for group in groups]
    else:
        k = classes_per_client
        holders = {c: [] for c in classes.tolist()}
        for s in range(num_clients):
            for j in range(k):
                holders[permuted[(s * k + j) % num_classes].item()].append(s)
        parts: List[List[np.ndarray]] = [[] for _ in range(num_clients)]
        for c, clients in holders.items():
            if not clients:
                continue
            rows = rng.permutation(np.flatnonzero(y == c))
            if rows.size < len(clients):
                raise ValueError(
                    f"class {c!r} has {rows.size} examples for {len(clients)} clients: lower "
                    "num_clients or classes_per_client"
                )
            for s, chunk in zip(clients, np.array_split(rows, len(clients))):
                parts[s].append(chunk)
        indices = [rng.permutation(np.concatenate(p)) for p in parts]
        held = [sorted(c for c, clients in holders.items() if s in clients) for s in range(num_clients)]
    names = ["classes_" + "-".join(str(c) for c in group) for group in held]
    return from_indices(
        data, indices, weights=weights, names=names, return_indices=return_indices
    )


def dirichlet(
    data: PyTree,
    labels: Any,
    num_clients: int,
    alpha: float,
    *,
    min_size: int = 1,
    max_tries: int = 100,
    seed: Seed = 0,
    weights: Any = None,
    return_indices: bool = False,
):
    """Dirichlet label skew: for each class c, the shares of its examples across
    clients are drawn from Dirichlet(alpha, ..., alpha) and its shuffled rows are
    cut accordingly. Small ``alpha`` -> each class concentrates on few clients.

    Draws are repeated (up to ``max_tries``) until every client has at least
    ``min_size`` examples; otherwise ``ValueError``.
    """
    n = _num_rows(data)
    y = _labels(data, labels, n)
    rng = numpy_generator(seed)
    num_clients = _positive_int(num_clients, "num_clients")
    alpha = _positive_float(alpha, "alpha")
    min_size = _positive_int(min_size, "min_size")
    max_tries = _positive_int(max_tries, "max_tries")
    if num_clients * min_size > n:
        raise ValueError(
            f"num_clients * min_size = {num_clients * min_size} exceeds the {n} examples"
        )
    classes = np.unique(y)
    for _ in range(max_tries):
        parts: List[List[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            rows = rng.permutation(np.flatnonzero(y == c))
            shares = rng.dirichlet(np.full(num_clients, alpha))
            cuts = np.round(np.cumsum(shares)[:-1] * rows.size).astype(np.int64)
            for s, chunk in enumerate(np.split(rows, cuts)):
                parts[s].append(chunk)
        indices = [np.concatenate(p) for p in parts]
        if min(index.size for index in indices) >= min_size:
            indices = [rng.permutation(index) for index in indices]
            return from_indices(data, indices, weights=weights, return_indices=return_indices)
    raise ValueError(
        f"alpha={alpha}: no Dirichlet draw in {max_tries} tries gave every one of the "
        f"{num_clients} clients at least min_size={min_size} examples; raise alpha or "
        "max_tries, or lower num_clients"
    )


def beta_proportions(
    data: PyTree,
    labels: Any,
    num_clients: int,
    a: float,
    b: float,
    *,
    client_size: Optional[int] = None,
    positive: Any = 1,
    seed: Seed = 0,
    weights: Any = None,
    return_indices: bool = False,
):
    """Binary labels; client s holds a fraction pi_s ~ Beta(a, b) of positives
    (FSGLD section 5.3: a = b = 100 is near-IID, a = b = 0.5 puts most clients
    at mostly-positive or mostly-negative).

    Every client has ``client_size`` examples, ``round(pi_s * client_size)`` of
    them positive (``labels == positive``), drawn without replacement. By
    default ``client_size`` is the largest size that the positive and negative
    pools can serve for the drawn proportions (at most N // num_clients); a
    given ``client_size`` that the pools cannot serve raises ``ValueError``.
    The drawn proportions are ``np.mean(labels[idx] == positive)`` of the
    returned indices (``return_indices=True``).
    """
    n = _num_rows(data)
    y = _labels(data, labels, n)
    rng = numpy_generator(seed)
    num_clients = _positive_int(num_clients, "num_clients")
    a = _positive_float(a, "a")
    b = _positive_float(b, "b")
    values = np.unique(y)
    if values.size > 2:
        raise ValueError(f"labels must be binary for beta_proportions, got {values.size} distinct values")
    if not np.any(y == positive) and values.size == 2:
        raise ValueError(
            f"positive={positive!r} is not one of the label values {values.tolist()}"
        )
    is_positive = y == positive
    positives = rng.permutation(np.flatnonzero(is_positive))
    negatives = rng.permutation(np.flatnonzero(~is_positive))
    pi = rng.beta(a, b, size=num_clients)

    def counts(size: int) -> np.ndarray:
        return np.round(pi * size).astype(np.int64)

    def feasible(size: int) -> bool:
        pos = counts(size)
        return pos.sum() <= positives.size and (size - pos).sum() <= negatives.size

    if client_size is None:
        size = n // num_clients
        if pi.sum() > 0:
            size = min(size, int(positives.size / pi.sum()) + 1)
        if (1 - pi).sum() > 0:
            size = min(size, int(negatives.size / (1 - pi).sum()) + 1)
        if n // num_clients < 1:
            raise ValueError(f"num_clients={num_clients} exceeds the {n} examples")
        # Largest feasible size (feasibility is monotone up to rounding: step down).
        while size >= 1 and not feasible(size):
            size -= 1
        if size < 1:
            raise ValueError(
                f"labels: the pools ({positives.size} positive, {negatives.size} negative) cannot "
                f"serve {num_clients} clients; check positive={positive!r}"
            )
    else:
        size = _positive_int(client_size, "client_size")
        if not feasible(size):
            pos = counts(size)
            raise ValueError(
                f"client_size={size}: the drawn proportions need {pos.sum()} positive and "
                f"{(size - pos).sum()} negative examples, only {positives.size} and "
                f"{negatives.size} exist"
            )
    pos = counts(size)
    pos_bounds = np.concatenate([[0], np.cumsum(pos)])
    neg_bounds = np.concatenate([[0], np.cumsum(size - pos)])
    indices = [
        rng.permutation(
            np.concatenate(
                [
                    positives[pos_bounds[s] : pos_bounds[s + 1]],
                    negatives[neg_bounds[s] : neg_bounds[s + 1]],
                ]
            )
        )
        for s in range(num_clients)
    ]
    return from_indices(data, indices, weights=weights, return_indices=return_indices)


def dominant_label(
    data: PyTree,
    labels: Any,
    *,
    major: int,
    minor: int,
    classes: Optional[Sequence[Any]] = None,
    seed: Seed = 0,
    weights: Any = None,
    return_indices: bool = False,
):
    """One client per class c: ``major`` examples of class c and ``minor`` of
    every other class, without replacement across clients (GT-DULA section on
    MNIST: agent i holds 4500 images of digit i and 100 of each other digit).

    ``classes`` (default: all sorted classes) fixes the client order. Raises
    ``ValueError`` naming ``major``/``minor`` when a class has too few examples.
    """
    n = _num_rows(data)
    y = _labels(data, labels, n)
    rng = numpy_generator(seed)
    major = _positive_int(major, "major")
    if isinstance(minor, bool) or not isinstance(minor, (int, np.integer)) or minor < 0:
        raise ValueError(f"minor must be a non-negative integer, got {minor!r}")
    classes = np.unique(y) if classes is None else np.asarray(classes)
    num = classes.size
    need = major + (num - 1) * minor
    pools = {}
    for c in classes.tolist():
        rows = rng.permutation(np.flatnonzero(y == c))
        if rows.size < need:
            raise ValueError(
                f"class {c!r} has {rows.size} examples but major + (classes - 1) * minor = {need} "
                "are needed: lower major or minor"
            )
        pools[c] = rows
    used = {c: 0 for c in pools}
    indices = []
    for owner in classes.tolist():
        parts = []
        for c in classes.tolist():
            take = major if c == owner else minor
            parts.append(pools[c][used[c] : used[c] + take])
            used[c] += take
        indices.append(rng.permutation(np.concatenate(parts)))
    return from_indices(
        data,
        indices,
        weights=weights,
        names=[f"class_{c}" for c in classes.tolist()],
        return_indices=return_indices,
    )


def by_key(
    data: PyTree,
    keys: Any,
    *,
    order: Optional[Sequence[Any]] = None,
    weights: Any = None,
    return_indices: bool = False,
):
    """One client per distinct value of ``keys`` (a site, cluster or block id),
    named after it. ``order`` (default: sorted distinct keys) fixes which key is
    client 0, 1, ...; keys listed in ``order`` must occur in the data, and rows
    whose key is not in ``order`` are left out.
    """
    n = _num_rows(data)
    k = _labels(data, keys, n, argument="keys")
    values = np.unique(k) if order is None else list(order)
    if len(values) == 0:
        raise ValueError("order is empty")
    indices = []
    for value in values:
        rows = np.flatnonzero(k == value)
        if rows.size == 0:
            raise ValueError(f"order: key {value!r} occurs in no example (the client would be empty)")
        indices.append(rows)
    names = [str(v.item() if hasattr(v, "item") else v) for v in values]
    return from_indices(data, indices, weights=weights, names=names, return_indices=return_indices)


def delayed_communication_data(*args, **kwargs):
    """FSGLD section 5.1 data (see :func:`fedmcmc.models.synthetic.delayed_communication_data`)."""
    return _synthetic_delayed_communication_data(*args, **kwargs)


delayed_communication_data.__doc__ = (
    "FSGLD section 5.1: 10 clients of 200 points from N(mu_s, I), mu_s uniform on [-6, 6]^2.\n\n"
    "Re-export of :func:`fedmcmc.models.synthetic.delayed_communication_data`; see there."
)
