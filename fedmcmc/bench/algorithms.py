"""The algorithms ``fedmcmc bench`` runs, and the ONE rule that sets each one's hyper-parameters.

Fairness: no algorithm is tuned per problem. Each entry below turns what a user
knows before sampling into settings, with the same rule on every problem:

* the Laplace approximation of the posterior (:func:`fedmcmc.bench.problems.laplace`,
  a federated Newton iteration: largest and smallest curvature ``lam_max``,
  ``lam_min``, largest posterior sd ``sd_max``),
* the number of rows ``N``, of clients ``S`` and their sizes,
* the run's budget (chains, kept draws, burn-in draws: the same for every algorithm).

Where an algorithm takes ``"auto"`` for a hyper-parameter (the library chooses it
from what the clients report), the benchmark passes ``"auto"`` and the rule below
is used only when the installed version refuses ``"auto"`` (a ``ValueError`` or
``TypeError`` from the constructor). The leaderboard's ``settings`` column says which.

Rules (step sizes in the papers' Langevin convention, ``theta + (h/2) grad + N(0, h)``):

``h`` (Langevin family: SGLD, DSGLD, FSGLD, FA-LD, QLSD)
    ``h = min(0.1 / lam_max, 2 b_eff / (N lam_max))``: a discretisation step of a
    tenth of the stiffest direction's scale, and minibatch gradient noise at most half
    the injected noise in that direction (the ratio ``h N lam_max / (4 b_eff)`` when each
    row carries ``lam_max / N`` of the curvature). ``b_eff`` is the number of rows one
    update's gradient estimate reads: ``min(32, N)`` for SGLD, ``sum_s f_s min(32, n_s)``
    for DSGLD/FSGLD (one client per update), ``sum_s min(32, n_s)`` for FA-LD/QLSD (every
    client per update). Batch size 32 everywhere (an upper bound: smaller clients use
    all their rows); 10 local steps per visit/round (DSGLD, FSGLD, FA-LD).
``thin`` (every iterative sampler)
    The library's own run lengths, ``thin="auto"`` and ``burn_in="auto"``
    (:mod:`fedmcmc.run_length`: one predicted relaxation time per draw), where the
    algorithm offers them (``supports_run_request``; PDMPs: ``sample_interval="auto"``);
    otherwise ``ceil(2 / (h lam_min))`` iterations per kept draw: one relaxation time of
    the slowest direction of the Langevin diffusion, and the budget's burn-in.
DULA / GT-DULA
    Full-batch local gradients, the default ring graph, ``alpha = 0.05 / lam_max``
    (the network average is a Langevin chain with ``h = 2 alpha``, so ``h lam_max = 0.1``
    as above), ``beta`` half its bound ``min(1, S / lambda_n, 2 / lambda_n)`` (Condition 1
    and a stable mixing step) and ``gamma`` half of ``min(beta, 1 / lambda_2)``
    (Condition 1), from the graph Laplacian's eigenvalues.
Fed Zig-Zag / Fed BPS
    ``sample_interval = sd_max`` (the time a unit-speed process needs to cross one
    posterior sd); Zig-Zag keeps its default ``refresh_rate = 0``, BPS refreshes at
    ``1 / sd_max`` (once per such crossing; its default 1.0 ignores the posterior's scale).
Fed Boomerang
    Its defaults (Laplace reference, ``refresh_rate = 0.1``) and ``sample_interval =
    pi / 2``: its dynamics rotate around the reference in whitened time (period 2 pi),
    whatever the posterior's scale.
Consensus Monte Carlo
    Its defaults (NUTS on every subposterior), ``thin = 1``, and a NUTS warm-up of
    ``max(200, burn_in)`` transitions per client (the class's default when ``burn_in x
    thin`` is 0): with ``thin = 1`` the budget's burn-in alone would give NUTS 25 transitions
    to adapt at the quick size, which left chains stuck.

The variants (VR-FA-LD*, QLSD++) take the rule of their base algorithm.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .problems import Laplace, ProblemInstance
from ..decentralised import graphs

__all__ = ["Budget", "Entry", "Plan", "ALGORITHMS", "names", "lookup_class", "plan"]

BATCH_SIZE = 32
LOCAL_STEPS = 10


@dataclasses.dataclass(frozen=True)
class Budget:
    """What every algorithm gets on a problem: chains, kept draws and burn-in draws, and
    ``seconds`` of wall time (``None``: no limit). A run still going after ``seconds`` stops
    at the end of its current chunk of draws (the engines' chunks are cut to about 1/250 of
    the run for this), or, when one chunk runs on (or the algorithm's ``fm.sample`` takes no
    run options, as the baselines'), its worker process is stopped ``grace_seconds`` later
    (default: a quarter of ``seconds``, at least :data:`fedmcmc.bench.workers.MIN_GRACE`;
    :mod:`fedmcmc.bench.workers`); either way its verdict says it lost on time."""

    chains: int
    num_samples: int
    burn_in: int
    seconds: Optional[float] = None
    grace_seconds: Optional[float] = None
    #: the library's run lengths (thin/burn_in "auto") where an algorithm offers them
    auto_run_length: bool = True

    def __post_init__(self):
        for name in ("seconds", "grace_seconds"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not value >= 0):
                raise ValueError(f"{name} must be a non-negative number of seconds or None, "
                                 f"got {value!r}")


@dataclasses.dataclass
class Plan:
    """One algorithm's run on one problem: the instance, ``fm.sample`` keywords, and how
    its settings were chosen (for the leaderboard)."""

    algorithm: Any
    sample_kwargs: Dict[str, Any]
    settings: str  # human-readable: "step_size=auto, batch_size=32, ..." or the rule's values
    uses_auto: bool


@dataclasses.dataclass(frozen=True)
class Entry:
    """A leaderboard algorithm: ``class_name`` in ``fedmcmc`` (or ``fedmcmc.baselines``),
    and ``make(cls, context) -> Plan`` applying its rule."""

    name: str
    family: str
    class_name: str
    make: Callable[[Any, "Context"], Plan]


@dataclasses.dataclass(frozen=True)
class Context:
    """Everything a rule may read: the problem's sizes, its Laplace fit and the budget."""

    instance: ProblemInstance
    laplace: Laplace
    budget: Budget

    @property
    def sizes(self) -> np.ndarray:
        return np.asarray(self.instance.federation.sizes, dtype=np.int64)

    @property
    def weights(self) -> np.ndarray:
        return np.asarray(self.instance.federation.weights, dtype=np.float64)

    @property
    def num_rows(self) -> int:
        return int(self.sizes.sum())

    def langevin_h(self, rows_per_update: float) -> float:
        lam, n = self.laplace.eig_max, self.num_rows
        return float(min(0.1 / lam, 2.0 * rows_per_update / (n * lam)))

    def thin(self, h: float) -> int:
        return max(1, int(math.ceil(2.0 / (h * self.laplace.eig_min))))

    def run(self, thin: int, algorithm: Any = None) -> Dict[str, Any]:
        """``fm.sample``'s run-length keywords: the library's own (``thin="auto"``,
        ``burn_in="auto"``) where ``algorithm`` offers them, else the rule's ``thin`` and the
        budget's burn-in."""
        if getattr(algorithm, "supports_run_request", False) and self.budget.auto_run_length:
            return dict(chains=self.budget.chains, num_samples=self.budget.num_samples,
                        burn_in="auto", thin="auto")
        return dict(chains=self.budget.chains, num_samples=self.budget.num_samples,
                    burn_in=self.budget.burn_in, thin=int(thin))


def _fmt(value: float) -> str:
    return f"{value:.3g}"


def _with_auto(cls, auto_kwargs: Dict[str, Any], rule_kwargs: Dict[str, Any],
               common: Dict[str, Any]) -> Tuple[Any, bool]:
    """``cls(**auto_kwargs, **common)`` if this version accepts ``"auto"``, else the rule's."""
    if auto_kwargs:
        try:
            return cls(**auto_kwargs, **common), True
        except (ValueError, TypeError):
            pass
    return cls(**rule_kwargs, **common), False


def _describe(kwargs: Dict[str, Any]) -> str:
    return ", ".join(f"{k}={_fmt(v) if isinstance(v, float) else v}" for k, v in kwargs.items())


# ----------------------------------------------------------- Langevin family


def _langevin(rows: Callable[["Context"], float], extra: Dict[str, Any], local_steps: bool):
    def make(cls, ctx: Context) -> Plan:
        h = ctx.langevin_h(rows(ctx))
        common = {"batch_size": BATCH_SIZE, **extra}
        if local_steps:
            common["local_steps"] = LOCAL_STEPS
        algorithm, auto = _with_auto(cls, {"step_size": "auto"}, {"step_size": h}, common)
        run = ctx.run(ctx.thin(h), algorithm)
        step = "step_size=auto" if auto else f"step_size={_fmt(h)} (rule)"
        settings = f"{step}, {_describe(common)}, thin={run['thin']}"
        return Plan(algorithm, run, settings, auto)

    return make


def _rows_sgld(ctx: Context) -> float:
    return float(min(BATCH_SIZE, ctx.num_rows))


def _rows_one_client(ctx: Context) -> float:
    return float(np.sum(ctx.weights * np.minimum(BATCH_SIZE, ctx.sizes)))


def _rows_every_client(ctx: Context) -> float:
    return float(np.sum(np.minimum(BATCH_SIZE, ctx.sizes)))


# ------------------------------------------------------- decentralised family


def _graph_eigenvalues(num_agents: int) -> Tuple[float, float]:
    """(lambda_2, lambda_n) of the default ring's Laplacian."""
    topo = graphs.topology("ring", num_agents, {})
    return float(topo.lambda_2), float(topo.lambda_n)


def _decentralised(tracking: bool):
    def make(cls, ctx: Context) -> Plan:
        n = len(ctx.sizes)
        lam2, lamn = _graph_eigenvalues(n)
        alpha = 0.05 / ctx.laplace.eig_max
        beta = 0.5 * min(1.0, n / lamn, 2.0 / lamn)
        rule = {"step_size": alpha, "beta": beta}
        auto = {"step_size": "auto", "beta": "auto"}
        if tracking:
            rule["gamma"] = 0.5 * min(beta, 1.0 / lam2)
            auto["gamma"] = "auto"
        algorithm, used_auto = _with_auto(cls, auto, rule, {})
        run = ctx.run(ctx.thin(2.0 * alpha), algorithm)
        values = auto if used_auto else rule
        settings = (f"{_describe(values)}{'' if used_auto else ' (rule)'}, graph=ring, "
                    f"full batch, thin={run['thin']}")
        return Plan(algorithm, run, settings, used_auto)

    return make


# --------------------------------------------------------------- PDMP family


def _pdmp(kind: str):
    def make(cls, ctx: Context) -> Plan:
        sd = ctx.laplace.sd_max
        if kind == "zigzag":
            kwargs = {"sample_interval": sd}
        elif kind == "bps":
            kwargs = {"sample_interval": sd, "refresh_rate": 1.0 / sd}
        else:  # boomerang
            kwargs = {"sample_interval": math.pi / 2}
        wanted = {**kwargs, "sample_interval": "auto"} if ctx.budget.auto_run_length else {}
        algorithm, auto = _with_auto(cls, wanted, kwargs, {})
        run = ctx.run(1, algorithm)
        run["thin"] = 1  # PDMPs: a draw every sample_interval
        shown = {**kwargs, "sample_interval": "auto"} if auto else kwargs
        return Plan(algorithm, run, f"{_describe(shown)}{'' if auto else ' (rule)'}", auto)

    return make


def _consensus(cls, ctx: Context) -> Plan:
    # NUTS needs a few hundred transitions to adapt whatever the budget: a warm-up of
    # burn_in x thin = 25 transitions (the quick size) left chains stuck (sd ratio 0 on Exam)
    warmup = max(cls.default_warmup, ctx.budget.burn_in)
    return Plan(cls(num_warmup=warmup), ctx.run(1), f"num_warmup={warmup}", False)


ALGORITHMS: Dict[str, Entry] = {
    e.name: e
    for e in [
        Entry("SGLD", "centralised Langevin", "SGLD", _langevin(_rows_sgld, {}, False)),
        Entry("DSGLD", "federated Langevin", "DSGLD", _langevin(_rows_one_client, {}, True)),
        Entry("FSGLD", "federated Langevin", "FSGLD", _langevin(_rows_one_client, {}, True)),
        Entry("FALD", "federated Langevin", "FALD", _langevin(_rows_every_client, {}, True)),
        Entry("VR-FALD*", "federated Langevin", "FALD",
              _langevin(_rows_every_client, {"variance_reduction": True}, True)),
        Entry("QLSD", "federated Langevin", "QLSD", _langevin(_rows_every_client, {}, False)),
        Entry("QLSD++", "federated Langevin", "QLSD",
              _langevin(_rows_every_client, {"variance_reduction": True}, False)),
        Entry("DULA", "decentralised Langevin", "DULA", _decentralised(False)),
        Entry("GTDULA", "decentralised Langevin", "GTDULA", _decentralised(True)),
        Entry("FedZigZag", "federated PDMP", "FedZigZag", _pdmp("zigzag")),
        Entry("FedBPS", "federated PDMP", "FedBPS", _pdmp("bps")),
        Entry("FedBoomerang", "federated PDMP", "FedBoomerang", _pdmp("boomerang")),
        Entry("ConsensusMC", "one-shot combination", "ConsensusMC", _consensus),
    ]
}


def names() -> List[str]:
    return list(ALGORITHMS)


def lookup_class(class_name: str) -> Tuple[Optional[type], str]:
    """The algorithm class from ``fedmcmc`` or ``fedmcmc.baselines``, or ``(None, why)``.

    Looked up at run time, so algorithms that land later are picked up without a change here.
    """
    import fedmcmc

    cls = getattr(fedmcmc, class_name, None)
    if cls is not None:
        return cls, ""
    try:
        module = importlib.import_module("fedmcmc.baselines")
    except Exception as error:  # noqa: BLE001 - any import failure means "not available"
        return None, f"fm.{class_name} not in this version (fedmcmc.baselines: {type(error).__name__}: {error})"
    cls = getattr(module, class_name, None)
    if cls is None:
        return None, f"fm.{class_name} not in this version"
    return cls, ""


def plan(entry: Entry, ctx: Context) -> Tuple[Optional[Plan], str]:
    """``(Plan, "")``, or ``(None, reason)`` when the algorithm is not available."""
    cls, why = lookup_class(entry.class_name)
    if cls is None:
        return None, why
    return entry.make(cls, ctx), ""
