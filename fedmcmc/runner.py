"""``fedmcmc run``: run every algorithm of a config on one federation and write the results.

Output directory layout::

    DIR/config.resolved.json     the config with every default, and what names resolved to
    DIR/draws/<label>.nc         ArviZ NetCDF of each algorithm's draws (az.from_netcdf)
    DIR/info.json                run figures per algorithm, the federation, the reference
    DIR/summary.json             the numbers of the report
    DIR/report.md, report.html   tables and plots (DIR/plots/*.png)
    DIR/checkpoints/<label>.npz  chain states and draws so far (resume)

Checkpoints: an algorithm that supports the generic run options
(``supports_resume = True``, see :mod:`fedmcmc.checkpoint`) writes its chain
states and draws every ``checkpoint.every_chunks`` chunks, on Ctrl-C and at the
end. ``resume=True`` skips finished algorithms, continues interrupted ones from
their last checkpoint and reproduces the draws of an uninterrupted run exactly
(draws are keyed by their global index). A checkpoint made with a different
config for that algorithm is refused.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

import numpy as np

from .config import ConfigError, ExperimentConfig, build_experiment, load_config
from .api import sample
from . import convergence
from .reference import reference_posterior
from .results import Result, SamplingDivergedError
from .checkpoint import Checkpointer, load_checkpoint
from .report import coordinate_names, flat_draws, json_safe, summarise, write_report

__all__ = ["RunOutcome", "run_experiment"]

#: Test hook: called with the Checkpointer after every checkpoint write.
_AFTER_CHECKPOINT: Optional[Callable] = None


@dataclasses.dataclass
class RunOutcome:
    out_dir: Path
    results: Dict[str, Any]
    summary: Dict[str, Any]
    status: Dict[str, str]
    interrupted: bool
    files: Dict[str, Path]


class _Console:
    def __init__(self, quiet: bool):
        self.quiet = quiet
        self._console = None
        if not quiet:
            from rich.console import Console

            self._console = Console(stderr=True)

    def print(self, message: str, style: Optional[str] = None) -> None:
        if self._console is not None:
            self._console.print(message, style=style, highlight=False)

    def warn(self, message: str) -> None:
        if self._console is not None:
            self._console.print(f"warning: {message}", style="yellow", highlight=False)
        else:
            print(f"warning: {message}", file=sys.stderr)

    def status(self, message: str):
        import contextlib

        if self._console is None:
            return contextlib.nullcontext()
        return self._console.status(message)


#: skeleton points per chain requested from PDMP algorithms for the trajectory plot
SKELETON_POINTS = 500


def _accepts(function, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


def _result_from_arrays(experiment, name, draws, stats, info):
    import jax.numpy as jnp

    flat_model = experiment.model.flatten(experiment.init)
    if draws.shape[1] == 0:
        samples = flat_model.unravel_draws(jnp.zeros((draws.shape[0], 0, flat_model.dim)))
    else:
        samples = flat_model.unravel_draws(jnp.asarray(draws))
    return Result(samples=samples, info=info, sample_stats=dict(stats), algorithm=name)


def _save_netcdf(result, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = result.to_arviz()
    # NetCDF attributes cannot be booleans or None (Result.to_arviz copies info's bools).
    def clean(attrs):
        for key, value in list(attrs.items()):
            if isinstance(value, (bool, np.bool_)):
                attrs[key] = int(value)
            elif value is None:
                attrs[key] = "None"

    clean(getattr(data, "_attrs", None) or {})
    for group in data.groups():
        clean(data[group].attrs)
    tmp = path.with_name(path.name + ".tmp")
    data.to_netcdf(str(tmp))
    tmp.replace(path)


def run_experiment(
    config: Union[str, Path, ExperimentConfig],
    out_dir: Union[str, Path],
    *,
    resume: bool = False,
    quiet: bool = False,
    progress: Optional[bool] = None,
) -> RunOutcome:
    """Run a config; see the module docstring for what is written. Raises ``ConfigError``."""
    console = _Console(quiet)
    if not isinstance(config, ExperimentConfig):
        config = load_config(config)
    out_dir = Path(out_dir)
    if progress is None:
        progress = False if quiet else None
    with console.status("resolving the config (model, data, federation)..."):
        experiment = build_experiment(config)
    federation = experiment.federation
    console.print(
        f"[bold]{config.name}[/bold]: model {config.model.name}, {federation.num_clients} clients, "
        f"{int(federation.total_size)} examples, {len(config.algorithms)} algorithm(s)"
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoint_dir = out_dir / "checkpoints"
    if not resume and checkpoint_dir.exists():
        shutil.rmtree(checkpoint_dir)
    (out_dir / "config.resolved.json").write_text(json.dumps(json_safe(experiment.resolved()), indent=1))

    reference = None
    notes: List[str] = []
    if config.reference.method != "none":
        label = "exact" if config.reference.method == "exact" else config.reference.method
        with console.status(f"reference posterior ({label}) on the pooled data..."):
            try:
                reference = reference_posterior(
                    experiment.model, federation, experiment.init,
                    method=config.reference.method, num_samples=config.reference.num_samples,
                    num_warmup=config.reference.num_warmup, chains=config.reference.chains,
                    seed=config.reference.seed, cache=config.reference.cache,
                )
            except (ImportError, ValueError) as error:
                notes.append(f"reference posterior unavailable: {error}")
                console.warn(f"reference posterior unavailable: {error}")
        if reference is not None:
            console.print(
                f"reference: {reference.method}"
                + (" (cached)" if reference.from_cache else f" ({reference.info.get('wall_time', 0):.1f} s)")
            )

    results: Dict[str, Any] = {}
    status: Dict[str, str] = {}
    infos: Dict[str, Any] = {}
    interrupted = False
    total = len(experiment.algorithms)
    for position, (label, section, algorithm) in enumerate(experiment.algorithms, start=1):
        run_hash = experiment.run_hash(label)
        path = checkpoint_dir / f"{label}.npz"
        previous = None
        if resume and path.exists():
            previous = load_checkpoint(path)
            if previous["meta"].get("run_hash") != run_hash:
                raise ConfigError(
                    f"algorithms ({label}): the config changed since its checkpoint {path} was "
                    "written (model, data, partition, sampling settings or this algorithm's "
                    "params differ); run again without --resume to start afresh"
                )
            if previous["meta"].get("complete"):
                meta = previous["meta"]
                result = _result_from_arrays(experiment, meta["algorithm"], previous["draws"],
                                             previous["stats"], meta["info"])
                results[label], status[label], infos[label] = result, meta.get("status", "complete"), meta["info"]
                console.print(f"[{position}/{total}] {label}: finished earlier, read from {path.name}")
                continue
        thin = section.thin or config.thin
        resumable = bool(getattr(algorithm, "supports_resume", False))
        meta = {"run_hash": run_hash, "label": label, "algorithm": algorithm.name,
                "complete": False}
        wall_before = float(previous["meta"].get("wall_time_so_far", 0.0)) if previous else 0.0

        def after_write(checkpointer, _label=label):
            if _AFTER_CHECKPOINT is not None:
                _AFTER_CHECKPOINT(checkpointer)

        checkpointer = Checkpointer(
            path, every=config.checkpoint.every_chunks, meta=meta,
            previous=previous if resumable else None,
            chunk_size=config.checkpoint.chunk_size, after_write=after_write,
        )
        options = dict(section.options)
        if "skeleton" not in options and _accepts(algorithm.sample_local, "skeleton"):
            options["skeleton"] = SKELETON_POINTS  # PDMP: a stretch of trajectory for the report
        if resumable:
            options.update(checkpointer.run_options())
        elif previous is not None:
            console.warn(f"{label}: {algorithm.name} cannot resume; running it again from the start")
        if checkpointer.start_draw:
            console.print(f"[{position}/{total}] {label}: resuming at draw {checkpointer.start_draw}")
        else:
            console.print(f"[{position}/{total}] {label}: {algorithm!r}")
        started = time.perf_counter()
        diverged_message = None
        if config.max_iterations is not None:
            options.setdefault("max_iterations", config.max_iterations)
        try:
            # the convergence check is made below, on the draws of the whole run (a resumed
            # run's result holds only its own): its warning goes to the console and the report
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", convergence.ConvergenceWarning)
                result = sample(
                    experiment.model, federation, algorithm, init=experiment.init,
                    num_samples=config.num_samples, burn_in=config.burn_in, thin=thin,
                    chains=config.chains, seed=config.seed, engine=config.engine,
                    progress=progress, **options,
                )
        except SamplingDivergedError as error:
            result = error.result
            diverged_message = str(error)
            if result is None:  # a family that kept no draws: record the failure, go on
                status[label] = "diverged"
                notes.append(f"{label}: {diverged_message} (no draws kept)")
                console.warn(diverged_message)
                continue
        except KeyboardInterrupt:
            # Ctrl-C outside the sampling loop (compilation, surrogate fitting): save what exists.
            if resumable and checkpointer.states is not None:
                checkpointer.meta["wall_time_so_far"] = wall_before + time.perf_counter() - started
                checkpointer.write()
            raise
        except (ValueError, TypeError) as error:
            raise ConfigError(f"algorithms ({label}): {error}") from None
        info = dict(result.info)
        stitched = False
        run_interrupted = bool(info.get("interrupted"))
        if resumable and checkpointer.states is not None and (previous is not None or run_interrupted):
            # The result of a resumed run holds only its own draws: stitch the checkpointed ones.
            draws, stats = checkpointer.kept()
            if draws is None:
                draws = np.zeros((config.chains, 0, int(flat_draws(result).shape[-1])))
            info["wall_time"] = wall_before + float(info.get("wall_time") or 0.0)
            info["draws_kept"] = int(draws.shape[1])
            if previous is not None:
                info["resumed_at_draw"] = int(previous["draws_done"])
                info.pop("start_draw", None)
            result = _result_from_arrays(experiment, result.algorithm, draws, stats, info)
            stitched = True
        if flat_draws(result).shape[1] >= 4:
            thresholds = convergence.ConvergenceCheck.of(options.get("convergence"))
            # fm.sample checked the draws it made; a run stitched to its checkpointed draws
            # (or a diverged one, whose error skips the check) is checked here
            figures = None if stitched else info.get("diagnostics")
            if figures is None:
                figures = convergence.check(result, dataclasses.replace(thresholds, warn=False))
            info["diagnostics"] = figures
            if not figures["converged"] and thresholds.warn and diverged_message is None:
                text = convergence.message(label, result.info, figures, thresholds)
                notes.append(f"ConvergenceWarning: {text}")
                console.warn(f"ConvergenceWarning: {text}")
        if diverged_message is not None:
            status[label] = "diverged"
            notes.append(f"{label}: {diverged_message}")
            console.warn(diverged_message)
        elif run_interrupted:
            status[label] = "interrupted"
        else:
            status[label] = "complete"
        results[label], infos[label] = result, info
        checkpointer.meta.update(
            wall_time_so_far=float(info.get("wall_time") or 0.0),
            complete=status[label] != "interrupted",
            status=status[label],
            info=json_safe(info),
        )
        if status[label] != "interrupted":
            # Finished: store draws and figures so --resume does not rerun it.
            checkpointer.draws = [flat_draws(result)]
            checkpointer.stats = [{k: np.asarray(v) for k, v in result.sample_stats.items()}]
            burn_in_used = int(info.get("burn_in", 0 if config.burn_in == "auto"
                                        else config.burn_in))
            checkpointer.first_index = burn_in_used
            checkpointer.draws_done = burn_in_used + int(flat_draws(result).shape[1])
            if checkpointer.states is None:
                checkpointer.states = [np.zeros(0)]
                checkpointer.meta["no_states"] = True
            checkpointer.write()
        elif resumable:
            checkpointer.write()
        _save_netcdf(result, out_dir / "draws" / f"{label}.nc")
        if run_interrupted:
            interrupted = True
            message = (f"{label}: interrupted after {int(flat_draws(result).shape[1])} "
                       "kept draws; the draws so far are saved")
            if resumable:
                message += "; continue with --resume"
            notes.append(message)
            console.warn(message)
            break

    names = coordinate_names(experiment.init)
    with console.status("diagnostics and report..."):
        summary = summarise(results, reference, names, config, status,
                            max_points=config.report.max_points,
                            curve_points=config.report.curve_points)
        info_out = {
            "config_name": config.name,
            "interrupted": interrupted,
            "federation": {"num_clients": int(federation.num_clients),
                           "sizes": [int(s) for s in federation.sizes],
                           "weights": [float(w) for w in federation.weights]},
            "reference": None if reference is None else {
                "method": reference.method, "mean": reference.mean.tolist(),
                "sd": reference.sd.tolist(), "info": reference.info,
                "from_cache": reference.from_cache,
            },
            "coordinates": names,
            "algorithms": {label: {"status": status[label], "info": infos[label]} for label in results},
        }
        (out_dir / "info.json").write_text(json.dumps(json_safe(info_out), indent=1))
        files = write_report(out_dir, config=config, experiment=experiment, results=results,
                             reference=reference, summary=summary, names=names, notes=notes)
    for label, entry in summary.items():
        distance = (entry.get("distances") or {}).get("w1_marginal_mean")
        min_ess = entry.get("min_ess")
        max_rhat = entry.get("max_rhat")
        console.print(
            f"  {label:<16} {entry['status']:<11} "
            f"W1 {'n/a' if distance is None else format(distance, '.4g')}  "
            f"min ESS {'n/a' if min_ess is None else format(min_ess, '.0f')}  "
            f"max R-hat {'n/a' if max_rhat is None else format(max_rhat, '.3f')}"
            + ("" if entry.get("converged") is not False else "  (not converged)")
        )
    console.print(f"report: {out_dir / 'report.md'}")
    return RunOutcome(out_dir=out_dir, results=results, summary=summary, status=status,
                      interrupted=interrupted, files=files)
