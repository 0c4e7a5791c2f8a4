"""``fedmcmc.sample``: the one entry point of every algorithm family."""

from __future__ import annotations

import numbers
from typing import Any, Optional

from .algorithm import Algorithm, check_nonnegative_int, check_positive_int
from .federation import Federation
from .model import Model
from .results import Result

__all__ = ["sample"]

ENGINES = ("local", "ray")


def sample(
    model: Model,
    federation: Federation,
    algorithm: Algorithm,
    init: Any,
    num_samples: int,
    burn_in: int = 0,
    thin: int = 1,
    chains: int = 1,
    seed: int = 0,
    engine: str = "local",
    progress: Optional[bool] = None,
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
        Draws discarded before them (same units as the kept draws).
    thin:
        Iterations between two draws (Langevin algorithms); PDMP algorithms
        take a draw every ``sample_interval`` units of process time instead.
    chains:
        Number of chains, run vmapped in one compiled program.
    seed:
        Integer seed of the run.
    engine:
        ``"local"`` (default; every client simulated in this process) or
        ``"ray"`` (client endpoints in Ray actors; ``fedmcmc.engines.ray_engine``).
    progress:
        Show a progress bar; ``None`` shows it when stderr is a terminal.
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
    burn_in = check_nonnegative_int(burn_in, "burn_in")
    thin = check_positive_int(thin, "thin")
    chains = check_positive_int(chains, "chains")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine not in algorithm.engines:
        raise ValueError(
            f"engine={engine!r} is not available for {type(algorithm).__name__}; "
            f"available: {algorithm.engines}"
        )
    if federation.is_deferred and engine != "ray":
        # Federation.from_loaders: the in-process engine simulates every client here, so the
        # loaders run here; on Ray each runs in its client's actor and the engine checks
        # init against the example shapes the clients report
        federation.load()
    if federation.is_deferred:
        with federation.kept_on_clients():
            return algorithm.sample(
                model, federation, init=init, num_samples=num_samples, burn_in=burn_in,
                thin=thin, chains=chains, seed=int(seed), engine=engine, progress=progress,
                **options,
            )
    model.check_params(init, federation.example(), argument="init")
    return algorithm.sample(
        model,
        federation,
        init=init,
        num_samples=num_samples,
        burn_in=burn_in,
        thin=thin,
        chains=chains,
        seed=int(seed),
        engine=engine,
        progress=progress,
        **options,
    )
