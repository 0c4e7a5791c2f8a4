"""Graphs of the decentralised samplers: construction, Laplacian spectrum, mixing, Condition 1."""

import math
import warnings

import jax.numpy as jnp
import networkx as nx
import numpy as np
import pytest

from fedmcmc.decentralised import graphs


@pytest.mark.parametrize("name", graphs.GRAPH_NAMES)
@pytest.mark.parametrize("n", [1, 2, 5, 12, 30])
def test_named_graphs_are_connected_with_n_agents(name, n):
    topo = graphs.topology(name, n)
    assert topo.n == n and topo.graph.number_of_nodes() == n
    assert nx.is_connected(topo.graph)
    lap = topo.laplacian
    np.testing.assert_allclose(lap.sum(axis=1), 0.0, atol=1e-12)
    np.testing.assert_allclose(lap, lap.T)
    eig = np.sort(np.linalg.eigvalsh(lap))
    assert topo.lambda_n == pytest.approx(eig[-1])
    if n > 1:
        assert topo.lambda_2 > 1e-9 and topo.lambda_2 == pytest.approx(eig[1])
    assert topo.senders.shape[0] == 2 * topo.graph.number_of_edges()


def test_known_spectra():
    n = 8
    ring = graphs.topology("ring", n)
    assert ring.lambda_2 == pytest.approx(2 - 2 * math.cos(2 * math.pi / n))
    assert ring.lambda_n == pytest.approx(4.0)
    complete = graphs.topology("complete", n)
    assert complete.lambda_2 == pytest.approx(n) and complete.lambda_n == pytest.approx(n)
    star = graphs.topology("star", n)
    assert star.lambda_2 == pytest.approx(1.0) and star.lambda_n == pytest.approx(n)
    path = graphs.topology("path", n)
    assert path.lambda_2 == pytest.approx(2 - 2 * math.cos(math.pi / n))
    torus = graphs.topology("torus", 16)
    assert set(dict(torus.graph.degree()).values()) == {4}
    grid = graphs.topology("grid", 12, {"shape": (3, 4)})
    assert grid.graph.number_of_edges() == 3 * 3 + 2 * 4
    expo = graphs.topology("exponential", 16)
    # hops 1, 2, 4, 8: degree 2 * 4 - 1 (hop 8 is its own inverse)
    assert set(dict(expo.graph.degree()).values()) == {7}


def test_erdos_renyi_is_reproducible_and_connected():
    a = graphs.topology("erdos_renyi", 40, {"p": 0.15, "seed": 3})
    b = graphs.topology("erdos_renyi", 40, {"p": 0.15, "seed": 3})
    assert sorted(a.graph.edges()) == sorted(b.graph.edges())
    assert nx.is_connected(a.graph)
    with pytest.raises(ValueError, match="graph"):
        graphs.topology("erdos_renyi", 40, {"p": 0.001, "max_tries": 3})


def test_networkx_graph_with_arbitrary_labels():
    g = nx.relabel_nodes(nx.petersen_graph(), {i: f"agent{i}" for i in range(10)})
    topo = graphs.topology(g, 10)
    assert topo.n == 10 and topo.num_edges == 15
    assert topo.lambda_2 == pytest.approx(2.0) and topo.lambda_n == pytest.approx(5.0)


@pytest.mark.parametrize(
    "bad, match",
    [
        (nx.Graph([(0, 1), (2, 3)]), "not connected"),
        (nx.DiGraph([(0, 1), (1, 2), (2, 0)]), "undirected"),
        (nx.Graph([(0, 1), (1, 2), (2, 2)]), "self-loops"),
        ("hexagon", "graph must be one of"),
        (42, "graph must be"),
    ],
)
def test_bad_graphs_raise_naming_graph(bad, match):
    with pytest.raises(ValueError, match=match) as info:
        graphs.topology(bad, 4 if not isinstance(bad, nx.Graph) else bad.number_of_nodes())
    assert "graph" in str(info.value)


def test_wrong_size_graph_raises():
    with pytest.raises(ValueError, match="graph has 6 nodes but the federation has 5"):
        graphs.topology(nx.cycle_graph(6), 5)
    with pytest.raises(ValueError, match="graph: grid shape"):
        graphs.topology("grid", 12, {"shape": (5, 3)})


@pytest.mark.parametrize("name, n", [("ring", 7), ("star", 40), ("erdos_renyi", 60), ("torus", 64)])
def test_mixers_apply_w_equal_i_minus_beta_l(name, n):
    topo = graphs.topology(name, n)
    x = np.random.default_rng(0).normal(size=(n, 3)).astype(np.float32)
    expected = topo.mixing(0.1) @ x
    for dense in (True, False):
        mixed = np.asarray(topo.mixer(dense=dense)(jnp.asarray(x), 0.1))
        np.testing.assert_allclose(mixed, expected, rtol=1e-5, atol=1e-5)
        # mixing preserves the network average (1^T L = 0)
        np.testing.assert_allclose(mixed.mean(axis=0), x.mean(axis=0), atol=1e-5)
    # the edge list is a neighbour table (padded at weight 0) unless the degrees are very
    # uneven (star: segment_sum); erdos_renyi pads rows of lower degree
    table = topo.neighbour_table()
    assert (table is None) == (name == "star")
    if table is not None:
        index, weight = table
        assert weight.sum() == topo.senders.shape[0]
        adjacency = np.zeros((n, n))
        np.add.at(adjacency, (np.repeat(np.arange(n), index.shape[1]), index.ravel()), weight.ravel())
        np.testing.assert_array_equal(adjacency, np.diag(np.diag(topo.laplacian)) - topo.laplacian)


def test_condition_1_warns_with_the_bound():
    topo = graphs.topology("ring", 5)  # lambda_2 = 1.382, lambda_n = 3.618
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert graphs.check_condition_1(topo, 0.3, 0.3) == []
    with pytest.warns(graphs.ConditionWarning, match=r"min\(1, n/lambda_n\)"):
        graphs.check_condition_1(topo, 1.2, 0.3)
    with pytest.warns(graphs.ConditionWarning, match=r"gamma=0.5 exceeds .* min\(beta, 1/lambda_2\)"):
        graphs.check_condition_1(topo, 0.3, 0.5)
    # beta = 1 satisfies Condition 1 but beta * lambda_n > 2 makes the consensus step unstable
    with pytest.warns(graphs.ConditionWarning, match="beta \\* lambda_n"):
        problems = graphs.check_condition_1(topo, 1.0)
    assert len(problems) == 1
    with pytest.raises(ValueError, match="beta=1.2"):
        graphs.check_condition_1(topo, 1.2, None, on_violation="raise")
    with pytest.raises(ValueError, match="gamma=0.9"):
        graphs.check_condition_1(topo, 0.5, 0.9, on_violation="raise")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert graphs.check_condition_1(topo, 1.2, None, on_violation="ignore")
