"""``fedmcmc.sample``: the one entry point of every algorithm family."""

from __future__ import annotations

import numbers
from typing import Any, Optional, Union

from . import convergence as convergence_module
from . import run_length
from .algorithm import Algorithm, check_positive_int
from .engines.engine import Engine, LocalEngine
from .engines.flower_engine import FlowerEngine
from .engines.options import ENGINE_OPTIONS, FLOWER_ONLY_OPTIONS, RAY_ONLY_OPTIONS
from .engines.ray_engine import RayEngine
from .federation import Federation
from .model import Model
from .results import Result

__all__ = ["sample", "resolve_engine"]

#: the engines ``engine=`` names by a string (shorthands for the engine objects)
ENGINES = ("local", "ray", "flower")

#: the options of the other engines that each shorthand refuses (``FlowerEngine.from_options``
#: refuses Ray's itself)
_FOREIGN_OPTIONS = {"local": (("Ray", RAY_ONLY_OPTIONS), ("Flower", FLOWER_ONLY_OPTIONS)),
                    "ray": (("Flower", FLOWER_ONLY_OPTIONS),)}


def resolve_engine(engine: Any, options: dict) -> Engine:
    """The engine object of ``fm.sample(..., engine=engine, **options)``: ``engine`` itself
    when it is a :class:`~fedmcmc.engines.engine.Engine`; for ``"ray"`` (``"flower"``), a
    :class:`~fedmcmc.engines.ray_engine.RayEngine`
    (:class:`~fedmcmc.engines.flower_engine.FlowerEngine`) built from the engine options among
    ``options`` (removed from it: what stays are the algorithm's); for ``"local"``,
    :class:`~fedmcmc.engines.engine.LocalEngine` (``options`` untouched: the algorithm
    refuses what it does not take). ``ValueError`` naming ``engine`` otherwise."""
    if isinstance(engine, Engine):
        given = sorted(set(options) & set(ENGINE_OPTIONS))
        if given:
            argument = engine.renamed_options.get(given[0], given[0])
            raise ValueError(
                f"{given[0]} is an engine option: with engine={engine!r} set it on the "
                f"engine object ({type(engine).__name__}({argument}=...)), not in fm.sample")
        return engine
    for label, only in _FOREIGN_OPTIONS.get(engine if isinstance(engine, str) else "", ()):
        given = [k for k in only if options.get(k) not in (None, False, 0)]
        if given:
            raise ValueError(f"{given[0]} is a {label} option; engine={engine!r} takes none")
    if isinstance(engine, str) and engine == "local":
        return LocalEngine()
    if isinstance(engine, str) and engine == "ray":
        return RayEngine.from_options({k: options.pop(k) for k in ENGINE_OPTIONS
                                       if k in options and k not in FLOWER_ONLY_OPTIONS})
    if isinstance(engine, str) and engine == "flower":
        return FlowerEngine.from_options({k: options.pop(k) for k in ENGINE_OPTIONS
                                          if k in options})
    raise ValueError(
        f"engine must be one of {ENGINES} or an engine object such as fm.RayEngine(...), "
        f"got {engine!r}")


def sample(
    model: Model,
    federation: Federation,
    algorithm: Algorithm,
    init: Any,
    num_samples: int,
    burn_in: Union[int, str] = 0,
    thin: Union[int, str] = 1,
    chains: int = 1,
    seed: int = 0,
    engine: Union[str, Engine] = "local",
    progress: Optional[bool] = None,
    *,
    max_iterations: Optional[int] = None,
    convergence: Any = None,
    **options: Any,
) -> Result:
    """Draw from the global posterior p(theta | all clients' data).

    Parameters
    ----------
    model:
        A :class:`fedmcmc.Model`.
    federation:
        A :class:`fedmcmc.Federation`, one data pytree per client, or
        :meth:`fedmcmc.Federation.from_loaders` (data that stay on the clients: with
        ``engine="ray"`` every loader runs in its client's process, never here).
    algorithm:
        An algorithm instance, e.g. ``fm.FSGLD(step_size=1e-4, batch_size=10, local_steps=50)``.
    init:
        Initial parameter pytree, shared by all chains.
    num_samples:
        Draws kept per chain.
    burn_in:
        Draws discarded before them (same units as the kept draws), or ``"auto"``: enough
        relaxation times, as the set-up predicts them, to forget ``init``
        (:mod:`fedmcmc.run_length`); the value used is ``result.info["burn_in"]``.
    thin:
        Iterations between two draws (Langevin and decentralised algorithms, baselines), or
        ``"auto"``: one predicted relaxation time of the slowest direction per draw
        (``result.info["thin"]``). PDMP algorithms take a draw every ``sample_interval``
        units of process time instead (their ``sample_interval="auto"``).
    chains:
        Number of chains, run vmapped in one compiled program.
    seed:
        Integer seed of the run.
    engine:
        Where the clients live: ``"local"`` or ``fm.LocalEngine()`` (default; every client
        simulated in this process), ``"ray"`` or ``fm.RayEngine(...)`` (client endpoints
        in Ray actors; :class:`fedmcmc.engines.ray_engine.RayEngine` lists its options),
        ``"flower"`` or ``fm.FlowerEngine(...)`` (client endpoints on Flower SuperNodes, one
        per site, for sites of different organisations; the hand-off and broadcast
        algorithms only). With ``"ray"`` (``"flower"``) the engine's keyword options
        (``ray_address``, ``visit_timeout``, ``clients_per_actor``, ...; ``flower_address``,
        ``flower_root_certificates``, ...) may be given among ``**options``.
    progress:
        Show a progress bar; ``None`` shows it when stderr is a terminal.
    max_iterations:
        The most iterations per chain an ``"auto"`` setting may plan (default
        ``fedmcmc.run_length.DEFAULT_MAX_ITERATIONS``, one million): ``thin="auto"`` stays
        within it, and an ``"auto"`` step size too slow for the run is raised (within a
        predicted variance inflation of 25 %, with a ``RunLengthWarning``).
    convergence:
        The convergence check every run makes (:mod:`fedmcmc.convergence`): ``None``
        (default thresholds: R-hat 1.01, bulk ESS 100), ``False`` (figures without a
        warning), a dict or ``fm.ConvergenceCheck(max_r_hat=..., min_ess_bulk=...)``.
        ``result.info["diagnostics"]`` holds per-parameter ``r_hat``, ``ess_bulk`` and
        ``ess_tail``.
    **options:
        Algorithm-specific run options (see the algorithm's ``sample``).

    Returns
    -------
    Result
        ``samples`` (pytree of ``(chains, num_samples, ...)`` leaves), ``info``
        and ``to_arviz()``.

    Raises
    ------
    ValueError
        When an argument is invalid; the message names it.
    SamplingDivergedError
        When a chain becomes non-finite; its ``result`` keeps the draws made so far.

    Warns
    -----
    ConvergenceWarning
        When an R-hat is above or a bulk ESS below the thresholds of ``convergence``; the
        message names the worst parameters and what to change.
    """
    if not isinstance(model, Model):
        raise ValueError(f"model must be a fedmcmc.Model, got {type(model).__name__}")
    if not isinstance(federation, Federation):
        raise ValueError(f"federation must be a fedmcmc.Federation, got {type(federation).__name__}")
    if not isinstance(algorithm, Algorithm):
        raise ValueError(
            f"algorithm must be a fedmcmc algorithm such as fm.FSGLD(...), got {algorithm!r}"
        )
    num_samples = check_positive_int(num_samples, "num_samples")
    burn_in = run_length.check_run_length(burn_in, "burn_in", 0)
    thin = run_length.check_run_length(thin, "thin", 1)
    chains = check_positive_int(chains, "chains")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    engine = resolve_engine(engine, options)
    refusal = engine.refusal(algorithm)  # a message pattern the engine does not carry
    if refusal is not None:
        raise refusal
    if not engine.offered_by(algorithm):
        available = tuple(name for name, offered in (("local", LocalEngine()),
                                                     ("ray", RayEngine()),
                                                     ("flower", FlowerEngine()))
                          if offered.offered_by(algorithm))
        raise ValueError(
            f"engine={engine.label!r} is not available for {type(algorithm).__name__}; "
            f"available: {available}"
        )
    thresholds = convergence_module.ConvergenceCheck.of(convergence)
    if max_iterations is not None:
        max_iterations = check_positive_int(max_iterations, "max_iterations")
    if getattr(algorithm, "supports_run_request", False):
        # the family resolves "auto" run lengths (and budgets its "auto" step sizes) after
        # its set-up, from the relaxation time it predicts
        options["run_request"] = run_length.RunRequest(
            num_samples=num_samples, burn_in=burn_in, thin=thin, chains=chains,
            max_iterations=max_iterations or run_length.DEFAULT_MAX_ITERATIONS,
            min_ess=thresholds.min_ess_bulk)
    else:
        for argument, value in (("thin", thin), ("burn_in", burn_in)):
            if run_length.is_auto(value):
                raise ValueError(
                    f"{argument}='auto' is not offered by {type(algorithm).__name__} (it "
                    f"predicts no relaxation time); give {argument} as an integer")
        if max_iterations is not None:
            raise ValueError(
                f"max_iterations bounds 'auto' settings, which {type(algorithm).__name__} "
                "does not offer; leave it out")
    if federation.is_deferred and not engine.loads_on_clients:
        # Federation.from_loaders: the in-process engine simulates every client here, so the
        # loaders run here; on Ray each runs in its client's actor and the engine checks
        # init against the example shapes the clients report
        federation.load()
    arguments = dict(init=init, num_samples=num_samples, burn_in=burn_in, thin=thin,
                     chains=chains, seed=int(seed), progress=progress, **options)
    if federation.is_deferred:
        with federation.kept_on_clients():
            result = engine.sample(algorithm, model, federation, **arguments)
    else:
        model.check_params(init, federation.example(), argument="init")
        result = engine.sample(algorithm, model, federation, **arguments)
    for argument, value in (("thin", thin), ("burn_in", burn_in)):
        if not run_length.is_auto(value):
            result.info.setdefault(argument, value)
    convergence_module.check(result, thresholds)
    return result
