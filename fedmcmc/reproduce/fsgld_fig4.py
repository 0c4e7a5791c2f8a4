"""FSGLD Figure 4: the constants epsilon_s^2 (FSGLD bound) against gamma_s^2 (DSGLD bound) on a grid."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from . import register
from ._common import Clock, figure, save, write_csv, write_json, write_readme

NAME = "fsgld-fig4"


@register(NAME, "FSGLD Fig. 4: epsilon_s^2 vs gamma_s^2 on a grid (section 5.1 model, Appendix E)")
def run(out_dir: Path, quick: bool) -> None:
    import fedmcmc as fm
    from fedmcmc.models.synthetic import delayed_communication_data

    clock = Clock()
    federation = delayed_communication_data(seed=0)
    model = fm.models.gaussian_mean(2)
    total = federation.total_size
    side = 41 if quick else 201
    axis = np.linspace(-6.0, 6.0, side)
    grid = jnp.asarray(np.stack(np.meshgrid(axis, axis), -1).reshape(-1, 2), jnp.float32)

    per_example_grad = jax.vmap(jax.grad(model.log_likelihood), in_axes=(None, 0))

    def constants(x, q_mean, q_precision):
        n = x.shape[0]

        def at(theta):
            g = per_example_grad(theta, x)  # (n, d): grad log p(x_i | theta)
            sq = jnp.sum(g**2, axis=1)
            grad_q = q_precision * (q_mean - theta)  # grad log q_s, q_s = N(q_mean, q_precision^-1 I)
            eps = jnp.mean(jnp.sum((g - grad_q / n) ** 2, axis=1))
            return sq.max(), sq.mean(), eps

        gamma_max, gamma_mean, eps = jax.lax.map(at, grid)
        return float(gamma_max.max()), float(gamma_mean.max()), float(eps.max())

    rows = []
    for s, client in enumerate(federation.clients):
        x = jnp.asarray(client)
        n_s = x.shape[0]
        mean_s = jnp.mean(x, axis=0)
        g_max, g_mean, eps_exact = constants(x, mean_s, float(n_s))  # exact factor N(xbar_s, n_s^-1 I)
        _, _, eps_printed = constants(x, mean_s, float(total))  # as printed: N(xbar_s, N^-1 I)
        rows.append([s, g_max, g_mean, eps_exact, eps_printed])
    rows = np.asarray(rows)

    fig, axes = figure(width=7, height=4.2)
    ax = axes[0, 0]
    idx = np.arange(len(rows))
    w = 0.2
    ax.bar(idx - 1.5 * w, rows[:, 1], w, label="gamma_s^2 (Assumption 1: max over theta and x_i)")
    ax.bar(idx - 0.5 * w, rows[:, 2], w, label="gamma_s^2, average over x_i (max over theta)")
    ax.bar(idx + 0.5 * w, rows[:, 3], w, label="epsilon_s^2, q_s = N(xbar_s, n_s^-1 I) (exact)")
    ax.bar(idx + 1.5 * w, rows[:, 4], w, label="epsilon_s^2, q_s = N(xbar_s, N^-1 I) (as printed)")
    ax.set_yscale("log")
    ax.set_xlabel("client s")
    ax.set_ylabel("constant (grid approximation, theta in [-6, 6]^2)")
    ax.set_xticks(idx)
    ax.legend(fontsize=7)
    ax.set_title("Fig. 4: epsilon_s^2 vs gamma_s^2")
    save(fig, out_dir, "fig4_constants.png")
    write_csv(out_dir, "constants.csv",
              ["client", "gamma2_max", "gamma2_mean", "epsilon2_exact_surrogate", "epsilon2_printed_surrogate"],
              rows.tolist())
    ratio = rows[:, 1] / rows[:, 3]
    ratio_mean = rows[:, 2] / rows[:, 3]
    held = bool(np.all(rows[:, 3] * 10 < rows[:, 2]))
    held_printed = bool(np.all(rows[:, 4] < rows[:, 2]))
    write_json(out_dir, "results.json", {"grid_side": side, "grid_range": [-6, 6],
                                         "rows": rows, "claim_held": held,
                                         "claim_held_with_printed_surrogate": held_printed})
    table = "| client | gamma_s^2 (max) | gamma_s^2 (avg over x_i) | eps_s^2 (exact q_s) | eps_s^2 (printed q_s) |\n|---|---|---|---|---|\n"
    table += "\n".join(f"| {int(r[0])} | {r[1]:.1f} | {r[2]:.1f} | {r[3]:.2f} | {r[4]:.1f} |" for r in rows)
    write_readme(
        out_dir, name=NAME, quick=quick, seconds=clock(), table=table,
        title="FSGLD Figure 4: epsilon_s^2 against gamma_s^2",
        paper="Figure 4 (section 5.1 model): grid approximations show epsilon_s^2 << gamma_s^2 for "
              "every shard s, consistent with CG-DSGLD's lower MSE in Figure 3b.",
        ours=f"On a {side} x {side} grid over [-6, 6]^2, with the exact surrogates epsilon_s^2 is "
             f"{ratio.min():.0f} to {ratio.max():.0f} times smaller than gamma_s^2 (Assumption 1) and "
             f"{ratio_mean.min():.0f} to {ratio_mean.max():.0f} times smaller than its average-over-x_i "
             "version. With exact Gaussian surrogates epsilon_s^2 does not depend on theta: it is the "
             "within-client scatter (1/N_s) sum ||x_i - xbar_s||^2 (about d = 2). With the surrogate as "
             "printed in the early version (precision N instead of n_s) epsilon_s^2 grows with the "
             f"distance to xbar_s and is {'still' if held_printed else 'not'} below the average gamma_s^2 "
             "for every client. Plot: `fig4_constants.png`.",
        differences="The paper does not give its grid; we use theta on [-6, 6]^2 (the square the "
                    "client means are drawn from), so the gamma values depend on that choice. "
                    "epsilon_s^2 is the Appendix E definition (5a) maximised over the grid; gamma_s^2 "
                    "is Assumption 1's bound (max over theta and examples), with the average over "
                    "examples shown too because (5a) averages over examples.",
        verdict=("Yes: epsilon_s^2 is more than an order of magnitude below gamma_s^2 for every client."
                 if held else "No: epsilon_s^2 is not far below gamma_s^2 for every client."),
        files=["fig4_constants.png", "constants.csv", "results.json"],
    )
