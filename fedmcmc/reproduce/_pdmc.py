"""Shared by the Fed-PDMC reproductions of Figures 3-5: marginal W1 to a NUTS reference against M.

Not a reproduction itself (leading underscore: the registry does not import it as one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Sequence

import numpy as np

from ._common import figure, save, write_csv


def w1_against_workers(out_dir: Path, *, model, make_clients: Callable[[int], list], init,
                       workers: Sequence[int], runs: int, num_samples: int, interval: float,
                       burn_in: int, nuts: Dict, algorithm_kwargs: Dict, names: Sequence[str],
                       title: str, png: str, seed: int = 0):
    """For every M: ``runs`` independent Fed Zig-Zag chains (one compiled call), the marginal W1
    of every chain's draws to a NUTS reference of the pooled data (same for all M)."""
    import fedmcmc as fm
    from fedmcmc.diagnostics import wasserstein_marginal

    pooled = fm.Federation(make_clients(1))
    reference = fm.reference_posterior(model, pooled, init, method="nuts", seed=seed, **nuts)
    ref = np.asarray(reference.draws, np.float64)
    sd = ref.std(axis=0)
    # noise level of the reference itself: W1 between its two halves
    half = ref.shape[0] // 2
    floor = wasserstein_marginal(ref[:half], ref[half:2 * half])

    # start every chain at the reference mean: a unit-speed Zig-Zag needs |x* - x0| time units
    # just to reach the posterior, which the short runs here cannot afford
    import jax.numpy as jnp

    flat = model.flatten(init)
    start = flat.unravel(jnp.asarray(reference.mean, flat.dtype))
    per_m = {}
    infos = {}
    for m in workers:
        result = fm.sample(model, fm.Federation(make_clients(m)), fm.FedZigZag(interval, **algorithm_kwargs),
                           init=start, num_samples=num_samples, burn_in=burn_in, chains=runs,
                           seed=seed + m, progress=False, rate_diagnostics=False)
        draws = _flat_draws(model, init, result.samples)  # (runs, draws, d)
        per_m[m] = np.stack([wasserstein_marginal(draws[c], ref) for c in range(runs)])  # (runs, d)
        infos[m] = {k: result.info.get(k) for k in
                    ("effective_switching_rate", "events", "rejections", "bound_violations",
                     "wall_time", "redistributions")}
        infos[m]["ess_min_per_run"] = float(np.min(result.info.get("ess_batch_means", [np.nan]))) / runs

    rows = []
    for m in workers:
        w = per_m[m]
        for c in range(runs):
            rows.append([m, c, *w[c].tolist()])
    write_csv(out_dir, "w1_per_run.csv", ["M", "run", *[f"w1_{n}" for n in names]], rows)

    d = len(names)
    fig, axes = figure(ncols=min(d, 4), nrows=int(np.ceil(d / 4)), width=3.2, height=2.8)
    flat_axes = axes.ravel()
    for i in range(d):
        ax = flat_axes[i]
        ax.boxplot([per_m[m][:, i] for m in workers])
        ax.set_xticks(range(1, len(workers) + 1))
        ax.set_xticklabels([str(m) for m in workers])
        ax.axhline(floor[i], color="C2", ls=":", lw=1)
        ax.set_title(f"{names[i]}", fontsize=9)
        ax.set_xlabel("workers M", fontsize=8)
        if i % 4 == 0:
            ax.set_ylabel("marginal W1 to NUTS", fontsize=8)
    for j in range(d, len(flat_axes)):
        flat_axes[j].axis("off")
    fig.suptitle(title, fontsize=10)
    save(fig, out_dir, png)
    return reference, per_m, infos, sd, floor


def _flat_draws(model, init, samples):
    import jax

    ravel = model.flatten(init).ravel
    return np.asarray(jax.vmap(jax.vmap(ravel))(samples), np.float64)


def summary_table(workers, per_m, sd, floor, names) -> str:
    lines = ["| M | " + " | ".join(f"W1 {n} (median over runs)" for n in names) + " | mean W1 / posterior sd |",
             "|---|" + "---|" * (len(names) + 1)]
    for m in workers:
        med = np.median(per_m[m], axis=0)
        lines.append(f"| {m} | " + " | ".join(f"{v:.3f}" for v in med)
                     + f" | {np.mean(per_m[m] / sd):.3f} |")
    lines.append("| reference half vs half | " + " | ".join(f"{v:.3f}" for v in floor) + " | |")
    return "\n".join(lines)


def verdict_numbers(workers, per_m, sd):
    """Mean over runs and coordinates of W1 / posterior sd, per M; the largest ratio to M = min."""
    score = np.array([np.mean(per_m[m] / sd) for m in workers])
    return score, float(score.max() / score[0])


def ess_sentence(workers, infos) -> str:
    """Batch-means ESS per run (smallest coordinate) and switching rate at every M: the Monte Carlo
    error behind W1 at a fixed horizon T (Remark 4.1: higher rates, more diffusive paths)."""
    parts = [f"M={m}: ESS {infos[m]['ess_min_per_run']:.0f}, rate {infos[m]['effective_switching_rate']:.0f}"
             for m in workers]
    return ("Smallest batch-means ESS per run and switching rate: " + "; ".join(parts) + ". Any rise "
            "of W1 with M at a fixed T goes with the falling ESS per unit time (Remark 4.1), i.e. "
            "Monte Carlo error, not a bias; the paper's runs are longer (T = 100).")
