"""The benchmark's rows, run in worker processes.

Two things need a row outside the process that schedules it:

* **the time budget.** A run is asked to stop at the end of each compiled chunk once its
  budget is spent, but one chunk can take minutes (one draw of Fed Boomerang under client
  drift took 115-175 s on the development machine before its workers' searches stopped at
  the earliest proposal; a slow model or a large ``sample_interval`` can still do it). A row
  whose worker is still busy ``grace`` seconds after its budget is stopped by ending the
  worker's process; its verdict says it lost on time, and a fresh worker takes the next row.
* **several rows at once.** Most of a small row is XLA compilation, which runs on one core:
  ``jobs=2`` on 2 cores nearly halves the wall time of ``fedmcmc bench --quick``. Rows then
  share the machine, so their wall times (and ESS per second) include that contention; the
  leaderboard's README says how many ran at a time.

Workers are started with ``spawn`` (a fresh interpreter: JAX is not fork-safe), build each
problem themselves (a problem's model holds functions, which do not pickle) and receive the
parts the scheduler computed once: the reference posterior and the Laplace fit.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

__all__ = ["Task", "run_rows"]

#: seconds a row may run past its budget before its worker is stopped (at least)
MIN_GRACE = 10.0

#: (index, problem name, algorithm name, budget, seed, reference, reference ESS, Laplace fit)
Task = Tuple[int, str, str, Any, int, Any, float, Any]


def _worker(tasks, results) -> None:  # pragma: no cover - runs in a child process
    """A worker's loop: take a task, run the row, send it back; ``None`` ends the loop."""
    import warnings

    from . import algorithms as algorithms_module
    from . import problems as problems_module
    from .row import run_one

    warnings.simplefilter("ignore", FutureWarning)  # ArviZ's import-time notice
    instances: Dict[str, Any] = {}
    while True:
        task = tasks.get()
        if task is None:
            return
        index, problem_name, algorithm_name, budget, seed, reference, reference_ess, laplace = task
        try:
            if problem_name not in instances:
                instances[problem_name] = problems_module.get(problem_name).build()
            ctx = algorithms_module.Context(instances[problem_name], laplace, budget)
            entry = algorithms_module.ALGORITHMS[algorithm_name]
            row = run_one(entry, ctx, reference, reference_ess, seed,
                          on_start=lambda settings: results.put(("started", index, settings)))
        except Exception as error:  # noqa: BLE001 - a row, not a dead worker
            row = {"problem": problem_name, "algorithm": algorithm_name, "seed": seed,
                   "verdict": f"FAILED: {type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"}
        results.put(("done", index, row))


class _Slot:
    """One worker process and the row it is running."""

    def __init__(self, context, results):
        self.tasks = context.Queue()
        self.process = context.Process(target=_worker, args=(self.tasks, results), daemon=True)
        self.process.start()
        self.task: Optional[Task] = None
        self.started: Optional[float] = None  # when the worker said it began the row
        self.settings: Dict[str, Any] = {}

    def give(self, task: Task) -> None:
        self.task, self.started, self.settings = task, None, {}
        self.tasks.put(task)

    def stop(self, *, kill: bool) -> None:
        if kill:
            self.process.terminate()
        else:
            try:
                self.tasks.put(None)
            except Exception:  # noqa: BLE001 - a closed queue: the process is gone
                pass
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=10)


def run_rows(
    tasks: Sequence[Task],
    *,
    jobs: int,
    seconds: Optional[float],
    on_row: Callable[[Dict[str, Any]], None],
    grace: Optional[float] = None,
) -> List[Dict[str, Any]]:
    """Run ``tasks`` on ``jobs`` worker processes; rows come back in the tasks' order.

    ``seconds``: the budget's wall time; a row still running ``grace`` seconds past it
    (default ``max(MIN_GRACE, seconds / 4)``) is stopped with its worker (``seconds=None``:
    never). ``on_row(row)`` is called as each row finishes (for the progress log).
    """
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    pending = list(tasks)
    rows: Dict[int, Dict[str, Any]] = {}
    if seconds is None:
        grace = None
    elif grace is None:
        grace = max(MIN_GRACE, 0.25 * float(seconds))
    slots = [_Slot(context, results) for _ in range(max(1, min(int(jobs), len(pending) or 1)))]

    def finish(index: int, row: Dict[str, Any]) -> None:
        rows[index] = row
        on_row(row)

    try:
        while pending or any(s.task is not None for s in slots):
            for slot in slots:
                if slot.task is None and pending:
                    slot.give(pending.pop(0))
            try:
                kind, index, payload = results.get(timeout=0.5)
            except queue.Empty:
                kind = None
            if kind is not None:
                slot = next((s for s in slots if s.task is not None and s.task[0] == index), None)
                if slot is not None:
                    if kind == "started":
                        slot.started, slot.settings = time.perf_counter(), payload
                    else:
                        slot.task = None
                        finish(index, payload)
            now = time.perf_counter()
            for i, slot in enumerate(slots):
                if slot.task is None:
                    continue
                index, problem_name, algorithm_name, _, seed, reference, _, _ = slot.task
                over = (grace is not None and slot.started is not None
                        and now - slot.started > seconds + grace)
                died = not slot.process.is_alive()
                if not (over or died):
                    continue
                row = {"problem": problem_name, "algorithm": algorithm_name, "seed": seed,
                       "reference": getattr(reference, "method", None), **slot.settings}
                if over:
                    row["wall_time_s"] = now - slot.started
                    row["verdict"] = (f"LOSES: over the time budget ({seconds:.0f} s; stopped after "
                                      f"{now - slot.started:.0f} s inside one compiled chunk of draws)")
                else:
                    row["verdict"] = f"FAILED: the worker process ended (exit code {slot.process.exitcode})"
                slot.task = None
                slot.stop(kill=True)
                slots[i] = _Slot(context, results)
                finish(index, row)
    finally:
        for slot in slots:
            slot.stop(kill=slot.task is not None)
    return [rows[task[0]] for task in tasks]
