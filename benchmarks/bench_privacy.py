"""The cost of differential privacy in accuracy (issue 47; docs/guide/privacy.md's table).

On the exam-schools federation (mlmRev Exam, 65 schools, linear regression, exact
posterior), SGLD and DSGLD without privacy and at epsilon 1 and 8 (delta 1e-5, clip norm
``--clip``): the largest |z| of the posterior means and the range of the sd ratios against
the exact posterior, the noise inflation the budget needed and the largest per-client
epsilon spent. The step size, thin and burn-in are those of a non-private ``"auto"`` run
(for the table only: a private deployment must choose h without reading the rows).

    python benchmarks/bench_privacy.py [--samples 1000] [--clip 2.0]
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np

import fedmcmc as fm
from fedmcmc.bench import problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--clip", type=float, default=2.0)
    parser.add_argument("--chains", type=int, default=4)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    instance = problems.get("exam-schools").build()
    reference = fm.reference_posterior(instance.model, instance.federation, instance.init,
                                       method=instance.reference_method, num_samples=20000,
                                       chains=4)
    mean, sd = np.asarray(reference.mean), np.asarray(reference.sd)
    rows = []
    for name, make in (("SGLD", lambda **k: fm.SGLD(batch_size=20, **k)),
                       ("DSGLD", lambda **k: fm.DSGLD(batch_size=20, local_steps=10, **k))):
        plain = fm.sample(instance.model, instance.federation, make(step_size="auto"),
                          init=instance.init, num_samples=args.samples, burn_in="auto",
                          thin="auto", chains=args.chains, seed=1, progress=False)
        h, thin, burn_in = (float(plain.info["step_size"]), int(plain.info["thin"]),
                            int(plain.info["burn_in"]))
        for epsilon in (None, 8.0, 1.0):
            if epsilon is None:
                result = plain
            else:
                result = fm.sample(
                    instance.model, instance.federation,
                    make(step_size=h, privacy=fm.Privacy(epsilon=epsilon, delta=1e-5,
                                                         clip_norm=args.clip)),
                    init=instance.init, num_samples=args.samples, burn_in=burn_in, thin=thin,
                    chains=args.chains, seed=1, progress=False)
            draws = result.flat_samples().reshape(-1, instance.dim)
            z = (draws.mean(axis=0) - mean) / sd
            ratio = draws.std(axis=0) / sd
            p = result.info.get("privacy")
            rows.append((name, "none" if epsilon is None else f"{epsilon:g}",
                         f"{np.max(np.abs(z)):.2f}", f"{ratio.min():.2f}-{ratio.max():.2f}",
                         "-" if p is None else f"{max(p['noise_inflation']):.2f}",
                         "-" if p is None else f"{max(p['epsilon']):.2f}", f"{h:.3g}"))
            print(rows[-1], flush=True)
    print("\n| algorithm | epsilon | max abs z | sd ratio | noise inflation (max) "
          "| epsilon spent (max) | h |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
