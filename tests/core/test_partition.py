"""fm.partition: sizes, label properties, reproducibility and errors naming the argument."""

import numpy as np
import pytest

import fedmcmc
from fedmcmc import partition
from fedmcmc.federation import Federation


def make_data(n=600, classes=6, seed=0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    rng.shuffle(y)
    # Column 0 is the row id, so client contents can be traced back to rows.
    x = np.column_stack([np.arange(n), rng.standard_normal((n, 2))]).astype(np.float32)
    return {"x": x, "y": y}


def rows_of(federation):
    return [client["x"][:, 0].astype(int) for client in federation.clients]


def check_disjoint(federation, n):
    rows = np.concatenate(rows_of(federation))
    assert rows.size == np.unique(rows).size, "a row was given to two clients"
    assert rows.min() >= 0 and rows.max() < n
    assert all(size > 0 for size in federation.sizes)


# --------------------------------------------------------------------------- iid


def test_iid_equal_sizes_cover_everything():
    data = make_data(603)
    fed = partition.iid(data, 10, seed=1)
    assert isinstance(fed, Federation)
    assert fed.num_clients == 10 and fed.total_size == 603
    assert fed.sizes.max() - fed.sizes.min() <= 1
    check_disjoint(fed, 603)


def test_iid_given_sizes_and_indices():
    data = make_data(100)
    fed, idx = partition.iid(data, sizes=[5, 30, 10], seed=0, return_indices=True)
    assert fed.sizes.tolist() == [5, 30, 10]
    for client, index in zip(fed.clients, idx):
        np.testing.assert_array_equal(client["x"][:, 0].astype(int), index)


def test_iid_reproducible_and_accepts_generator():
    data = make_data(100)
    a = rows_of(partition.iid(data, 4, seed=3))
    b = rows_of(partition.iid(data, 4, seed=np.random.default_rng(3)))
    c = rows_of(partition.iid(data, 4, seed=4))
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    assert not all(np.array_equal(u, v) for u, v in zip(a, c))


def test_iid_unshuffled_is_contiguous():
    fed = partition.iid(np.arange(10.0), 3, shuffle=False)
    np.testing.assert_array_equal(fed[0], [0, 1, 2, 3])
    np.testing.assert_array_equal(fed[2], [7, 8, 9])


def test_iid_errors_name_the_argument():
    data = make_data(10)
    with pytest.raises(ValueError, match="num_clients"):
        partition.iid(data, 11)
    with pytest.raises(ValueError, match="num_clients"):
        partition.iid(data, 0)
    with pytest.raises(ValueError, match="sizes"):
        partition.iid(data, sizes=[5, 6])
    with pytest.raises(ValueError, match="sizes"):
        partition.iid(data, sizes=[5, 0])
    with pytest.raises(ValueError, match="seed"):
        partition.iid(data, 2, seed="x")
    with pytest.raises(ValueError, match="data"):
        partition.iid({"a": np.zeros(5), "b": np.zeros(6)}, 2)


def test_uniform_weights():
    fed = partition.iid(make_data(101), sizes=[1, 100], weights="uniform")
    np.testing.assert_allclose(fed.weights, [0.5, 0.5])
    fed = partition.iid(make_data(101), sizes=[1, 100])
    np.testing.assert_allclose(fed.weights, [1 / 101, 100 / 101])


# --------------------------------------------------------------------------- by label


def test_by_label_k_classes_per_client():
    data = make_data(600, classes=6)
    fed = partition.by_label(data, "y", 6, 2, seed=0)
    check_disjoint(fed, 600)
    assert fed.total_size == 600  # 6 clients x 2 classes cover all 6 classes
    for client, name in zip(fed.clients, fed.names):
        assert np.unique(client["y"]).size == 2
        assert name == "classes_" + "-".join(str(c) for c in np.unique(client["y"]))


def test_by_label_labels_as_array_and_unused_classes():
    data = make_data(600, classes=6)
    fed = partition.by_label(data, data["y"], 2, 2, seed=0)
    used = np.unique(np.concatenate([c["y"] for c in fed.clients]))
    assert used.size == 4  # 2 clients x 2 classes: 2 classes are left out
    check_disjoint(fed, 600)


def test_by_label_disjoint_shares_no_class():
    data = make_data(2600, classes=26)
    fed = partition.by_label(data, "y", 10, disjoint=True, seed=2)
    classes = [set(np.unique(c["y"]).tolist()) for c in fed.clients]
    assert sorted(len(c) for c in classes) == [2] * 4 + [3] * 6
    for i in range(10):
        for j in range(i + 1, 10):
            assert not classes[i] & classes[j]
    assert set().union(*classes) == set(range(26))
    fed = partition.by_label(data, "y", 5, 3, disjoint=True, seed=2)
    assert all(np.unique(c["y"]).size == 3 for c in fed.clients)


def test_by_label_errors():
    data = make_data(60, classes=6)
    with pytest.raises(ValueError, match="classes_per_client"):
        partition.by_label(data, "y", 3, 7)
    with pytest.raises(ValueError, match="classes_per_client"):
        partition.by_label(data, "y", 3, disjoint=True, classes_per_client=3)
    with pytest.raises(ValueError, match="num_clients"):
        partition.by_label(data, "y", 7, disjoint=True)
    with pytest.raises(ValueError, match="labels"):
        partition.by_label(data, "nope", 3, 2)
    with pytest.raises(ValueError, match="labels"):
        partition.by_label(data, np.zeros(5), 3, 2)
    with pytest.raises(ValueError, match="num_clients|classes_per_client"):
        partition.by_label(make_data(12, classes=6), "y", 12, 6)  # 2 examples per class, 12 holders


# --------------------------------------------------------------------------- Dirichlet


def label_skew(federation, classes):
    """Mean total-variation distance between client label histograms and the pooled one."""
    pooled = np.bincount(np.concatenate([c["y"] for c in federation.clients]), minlength=classes)
    pooled = pooled / pooled.sum()
    dists = []
    for client in federation.clients:
        h = np.bincount(client["y"], minlength=classes) / client["y"].size
        dists.append(0.5 * np.abs(h - pooled).sum())
    return float(np.mean(dists))


def test_dirichlet_covers_and_skew_depends_on_alpha():
    data = make_data(3000, classes=10)
    skewed = partition.dirichlet(data, "y", 10, 0.1, seed=0)
    mild = partition.dirichlet(data, "y", 10, 100.0, seed=0)
    for fed in (skewed, mild):
        check_disjoint(fed, 3000)
        assert fed.total_size == 3000
    assert label_skew(skewed, 10) > 0.4
    assert label_skew(mild, 10) < 0.1


def test_dirichlet_errors():
    data = make_data(30, classes=3)
    with pytest.raises(ValueError, match="alpha"):
        partition.dirichlet(data, "y", 3, 0.0)
    with pytest.raises(ValueError, match="alpha"):
        partition.dirichlet(data, "y", 25, 1e-3, max_tries=3, seed=0)
    with pytest.raises(ValueError, match="min_size"):
        partition.dirichlet(data, "y", 10, 1.0, min_size=4)


# --------------------------------------------------------------------------- Beta proportions


def test_beta_proportions_near_iid_and_non_iid():
    rng = np.random.default_rng(0)
    data = {"x": rng.standard_normal((20000, 2)).astype(np.float32), "y": (np.arange(20000) % 2)}
    iid_fed, iid_idx = partition.beta_proportions(
        data, "y", 30, 100, 100, seed=1, return_indices=True
    )
    non_fed, non_idx = partition.beta_proportions(
        data, "y", 30, 0.5, 0.5, seed=1, return_indices=True
    )
    for fed in (iid_fed, non_fed):
        assert fed.num_clients == 30
        assert len(set(fed.sizes.tolist())) == 1  # equal client sizes
        assert fed.sizes[0] >= 1
    iid_pi = np.array([data["y"][i].mean() for i in iid_idx])
    non_pi = np.array([data["y"][i].mean() for i in non_idx])
    assert np.all(np.abs(iid_pi - 0.5) < 0.15)
    assert np.std(non_pi) > 0.25  # Beta(0.5, 0.5) has sd 0.35
    assert np.mean((non_pi < 0.2) | (non_pi > 0.8)) > 0.3
    rows = np.concatenate(non_idx)
    assert rows.size == np.unique(rows).size


def test_beta_proportions_client_size_and_errors():
    data = {"x": np.zeros((1000, 1), np.float32), "y": np.arange(1000) % 2}
    fed, idx = partition.beta_proportions(data, "y", 4, 2, 2, client_size=100, seed=0,
                                          return_indices=True)
    assert fed.sizes.tolist() == [100] * 4
    with pytest.raises(ValueError, match="client_size"):
        partition.beta_proportions(data, "y", 10, 0.5, 0.5, client_size=500, seed=0)
    with pytest.raises(ValueError, match="binary"):
        partition.beta_proportions({"x": np.zeros(9), "y": np.arange(9) % 3}, "y", 2, 1, 1)
    with pytest.raises(ValueError, match="a must"):
        partition.beta_proportions(data, "y", 2, -1, 1)


# --------------------------------------------------------------------------- dominant label, by key


def test_dominant_label_counts():
    data = make_data(1000, classes=5)
    fed = partition.dominant_label(data, "y", major=100, minor=10, seed=0)
    assert fed.num_clients == 5
    for owner, client in enumerate(fed.clients):
        counts = np.bincount(client["y"], minlength=5)
        assert counts[owner] == 100
        assert all(counts[c] == 10 for c in range(5) if c != owner)
    check_disjoint(fed, 1000)
    with pytest.raises(ValueError, match="major"):
        partition.dominant_label(data, "y", major=190, minor=10)


def test_by_key_groups_rows():
    data = make_data(100)
    site = np.array(["b", "a", "c", "a"] * 25)
    fed = partition.by_key(data, site)
    assert fed.names == ["a", "b", "c"]
    assert fed.sizes.tolist() == [50, 25, 25]
    for name, rows in zip(fed.names, rows_of(fed)):
        assert np.all(site[rows] == name)
    fed = partition.by_key(data, site, order=["c", "a"])
    assert fed.names == ["c", "a"] and fed.total_size == 75
    with pytest.raises(ValueError, match="order"):
        partition.by_key(data, site, order=["a", "z"])
    with pytest.raises(ValueError, match="keys"):
        partition.by_key(data, site[:3])


# --------------------------------------------------------------------------- FSGLD 5.1 generator


def test_delayed_communication_data():
    fed, mus = partition.delayed_communication_data(0, return_means=True)
    assert fed is not None and fed.num_clients == 10
    assert fed.sizes.tolist() == [200] * 10
    assert fed[0].shape == (200, 2)
    assert np.all(np.abs(mus) <= 6.0)
    np.testing.assert_allclose(fed.weights, 0.1)
    for client, mu in zip(fed.clients, mus):
        assert np.linalg.norm(client.mean(axis=0) - mu) < 0.35  # sd of the mean ~0.1 per axis
    again = fedmcmc.models.delayed_communication_data(0)
    np.testing.assert_array_equal(again[3], fed[3])


def test_beta_proportions_positive_must_be_a_label():
    data = {"x": np.zeros((10, 1))}
    labels = np.array(["a", "b"] * 5)
    with pytest.raises(ValueError, match="positive"):
        partition.beta_proportions(data, labels, 2, 1, 1)
    fed = partition.beta_proportions(data, labels, 2, 1, 1, positive="a")
    assert fed.num_clients == 2
