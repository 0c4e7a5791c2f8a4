"""GT-DULA's remaining bias on a real heterogeneous federation: predicted and measured (#16).

The federation of issue 16: the Bangladesh contraception survey (mlmRev ``Contraception``,
1,934 women) split by its 60 districts (2 to 118 women), logistic regression of ``use`` on an
intercept, age/10, (age/10)^2, urban and the ``livch`` dummies, prior N(0, 5^2).

For a grid of settings (step size alpha, beta = gamma, graph, number of agents and how
heterogeneous they are) the script prints the bias of the network average that
:mod:`fedmcmc.decentralised.tuning` predicts (linearised stationary law + the agents' third
derivatives), in posterior sds: the largest over coefficients and the (age/10)^2 one. With
``--measure`` it also runs GT-DULA at a few settings (4 chains, NUTS reference on the pooled
rows) and prints the measured bias beside the prediction, with its Monte Carlo standard error.

Usage::

    python benchmarks/bench_gtdula_bias.py              # predictions only (about a minute)
    python benchmarks/bench_gtdula_bias.py --measure    # and measured runs (about 15 minutes)
"""

from __future__ import annotations

import argparse
import time

import jax.numpy as jnp
import networkx as nx
import numpy as np

import fedmcmc as fm
from fedmcmc.bench import problems
from fedmcmc.decentralised import graphs, tuning


def contraception():
    x, y, keys = problems.contraception_rows(age_per_decade=True)
    groups = [np.nonzero(keys == k)[0] for k in sorted(set(keys))]
    return x, y, groups


def groupings(groups, seed=0):
    """The districts; the same rows in 60 groups of the same sizes drawn at random (no
    heterogeneity beyond sampling); 20 agents of three neighbouring districts each."""
    rng = np.random.default_rng(seed)
    rows = rng.permutation(np.concatenate(groups))
    shuffled, start = [], 0
    for g in groups:
        shuffled.append(rows[start:start + len(g)])
        start += len(g)
    merged = [np.concatenate(groups[i:i + 3]) for i in range(0, len(groups), 3)]
    return {"60 districts": groups, "60 random groups": shuffled, "20 district triples": merged}


def graph_of(name, n):
    if name == "geometric":
        graph = nx.random_geometric_graph(n, 0.25 if n > 30 else 0.4, seed=1)
        return graph if nx.is_connected(graph) else "ring"
    return name


def setup(x, y, groups):
    federation = fm.Federation([{"x": x[g].astype(np.float32), "y": y[g].astype(np.float32)}
                                for g in groups])
    model = fm.models.logistic_regression(x.shape[1], prior_scale=5.0)
    terms, third, _ = tuning.local_terms_fn(model, jnp.zeros(x.shape[1]), federation.padded())
    mode, at_mode, _ = tuning.global_mode(terms, np.zeros(x.shape[1]))
    return model, federation, mode, at_mode, third


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measure", action="store_true", help="also run GT-DULA (slow)")
    args = parser.parse_args(argv)
    x, y, districts = contraception()
    print(f"{'agents':22s} {'graph':10s} {'lambda_2':>8s} {'alpha':>8s} {'beta=gamma':>10s} "
          f"{'max|bias|':>9s} {'age2 bias':>9s} {'consensus':>9s}")
    prepared = {}
    for label, groups in groupings(districts).items():
        model, federation, mode, at_mode, third = setup(x, y, groups)
        prepared[label] = (model, federation, mode, at_mode, third)
        n = len(groups)
        for graph_name in ["ring", "geometric", "complete"]:
            topo = graphs.topology(graph_of(graph_name, n), n)
            betas = [tuning.choose_beta(topo)]
            if graph_name == "ring":
                betas.append(0.3)
            for beta in betas:
                gamma = tuning.choose_gamma(topo, beta)
                for alpha in (4e-5, 2e-5, 1e-5, 5e-6):
                    try:
                        p = tuning.predict(mode, at_mode, third, topo.laplacian, alpha, beta, gamma)
                    except ValueError:
                        print(f"{label:22s} {graph_name:10s} {topo.lambda_2:8.4f} {alpha:8.0e} "
                              f"{beta:10.3f}  unstable")
                        continue
                    print(f"{label:22s} {graph_name:10s} {topo.lambda_2:8.4f} {alpha:8.0e} "
                          f"{beta:10.3f} {np.abs(p.bias_in_sd).max():9.3f} "
                          f"{p.bias_in_sd[2]:9.3f} {p.consensus_error:9.4f}")
    if not args.measure:
        return
    print("\nmeasured (4 chains, NUTS on the pooled rows): (age/10)^2 bias in sd")
    model, federation, mode, at_mode, third = prepared["60 districts"]
    reference = fm.reference_posterior(model, federation, jnp.zeros(7), method="nuts",
                                       num_samples=5000, num_warmup=1000, chains=4, seed=0)
    draws = np.asarray(reference.draws)
    mean, sd = draws.mean(0), draws.std(0)
    import arviz

    for graph_name, alpha, beta in [("ring", 2e-5, 0.3), ("ring", 5e-6, 0.3),
                                    ("complete", 4e-5, 1 / 60), ("geometric", 4e-5, None)]:
        topo = graphs.topology(graph_of(graph_name, 60), 60)
        beta = tuning.choose_beta(topo) if beta is None else beta
        gamma = tuning.choose_gamma(topo, beta)
        algorithm = fm.GTDULA(step_size=alpha, beta=beta, gamma=gamma,
                              graph=graph_of(graph_name, 60), spread_limit=None)
        settings = algorithm.settings(model, federation, jnp.zeros(7))
        thin = max(1, int(settings.prediction.iterations_per_effective_draw / 40))
        started = time.perf_counter()
        result = fm.sample(model, federation, algorithm, init=jnp.zeros(7), num_samples=1500,
                           burn_in=250, thin=thin, chains=4, seed=0, progress=False)
        samples = np.asarray(result.samples)
        z = (samples[..., 2].mean() - mean[2]) / sd[2]
        mcse = float(arviz.mcse(samples[..., 2], method="mean")) / sd[2]
        print(f"{graph_name:10s} alpha={alpha:.0e} beta=gamma={beta:.3f}: measured {z:+.3f} "
              f"(MCSE {mcse:.3f}), predicted {settings.prediction.bias_in_sd[2]:+.3f}, "
              f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
