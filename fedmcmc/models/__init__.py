"""The model zoo (``fm.models``): builders returning :class:`fm.Model <fedmcmc.Model>`.

Every builder documents its parameter pytree and the layout of ONE example (a
row of a client's data pytree). Common ``model.attributes``:

``"init"``            ``key -> params``: a starting point (zeros, or a random
                      initialisation for the neural networks).
``"exact_posterior"`` ``data -> (mean, covariance)`` over the flat parameter
                      vector, where the posterior is known (Gaussian mean,
                      Bernoulli, linear regression); ``data`` is the pooled
                      pytree or an ``fm.Federation``.

``"predict"``/``"apply"``  predictions / logits for a batch of inputs.

PDMP bounds, in the convention of :mod:`fedmcmc.pdmp.bounds`: ``"hessian_bound"``
(``example -> (d, d)``, an elementwise bound on the Hessian of
-log p(example | theta); Gaussian mean, linear and logistic regression),
``"prior_hessian_bound"``, ``"curvature_bound"`` and ``"prior_curvature_bound"`` (Loewner
bounds ``0 <= Hessian <= B`` of a log-concave likelihood and prior: Gaussian mean, linear
and logistic regression; the Boomerang's whitened bound) and ``"quadratic_potential"``
(Gaussian mean, linear regression). ``ar1_student_t`` and ``lgcp`` are the PDMP family's models
(:mod:`fedmcmc.pdmp.models`, with their bounds) under zoo names.

Registry, for configuration files: :func:`get` ``(name, **kwargs)`` builds a
model by name, :func:`names` lists them, :func:`data_generator` gives a
synthetic data generator where one fits. Paper data generators are in
:mod:`fedmcmc.models.synthetic`; :func:`predictive_log_likelihood` reports
train/test log-likelihoods from draws.
"""

from __future__ import annotations

from typing import Callable, Dict, List

from ..model import Model
from . import synthetic
from .conjugate import (
    bernoulli,
    bernoulli_posterior,
    gaussian_mean,
    gaussian_mean_posterior,
    linear_regression,
    linear_regression_posterior,
)
from .evaluation import log_likelihood_matrix, predictive_log_likelihood
from .glm import logistic_regression, poisson_regression
from .metric_learning import metric_learning, metric_learning_pairs, top_eigenvectors
from .nn import lenet5, mlp_classifier
from .synthetic import delayed_communication_data, teacher_classification_clients, teacher_classification_data
from .pdmp_examples import ar1_data, ar1_student_t, lgcp, lgcp_data
from ..rng import numpy_generator
from ._common import as_matrix, as_vector

_REGISTRY: Dict[str, Callable[..., Model]] = {
    "gaussian_mean": gaussian_mean,
    "bernoulli": bernoulli,
    "linear_regression": linear_regression,
    "logistic_regression": logistic_regression,
    "poisson_regression": poisson_regression,
    "metric_learning": metric_learning,
    "mlp_classifier": mlp_classifier,
    "lenet5": lenet5,
    "ar1_student_t": ar1_student_t,
    "lgcp": lgcp,
}


def names() -> List[str]:
    """The registered model names, sorted."""
    return sorted(_REGISTRY)


def builder(name: str) -> Callable[..., Model]:
    """The builder function registered under ``name``."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"model name {name!r} is unknown; known models: {', '.join(names())}")
    return _REGISTRY[name]


def get(name: str, **kwargs) -> Model:
    """Build the model registered under ``name`` with keyword arguments ``kwargs``
    (those of its builder, e.g. ``get("logistic_regression", dim=6)``).

    Unknown names and wrong keyword arguments raise ``ValueError``.
    """
    build = builder(name)
    try:
        return build(**kwargs)
    except TypeError as error:
        raise ValueError(f"model {name!r}: bad arguments {sorted(kwargs)} ({error})") from error


def _gaussian_mean_data(model_params, num_examples=1000, mean=1.0, seed=0):
    import numpy as np

    dim = int(model_params.get("dim", 2))
    cov = as_matrix(model_params.get("noise_cov", 1.0), dim, "noise_cov")
    rng = numpy_generator(seed)
    x = rng.multivariate_normal(as_vector(mean, dim, "mean"), cov, size=int(num_examples))
    return x.astype(np.float32)


def _bernoulli_data(model_params, num_examples=100, p=0.3, seed=0):
    import numpy as np


    return (numpy_generator(seed).random(int(num_examples)) < float(p)).astype(np.float32)


def _regression_data(generator):
    def generate(model_params, num_examples=1000, seed=0, **kwargs):
        dim = int(model_params.get("dim", 3))
        if "noise_std" in model_params and generator is synthetic.linear_regression_data:
            kwargs.setdefault("noise_std", model_params["noise_std"])
        return generator(int(num_examples), dim, seed=seed, **kwargs)[0]

    return generate


_GENERATORS = {
    "gaussian_mean": _gaussian_mean_data,
    "bernoulli": _bernoulli_data,
    "linear_regression": _regression_data(synthetic.linear_regression_data),
    "logistic_regression": _regression_data(synthetic.logistic_regression_data),
    "poisson_regression": _regression_data(synthetic.poisson_regression_data),
}


def data_generator(name: str):
    """A synthetic data generator for the zoo model ``name``, or ``None`` if it has none:
    ``generate(model_params, num_examples=..., seed=..., **options) -> data pytree`` in the
    model's example layout (``model_params``: the builder's keyword arguments, e.g. ``dim``).

    gaussian_mean: rows N(mean, noise_cov) (``mean`` default 1); bernoulli: coin tosses
    with probability ``p``; linear / logistic / Poisson regression: the
    :mod:`fedmcmc.models.synthetic` generators (first column of x is 1, an intercept).
    """
    builder(name)  # unknown names raise ValueError
    return _GENERATORS.get(name)


def register(name: str, build: Callable[..., Model], *, overwrite: bool = False) -> None:
    """Add a builder to the registry (``overwrite=True`` to replace one)."""
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string")
    if not callable(build):
        raise ValueError("build must be callable: (**kwargs) -> fm.Model")
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"name {name!r} is already registered (pass overwrite=True)")
    _REGISTRY[name] = build


__all__ = [
    "get",
    "names",
    "builder",
    "register",
    "data_generator",
    "gaussian_mean",
    "gaussian_mean_posterior",
    "bernoulli",
    "bernoulli_posterior",
    "linear_regression",
    "linear_regression_posterior",
    "logistic_regression",
    "poisson_regression",
    "metric_learning",
    "metric_learning_pairs",
    "top_eigenvectors",
    "mlp_classifier",
    "lenet5",
    "ar1_student_t",
    "ar1_data",
    "lgcp",
    "lgcp_data",
    "predictive_log_likelihood",
    "log_likelihood_matrix",
    "delayed_communication_data",
    "teacher_classification_data",
    "teacher_classification_clients",
    "synthetic",
]
