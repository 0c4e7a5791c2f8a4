"""The progress bar every engine shows on long runs (rich), one implementation."""

from __future__ import annotations

import sys
from typing import Optional

__all__ = ["progress_bar"]


def progress_bar(enabled: Optional[bool], label: str, total: int):
    """A started ``rich`` progress bar and its task for ``total`` units, or ``None`` when
    ``enabled`` is false (``None``: shown when stderr is a terminal). The caller advances it
    with ``bar[0].update(bar[1], ...)`` and stops it with ``bar[0].stop()``; the task's
    ``rate`` field starts as "compiling" (the first chunk also compiles the program)."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return None
    from rich.progress import (  # rich is imported only when a bar is shown
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        transient=False,
    )
    progress.start()
    task = progress.add_task(label, total=total, rate="compiling")
    return progress, task
