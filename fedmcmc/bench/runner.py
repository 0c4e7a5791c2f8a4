"""``fedmcmc bench``: every algorithm on every problem, against the reference; leaderboard and README.

:func:`run` builds each problem (:mod:`fedmcmc.bench.problems`), computes or reads its
cached reference (:func:`fedmcmc.reference_posterior`), its Laplace fit (what the
hyper-parameter rules of :mod:`fedmcmc.bench.algorithms` read), runs every algorithm
with the same budget and seed, and writes into the output directory:

``leaderboard.csv``
    One row per problem and algorithm (:data:`COLUMNS`).
``README.md``
    The command, the budget, one table per problem with the verdicts in words
    (who loses and why), the rules and the verdict's definition.
``results.json``
    The same rows and each problem's reference figures.
``accuracy_vs_cost.png``
    Per problem, the error against wall time and against floats communicated
    (when matplotlib is installed).
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..reference import reference_posterior
from . import algorithms as algorithms_module
from . import metrics
from . import problems as problems_module
from . import workers
from .row import number

__all__ = ["COLUMNS", "SIZES", "run", "write_outputs"]

#: leaderboard.csv's columns, in order
COLUMNS = [
    "problem", "algorithm", "family", "verdict", "rank", "max_abs_z", "sd_ratio_min",
    "sd_ratio_max", "w1_max", "ess_min", "r_hat_max", "ess_bulk_min", "ess_tail_min",
    "converged", "thin", "burn_in", "wall_time_s", "ess_per_second", "iterations",
    "rounds", "messages", "floats_communicated", "floats_per_effective_draw", "settings",
    "uses_auto", "warnings", "worst_mean_coordinate", "z_of_worst", "worst_sd_coordinate",
    "reference", "seed",
]

#: budget per size: the same for every algorithm on every problem
SIZES = {
    "quick": algorithms_module.Budget(chains=2, num_samples=80, burn_in=20, seconds=45.0),
    "default": algorithms_module.Budget(chains=4, num_samples=500, burn_in=125, seconds=300.0),
}

#: reference settings (the same at both sizes, so the cached reference is shared)
REFERENCE = {"num_samples": 2000, "num_warmup": 1000, "chains": 4, "seed": 0}


def _log(message: str, quiet: bool) -> None:
    if not quiet:
        print(message, file=sys.stderr, flush=True)


def _reference(instance, quiet: bool):
    started = time.perf_counter()
    reference = reference_posterior(
        instance.model, instance.federation, instance.init, method=instance.reference_method,
        **REFERENCE,
    )
    reference_ess = (
        float(reference.draws.shape[0]) if reference.method == "exact"
        else float(reference.info.get("min_ess") or reference.draws.shape[0])
    )
    _log(f"  reference: {reference.method} ({'cached' if reference.from_cache else 'computed'}, "
         f"{time.perf_counter() - started:.1f} s)", quiet)
    return reference, reference_ess


def _error(row: Dict[str, Any]) -> float:
    """One number per row for ranking: the worse of the mean error and the sd error."""
    if row.get("max_abs_z") is None:
        return math.inf
    return max(row["max_abs_z"], abs(row["sd_ratio_min"] - 1.0), abs(row["sd_ratio_max"] - 1.0))


def _rank(rows: List[Dict[str, Any]]) -> None:
    """``rank`` within each problem: 1 = most accurate (ties broken by ESS per second)."""
    for problem in {r["problem"] for r in rows}:
        ranked = [r for r in rows if r["problem"] == problem and r.get("max_abs_z") is not None]
        ranked.sort(key=lambda r: (_error(r), -(r.get("ess_per_second") or 0.0)))
        for position, row in enumerate(ranked, start=1):
            row["rank"] = position


def run(
    out_dir,
    *,
    quick: bool = False,
    problems: Optional[Sequence[str]] = None,
    algorithms: Optional[Sequence[str]] = None,
    seed: int = 0,
    budget: Optional[algorithms_module.Budget] = None,
    quiet: bool = False,
    command: Optional[str] = None,
    jobs: Optional[int] = None,
) -> Path:
    """Run the benchmark; write ``leaderboard.csv``, ``README.md``, ``results.json`` into ``out_dir``.

    Parameters
    ----------
    quick:
        The quick size: the problems of :data:`fedmcmc.bench.problems.QUICK` and
        :data:`SIZES` ``["quick"]``.
    problems, algorithms:
        Subsets by name (default: all of the size / all of :data:`ALGORITHMS`).
    budget:
        Overrides the size's budget (chains, kept draws, burn-in draws, seconds, and the
        grace after which a row stuck inside one chunk is stopped with its worker).
    command:
        The command line written into the README (default: rebuilt from the arguments).
    jobs:
        Rows run at a time, each in its own worker process (:mod:`fedmcmc.bench.workers`;
        a row still running a quarter of its budget past the budget is stopped with its
        worker). Default: 2 at the quick size on a machine of at least 2 cores (most of a
        quick row is compilation, which runs on one core), 1 at the default size, so that
        its wall times are not shared.

    Returns the path of ``README.md``.
    """
    size = "quick" if quick else "default"
    problem_names = list(problems) if problems else problems_module.names(quick)
    for name in problem_names:
        problems_module.get(name)  # ValueError naming the problem
    algorithm_names = list(algorithms) if algorithms else algorithms_module.names()
    for name in algorithm_names:
        if name not in algorithms_module.ALGORITHMS:
            raise ValueError(
                f"algorithms: unknown {name!r}; choose from {algorithms_module.names()}"
            )
    budget = budget or SIZES[size]
    default_jobs = min(2, os.cpu_count() or 1) if quick else 1
    if jobs is None:
        jobs = default_jobs
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer, got {jobs!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    problem_info: Dict[str, Dict[str, Any]] = {}
    tasks: List[workers.Task] = []
    for name in problem_names:
        problem = problems_module.get(name)
        _log(f"{name}: {problem.description}", quiet)
        instance = problem.build()
        reference, reference_ess = _reference(instance, quiet)
        laplace = problems_module.laplace(instance)
        ctx = algorithms_module.Context(instance, laplace, budget)
        sizes = np.asarray(instance.federation.sizes)
        problem_info[name] = {
            "description": problem.description,
            "source": problem.source,
            "rows": int(sizes.sum()),
            "clients": int(sizes.size),
            "client_sizes": [int(sizes.min()), int(np.median(sizes)), int(sizes.max())],
            "dim": instance.dim,
            "coordinates": list(instance.coordinates),
            "reference": reference.method,
            "reference_ess": reference_ess,
            "reference_info": {k: v for k, v in reference.info.items()
                               if isinstance(v, (int, float, str))},
            "reference_mean": np.asarray(reference.mean).tolist(),
            "reference_sd": np.asarray(reference.sd).tolist(),
            "laplace": {"eig_max": laplace.eig_max, "eig_min": laplace.eig_min,
                        "sd_max": laplace.sd_max},
        }
        for algorithm_name in algorithm_names:
            tasks.append((len(tasks), name, algorithm_name, ctx.budget, seed, reference,
                          reference_ess, laplace))

    def log_row(row: Dict[str, Any]) -> None:
        z = row.get("max_abs_z")
        _log(f"  {row['problem']:<15} {row['algorithm']:<13} {row.get('wall_time_s', 0.0):7.1f} s  "
             + (f"max|z| {z:.2f}  sd ratio {row['sd_ratio_min']:.2f}-{row['sd_ratio_max']:.2f}  "
                if z is not None else "")
             + row["verdict"], quiet)

    _log(f"{len(tasks)} runs, {jobs} at a time", quiet)
    rows = workers.run_rows(tasks, jobs=jobs, seconds=budget.seconds, on_row=log_row,
                            grace=budget.grace_seconds)
    _rank(rows)
    if command is None:
        command = "fedmcmc bench" + (" --quick" if quick else "") + f" --out {out_dir}"
        if problems:
            command += " --problems " + ",".join(problem_names)
        if algorithms:
            command += " --algorithms " + ",".join(algorithm_names)
        if seed:
            command += f" --seed {seed}"
        if jobs != default_jobs:
            command += f" --jobs {jobs}"
    meta = {
        "command": command,
        "size": size,
        "budget": {"chains": budget.chains, "num_samples": budget.num_samples,
                   "burn_in": budget.burn_in},
        "seed": seed,
        "jobs": jobs,
        "total_wall_time_s": time.perf_counter() - started,
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.python_version()}",
    }
    return write_outputs(out, rows, problem_info, meta)


# ---------------------------------------------------------------- outputs


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return ""
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-2):
            return f"{value:.3g}"
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def write_csv(path: Path, rows: List[Dict[str, Any]]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in COLUMNS})


def _table(rows: List[Dict[str, Any]]) -> List[str]:
    header = ["rank", "algorithm", "verdict", "max abs z", "sd ratio min-max", "ESS",
              "max R-hat", "thin / burn-in", "wall s", "ESS/s", "floats sent", "settings"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    ordered = sorted(rows, key=lambda r: (r.get("rank") or 10**6, r["algorithm"]))
    for r in ordered:
        ratio = (f"{r['sd_ratio_min']:.2f}-{r['sd_ratio_max']:.2f}"
                 if r.get("sd_ratio_min") is not None else "")
        cells = [
            _cell(r.get("rank")), r["algorithm"], r["verdict"].replace("|", "/"),
            _cell(r.get("max_abs_z")), ratio, _cell(r.get("ess_min")),
            _cell(r.get("r_hat_max")),
            (f"{r['thin']} / {r['burn_in']}" if r.get("thin") is not None else ""),
            _cell(r.get("wall_time_s")), _cell(r.get("ess_per_second")),
            _cell(number(r.get("floats_communicated"))), (r.get("settings") or "").replace("|", "/"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _summary(rows: List[Dict[str, Any]]) -> List[str]:
    ok = [r for r in rows if r["verdict"] == "ok"]
    lost = [r for r in rows if r["verdict"].startswith("LOSES")]
    failed = [r for r in rows if r["verdict"].startswith("FAILED")]
    missing = [r for r in rows if r["verdict"].startswith("not available")]
    lines = []
    if ok:
        fastest = max(ok, key=lambda r: r.get("ess_per_second") or 0.0)
        lines.append(f"- Accurate: {', '.join(r['algorithm'] for r in ok)}. Most effective draws "
                     f"per second among them: **{fastest['algorithm']}** "
                     f"({fastest['ess_per_second']:.3g}/s).")
    else:
        lines.append("- **No algorithm was accurate on this problem at this budget.**")
    for r in lost:
        lines.append(f"- **{r['algorithm']} loses here**: {r['verdict'][len('LOSES: '):]}.")
    for r in failed:
        lines.append(f"- **{r['algorithm']} failed here**: {r['verdict'][len('FAILED: '):]}.")
    if missing:
        lines.append(f"- Not available in this version: {', '.join(r['algorithm'] for r in missing)}.")
    return lines


def _plot(path: Path, rows: List[Dict[str, Any]], problem_names: List[str]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001 - plots are optional
        return False
    fig, axes = plt.subplots(len(problem_names), 2, figsize=(11, 3.6 * len(problem_names)),
                             squeeze=False)
    for i, name in enumerate(problem_names):
        done = [r for r in rows if r["problem"] == name and r.get("max_abs_z") is not None]
        for j, (key, label) in enumerate([("wall_time_s", "wall time (s)"),
                                          ("floats_communicated", "floats communicated")]):
            ax = axes[i][j]
            for r in done:
                x = number(r.get(key))
                if x is None or x <= 0:
                    continue
                marker = "o" if r["verdict"] == "ok" else "x"
                ax.scatter([x], [_error(r)], marker=marker)
                ax.annotate(r["algorithm"], (x, _error(r)), fontsize=7)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(label)
            ax.set_ylabel("error (max of |z|, |sd ratio - 1|)")
            ax.set_title(f"{name} (o ok, x loses)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def write_outputs(out: Path, rows: List[Dict[str, Any]], problem_info: Dict[str, Dict[str, Any]],
                  meta: Dict[str, Any]) -> Path:
    """Write ``leaderboard.csv``, ``results.json``, the plot and ``README.md``; return README's path."""
    write_csv(out / "leaderboard.csv", rows)
    with open(out / "results.json", "w") as handle:
        json.dump({"meta": meta, "problems": problem_info, "rows": rows}, handle, indent=1,
                  default=lambda v: v.item() if hasattr(v, "item") else str(v))
    names = list(problem_info)
    plotted = _plot(out / "accuracy_vs_cost.png", rows, names)
    budget = meta["budget"]
    lines = [
        "# fedmcmc benchmark leaderboard",
        "",
        f"Made by `{meta['command']}` ({meta['size']} size) on {meta['date']}, "
        f"{meta['machine']}; {meta['total_wall_time_s'] / 60:.1f} minutes in all.",
        "",
        f"Every algorithm gets the same budget on every problem: {budget['chains']} chains, "
        f"{budget['num_samples']} kept draws per chain after {budget['burn_in']} burn-in draws, "
        f"seed {meta['seed']}, starting from the same point (zeros). Hyper-parameters come "
        "from one rule per algorithm (below), the same on every problem, or `\"auto\"` where "
        "the algorithm offers it. Wall time includes compilation and set-up (surrogates, "
        "bounds, Laplace fits), on a shared machine: compare orders of magnitude."
        + (f" {meta['jobs']} runs went at a time (each in its own process), so every wall time "
           "also includes the others' share of the machine." if meta.get("jobs", 1) > 1 else ""),
        "",
        "Columns of `leaderboard.csv`: " + ", ".join(f"`{c}`" for c in COLUMNS) + ".",
        "",
    ]
    for name in names:
        info = problem_info[name]
        problem_rows = [r for r in rows if r["problem"] == name]
        low, median, high = info["client_sizes"]
        lines += [
            f"## {name}",
            "",
            f"{info['description']} Source: {info['source']}. {info['rows']} rows in "
            f"{info['clients']} clients (sizes {low} to {high}, median {median}), "
            f"{info['dim']} parameters ({', '.join(info['coordinates'])}). Reference: "
            f"{'exact Gaussian posterior' if info['reference'] == 'exact' else 'BlackJAX NUTS on the pooled rows'} "
            f"(ESS {info['reference_ess']:.0f}).",
            "",
            *_summary(problem_rows),
            "",
            *_table(problem_rows),
            "",
        ]
    if plotted:
        lines += ["## Accuracy against cost", "",
                  "![error against wall time and communication](accuracy_vs_cost.png)", ""]
    lines += [
        "## How settings are chosen",
        "",
        _dedent(algorithms_module.__doc__),
        "",
        "## What the columns and verdicts mean",
        "",
        _dedent(metrics.__doc__),
        "",
    ]
    readme = out / "README.md"
    readme.write_text("\n".join(lines))
    return readme


def _dedent(text: str) -> str:
    """A module docstring as Markdown: RST definition lists (a term, then an indented body)
    become bullets, so that Markdown does not read the bodies as code blocks."""
    import inspect

    lines = inspect.cleandoc(text or "").splitlines()
    out: List[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        indented = i + 1 < len(lines) and lines[i + 1].startswith("    ")
        if line and not line.startswith(" ") and indented:
            body = []
            i += 1
            while i < len(lines) and lines[i].startswith("    "):
                body.append(lines[i].strip())
                i += 1
            out.append(f"- {line.strip()}: " + " ".join(body))
            continue
        out.append(line.strip() if line.startswith("  ") and not line.lstrip().startswith("*") else line)
        i += 1
    return "\n".join(out).strip()
