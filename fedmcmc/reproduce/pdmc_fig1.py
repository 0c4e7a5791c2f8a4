"""Fed-PDMC Figure 1: switching rate of the Federated Zig-Zag against the number of workers M."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import register
from ._common import Clock, figure, save, write_csv, write_json, write_readme

NAME = "pdmc-fig1"


def expected_rates(y: np.ndarray, num_workers: int, draws: int = 20_000, seed: int = 1):
    """Stationary expected federated and canonical Zig-Zag rates for the flat-prior Gaussian
    model with unit covariance (Section 6.1): under pi x Uniform(v) the rate of coordinate k is
    sum_m (v_k n_m (x_k - ybar_{m,k}))_+, whose expectation is (1/2) sum_m n_m E|x_k - ybar_{m,k}|
    with x ~ N(ybar, I/N). Monte Carlo over x."""
    n, d = y.shape
    rng = np.random.default_rng(seed)
    x = y.mean(axis=0) + rng.standard_normal((draws, d)) / np.sqrt(n)
    fed = 0.0
    for block in np.array_split(y, num_workers):
        fed += 0.5 * np.abs(len(block) * (x - block.mean(axis=0))).sum(axis=1).mean()
    can = 0.5 * np.abs(n * (x - y.mean(axis=0))).sum(axis=1).mean()
    return float(fed), float(can)


@register(NAME, "Fed-PDMC Fig. 1: Fed Zig-Zag switching rate against M with the sqrt(N M) curve (Gaussian, N=50, d=10)")
def run(out_dir: Path, quick: bool) -> None:
    import fedmcmc as fm
    from fedmcmc.pdmp import models

    clock = Clock()
    d, n, alpha = 10, 50, 1.0
    workers = (1, 25) if quick else (1, 2, 5, 10, 25, 50)
    chains = 5 if quick else 20
    num_samples, interval = (6, 0.5) if quick else (20, 0.5)
    y = models.gaussian_data(0, n, 0.5 * np.ones(d), alpha ** 2 * np.eye(d))
    model = models.gaussian_model(alpha ** 2 * np.eye(d))  # flat prior, as in the paper

    rows = []
    per_run = {}
    for m in workers:
        clients = np.array_split(y, m)
        result = fm.sample(model, fm.Federation(clients), fm.FedZigZag(sample_interval=interval),
                           init=np.full(d, 0.5, np.float32), num_samples=num_samples, burn_in=2,
                           chains=chains, seed=m, progress=False)
        info = result.info
        # rate per run (chain): velocity changes per unit time, from the per-draw diagnostics
        per_chain = np.nanmean(np.asarray(result.sample_stats["rate_federated"]), axis=1)
        per_run[m] = per_chain
        fed, can = expected_rates(y, m)
        rows.append([m, info["effective_switching_rate"], float(per_chain.mean()),
                     float(per_chain.std(ddof=1)), float(np.nanmean(result.sample_stats["rate_canonical"])),
                     fed, can, alpha * d * np.sqrt(n * m)])

    rows = np.asarray(rows, dtype=float)
    header = ["M", "effective_switching_rate", "mean_rate_over_runs", "sd_rate_over_runs",
              "canonical_rate_measured", "expected_rate_exact", "expected_canonical_rate",
              "paper_curve_sigma0_sqrt_NM"]
    write_csv(out_dir, "switching_rate.csv", header, rows.tolist())

    fig, axes = figure(ncols=1, width=6.0, height=4.5)
    ax = axes[0, 0]
    grid = np.linspace(1, max(workers), 200)
    ax.plot(grid, alpha * d * np.sqrt(n * grid), "k-", label=r"paper: $\sigma_0\sqrt{NM}$, $\sigma_0=\alpha d$")
    ax.plot(rows[:, 0], rows[:, 5], "C2--", label="exact expected rate for this data set")
    ax.plot(rows[:, 0], rows[:, 6], "C7:", label="canonical (non-federated) rate")
    for j, m in enumerate(workers):
        ax.plot(np.full(len(per_run[m]), m), per_run[m], "o", color="C0", ms=3, alpha=0.5,
                label=f"{chains} runs (rate at draws, averaged per run)" if j == 0 else None)
    ax.plot(rows[:, 0], rows[:, 1], "C3s", ms=6, label="effective switching rate (all runs)")
    ax.set_xlabel("number of workers M")
    ax.set_ylabel("switching rate (events per unit time)")
    ax.set_title(f"Federated Zig-Zag, Gaussian N={n}, d={d}, flat prior")
    ax.legend(fontsize=7)
    save(fig, out_dir, "switching_rate.png")

    measured = rows[:, 1]
    rel = np.abs(measured - rows[:, 5]) / rows[:, 5]
    below_bound = bool(np.all(measured <= rows[:, 7] * 1.05))
    big = rows[:, 0] >= 5
    slope = float(np.polyfit(np.log(rows[big, 0]), np.log(measured[big]), 1)[0]) if big.sum() >= 2 else float("nan")
    held = bool(np.all(rel < 0.15) and below_bound and np.all(np.diff(measured) > 0))
    write_json(out_dir, "results.json", {
        "workers": list(workers), "chains": chains, "process_time_per_run": num_samples * interval,
        "effective_switching_rate": measured, "expected_rate_exact": rows[:, 5],
        "paper_curve": rows[:, 7], "relative_error_vs_expected": rel, "rate_per_run": per_run,
        "loglog_slope_M_ge_5": slope, "below_paper_curve": below_bound, "claim_held": held})
    table = "\n".join(
        ["| M | measured rate | expected (exact, this data) | paper curve sigma0 sqrt(NM) | canonical |",
         "|---|---|---|---|---|"] +
        [f"| {int(r[0])} | {r[1]:.1f} | {r[5]:.1f} | {r[7]:.1f} | {r[6]:.1f} |" for r in rows])
    write_readme(
        out_dir, name=NAME, quick=quick, seconds=clock(),
        title="Fed-PDMC Figure 1: switching rate against the number of workers",
        paper="Figure 1 (Section 6.1): N = 50 observations of a d = 10 Gaussian with Sigma = I, "
              "flat prior, split equally over M workers; the mean switching rate of 20 runs of the "
              "Federated Zig-Zag against M shows \"good agreement between experiment and theory\", "
              "the theory curve being sigma_0 sqrt(N M) with sigma_0 = alpha d (Section 4.1, Appendix B).",
        ours=f"Effective switching rate (velocity changes per unit process time, {chains} runs of "
             f"T = {num_samples * interval:g} each after burn-in 1) grows from {measured[0]:.0f} at M = "
             f"{workers[0]} to {measured[-1]:.0f} at M = {workers[-1]}; log-log slope for M >= 5: "
             f"{slope:.2f} (sqrt: 0.5). It matches the exact stationary expected rate of this data set "
             f"(green; (1/2) sum_k sum_m n_m E|x_k - ybar_mk| under the posterior) within "
             f"{100 * rel.max():.1f}%, and stays below the paper's curve sigma_0 sqrt(NM), which is the "
             f"upper bound of Appendix B (it drops the factors 1/2 for v and sqrt(2/pi) for E|Z|, "
             f"so the measured rate is about 0.4 of it for large M). See `switching_rate.png`.",
        table=table,
        differences="Our 'runs' are independent chains on one data set (seed 0); the paper does not say "
                    "whether its runs redraw the data. The rate is measured over a short horizon per run "
                    f"(T = {num_samples * interval:g}; the paper does not state its T). The paper's "
                    "curve is drawn as stated; we add the exact expected rate, which the paper's "
                    "bound is a constant factor above." + (" Quick size: 2 values of M, 5 runs." if quick else ""),
        verdict=("Yes: the rate grows like sqrt(N M) and agrees with the theory (exactly with the "
                 "expected rate; within the paper's sigma_0 sqrt(NM) bound)." if held else
                 "Not fully: see the table (measured vs expected rate, monotonicity, the bound)."),
        files=["switching_rate.png", "switching_rate.csv", "results.json"],
    )
