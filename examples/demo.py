"""FSGLD against DSGLD on the delayed-communication problem (FSGLD paper, section 5.1).

Ten clients hold 200 points each from N(mu_s, I), mu_s uniform on [-6, 6]^2;
we infer the global mean under a N(0, I) prior. The chain takes 1, 20 or 200
local steps on a client before it is handed on. DSGLD drifts towards each
client's local posterior during a visit and ends up sampling a mixture of
them; FSGLD's conducive gradients keep it on the global posterior.

Run:  python examples/demo.py [--out DIR] [--quick]
Prints each method's distance to the exact posterior and saves a plot like
the paper's Figure 2.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np

import fedmcmc as fm


def make_problem(seed: int = 0, clients: int = 10, size: int = 200):
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-6, 6, size=(clients, 2))
    data = [rng.normal(c, 1.0, size=(size, 2)).astype(np.float32) for c in centres]
    model = fm.Model(
        log_prior=lambda mu: -0.5 * jnp.sum(mu**2),
        log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2),
        name="gaussian_mean",
    )
    return model, fm.Federation(data)


def exact_posterior(federation):
    precision = federation.total_size + 1.0
    return federation.pooled().sum(axis=0) / precision, np.eye(2) / precision


def gaussian_w2(mean_a, cov_a, mean_b, cov_b) -> float:
    """2-Wasserstein distance between two Gaussians."""
    from scipy.linalg import sqrtm

    root_b = sqrtm(cov_b)
    cross = sqrtm(root_b @ cov_a @ root_b)
    value = np.sum((mean_a - mean_b) ** 2) + np.trace(cov_a + cov_b - 2 * np.real(cross))
    return float(np.sqrt(max(value, 0.0)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="demo_output", help="folder for the plot")
    parser.add_argument("--quick", action="store_true", help="fewer draws (a few seconds)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    model, federation = make_problem()
    mean, covariance = exact_posterior(federation)
    num_samples = 200 if args.quick else 500
    settings = dict(init=jnp.zeros(2), num_samples=num_samples, burn_in=200, thin=100, chains=4, seed=0)
    print(f"exact posterior mean {np.round(mean, 4)}, sd {np.sqrt(covariance[0, 0]):.4f}")
    print(f"{'method':<8}{'local steps':>12}{'|mean error|':>14}{'sd ratio':>10}{'W2':>10}{'time (s)':>10}")

    draws = {}
    for local_steps in (1, 20, 200):
        for name, algorithm in (
            ("DSGLD", fm.DSGLD(step_size=1e-4, batch_size=10, local_steps=local_steps)),
            ("FSGLD", fm.FSGLD(step_size=1e-4, batch_size=10, local_steps=local_steps, surrogate="exact")),
        ):
            started = time.perf_counter()
            result = fm.sample(model, federation, algorithm, **settings)
            elapsed = time.perf_counter() - started
            flat = result.flat_samples().reshape(-1, 2)
            fit_mean, fit_cov = flat.mean(axis=0), np.cov(flat.T)
            draws[(name, local_steps)] = flat
            print(
                f"{name:<8}{local_steps:>12}{np.linalg.norm(fit_mean - mean):>14.4f}"
                f"{np.sqrt(np.mean(np.diag(fit_cov)) / covariance[0, 0]):>10.2f}"
                f"{gaussian_w2(fit_mean, fit_cov, mean, covariance):>10.4f}{elapsed:>10.1f}"
            )

    print(
        "note: with the paper's h = 1e-4 and m = 10, minibatch noise inflates every sampler's sd\n"
        "      (FSGLD's by the factor sqrt(1 + h sigma^2 / 4) ~ 3.4); DSGLD's spread across clients is\n"
        "      the drift to local posteriors that grows with the local steps."
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(12, 8), sharex=True, sharey=True)
    colours = plt.cm.tab10(np.arange(federation.num_clients))
    for row, name in enumerate(("DSGLD", "FSGLD")):
        for col, local_steps in enumerate((1, 20, 200)):
            ax = axes[row, col]
            for s, client in enumerate(federation.clients):
                ax.scatter(client[:, 0], client[:, 1], s=3, color=colours[s], alpha=0.3)
            flat = draws[(name, local_steps)]
            ax.scatter(flat[:, 0], flat[:, 1], s=2, color="black", label="posterior draws")
            ax.scatter(*mean, marker="x", color="red", s=80, label="exact posterior mean")
            ax.set_title(f"{name} ({local_steps} local step{'s' if local_steps > 1 else ''})")
            ax.set_xlabel(r"$\mu_1$")
            ax.set_ylabel(r"$\mu_2$")
    axes[0, 0].legend(loc="upper left", fontsize=8)
    fig.suptitle("Global-mean posterior draws: DSGLD drifts to a mixture of local posteriors; FSGLD does not")
    fig.tight_layout()
    path = out / "fsgld_vs_dsgld.png"
    fig.savefig(path, dpi=120)
    print(f"plot saved to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
