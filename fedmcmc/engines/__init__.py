"""Engines: where an algorithm's clients live and how the driver reaches them.

``engine.py`` holds the engine objects ``fm.sample`` runs an algorithm on (``LocalEngine``:
one compiled JAX program, :func:`run_chains`; the message-passing engines, ``InProcessEngine``
and ``ray_engine.RayEngine``); ``session.py`` the one protocol session every message-passing
pattern runs in (hand-off ``handoff.py``, broadcast ``broadcast.py``, neighbour
``neighbour.py``); ``driver.py`` the one run driver."""

from .local import run_chains

__all__ = ["run_chains"]
