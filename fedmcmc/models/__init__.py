"""The model zoo (``fm.models``): builders returning :class:`fm.Model <fedmcmc.Model>`.

Every builder documents its parameter pytree and the layout of ONE example (a
row of a client's data pytree). Common ``model.attributes``:

``"init"``            ``key -> params``: a starting point (zeros, or a random
                      initialisation for the neural networks).
``"exact_posterior"`` ``data -> (mean, covariance)`` over the flat parameter
                      vector, where the posterior is known (Gaussian mean,
                      Bernoulli, linear regression); ``data`` is the pooled
                      pytree or an ``fm.Federation``.
``"hessian_bound"``   ``data -> Q`` with elementwise ``|Hessian of the log
                      likelihood sum| <= Q`` everywhere (logistic regression,
                      AR(1) Student-t), for PDMP Poisson thinning.
``"predict"``/``"apply"``  predictions / logits for a batch of inputs.

Registry, for configuration files: :func:`get` ``(name, **kwargs)`` builds a
model by name, :func:`names` lists them. Paper data generators are in
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
from .cox import grid_adjacency, lgcp
from .evaluation import log_likelihood_matrix, predictive_log_likelihood
from .glm import logistic_regression, poisson_regression
from .metric_learning import metric_learning, metric_learning_pairs, top_eigenvectors
from .nn import lenet5, mlp_classifier
from .synthetic import delayed_communication_data
from .timeseries import ar1_student_t, student_t_bounds

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
    "student_t_bounds",
    "lgcp",
    "grid_adjacency",
    "predictive_log_likelihood",
    "log_likelihood_matrix",
    "delayed_communication_data",
    "synthetic",
]
