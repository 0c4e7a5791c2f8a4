"""Reports of a ``fedmcmc run``: figures per algorithm, PNG plots, ``report.md`` and ``report.html``.

:func:`summarise` turns the results of one federation into plain numbers
(distances to the reference posterior, ESS, ESS per second, rounds, floats
communicated, error curves); :func:`write_report` draws the plots and writes
both documents from the same numbers, which are also stored in
``summary.json`` so that the report can be checked against the draws.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from . import diagnostics
from .results import flatten_names

__all__ = ["coordinate_names", "summarise", "error_curve", "write_report", "json_safe"]


# ------------------------------------------------------------------ helpers


def json_safe(value: Any, max_size: int = 10_000) -> Any:
    """Plain JSON types; large arrays are replaced by a note of their shape."""
    if isinstance(value, dict):
        return {str(k): json_safe(v, max_size) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, max_size) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, str) or value is None:
        return value
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        array = np.asarray(value)
        if array.size > max_size:
            return f"<array of shape {list(array.shape)} omitted>"
        if np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_:
            return json_safe(array.tolist(), max_size)
    return str(value)


def coordinate_names(init) -> List[str]:
    """One name per flat coordinate: ``mu[0]``, ``w[1, 2]``, ``b`` (a scalar leaf)."""
    names = []
    for leaf_name, leaf in flatten_names(init).items():
        leaf = np.asarray(leaf)
        if leaf.size == 1 and leaf.ndim == 0:
            names.append(leaf_name)
        else:
            for index in np.ndindex(*leaf.shape):
                names.append(f"{leaf_name}[{', '.join(map(str, index))}]")
    return names


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return f"{int(value):,}"
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if not math.isfinite(value):
            return "n/a"
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.{digits - 1}e}"
        return f"{value:.{digits}g}"
    return str(value)


def flat_draws(result) -> np.ndarray:
    """``result``'s draws as (chains, draws, dim), also when it has no draws
    (``Result.flat_samples`` cannot reshape an empty array)."""
    import jax

    leaves = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(result.samples)]
    chains, draws = leaves[0].shape[:2]
    return np.concatenate(
        [leaf.reshape(chains, draws, int(np.prod(leaf.shape[2:], dtype=int))) for leaf in leaves],
        axis=-1,
    )


def _finite_draws(flat: np.ndarray) -> np.ndarray:
    """Pooled (n, dim) draws without non-finite rows."""
    pooled = flat.reshape(-1, flat.shape[-1])
    return pooled[np.all(np.isfinite(pooled), axis=1)]


def error_curve(flat: np.ndarray, reference_draws: np.ndarray, info: dict, sample_stats: dict,
                burn_in: int, points: int = 12) -> List[Dict[str, float]]:
    """Mean marginal W1 to the reference of the first k kept draws (all chains), on a grid of k.

    ``rounds`` at k is the largest ``round`` over chains at draw k when the
    result records it per draw, otherwise ``info["rounds"]`` pro rata by draws;
    ``floats`` is ``info["floats_communicated"]`` pro rata by draws made
    (burn-in included), exact when communication is proportional to draws.
    """
    chains, kept, _ = flat.shape
    if kept < 2:
        return []
    grid = np.unique(np.geomspace(max(2, min(10, kept)), kept, points).astype(int))
    total_draws = burn_in + kept
    total_rounds = float(info.get("rounds") or 0)
    total_floats = float(info.get("floats_communicated") or 0)
    rounds_per_draw = None
    if "round" in sample_stats and np.asarray(sample_stats["round"]).shape[:2] == (chains, kept):
        rounds_per_draw = np.asarray(sample_stats["round"]).max(axis=0)
    curve = []
    for k in grid:
        sub = _finite_draws(flat[:, :k])
        if sub.shape[0] < 2:
            continue
        w1 = float(np.mean(diagnostics.wasserstein_marginal(sub, reference_draws)))
        fraction = (burn_in + k) / total_draws
        rounds = float(rounds_per_draw[k - 1]) if rounds_per_draw is not None else total_rounds * fraction
        curve.append({"draws": int(k), "rounds": rounds, "floats": total_floats * fraction,
                      "w1_marginal_mean": w1})
    return curve


# ---------------------------------------------------------------- summaries


def summarise(results: Dict[str, Any], reference, names: List[str], config, status: Dict[str, str],
              max_points: int = 1000, curve_points: int = 12) -> Dict[str, Any]:
    """Numbers of the report, per algorithm label (plain JSON types)."""
    out: Dict[str, Any] = {}
    for label, result in results.items():
        flat = flat_draws(result).astype(np.float64)
        chains, kept, dim = flat.shape
        info = result.info
        entry: Dict[str, Any] = {
            "algorithm": result.algorithm,
            "status": status.get(label, "complete"),
            "chains": chains,
            "draws_per_chain": kept,
            "wall_time": info.get("wall_time"),
            "rounds": info.get("rounds"),
            "messages": info.get("messages"),
            "floats_communicated": info.get("floats_communicated"),
            "iterations": info.get("iterations"),
            "thin": info.get("thin"),
            "burn_in": info.get("burn_in"),
            "sample_interval": info.get("sample_interval"),
        }
        pooled = _finite_draws(flat)
        finite_chains = np.all(np.isfinite(flat), axis=(1, 2))
        if pooled.shape[0] >= 2:
            entry["mean"] = pooled.mean(axis=0).tolist()
            entry["sd"] = pooled.std(axis=0).tolist()
        figures = info.get("diagnostics")
        if isinstance(figures, dict) and len(figures.get("r_hat") or []) == dim:
            # the run's own convergence check (fedmcmc.convergence), one chain's split R-hat
            # included
            entry["ess"] = figures["ess_bulk"]
            entry["ess_tail"] = figures["ess_tail"]
            entry["rhat"] = figures["r_hat"]
            entry["min_ess"] = figures.get("min_ess_bulk")
            entry["max_rhat"] = figures.get("max_r_hat")
            entry["converged"] = figures.get("converged")
            wall = float(info.get("wall_time") or 0.0)
            entry["ess_per_second"] = (float(entry["min_ess"]) / wall
                                       if wall > 0 and entry["min_ess"] is not None else None)
        elif kept >= 4 and finite_chains.any():
            good = flat[finite_chains]
            ess = diagnostics.ess(good)
            entry["ess"] = ess.tolist()
            entry["min_ess"] = float(np.min(ess))
            wall = float(info.get("wall_time") or 0.0)
            entry["ess_per_second"] = float(np.min(ess) / wall) if wall > 0 else None
            if good.shape[0] > 1:
                entry["rhat"] = diagnostics.rhat(good).tolist()
                entry["max_rhat"] = float(np.nanmax(entry["rhat"]))
        if reference is not None and pooled.shape[0] >= 2:
            entry["distances"] = diagnostics.compare(pooled, reference.draws, max_points=max_points)
            entry["error_curve"] = error_curve(
                flat, reference.draws, info, result.sample_stats,
                int(info.get("burn_in", 0 if config.burn_in == "auto" else config.burn_in)),
                curve_points
            )
        out[label] = json_safe(entry)
    return out


# -------------------------------------------------------------------- plots


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_traces(results, names, path: Path, coordinates: int = 4) -> Path:
    plt = _plt()
    labels = list(results)
    dim = min(len(names), coordinates)
    fig, axes = plt.subplots(len(labels), dim, figsize=(3.6 * dim, 2.4 * len(labels)),
                             squeeze=False, constrained_layout=True)
    for row, label in enumerate(labels):
        flat = flat_draws(results[label])
        for col in range(dim):
            ax = axes[row, col]
            for chain in range(flat.shape[0]):
                ax.plot(flat[chain, :, col], lw=0.6, alpha=0.8, label=f"chain {chain}")
            ax.set_title(f"{label}: {names[col]}", fontsize=9)
            ax.set_xlabel("kept draw (after burn-in)")
            ax.set_ylabel(f"{names[col]} (parameter units)")
            if row == 0 and col == 0:
                ax.legend(fontsize=7, loc="upper right")
    fig.suptitle("Trace plots")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_marginals(results, reference, names, path: Path, coordinates: int = 6) -> Path:
    plt = _plt()
    from scipy.stats import gaussian_kde, norm

    dim = min(len(names), coordinates)
    cols = min(dim, 3)
    rows = math.ceil(dim / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False,
                             constrained_layout=True)
    for i in range(dim):
        ax = axes[i // cols, i % cols]
        samples = {label: _finite_draws(flat_draws(r))[:, i] for label, r in results.items()}
        pieces = [v for v in samples.values() if v.size > 1]
        if reference is not None:
            pieces.append(reference.draws[:, i])
        if not pieces:
            continue
        low = min(np.percentile(v, 0.5) for v in pieces)
        high = max(np.percentile(v, 99.5) for v in pieces)
        pad = 0.1 * (high - low + 1e-12)
        grid = np.linspace(low - pad, high + pad, 300)
        if reference is not None:
            if reference.method == "exact":
                density = norm.pdf(grid, reference.mean[i], math.sqrt(reference.cov[i, i]))
                what = "reference (exact)"
            else:
                density = gaussian_kde(reference.draws[:, i])(grid)
                what = f"reference ({reference.method})"
            ax.plot(grid, density, color="black", lw=2.0, ls="--", label=what)
        for label, values in samples.items():
            if values.size > 1 and np.std(values) > 0:
                ax.plot(grid, gaussian_kde(values)(grid), lw=1.4, label=label)
        ax.set_xlabel(f"{names[i]} (parameter units)")
        ax.set_ylabel("density (per parameter unit)")
        ax.set_title(names[i], fontsize=9)
        if i == 0:
            ax.legend(fontsize=7)
    for j in range(dim, rows * cols):
        axes[j // cols, j % cols].axis("off")
    fig.suptitle("Marginal posterior densities (kernel density estimates) against the reference")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_convergence(summary, path: Path) -> Optional[Path]:
    curves = {label: s.get("error_curve") or [] for label, s in summary.items()}
    if not any(curves.values()):
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8), constrained_layout=True)
    panels = [("draws", "kept draws per chain"), ("rounds", "communication rounds (client visits)"),
              ("floats", "floats communicated (cumulative)")]
    for ax, (key, xlabel) in zip(axes, panels):
        plotted = False
        for label, curve in curves.items():
            x = np.array([p[key] for p in curve], dtype=float)
            y = np.array([p["w1_marginal_mean"] for p in curve], dtype=float)
            ok = (x > 0) & np.isfinite(y)
            if ok.sum() >= 1:
                ax.plot(x[ok], y[ok], marker="o", ms=3, label=label)
                plotted = True
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("mean marginal W1 to reference (parameter units)")
        if plotted:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no communication recorded\n(centralised runs)", ha="center",
                    va="center", transform=ax.transAxes, fontsize=8)
    fig.suptitle("Error of the first k draws against draws, rounds and communication")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _skeleton(result):
    """(times, positions) of a PDMP trajectory if the result carries one, else None."""
    candidate = getattr(result, "skeleton", None)
    info = result.info if isinstance(result.info, dict) else {}
    if candidate is None:
        candidate = info.get("skeleton")
    if candidate is None and info.get("skeleton_times") is not None:
        # the PDMP family: per-chain lists in info["skeleton_times"], ["skeleton_positions"]
        candidate = {"times": info["skeleton_times"][0], "positions": info["skeleton_positions"][0]}
    if candidate is None:
        return None
    if isinstance(candidate, dict):
        times = candidate.get("times", candidate.get("t"))
        positions = candidate.get("positions", candidate.get("x", candidate.get("position")))
    elif hasattr(candidate, "times") and hasattr(candidate, "positions"):
        times, positions = candidate.times, candidate.positions
    elif isinstance(candidate, (tuple, list)) and len(candidate) >= 2:
        times, positions = candidate[0], candidate[1]
    else:
        return None
    if times is None or positions is None:
        return None
    times, positions = np.asarray(times, dtype=float), np.asarray(positions, dtype=float)
    while times.ndim > 1:  # chains (and more) first: take the first
        times, positions = times[0], positions[0]
    if positions.ndim == 1:
        positions = positions[:, None]
    if positions.ndim != 2 or positions.shape[0] != times.shape[0] or times.shape[0] < 2:
        return None
    return times, positions


def plot_trajectories(results, names, path: Path, events: int = 200) -> Optional[Path]:
    found = {label: _skeleton(r) for label, r in results.items()}
    found = {k: v for k, v in found.items() if v is not None}
    if not found:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(found), figsize=(4.6 * len(found), 4.0), squeeze=False,
                             constrained_layout=True)
    for ax, (label, (times, positions)) in zip(axes[0], found.items()):
        positions = positions[:events]
        if positions.shape[1] >= 2:
            ax.plot(positions[:, 0], positions[:, 1], lw=0.8, marker=".", ms=3, label="skeleton path")
            ax.plot(positions[0, 0], positions[0, 1], "go", label="start")
            ax.set_xlabel(f"{names[0]} (parameter units)")
            ax.set_ylabel(f"{names[1]} (parameter units)")
        else:
            ax.plot(times[:events], positions[:, 0], lw=0.8, marker=".", ms=3, label="skeleton path")
            ax.set_xlabel("process time")
            ax.set_ylabel(f"{names[0]} (parameter units)")
        ax.set_title(f"{label}: first {positions.shape[0]} events", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("A stretch of the PDMP trajectory (first chain)\nskeleton points joined by straight "
                 "lines: exact for Zig-Zag and BPS; the Boomerang moves on ellipses between them",
                 fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- documents


def _blocks_to_markdown(blocks) -> str:
    lines = []
    for block in blocks:
        kind = block[0]
        if kind in ("h1", "h2", "h3"):
            lines += ["#" * int(kind[1]) + " " + block[1], ""]
        elif kind == "p":
            lines += [block[1], ""]
        elif kind == "list":
            lines += [f"- {item}" for item in block[1]] + [""]
        elif kind == "table":
            header, rows = block[1], block[2]
            lines.append("| " + " | ".join(header) + " |")
            lines.append("|" + "|".join("---" for _ in header) + "|")
            lines += ["| " + " | ".join(row) + " |" for row in rows]
            lines.append("")
        elif kind == "img":
            lines += [f"![{block[2]}]({block[1]})", "", f"*{block[2]}*", ""]
    return "\n".join(lines)


def _blocks_to_html(blocks, title: str) -> str:
    parts = [
        "<!DOCTYPE html>", "<html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:3px 8px;"
        "text-align:right}th{background:#eee}img{max-width:100%}code{background:#f4f4f4}</style>",
        "</head><body>",
    ]
    for block in blocks:
        kind = block[0]
        if kind in ("h1", "h2", "h3"):
            parts.append(f"<{kind}>{html.escape(block[1])}</{kind}>")
        elif kind == "p":
            parts.append(f"<p>{html.escape(block[1])}</p>")
        elif kind == "list":
            parts.append("<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in block[1]) + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{html.escape(h)}</th>" for h in block[1])
            body = "".join(
                "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in block[2]
            )
            parts.append(f"<table><tr>{head}</tr>{body}</table>")
        elif kind == "img":
            parts.append(
                f"<figure><img src='{html.escape(block[1])}' alt='{html.escape(block[2])}'>"
                f"<figcaption>{html.escape(block[2])}</figcaption></figure>"
            )
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(out_dir: Path, *, config, experiment, results, reference, summary, names,
                 notes: List[str]) -> Dict[str, Path]:
    """Write plots, ``report.md``, ``report.html`` and ``summary.json`` into ``out_dir``."""
    out_dir = Path(out_dir)
    plots_dir = out_dir / "plots"
    plots_dir.mkdir(parents=True, exist_ok=True)
    written: Dict[str, Path] = {}
    nonempty = {k: r for k, r in results.items() if flat_draws(r).shape[1] > 0}
    if nonempty:
        written["traces"] = plot_traces(nonempty, names, plots_dir / "traces.png",
                                        config.report.trace_coordinates)
        written["marginals"] = plot_marginals(nonempty, reference, names, plots_dir / "marginals.png")
    convergence = plot_convergence(summary, plots_dir / "convergence.png")
    if convergence is not None:
        written["convergence"] = convergence
    trajectory = plot_trajectories(nonempty, names, plots_dir / "trajectory.png")
    if trajectory is not None:
        written["trajectory"] = trajectory

    federation = experiment.federation
    blocks: list = [("h1", f"fedmcmc run: {config.name}")]
    blocks.append(("p", (
        f"Model {config.model.name} ({experiment.model_source}), data {experiment.data_source}; "
        f"{federation.num_clients} clients of sizes {', '.join(str(int(s)) for s in federation.sizes)} "
        f"({int(federation.total_size)} examples), partition {config.partition.method}. "
        f"{config.chains} chain(s) x {config.num_samples} kept draws after {config.burn_in} burn-in "
        f"draws, thin {config.thin}, seed {config.seed}, engine {config.engine}."
    )))
    if reference is not None:
        extra = "" if reference.method == "exact" else (
            f", {reference.info.get('chains')} chains x {reference.info.get('num_samples')} draws, "
            f"divergences {reference.info.get('divergences')}, max R-hat {_fmt(reference.info.get('max_rhat'))}"
        )
        half = reference.draws.shape[0] // 2
        floor = float(np.mean(diagnostics.wasserstein_marginal(
            reference.draws[:half], reference.draws[half:]))) if half >= 2 else None
        blocks.append(("p", (
            f"Reference posterior: {reference.method} on the pooled data "
            f"({reference.draws.shape[0]} draws{extra}"
            f"{', read from cache' if reference.from_cache else ''}). Noise floor of the "
            f"distances: the mean marginal W1 between the two halves of the reference draws is "
            f"{_fmt(floor)}."
        )))
    else:
        blocks.append(("p", "No reference posterior: distances are not computed."))
    if notes:
        blocks.append(("list", notes))

    blocks.append(("h2", "Comparison"))
    header = ["algorithm", "status", "mean marginal W1", "joint W1", "KL (Gaussian fits)", "MMD",
              "min ESS", "ESS / s", "max R-hat", "converged", "rounds", "floats communicated",
              "wall time (s)"]
    rows = []
    for label, entry in summary.items():
        distances = entry.get("distances") or {}
        rows.append([
            label, entry.get("status", ""), _fmt(distances.get("w1_marginal_mean")),
            _fmt(distances.get("w1_joint")), _fmt(distances.get("kl_gaussian")),
            _fmt(distances.get("mmd")), _fmt(entry.get("min_ess")), _fmt(entry.get("ess_per_second")),
            _fmt(entry.get("max_rhat")),
            {True: "yes", False: "no"}.get(entry.get("converged"), "n/a"),
            _fmt(entry.get("rounds")),
            _fmt(entry.get("floats_communicated")), _fmt(entry.get("wall_time")),
        ])
    blocks.append(("table", header, rows))
    blocks.append(("p", (
        "W1: 1-Wasserstein distance to the reference draws (marginal: mean over coordinates; joint: "
        f"exact optimal assignment on at most {config.report.max_points} draws of each). KL: "
        "KL(N_algorithm || N_reference) between Gaussian fits, in nats. MMD: Gaussian kernel, median "
        "bandwidth. ESS: ArviZ bulk ESS, minimum over coordinates; ESS / s divides it by the "
        "sampling wall time (compilation included). R-hat: rank-normalised split R-hat (one "
        "chain: its two halves); converged: every R-hat at most 1.01 and every bulk ESS at least "
        "100 (the run's convergence check, fedmcmc.convergence). Rounds and floats: as counted by the algorithm "
        "(result.info)."
    )))

    for label, entry in summary.items():
        blocks.append(("h3", f"{label} ({entry.get('algorithm')})"))
        lengths = ", ".join(f"{key.replace('_', ' ')} {_fmt(entry[key])}"
                            for key in ("thin", "burn_in", "sample_interval")
                            if entry.get(key) is not None)
        if lengths:
            blocks.append(("p", f"Run length used: {lengths}."))
        coords = []
        reference_sd = reference.sd if reference is not None else None
        for i, name in enumerate(names[:50]):
            row = [name, _fmt((entry.get("mean") or [None] * len(names))[i]),
                   _fmt((entry.get("sd") or [None] * len(names))[i])]
            if reference is not None:
                row += [_fmt(float(reference.mean[i])), _fmt(float(reference_sd[i])),
                        _fmt(((entry.get("distances") or {}).get("w1_marginal") or [None] * len(names))[i])]
            row += [_fmt((entry.get("ess") or [None] * len(names))[i]),
                    _fmt((entry.get("ess_tail") or [None] * len(names))[i]),
                    _fmt((entry.get("rhat") or [None] * len(names))[i])]
            coords.append(row)
        head = ["coordinate", "mean", "sd"]
        if reference is not None:
            head += ["reference mean", "reference sd", "W1"]
        head += ["bulk ESS", "tail ESS", "R-hat"]
        blocks.append(("table", head, coords))
        if len(names) > 50:
            blocks.append(("p", f"(first 50 of {len(names)} coordinates)"))

    blocks.append(("h2", "Plots"))
    captions = {
        "traces": "Traces of the first coordinates, every chain (x: kept draw index; y: parameter value).",
        "marginals": "Marginal densities of each algorithm against the reference posterior (dashed).",
        "convergence": ("Mean marginal W1 to the reference of the first k draws, against draws, "
                        "communication rounds and floats communicated (log-log). Rounds at draw k "
                        "as recorded per draw when the algorithm records them, floats pro rata "
                        "by draws made."),
        "trajectory": "A stretch of the PDMP skeleton trajectory of the first chain.",
    }
    for key in ("traces", "marginals", "convergence", "trajectory"):
        if key in written:
            blocks.append(("img", f"plots/{written[key].name}", captions[key]))
    blocks.append(("p", (
        "Files: draws/<label>.nc (ArviZ NetCDF), info.json (run figures), config.resolved.json "
        "(the config with defaults), summary.json (the numbers of this report)."
    )))

    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    (out_dir / "report.md").write_text(_blocks_to_markdown(blocks))
    (out_dir / "report.html").write_text(_blocks_to_html(blocks, f"fedmcmc run: {config.name}"))
    written["report_md"] = out_dir / "report.md"
    written["report_html"] = out_dir / "report.html"
    return written
