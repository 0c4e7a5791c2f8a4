"""The cost of Fed-PDMC's per-event privacy in accuracy (issue 47; docs/guide/privacy.md's table).

On the contraception federation (mlmRev Contraception, 60 districts, logistic regression,
NUTS reference on the pooled rows), Fed Zig-Zag without privacy and with
``privacy=(epsilon, delta)`` *per communicated event time* (Theorem 5.1; ``--epsilons``, per
event delta ``--delta``): the largest |z| of the posterior means and the range of the sd
ratios against the reference, with the run's composed guarantee
(``info["privacy"]``: the per-event pair composed over every time each worker proposed).

The sensitivity K of Theorem 5.1 for Zig-Zag on logistic regression: replacing one row
(xi, eta) of a worker by (xi', eta') moves coordinate j's rate (v_j d_j U_m)^+ by at most
|xi_j| + |xi'_j| (|v_j| = 1, |sigma(.) - eta| <= 1), so the worker's rate, the sum over the
coordinates, by at most ``K = 2 max_i ||xi_i||_1`` (Example 5.2's label flip with ||v|| = 1
gives max ||xi||_2; Zig-Zag's velocities have |v_j| = 1, so the 1-norm).

Every run has the same budget of event rounds per chain (``--rounds``: the communication):
the sample interval is that budget over the draws (burn-in included) and the expected round
rate, the non-private run's measured rate plus M rho (for the table only: the non-private
rate reads the rows). Control variates are off in every row (``privacy=`` turns them off: their
shifts read the rows outside Theorem 5.1's events).

    python benchmarks/bench_privacy_pdmc.py [--rounds 40000] [--samples 100] [--epsilons 8,1]
        [--delta 1e-12]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

import fedmcmc as fm
from fedmcmc.pdmp import privacy as pdmp_privacy
from fedmcmc.bench import problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40000,
                        help="event rounds per chain, burn-in included (about: the rate is "
                             "estimated)")
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--burn-in", type=int, default=25, help="draws")
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--epsilons", default="8,1", help="comma-separated per-event budgets")
    parser.add_argument("--delta", type=float, default=1e-12, help="per-event delta")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    instance = problems.get("contraception").build()
    x, _, _ = problems.contraception_rows()
    sensitivity = 2.0 * float(np.max(np.sum(np.abs(x), axis=1)))
    num_workers = instance.federation.num_clients
    reference = fm.reference_posterior(instance.model, instance.federation, instance.init,
                                       method=instance.reference_method, num_samples=5000,
                                       chains=4)
    mean, sd = np.asarray(reference.mean), np.asarray(reference.sd)
    draws_per_chain = args.samples + args.burn_in
    budgets = [float(e) for e in args.epsilons.split(",") if e.strip()]
    # the non-private run's round rate: a short pilot of the same sampler
    pilot = fm.sample(instance.model, instance.federation,
                      fm.FedZigZag(1.0, control_variates=False), init=instance.init,
                      num_samples=10, burn_in=0, thin=1, chains=args.chains, seed=2,
                      progress=False)
    plain_rate = pilot.info["event_iterations"] / pilot.info["process_time"]
    print(f"K = {sensitivity:.3f}, M = {num_workers}, non-private round rate "
          f"{plain_rate:.1f} per unit time", flush=True)
    rows = []
    for epsilon in [None] + budgets:
        started = time.perf_counter()
        rho = 0.0 if epsilon is None else pdmp_privacy.rho_for_privacy(
            epsilon, args.delta, sensitivity)
        interval = args.rounds / (draws_per_chain * (plain_rate + num_workers * rho))
        privacy = {} if epsilon is None else dict(privacy=(epsilon, args.delta),
                                                  sensitivity=sensitivity)
        result = fm.sample(instance.model, instance.federation,
                           fm.FedZigZag(interval, control_variates=False, **privacy),
                           init=instance.init, num_samples=args.samples, burn_in=args.burn_in,
                           thin=1, chains=args.chains, seed=1, progress=False)
        draws = result.flat_samples().reshape(-1, instance.dim)
        z = (draws.mean(axis=0) - mean) / sd
        ratio = draws.std(axis=0) / sd
        p = result.info.get("privacy")
        rounds = result.info["event_iterations"] / args.chains
        rows.append(("FedZigZag", "none" if epsilon is None else f"{epsilon:g}",
                     f"{np.max(np.abs(z)):.2f}", f"{ratio.min():.2f}-{ratio.max():.2f}",
                     f"{rho:.1f}", f"{interval:.3g}", f"{rounds:.0f}",
                     "-" if p is None else f"{max(p['epsilon']):.3g}",
                     "-" if p is None else f"{p['delta']:.2g}"))
        print(rows[-1], f"{time.perf_counter() - started:.0f} s", flush=True)
    print("\n| algorithm | epsilon per event | max abs z | sd ratio | rho per worker "
          "| sample interval | event rounds per chain | composed epsilon (max) "
          "| composed delta |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
