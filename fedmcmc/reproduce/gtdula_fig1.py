"""GT-DULA Figure 1 (a)-(d): the 1-D Gaussian problem of section 5.1 on a ring of 5 agents."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import register
from ._common import Clock, figure, save, write_json, write_readme

NAME = "gtdula-fig1"
SIGMAS = [10.0, 5.0, 16.0, 2.0, 18.0]
SIGMA_THETA = 1.0
PER_AGENT = 80
BETA = GAMMA = 0.2


def problem_data(seed=2025):
    rng = np.random.default_rng(seed)
    return [rng.normal(0.5, s, PER_AGENT) for s in SIGMAS]


def gaussian_model_and_federation(data):
    import jax.numpy as jnp

    import fedmcmc as fm

    clients = [{"x": x.astype(np.float32), "sigma": np.full(x.shape[0], s, np.float32)}
               for x, s in zip(data, SIGMAS)]
    model = fm.Model(
        log_prior=lambda th: -0.5 * jnp.sum(th**2) / SIGMA_THETA**2,
        log_likelihood=lambda th, ex: -0.5 * jnp.sum((ex["x"] - th) ** 2) / ex["sigma"] ** 2,
    )
    return model, fm.Federation(clients)


def _fitted_kl(draws, post_mean, post_var):
    """KL(N(fit over chains) || posterior) at every draw; draws (chains, draws)."""
    m = draws.mean(0)
    v = draws.var(0, ddof=1)
    return 0.5 * (v / post_var + (m - post_mean) ** 2 / post_var - 1 + np.log(post_var / v))


@register(NAME, "GT-DULA Fig. 1(a)-(d): KL vs iterations (Lyapunov oracle and simulation), minibatches, step-size reductions, gradient error")
def run(out_dir: Path, quick: bool) -> None:
    import jax.numpy as jnp

    import fedmcmc as fm
    from fedmcmc.decentralised import diagnostics as D
    from fedmcmc.decentralised import graphs

    clock = Clock()
    data = problem_data()
    quad = D.gaussian_mean_problem(data, SIGMAS, SIGMA_THETA)
    lap = graphs.topology("ring", 5).laplacian
    post_mean, post_cov = quad.posterior()
    post_mean, post_var = float(post_mean[0]), float(post_cov[0, 0])
    model, federation = gaussian_model_and_federation(data)
    alpha = 2e-3
    iterations = 300 if quick else 600
    every = 5
    chains = 500 if quick else 4000
    out = {"alpha": alpha, "beta": BETA, "gamma": GAMMA, "chains": chains}

    # (a) KL against iterations: analytical (exact moment recursion) and simulated
    curves_a = {}
    for name, gamma in (("DULA", None), ("GTDULA", GAMMA)):
        ks, kl = D.kl_trajectory(quad, lap, alpha, BETA, gamma, iterations=iterations, every=every)
        algorithm = fm.DULA(step_size=alpha, beta=BETA) if gamma is None else \
            fm.GTDULA(step_size=alpha, beta=BETA, gamma=gamma)
        result = fm.sample(model, federation, algorithm=algorithm, init=jnp.zeros(1), burn_in=0,
                           num_samples=iterations // every, thin=every, chains=chains, seed=0,
                           progress=False)
        draws = np.asarray(result.samples, np.float64)[..., 0]
        sim = _fitted_kl(draws, post_mean, post_var)
        oracle = D.stationary_distribution(quad, lap, alpha, BETA, gamma)
        curves_a[name] = (ks, kl, np.arange(1, draws.shape[1] + 1) * every, sim, oracle.kl)
        out[f"a_{name}"] = {"asymptotic_kl_oracle": oracle.kl,
                            "simulated_kl_last_quarter": float(np.mean(sim[-len(sim) // 4:]))}
    floor = 1.0 / chains  # order of the Monte Carlo floor of a fitted-Gaussian KL

    # (b) minibatch sizes, GT-DULA: analytical with the exact minibatch-noise covariance
    batches = [80, 40, 20, 10, 5]
    curves_b = {}
    for m in batches:
        noise = None if m >= PER_AGENT else D.gaussian_mean_minibatch_noise(data, SIGMAS, m)
        ks, kl = D.kl_trajectory(quad, lap, alpha, BETA, GAMMA, iterations=iterations, every=every,
                                 gradient_noise=noise)
        asym = D.stationary_distribution(quad, lap, alpha, BETA, GAMMA, gradient_noise=noise).kl
        curves_b[m] = (ks, kl, asym)
    sim_b = {}
    for m in (batches[0], batches[-1]):
        result = fm.sample(model, federation, algorithm=fm.GTDULA(step_size=alpha, beta=BETA, gamma=GAMMA,
                                                                  batch_size=m if m < PER_AGENT else None),
                           init=jnp.zeros(1), burn_in=0, num_samples=iterations // every, thin=every,
                           chains=chains, seed=1, progress=False)
        sim_b[m] = _fitted_kl(np.asarray(result.samples, np.float64)[..., 0], post_mean, post_var)
    out["b_asymptotic_kl"] = {str(m): curves_b[m][2] for m in batches}
    out["b_simulated_kl_last_quarter"] = {str(m): float(np.mean(v[-len(v) // 4:])) for m, v in sim_b.items()}

    # (c), (d) step size reduced x0.1 every `period` iterations: oracle per stage + simulated gradient error
    alphas = [alpha * 0.1**j for j in range(4)]
    stage = {name: [D.stationary_distribution(quad, lap, a, BETA, g) for a in alphas]
             for name, g in (("DULA", None), ("GTDULA", GAMMA))}
    period = 100 if quick else 200
    grad_sim = {}
    for name in ("DULA", "GTDULA"):
        algorithm = fm.DULA(step_size=alpha, beta=BETA, decay_every=period) if name == "DULA" else \
            fm.GTDULA(step_size=alpha, beta=BETA, gamma=GAMMA, decay_every=period)
        result = fm.sample(model, federation, algorithm=algorithm, init=jnp.zeros(1), burn_in=0,
                           num_samples=4 * period, thin=1, chains=50 if quick else 200, seed=2,
                           progress=False)
        # sample_stats["gradient_error"] is the norm ||d - 1 (x) u_bar||; the oracle gives E of its square
        grad_sim[name] = (np.asarray(result.sample_stats["gradient_error"], np.float64) ** 2).mean(0)
    out["c_asymptotic_kl"] = {name: [s.kl for s in v] for name, v in stage.items()}
    out["d_gradient_error_sq_oracle"] = {name: [s.gradient_error_sq for s in v] for name, v in stage.items()}
    out["d_gradient_error_simulated_end_of_stage"] = {
        name: [float(np.mean(v[(j + 1) * period - period // 4:(j + 1) * period])) for j in range(4)]
        for name, v in grad_sim.items()}
    out["alphas"] = alphas

    fig, axes = figure(ncols=2, nrows=2, width=5.4, height=4.0)
    ax = axes[0, 0]
    for name, colour in (("DULA", "C3"), ("GTDULA", "C2")):
        ks, kl, ksim, sim, asym = curves_a[name]
        ax.semilogy(ks[1:], kl[1:], color=colour, label=f"{name} analytical")
        ax.semilogy(ksim, np.maximum(sim, 1e-8), ".", ms=3, color=colour, alpha=0.6,
                    label=f"{name} simulated ({chains} chains)")
    ax.axhline(floor, color="grey", ls=":", lw=1, label="~Monte Carlo floor (1/chains)")
    ax.set_xlabel("iteration k")
    ax.set_ylabel("KL(network average || posterior)")
    ax.set_title(f"(a) full gradients, alpha = {alpha:g}")
    ax.legend(fontsize=6)
    ax = axes[0, 1]
    for j, m in enumerate(batches):
        ks, kl, asym = curves_b[m]
        ax.semilogy(ks[1:], kl[1:], color=f"C{j}", label=f"m = {m}" + (" (full)" if m == PER_AGENT else ""))
        if m in sim_b:
            ax.semilogy(np.arange(1, len(sim_b[m]) + 1) * every, np.maximum(sim_b[m], 1e-8), ".", ms=3,
                        color=f"C{j}", alpha=0.6, label=f"m = {m} simulated")
    ax.set_xlabel("iteration k")
    ax.set_ylabel("KL(network average || posterior)")
    ax.set_title("(b) GT-DULA, minibatch sizes (analytical)")
    ax.legend(fontsize=6)
    ax = axes[1, 0]
    for name, colour in (("DULA", "C3"), ("GTDULA", "C2")):
        ax.loglog(alphas, [s.kl for s in stage[name]], "o-", color=colour, label=name)
    ax.invert_xaxis()
    ax.set_xlabel("step size alpha (reduced x0.1 per stage)")
    ax.set_ylabel("asymptotic KL (Lyapunov oracle)")
    ax.set_title("(c) step-size reductions")
    ax.legend(fontsize=7)
    ax = axes[1, 1]
    for name, colour in (("DULA", "C3"), ("GTDULA", "C2")):
        ax.semilogy(np.arange(1, 4 * period + 1), grad_sim[name], color=colour, label=f"{name} simulated")
        for j, s in enumerate(stage[name]):
            ax.hlines(s.gradient_error_sq, j * period, (j + 1) * period, colors=colour, linestyles="--",
                      label=f"{name} oracle" if j == 0 else None)
    ax.set_xlabel(f"iteration (alpha x0.1 every {period})")
    ax.set_ylabel("gradient error E||d_i - global gradient||^2")
    ax.set_title("(d) gradient error under step-size reductions")
    ax.legend(fontsize=6)
    save(fig, out_dir, "fig1_gtdula.png")

    kl_d = out["a_DULA"]["asymptotic_kl_oracle"]
    kl_g = out["a_GTDULA"]["asymptotic_kl_oracle"]
    sim_d = out["a_DULA"]["simulated_kl_last_quarter"]
    sim_g = out["a_GTDULA"]["simulated_kl_last_quarter"]
    match = all(abs(np.log(s / o)) < np.log(3) for s, o in ((sim_d, kl_d), (sim_g, kl_g)) if o > 3 * floor)
    batch_monotone = all(curves_b[a][2] <= curves_b[b][2] for a, b in zip(batches, batches[1:]))
    ge_d = out["d_gradient_error_sq_oracle"]["DULA"]
    ge_g = out["d_gradient_error_sq_oracle"]["GTDULA"]
    dula_saturates = ge_d[-1] > 0.5 * ge_d[0]
    gt_reduces = all(b < 0.5 * a for a, b in zip(ge_g, ge_g[1:]))
    kl_c = all(g < d for g, d in zip(out["c_asymptotic_kl"]["GTDULA"], out["c_asymptotic_kl"]["DULA"]))
    held = bool(kl_g < kl_d and match and batch_monotone and dula_saturates and gt_reduces and kl_c)
    out.update(claim_held=held, simulation_matches_analytical=bool(match), batch_monotone=bool(batch_monotone),
               dula_gradient_error_saturates=bool(dula_saturates), gtdula_gradient_error_shrinks=bool(gt_reduces))
    write_json(out_dir, "results.json", out)
    sim_ge = out["d_gradient_error_simulated_end_of_stage"]
    table = ("| quantity | DULA | GT-DULA |\n|---|---|---|\n"
             f"| (a) asymptotic KL, oracle (alpha = {alpha:g}) | {kl_d:.2e} | {kl_g:.2e} |\n"
             f"| (a) KL of the simulation, last quarter | {sim_d:.2e} | {sim_g:.2e} |\n"
             + "".join(f"| (c) asymptotic KL at alpha = {a:.0e} | {d:.2e} | {g:.2e} |\n" for a, d, g in
                       zip(alphas, out["c_asymptotic_kl"]["DULA"], out["c_asymptotic_kl"]["GTDULA"]))
             + "".join(f"| (d) gradient error at alpha = {a:.0e}: oracle / simulated | {d:.2f} / {sd:.2f} | "
                       f"{g:.3g} / {sg:.3g} |\n" for a, d, g, sd, sg in
                       zip(alphas, ge_d, ge_g, sim_ge["DULA"], sim_ge["GTDULA"]))
             + "\n(b) GT-DULA asymptotic KL by minibatch size m: "
             + ", ".join(f"m = {m}: {curves_b[m][2]:.2e}" for m in batches) + ".")
    write_readme(
        out_dir, name=NAME, quick=quick, seconds=clock(), table=table,
        title="GT-DULA Figure 1: KL, minibatches, step-size reductions and gradient error (1-D Gaussian)",
        paper="Section 5.1: theta ~ N(0, sigma_theta^2), agent i holds 80 draws of N(theta, sigma_i^2), "
              "sigma = 10, 5, 16, 2, 18, ring of 5 agents. (a) analytical and simulated KL match, and "
              "GT-DULA has a lower bias than DULA; (b) smaller minibatches raise the bias; (c) reducing "
              "alpha x0.1 (from 1e-5, every 100 iterations) lowers GT-DULA's asymptotic KL; (d) DULA's "
              "gradient error saturates around 20 whatever alpha, GT-DULA's keeps falling with every "
              "reduction.",
        ours=f"alpha = {alpha:g}, beta = gamma = {BETA}, sigma_theta = {SIGMA_THETA}. The analytical curves "
             "are the exact moment recursion of the (linear-Gaussian) chains and the asymptotic values the "
             "Lyapunov oracle (`fedmcmc.decentralised.diagnostics`); the simulated KL is that of a Gaussian "
             f"fitted over {chains} chains at each iteration. Simulation matches analysis where the KL is "
             f"above the Monte Carlo floor (~{floor:.0e}): {bool(match)}. Bias increases as m decreases: "
             f"{bool(batch_monotone)}. DULA's gradient error stays at {ge_d[0]:.1f} -> {ge_d[-1]:.1f} over "
             f"three x0.1 reductions while GT-DULA's falls {ge_g[0]:.2g} -> {ge_g[-1]:.2g}. Plot: "
             "`fig1_gtdula.png`.",
        differences="The paper does not state sigma_theta, beta, gamma or the alpha of (a)/(b); we use "
                    f"sigma_theta = 1, beta = gamma = 0.2 and alpha = {alpha:g} (large enough that the "
                    "asymptotic KLs are resolvable by simulation); (c)-(d) start at the same alpha instead "
                    f"of 1e-5 and reduce every {period} iterations. 80 points per agent (400 in total; the "
                    "paper's text says 200). (c) is from the oracle at each stage's alpha (at alpha 1e-5 "
                    "a 100-iteration stage is far from stationary, so a simulated KL would measure the "
                    "transient, not the bias). Minibatches are drawn with replacement."
                    + (f" --quick: {chains} chains, {iterations} iterations." if quick else ""),
        verdict=("Yes: all four panels behave as the paper states." if held else
                 "Partly: see the flags in results.json (simulation_matches_analytical, batch_monotone, "
                 "dula_gradient_error_saturates, gtdula_gradient_error_shrinks)."),
        files=["fig1_gtdula.png", "results.json"],
    )
