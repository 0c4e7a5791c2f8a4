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

import contextlib
import dataclasses
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import numpy as np

from .arrays import device_array

PyTree = Any

__all__ = [
    "Federation",
    "ConcatenatedData",
    "PaddedData",
    "ClientDescription",
    "DescribedFederation",
    "describe_client",
    "load_client",
]


@dataclasses.dataclass(frozen=True)
class ConcatenatedData:
    """All clients' rows concatenated; client ``s`` owns rows ``offsets[s] : offsets[s] + sizes[s]``."""

    data: PyTree
    offsets: jax.Array  # (S,) int32
    sizes: jax.Array  # (S,) int32


#: a computation over every client's rows uses :meth:`PaddedData.unpadded` when more than this
#: share of the padded rows would be padding (clients of unequal size): the decentralised
#: full-batch gradients and Fed-PDMC's in-process thinning
UNPADDED_ABOVE_PADDING = 0.25


@dataclasses.dataclass(frozen=True)
class PaddedData:
    """Clients stacked on a leading axis and padded to the largest client; ``mask`` is 1 on real rows."""

    data: PyTree  # leaves (S, max_size, ...)
    mask: jax.Array  # (S, max_size) float
    sizes: jax.Array  # (S,) int32

    @property
    def padding_share(self) -> float:
        """The share of the padded rows that are padding (0 for clients of equal size)."""
        mask = np.asarray(self.mask) > 0
        return float(1.0 - mask.sum() / mask.size)

    @property
    def mostly_padding(self) -> bool:
        """Whether :meth:`unpadded` saves work: padding above :data:`UNPADDED_ABOVE_PADDING`."""
        return self.padding_share > UNPADDED_ABOVE_PADDING

    def unpadded(self):
        """``(rows, owner)``: the real rows stacked client after client (device arrays) and
        the index of each row's client (int32, sorted): the layout in which a computation over
        every client's rows costs the real rows only, however unequal the clients."""
        client, row = np.nonzero(np.asarray(self.mask) > 0)  # sorted by client
        rows = jax.tree_util.tree_map(lambda leaf: device_array(np.asarray(leaf)[client, row]),
                                      self.data)
        return rows, device_array(client.astype(np.int32))


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
            w = _check_weights(np.asarray(weights, dtype=np.float64), self.num_clients)
            self.weights = w
            self.weights_given = True

        if names is None:
            self.names = [f"client_{i}" for i in range(self.num_clients)]
        else:
            if len(names) != self.num_clients:
                raise ValueError("names must have one entry per client")
            self.names = [str(n) for n in names]

    # ------------------------------------------------------ data left on the clients
    @classmethod
    def from_loaders(
        cls,
        loaders: Sequence[Callable[[], PyTree]],
        weights: Optional[Sequence[float]] = None,
        *,
        names: Optional[Sequence[str]] = None,
    ) -> "Federation":
        """A federation whose data stay where they are: one zero-argument callable per client.

        Each ``loaders[s]()`` returns client ``s``'s data pytree (every leaf's leading axis
        indexes its examples), read where it runs: from the client machine's disk, database
        or device. With ``engine="ray"`` each loader is called inside its client's actor
        (placed on the client's node by ``client_resources``); the client validates its rows
        there and reports only its size and the shapes of one example, so the driver never
        receives a row. With ``engine="local"`` (every client simulated in this process) the
        loaders are called here, once, when the data are first needed.

        The loaders must be picklable for ``engine="ray"`` (module-level functions,
        ``functools.partial`` of them, or callable objects; not lambdas closing over large
        arrays, which would ship the data with the loader). ``weights``: the client
        selection probabilities f_s, as in :class:`Federation` (default: proportional to
        the sizes the clients report).
        """
        if isinstance(loaders, (str, bytes)) or not hasattr(loaders, "__len__"):
            raise ValueError("loaders must be a sequence with one zero-argument callable per client")
        loaders = list(loaders)
        if not loaders:
            raise ValueError("loaders is empty: a federation needs at least one client")
        for index, loader in enumerate(loaders):
            if not callable(loader):
                raise ValueError(
                    f"loaders[{index}] must be a zero-argument callable returning the client's "
                    f"data, got {type(loader).__name__}"
                )
        if names is not None and len(names) != len(loaders):
            raise ValueError("names must have one entry per client")
        if weights is not None:
            _check_weights(np.asarray(weights, dtype=np.float64), len(loaders))
        federation = cls.__new__(cls)
        federation.__dict__.update(
            num_clients=len(loaders),
            names=[f"client_{i}" for i in range(len(loaders))] if names is None
            else [str(n) for n in names],
            _loaders=loaders,
            _requested_weights=None if weights is None else list(weights),
        )
        return federation

    @property
    def is_deferred(self) -> bool:
        """True for a :meth:`from_loaders` federation whose loaders have not been called here."""
        return "_clients" not in self.__dict__

    @property
    def loaders(self) -> Optional[list]:
        """The clients' loaders of a :meth:`from_loaders` federation, else ``None``."""
        return self.__dict__.get("_loaders")

    def load(self) -> "Federation":
        """Call the loaders of a :meth:`from_loaders` federation in this process (once) and
        validate the data as :class:`Federation` does; returns ``self``. A no-op otherwise."""
        if self.is_deferred:
            loaders = self.__dict__["_loaders"]
            clients = [load_client(loader, index) for index, loader in enumerate(loaders)]
            Federation.__init__(self, clients, self.__dict__["_requested_weights"], names=self.names)
        return self

    @contextlib.contextmanager
    def kept_on_clients(self):
        """While inside, the driver may not call this (deferred) federation's loaders: any
        access to its data raises ``RuntimeError`` instead (``engine="ray"`` runs use it)."""
        self.__dict__["_remote_depth"] = self.__dict__.get("_remote_depth", 0) + 1
        try:
            yield self
        finally:
            self.__dict__["_remote_depth"] -= 1

    def client_sources(self) -> list:
        """What a client endpoint is built from: its loader (deferred federation, called in the
        client's process) or its data."""
        if self.is_deferred:
            return list(self.__dict__["_loaders"])
        return list(self._clients)

    def __getattr__(self, name: str):
        # Only reached for attributes not set yet: the data attributes of a deferred
        # (from_loaders) federation, which engine="local" loads here on first use.
        if name.startswith("__") or "_loaders" not in self.__dict__ or not self.is_deferred:
            raise AttributeError(name)
        if self.__dict__.get("_remote_depth", 0):
            raise RuntimeError(
                f"Federation.{name}: this federation's data stay on the clients while an "
                "engine='ray' run uses it (its loaders run in the client processes only); "
                "the engine asked the driver for them, which is a bug: please report it"
            )
        self.load()
        return getattr(self, name)

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
        data = jax.tree_util.tree_map(device_array, self.pooled())
        return ConcatenatedData(
            data=data,
            offsets=device_array(offsets, np.int32),
            sizes=device_array(self.sizes, np.int32),
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
            lambda *leaves: device_array(np.stack([pad(leaf) for leaf in leaves])), *self._clients
        )
        mask = (np.arange(max_size)[None, :] < self.sizes[:, None]).astype(np.float32)
        return PaddedData(
            data=stacked, mask=device_array(mask), sizes=device_array(self.sizes, np.int32)
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


def _check_weights(w: np.ndarray, num_clients: int) -> np.ndarray:
    """The client selection probabilities f_s, checked (``ValueError`` naming ``weights``)."""
    if w.ndim != 1 or w.shape[0] != num_clients:
        raise ValueError(
            f"weights must have one entry per client ({num_clients}), got shape {w.shape}"
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
    return w


def load_client(source: Any, index: int) -> PyTree:
    """Client ``index``'s data from its ``source`` (a loader, called here, or the data itself),
    validated as :class:`Federation` validates a client (``ValueError`` naming ``clients[index]``)."""
    data = source
    if callable(source):
        try:
            data = source()
        except Exception as error:  # noqa: BLE001 - re-raised with the client named
            raise ValueError(
                f"loaders[{index}] failed: {type(error).__name__}: {error}"
            ) from error
    try:
        checked = Federation([data])
    except ValueError as error:
        raise ValueError(str(error).replace("clients[0]", f"clients[{index}]")) from None
    return checked[0]


class ClientDescription(NamedTuple):
    """What a client reports about its data instead of the data: its number of rows, the
    pytree structure and per-example shapes/dtypes (as one all-zero example)."""

    size: int
    zero_example: PyTree  # one example of zeros: shapes and dtypes only


def describe_client(data: PyTree) -> ClientDescription:
    """The :class:`ClientDescription` of a client's (validated) data."""
    leaves = jax.tree_util.tree_leaves(data)
    zero = jax.tree_util.tree_map(lambda leaf: np.zeros_like(np.asarray(leaf)[0]), data)
    return ClientDescription(size=int(np.shape(leaves[0])[0]), zero_example=zero)


class DescribedFederation:
    """The driver's view of a federation whose data stay on the clients (engine="ray" with
    :meth:`Federation.from_loaders`): sizes, weights and names from what the clients reported,
    no rows. Asking it for data raises ``RuntimeError``."""

    def __init__(self, federation: Federation, descriptions: Sequence[ClientDescription]):
        if len(descriptions) != federation.num_clients:  # pragma: no cover - engine invariant
            raise ValueError("one description per client is needed")
        first = descriptions[0].zero_example
        structure = jax.tree_util.tree_structure(first)
        shapes = [(np.shape(x), np.asarray(x).dtype.kind) for x in jax.tree_util.tree_leaves(first)]
        for index, description in enumerate(descriptions[1:], start=1):
            other = description.zero_example
            if jax.tree_util.tree_structure(other) != structure:
                raise ValueError(
                    f"clients[{index}] has a different pytree structure from clients[0]: "
                    f"{jax.tree_util.tree_structure(other)} vs {structure}"
                )
            other_shapes = [np.shape(x) for x in jax.tree_util.tree_leaves(other)]
            if other_shapes != [s for s, _ in shapes]:
                raise ValueError(
                    f"clients[{index}]: per-example shapes {other_shapes} differ from "
                    f"clients[0]'s {[s for s, _ in shapes]}"
                )
        self.num_clients = federation.num_clients
        self.names = list(federation.names)
        self.sizes = np.asarray([d.size for d in descriptions], dtype=np.int64)
        self.total_size = int(self.sizes.sum())
        requested = federation.__dict__.get("_requested_weights")
        if requested is None:
            self.weights = self.sizes / self.total_size
            self.weights_given = False
        else:
            self.weights = _check_weights(np.asarray(requested, dtype=np.float64), self.num_clients)
            self.weights_given = True
        self._zero_example = first

    def __len__(self) -> int:
        return self.num_clients

    def example(self) -> PyTree:
        """An all-zero example with the clients' structure, shapes and dtypes."""
        return self._zero_example

    def _no_data(self, *args, **kwargs):
        raise RuntimeError(
            "this federation's data stay on the clients (Federation.from_loaders on "
            "engine='ray'): the driver has no rows to give"
        )

    __getitem__ = pooled = concatenated = padded = clients = _no_data
