"""``fedmcmc.sample``: the one entry point of every algorithm family."""

from __future__ import annotations

import numbers
from typing import Any, Optional, Union

from . import convergence as convergence_module
from . import run_length
from .algorithm import Algorithm, check_positive_int
from .federation import Federation
from .model import Model
from .results import Result

__all__ = ["sample"]

ENGINES = ("local", "ray", "flower")


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
    engine: str = "local",
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
        ``"local"`` (default; every client simulated in this process) or
        ``"ray"`` (client endpoints in Ray actors; ``fedmcmc.engines.ray_engine``).
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
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine == "flower" and engine not in algorithm.engines and \
            getattr(algorithm, "flower_refusal", None):
        from .engines.flower_engine import refuse_flower  # imports no Flower

        refuse_flower(type(algorithm).__name__, algorithm.flower_refusal)
    if engine not in algorithm.engines:
        raise ValueError(
            f"engine={engine!r} is not available for {type(algorithm).__name__}; "
            f"available: {algorithm.engines}"
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
    if federation.is_deferred and engine not in ("ray", "flower"):
        # Federation.from_loaders: the in-process engine simulates every client here, so the
        # loaders run here; on Ray each runs in its client's actor and the engine checks
        # init against the example shapes the clients report
        federation.load()
    arguments = dict(init=init, num_samples=num_samples, burn_in=burn_in, thin=thin,
                     chains=chains, seed=int(seed), engine=engine, progress=progress, **options)
    if federation.is_deferred:
        with federation.kept_on_clients():
            result = algorithm.sample(model, federation, **arguments)
    else:
        model.check_params(init, federation.example(), argument="init")
        result = algorithm.sample(model, federation, **arguments)
    for argument, value in (("thin", thin), ("burn_in", burn_in)):
        if not run_length.is_auto(value):
            result.info.setdefault(argument, value)
    convergence_module.check(result, thresholds)
    return result
