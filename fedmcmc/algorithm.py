"""The base of the public algorithm classes and the shared argument checks."""

from __future__ import annotations

import numbers
from typing import Any, Optional

__all__ = ["Algorithm", "check_positive_int", "check_positive_float", "check_nonnegative_int"]


def check_optional(check, value: Any, argument: str):
    """``None`` where an argument is optional and not given, else ``check(value, argument)``."""
    return None if value is None else check(value, argument)


def check_positive_int(value: Any, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{argument} must be a positive integer, got {value!r}")
    return int(value)


def check_nonnegative_int(value: Any, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{argument} must be a non-negative integer, got {value!r}")
    return int(value)


def check_positive_float(value: Any, argument: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{argument} must be a positive number, got {value!r}") from None
    if not (number > 0 and number < float("inf")):
        raise ValueError(f"{argument} must be a positive finite number, got {value!r}")
    return number


def check_nonnegative_float(value: Any, argument: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{argument} must be a non-negative number, got {value!r}") from None
    if not (number >= 0 and number < float("inf")):
        raise ValueError(f"{argument} must be a non-negative finite number, got {value!r}")
    return number


class Algorithm:
    """A sampling algorithm: hyper-parameters in the constructor, and what each kind of
    engine runs (:mod:`fedmcmc.engines.engine`; :func:`fedmcmc.sample` picks the engine and
    calls it after the arguments common to all algorithms have been checked):

    * :meth:`sample_local`: the in-process run (``engine="local"``);
    * :meth:`sample_distributed`: the message-passing run (client endpoints and a server
      on the transport a message-passing engine supplies, ``engine="ray"``), offered when
      ``message_passing`` is true.

    Neither is told the engine's name.
    """

    name: str = "algorithm"
    #: whether the algorithm offers :meth:`sample_distributed`
    message_passing: bool = False
    #: the communication pattern of :meth:`sample_distributed`, a key of
    #: :data:`fedmcmc.engines.engine.PATTERNS` (``"handoff"``, ``"broadcast"``,
    #: ``"event_rounds"``, ``"neighbour_exchange"``): an engine that does not carry it refuses
    #: the algorithm before anything starts. ``None``: undeclared (every engine runs it)
    message_pattern: Optional[str] = None

    def sample_local(self, model, federation, *, init, num_samples, burn_in, thin, chains,
                     seed, progress, **options):  # pragma: no cover - interface
        """Every client simulated in this process; returns a :class:`fedmcmc.Result`."""
        raise NotImplementedError

    def sample_distributed(self, model, federation, engine, *, init, num_samples, burn_in,
                           thin, chains, seed, progress,
                           **options):  # pragma: no cover - interface
        """The clients as endpoints on ``engine``'s transport
        (:class:`fedmcmc.engines.engine.ProtocolEngine`: ``engine.transports()``,
        ``engine.session_options(options, name)``, ``engine.label`` for ``info`` and
        messages); returns a :class:`fedmcmc.Result`."""
        raise NotImplementedError

    def hyperparameters(self) -> dict:
        """The constructor arguments, for reports and configs."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.hyperparameters().items())
        return f"{type(self).__name__}({args})"
