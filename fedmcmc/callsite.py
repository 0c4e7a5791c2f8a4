"""Where a warning should point: the user's line, not fedmcmc's.

A warning raised deep inside ``fm.sample`` (a surrogate fit, a step-size check, a network
bias estimate) with a fixed ``stacklevel`` points at whichever fedmcmc frame happens to be
that many levels up, and any refactoring moves it. :func:`user_stacklevel` counts instead:
the ``stacklevel`` that makes ``warnings.warn`` report the frame that called into fedmcmc
(the user's script, notebook cell or test), so ``-W error`` filters by module and the
printed location are the user's.
"""

from __future__ import annotations

import os
import sys

__all__ = ["user_stacklevel"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_stacklevel() -> int:
    """``stacklevel`` for a ``warnings.warn`` in the calling function: the frame just outside
    the outermost fedmcmc frame of the current stack (frames of other libraries in between,
    such as JAX's tracing, are passed over)."""
    frame = sys._getframe(1)  # the function that warns: stacklevel 1
    level, outermost = 1, 1
    while frame is not None:
        if os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
            outermost = level
        frame = frame.f_back
        level += 1
    return outermost + 1
