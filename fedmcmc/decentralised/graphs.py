"""Communication graphs of the decentralised samplers (GT-DULA paper, sections 2-4).

Agents talk over a connected undirected graph G(V, E) (Assumption 2). The
samplers only need its Laplacian L = D - A, through the mixing matrices
``W_beta = I - beta L`` and ``W_gamma = I - gamma L`` of equations (7)-(8), and
the two eigenvalues that appear in Condition 1: lambda_2 (algebraic
connectivity) and lambda_n (largest).

A graph is named (``"ring"``, ``"path"``, ``"star"``, ``"complete"``,
``"grid"``, ``"torus"``, ``"erdos_renyi"``, ``"exponential"``) and built for
``n`` agents, or given as any connected ``networkx`` graph with ``n`` nodes;
agent ``i`` is then the ``i``-th node of ``list(graph.nodes)``.

Agents' states are mixed with an edge list so one mixing step costs ``O(|E| d)``,
not O(n^2 d): when the degrees are nearly uniform (ring, torus, exponential,
grid, ...) as a table of neighbour indices (one row gather per neighbour slot,
fused with the rest of the update), otherwise with gather + ``segment_sum``;
dense graphs use the dense matrix, which is faster there.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import TYPE_CHECKING, Any, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from ..arrays import device_array
from ..callsite import user_stacklevel

if TYPE_CHECKING:  # networkx is imported where a graph is built or read: `import fedmcmc`
    import networkx as nx  # and the Ray engine's client processes do without it (~0.1 s)

__all__ = [
    "GRAPH_NAMES",
    "Topology",
    "make_graph",
    "topology",
    "laplacian",
    "laplacian_spectrum",
    "mixing_matrix",
    "check_condition_1",
    "ConditionWarning",
]

GRAPH_NAMES = ("ring", "path", "star", "complete", "grid", "torus", "erdos_renyi", "exponential")


class ConditionWarning(UserWarning):
    """Hyper-parameters outside Condition 1 of the GT-DULA paper (or an unstable mixing step)."""


def _grid_shape(n: int, shape: Optional[Tuple[int, int]]) -> Tuple[int, int]:
    if shape is not None:
        rows, cols = (int(s) for s in shape)
        if rows * cols != n:
            raise ValueError(f"graph: grid shape {shape} has {rows * cols} nodes, need {n} agents")
        return rows, cols
    rows = max(r for r in range(1, int(math.isqrt(n)) + 1) if n % r == 0)
    return rows, n // rows


def exponential_graph(n: int) -> nx.Graph:
    """Agent i linked to i +- 2^k (mod n), k = 0, 1, ..., floor(log2(n - 1)) (undirected)."""
    import networkx as nx

    graph = nx.Graph()
    graph.add_nodes_from(range(n))
    if n > 1:
        for k in range(int(math.floor(math.log2(n - 1))) + 1):
            hop = 2**k
            for i in range(n):
                j = (i + hop) % n
                if j != i:
                    graph.add_edge(i, j)
    return graph


def make_graph(graph: Any, n: int, **options: Any) -> nx.Graph:
    """A connected ``networkx`` graph on ``n`` agents.

    Parameters
    ----------
    graph:
        A name in :data:`GRAPH_NAMES` or a ``networkx.Graph`` (returned as is
        after the checks).
    n:
        Number of agents (the federation's clients).
    **options:
        ``shape=(rows, cols)`` for ``"grid"``/``"torus"`` (default: the most
        square factorisation of n); ``p`` (default ``min(1, 2 log(n) / n)``),
        ``seed`` (default 0) and ``max_tries`` (default 100) for
        ``"erdos_renyi"``, which is redrawn until connected.

    Raises
    ------
    ValueError
        Naming ``graph``: unknown name, a disconnected graph, a directed graph,
        self-loops, or a graph whose size is not ``n``.
    """
    import networkx as nx

    if isinstance(graph, str):
        if graph not in GRAPH_NAMES:
            raise ValueError(f"graph must be one of {GRAPH_NAMES} or a networkx graph, got {graph!r}")
        known = {"grid": {"shape"}, "torus": {"shape"}, "erdos_renyi": {"p", "seed", "max_tries"}}
        unknown = set(options) - known.get(graph, set())
        if unknown:
            raise ValueError(f"graph_options {sorted(unknown)} do not apply to graph={graph!r}")
        if n < 1:
            raise ValueError(f"graph: need at least one agent, got n={n}")
        if graph == "ring":
            g = nx.cycle_graph(n) if n > 2 else nx.path_graph(n)
        elif graph == "path":
            g = nx.path_graph(n)
        elif graph == "star":
            g = nx.star_graph(n - 1) if n > 1 else nx.empty_graph(1)
        elif graph == "complete":
            g = nx.complete_graph(n)
        elif graph in ("grid", "torus"):
            rows, cols = _grid_shape(n, options.get("shape"))
            # a side of length <= 2 cannot wrap without a multi-edge: it stays open
            periodic = (rows > 2, cols > 2) if graph == "torus" else False
            g = nx.grid_2d_graph(rows, cols, periodic=periodic)
            g = nx.convert_node_labels_to_integers(g, ordering="sorted")
        elif graph == "erdos_renyi":
            p = float(options.get("p", min(1.0, 2.0 * math.log(max(n, 2)) / max(n, 2))))
            if not 0 < p <= 1:
                raise ValueError(f"graph_options p must be in (0, 1], got {p}")
            rng = np.random.default_rng(options.get("seed", 0))
            tries = int(options.get("max_tries", 100))
            for _ in range(tries):
                g = nx.gnp_random_graph(n, p, seed=int(rng.integers(2**31)))
                if nx.is_connected(g):
                    break
            else:
                raise ValueError(
                    f"graph='erdos_renyi' with p={p} gave no connected graph on {n} agents in "
                    f"{tries} tries; raise p"
                )
        else:  # exponential
            g = exponential_graph(n)
        return g
    if not isinstance(graph, nx.Graph):
        raise ValueError(
            f"graph must be one of {GRAPH_NAMES} or a networkx graph, got {type(graph).__name__}"
        )
    if options:
        raise ValueError("graph_options only apply to named graphs, not to a networkx graph")
    check_graph(graph)
    if graph.number_of_nodes() != n:
        raise ValueError(
            f"graph has {graph.number_of_nodes()} nodes but the federation has {n} clients "
            "(one agent per client)"
        )
    return graph


def check_graph(graph: nx.Graph) -> None:
    """``ValueError`` naming ``graph`` unless it is a connected, undirected, simple graph."""
    import networkx as nx

    if graph.is_directed():
        raise ValueError("graph must be undirected (Assumption 2 of the GT-DULA paper)")
    if graph.number_of_nodes() == 0:
        raise ValueError("graph has no nodes")
    if nx.number_of_selfloops(graph) > 0:
        raise ValueError("graph has self-loops; the mixing step needs a simple graph")
    if not nx.is_connected(graph):
        parts = nx.number_connected_components(graph)
        raise ValueError(
            f"graph is not connected ({parts} components): the agents cannot reach consensus "
            "(Assumption 2 of the GT-DULA paper)"
        )


def laplacian(graph: nx.Graph) -> np.ndarray:
    """L = D - A in the node order ``list(graph.nodes)`` (float64). Edge weights are ignored."""
    import networkx as nx

    adjacency = nx.to_numpy_array(graph, nodelist=list(graph.nodes), weight=None, dtype=np.float64)
    return np.diag(adjacency.sum(axis=1)) - adjacency


def laplacian_spectrum(lap: np.ndarray) -> Tuple[float, float]:
    """(lambda_2, lambda_n): second-smallest and largest eigenvalues of the Laplacian.

    For one agent both are 0.
    """
    eigenvalues = np.sort(np.linalg.eigvalsh(lap))
    if eigenvalues.shape[0] == 1:
        return 0.0, 0.0
    return float(max(eigenvalues[1], 0.0)), float(eigenvalues[-1])


def mixing_matrix(lap: np.ndarray, beta: float) -> np.ndarray:
    """W_beta = I - beta L (equation (7))."""
    return np.eye(lap.shape[0]) - beta * lap


@dataclasses.dataclass(frozen=True)
class Topology:
    """A connected graph on ``n`` agents with what the samplers need.

    ``senders``/``receivers`` hold every edge in both directions;
    ``laplacian`` is dense float64 (for diagnostics and the Lyapunov oracle).
    """

    graph: nx.Graph
    name: str
    n: int
    laplacian: np.ndarray
    degrees: np.ndarray
    senders: np.ndarray
    receivers: np.ndarray
    lambda_2: float
    lambda_n: float

    @property
    def num_edges(self) -> int:
        return int(self.senders.shape[0] // 2)

    def mixing(self, beta: float) -> np.ndarray:
        return mixing_matrix(self.laplacian, beta)

    def use_dense(self) -> bool:
        """Dense mixing (one (n, n) matmul) for dense graphs; edge lists otherwise."""
        return self.senders.shape[0] >= self.n * self.n // 4

    def neighbour_table(self) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """``(index (n, k), weight (n, k))``: agent i's neighbours in row i (k = largest
        degree), padded with i itself at weight 0; ``None`` when padding would more than
        double the edge list (very uneven degrees: the star)."""
        n, k = self.n, int(self.degrees.max()) if self.n else 0
        if k == 0 or n * k > 2 * self.senders.shape[0]:
            return None
        index = np.tile(np.arange(n, dtype=np.int32)[:, None], (1, k))
        weight = np.zeros((n, k), np.float32)
        slot = np.zeros(n, np.int64)
        for sender, receiver in zip(self.senders, self.receivers):  # sorted by receiver
            index[receiver, slot[receiver]] = sender
            weight[receiver, slot[receiver]] = 1.0
            slot[receiver] += 1
        return index, weight

    def mixer(self, dense: Optional[bool] = None):
        """``(x, coefficient) -> x - coefficient * (L x)`` for ``x`` of shape (n, d): W x."""
        dense = self.use_dense() if dense is None else dense
        if dense:
            lap = device_array(self.laplacian, np.float32)

            def mix(x, coefficient):
                return x - coefficient * (lap @ x)

            return mix
        table = self.neighbour_table()
        if table is not None:
            index, weight = table
            padded = not bool(weight.all())
            columns = [jnp.asarray(index[:, j]) for j in range(index.shape[1])]
            weights = [jnp.asarray(weight[:, j:j + 1]) for j in range(index.shape[1])]
            degrees = jnp.asarray(self.degrees[:, None], dtype=jnp.float32)

            def mix(x, coefficient):
                # sum_j x[neighbour_j(i)]: k row gathers that fuse with the update
                neighbour_sum = None
                for column, w in zip(columns, weights):
                    term = x[column] * w if padded else x[column]
                    neighbour_sum = term if neighbour_sum is None else neighbour_sum + term
                return x - coefficient * (degrees * x - neighbour_sum)

            return mix
        senders = jnp.asarray(self.senders, dtype=jnp.int32)
        receivers = jnp.asarray(self.receivers, dtype=jnp.int32)
        degrees = jnp.asarray(self.degrees, dtype=jnp.float32)
        n = self.n

        def mix(x, coefficient):
            neighbour_sum = jax.ops.segment_sum(
                x[senders], receivers, num_segments=n, indices_are_sorted=True
            )
            return x - coefficient * (degrees[:, None] * x - neighbour_sum)

        return mix

    def describe(self) -> dict:
        return {
            "graph": self.name,
            "n_agents": self.n,
            "edges": self.num_edges,
            "lambda_2": self.lambda_2,
            "lambda_n": self.lambda_n,
        }


def topology(graph: Any, n: int, graph_options: Optional[Mapping[str, Any]] = None) -> Topology:
    """Build and check the graph on ``n`` agents (see :func:`make_graph`)."""
    g = make_graph(graph, n, **dict(graph_options or {}))
    check_graph(g)
    if g.number_of_nodes() != n:  # pragma: no cover - make_graph guarantees it
        raise ValueError(f"graph has {g.number_of_nodes()} nodes, expected {n}")
    nodes = list(g.nodes)
    index = {node: i for i, node in enumerate(nodes)}
    pairs = [(index[u], index[v]) for u, v in g.edges()]
    directed = pairs + [(j, i) for i, j in pairs]
    directed.sort(key=lambda e: (e[1], e[0]))  # sorted by receiver for segment_sum
    if directed:
        senders = np.array([s for s, _ in directed], dtype=np.int32)
        receivers = np.array([r for _, r in directed], dtype=np.int32)
    else:
        senders = receivers = np.zeros((0,), dtype=np.int32)
    lap = laplacian(g)
    lam2, lamn = laplacian_spectrum(lap)
    name = graph if isinstance(graph, str) else f"networkx:{type(graph).__name__}"
    return Topology(
        graph=g,
        name=name,
        n=n,
        laplacian=lap,
        degrees=np.diag(lap).copy(),
        senders=senders,
        receivers=receivers,
        lambda_2=lam2,
        lambda_n=lamn,
    )


def check_condition_1(
    topo: Topology,
    beta: float,
    gamma: Optional[float] = None,
    on_violation: str = "warn",
    stacklevel: Optional[int] = None,
) -> list:
    """Check the graph parts of Condition 1: beta <= min(1, n / lambda_n), gamma <= min(beta, 1 / lambda_2).

    Also checks that the mixing steps contract the disagreement between
    agents, ``|1 - beta lambda_i| < 1`` for every non-zero Laplacian eigenvalue,
    i.e. beta * lambda_n < 2 (and the same for gamma): Condition 1 alone does
    not imply it (beta = 1 on a ring of 5 or more agents has beta * lambda_n > 2,
    and the agents' disagreement then grows geometrically).

    The conditions on alpha involve Lipschitz and log-Sobolev constants of
    the model and are not checked.

    Parameters
    ----------
    on_violation:
        ``"warn"`` (a :class:`ConditionWarning`), ``"raise"`` (``ValueError``
        naming ``beta`` or ``gamma``) or ``"ignore"``.

    Returns
    -------
    list of str
        The violated conditions (empty when all hold).
    """
    if on_violation not in ("warn", "raise", "ignore"):
        raise ValueError(f"condition must be 'warn', 'raise' or 'ignore', got {on_violation!r}")
    problems = []
    n, lam2, lamn = topo.n, topo.lambda_2, topo.lambda_n
    if n > 1:
        beta_bound = min(1.0, n / lamn)
        if beta > beta_bound * (1 + 1e-12):
            problems.append(
                f"beta={beta:g} exceeds the Condition 1 bound min(1, n/lambda_n) = "
                f"min(1, {n}/{lamn:.4g}) = {beta_bound:.4g}"
            )
        if beta * lamn >= 2:
            problems.append(
                f"beta={beta:g}: beta * lambda_n = {beta * lamn:.4g} >= 2, so W_beta = I - beta L "
                f"has an eigenvalue {1 - beta * lamn:.4g} <= -1 and the agents diverge from each "
                f"other; need beta < 2/lambda_n = {2 / lamn:.4g}"
            )
        if gamma is not None:
            gamma_bound = min(beta, 1.0 / lam2)
            if gamma > gamma_bound * (1 + 1e-12):
                problems.append(
                    f"gamma={gamma:g} exceeds the Condition 1 bound min(beta, 1/lambda_2) = "
                    f"min({beta:g}, 1/{lam2:.4g}) = {gamma_bound:.4g}"
                )
            if gamma * lamn >= 2:
                problems.append(
                    f"gamma={gamma:g}: gamma * lambda_n = {gamma * lamn:.4g} >= 2, so the gradient "
                    f"trackers diverge from each other; need gamma < 2/lambda_n = {2 / lamn:.4g}"
                )
    if problems and on_violation != "ignore":
        message = (
            f"graph {topo.name!r} with {n} agents (lambda_2={lam2:.4g}, lambda_n={lamn:.4g}): "
            + "; ".join(problems)
        )
        if on_violation == "raise":
            raise ValueError(message)
        if stacklevel is None:
            stacklevel = user_stacklevel()
        warnings.warn(message, ConditionWarning, stacklevel=stacklevel)
    return problems
