"""Federations: one data pytree per client, and the client weights f_s.

A :class:`Federation` validates the clients' data once and offers the two
layouts the compiled engines use:

* :meth:`Federation.concatenated` -- every client's rows one after the other,
  with ``offsets`` and ``sizes``. A minibatch of client ``s`` is
  ``offsets[s] + floor(u * sizes[s])``: O(batch) work and no padding waste,
  whatever the spread of client sizes. Used by the Langevin samplers.
* :meth:`Federation.padded` -- a ``(clients, max_size, ...)`` stack with a 0/1
  mask, for computations ``vmap``-ped over clients on their full data
  (surrogate fitting, full-batch gradients of every agent, PDMP workers).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any

__all__ = ["Federation", "ConcatenatedData", "PaddedData"]


@dataclasses.dataclass(frozen=True)
class ConcatenatedData:
    """All clients' rows concatenated; client ``s`` owns rows ``offsets[s] : offsets[s] + sizes[s]``."""

    data: PyTree
    offsets: jax.Array  # (S,) int32
    sizes: jax.Array  # (S,) int32


@dataclasses.dataclass(frozen=True)
class PaddedData:
    """Clients stacked on a leading axis and padded to the largest client; ``mask`` is 1 on real rows."""

    data: PyTree  # leaves (S, max_size, ...)
    mask: jax.Array  # (S, max_size) float
    sizes: jax.Array  # (S,) int32


class Federation:
    """Data split across clients that cannot pool it.

    Parameters
    ----------
    clients:
        A sequence with one data pytree per client. Every leaf's leading axis
        indexes that client's examples; all clients share the same structure
        and per-example shapes; clients may have different sizes.
    weights:
        The client selection probabilities f_s of the DSGLD/FSGLD scheduler.
        ``None`` (default) sets them proportional to client size, f_s = N_s / N.
        Otherwise they must be strictly positive and sum to 1.
    names:
        Optional client names (for reports and error messages).
    """

    def __init__(
        self,
        clients: Sequence[PyTree],
        weights: Optional[Sequence[float]] = None,
        *,
        names: Optional[Sequence[str]] = None,
    ) -> None:
        if isinstance(clients, (str, bytes)) or not hasattr(clients, "__len__"):
            raise ValueError("clients must be a sequence with one data pytree per client")
        clients = list(clients)
        if len(clients) == 0:
            raise ValueError("clients is empty: a federation needs at least one client")

        reference_structure = None
        reference_shapes = None
        sizes = []
        converted = []
        for index, client in enumerate(clients):
            leaves, structure = jax.tree_util.tree_flatten(client)
            if not leaves:
                raise ValueError(f"clients[{index}] has no data leaves")
            arrays = [np.asarray(leaf) for leaf in leaves]
            for array in arrays:
                if array.ndim == 0:
                    raise ValueError(
                        f"clients[{index}]: every leaf needs a leading example axis, got a scalar"
                    )
            leading = {array.shape[0] for array in arrays}
            if len(leading) != 1:
                raise ValueError(
                    f"clients[{index}]: the leaves' leading axes disagree ({sorted(leading)}); "
                    "every leaf must have one row per example"
                )
            size = leading.pop()
            if size == 0:
                raise ValueError(f"clients[{index}] has no examples")
            for array in arrays:
                if np.issubdtype(array.dtype, np.inexact) and not np.all(np.isfinite(array)):
                    raise ValueError(f"clients[{index}]: data contains NaN or infinite values")
                if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
                    raise ValueError(
                        f"clients[{index}]: leaves must be numeric arrays, got dtype {array.dtype}"
                    )
            shapes = [(array.shape[1:], array.dtype.kind) for array in arrays]
            if reference_structure is None:
                reference_structure, reference_shapes = structure, shapes
            else:
                if structure != reference_structure:
                    raise ValueError(
                        f"clients[{index}] has a different pytree structure from clients[0]: "
                        f"{structure} vs {reference_structure}"
                    )
                if [s for s, _ in shapes] != [s for s, _ in reference_shapes]:
                    raise ValueError(
                        f"clients[{index}]: per-example shapes {[s for s, _ in shapes]} differ "
                        f"from clients[0]'s {[s for s, _ in reference_shapes]}"
                    )
            sizes.append(int(size))
            converted.append(jax.tree_util.tree_unflatten(structure, arrays))

        self._clients = converted
        self._structure = reference_structure
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.num_clients = len(converted)
        self.total_size = int(self.sizes.sum())

        if weights is None:
            self.weights = self.sizes / self.total_size
            self.weights_given = False
        else:
            w = np.asarray(weights, dtype=np.float64)
            if w.ndim != 1 or w.shape[0] != self.num_clients:
                raise ValueError(
                    f"weights must have one entry per client ({self.num_clients}), got shape {w.shape}"
                )
            if not np.all(np.isfinite(w)):
                raise ValueError("weights contain NaN or infinite values")
            if np.any(w < 0):
                raise ValueError(f"weights must be non-negative, got {w.tolist()}")
            if np.any(w == 0):
                raise ValueError(
                    "weights must be strictly positive: every client needs f_s > 0 "
                    "(the estimators divide by f_s)"
                )
            if not np.isclose(w.sum(), 1.0, rtol=0, atol=1e-6):
                raise ValueError(f"weights must sum to 1, got sum {w.sum():.6g}")
            self.weights = w
            self.weights_given = True

        if names is None:
            self.names = [f"client_{i}" for i in range(self.num_clients)]
        else:
            if len(names) != self.num_clients:
                raise ValueError("names must have one entry per client")
            self.names = [str(n) for n in names]

    # ----------------------------------------------------------------- access
    def __len__(self) -> int:
        return self.num_clients

    def __getitem__(self, index: int) -> PyTree:
        return self._clients[index]

    @property
    def clients(self) -> list:
        return list(self._clients)

    def __repr__(self) -> str:  # pragma: no cover - cosmetic
        return (
            f"Federation({self.num_clients} clients, sizes {self.sizes.min()}..{self.sizes.max()}, "
            f"total {self.total_size})"
        )

    def example(self) -> PyTree:
        """One example (row 0 of client 0), for shape checks."""
        return jax.tree_util.tree_map(lambda leaf: leaf[0], self._clients[0])

    def pooled(self) -> PyTree:
        """All clients' data in one pytree. For references and tests only: the
        federated algorithms never call it."""
        return jax.tree_util.tree_map(lambda *leaves: np.concatenate(leaves, axis=0), *self._clients)

    # ---------------------------------------------------------------- layouts
    def concatenated(self) -> ConcatenatedData:
        offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        data = jax.tree_util.tree_map(jnp.asarray, self.pooled())
        return ConcatenatedData(
            data=data,
            offsets=jnp.asarray(offsets, dtype=jnp.int32),
            sizes=jnp.asarray(self.sizes, dtype=jnp.int32),
        )

    def padded(self) -> PaddedData:
        max_size = int(self.sizes.max())

        def pad(leaf: np.ndarray) -> np.ndarray:
            width = [(0, max_size - leaf.shape[0])] + [(0, 0)] * (leaf.ndim - 1)
            # Pad by repeating row 0 so padded rows stay valid model inputs (masked out).
            padding = np.repeat(leaf[:1], max_size - leaf.shape[0], axis=0)
            del width
            return np.concatenate([leaf, padding], axis=0)

        stacked = jax.tree_util.tree_map(
            lambda *leaves: jnp.asarray(np.stack([pad(leaf) for leaf in leaves])), *self._clients
        )
        mask = (np.arange(max_size)[None, :] < self.sizes[:, None]).astype(np.float32)
        return PaddedData(
            data=stacked, mask=jnp.asarray(mask), sizes=jnp.asarray(self.sizes, dtype=jnp.int32)
        )

    def subset(self, keep: Sequence[int]) -> "Federation":
        """A federation of the clients in ``keep``; weights renormalised if they were given."""
        keep = list(keep)
        weights = None
        if self.weights_given:
            w = self.weights[keep]
            weights = w / w.sum()
        return Federation(
            [self._clients[i] for i in keep], weights=weights, names=[self.names[i] for i in keep]
        )
