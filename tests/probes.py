"""Fresh-process probes: what a piece of code imports when it runs in a new Python process
(the tests of start-up time check that a run does not load a library it does not need)."""

from __future__ import annotations

import subprocess
import sys
from typing import Iterable, List


def modules_loaded_by(code: str, modules: Iterable[str], timeout: float = 300.0) -> List[str]:
    """Run ``code`` in a new Python process and return those of ``modules`` that are in its
    ``sys.modules`` at the end (the process must succeed)."""
    modules = list(modules)
    probe = (f"{code}\nimport sys as _probe_sys\n"
             f"print('modules:', *[m for m in {modules!r} if m in _probe_sys.modules])")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=timeout)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip().splitlines()[-1].split()[1:]
