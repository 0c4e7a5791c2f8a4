"""The cost of differential privacy in accuracy (issue 47; docs/guide/privacy.md's table).

On the exam-schools federation (mlmRev Exam, 65 schools, linear regression, exact
posterior), each family (``--algorithms``: SGLD, DSGLD, FSGLD, FALD, QLSD) without privacy
and at epsilon 8 and 1 (delta 1e-5, clip norm ``--clip``): the largest |z| of the posterior
means and the range of the sd ratios against the exact posterior, the noise inflation the
budget needed and the largest per-client epsilon spent. The step size, thin and burn-in are
those of a non-private ``"auto"`` run, and FSGLD's private runs are given the clients'
Laplace surrogates as precomputed ``(precision, shift)`` (for the table only: a private
deployment must choose h without reading the rows, and take its surrogates from public
data).

    python benchmarks/bench_privacy.py [--samples 1000] [--clip 2.0] [--algorithms SGLD,DSGLD]
        [--epsilons 8,1] [--settings-from DSGLD] [--settings H,THIN,BURN_IN]

Cost: the table's runs are long by nature, not by overhead. At 500 draws the non-private
"auto" run of FA-LD and QLSD chooses h = 6.83e-6, thin = 1,814 (the relaxation time
2 / (h lambda_min)) and a burn-in of 50 draws: each run is 4 x 550 x 1,814 = 4.0 million
chain iterations of 65 clients x 20 rows. A private iteration costs about 2.5 times the CPU
of a plain one (per-example gradients clipped, Floyd's sampling of distinct rows: its
sequential loop measured faster than the vectorised alternatives), and calibrating a private
run's noise about 40 CPU seconds (47 distinct school sizes, a bisection of about 14
accountings each). Nothing recompiles per epsilon. Every run prints its h, thin and burn-in:
``--settings`` gives them to a later run, which skips the non-private run (and its row) and
makes the private rows with the same settings and draws.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

import fedmcmc as fm
from fedmcmc.bench import problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--clip", type=float, default=2.0)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--algorithms", default="SGLD,DSGLD,FSGLD,FALD,QLSD",
                        help="comma-separated, of SGLD, DSGLD, FSGLD, FALD, QLSD")
    parser.add_argument("--epsilons", default="8,1", help="comma-separated budgets")
    parser.add_argument("--settings-from", default=None,
                        help="take h, thin and burn-in from this algorithm's non-private "
                             "'auto' run (and leave out the non-private row)")
    parser.add_argument("--settings", default=None,
                        help="H,THIN,BURN_IN of an earlier non-private 'auto' run (printed by "
                             "it): skip that run and its row")
    args = parser.parse_args()
    if args.settings and args.settings_from:
        raise ValueError("--settings and --settings-from both choose the settings: give one")
    given_settings = None
    if args.settings:
        parts = args.settings.split(",")
        if len(parts) != 3:
            raise ValueError(f"--settings must be H,THIN,BURN_IN, got {args.settings!r}")
        given_settings = (float(parts[0]), int(parts[1]), int(parts[2]))
    warnings.simplefilter("ignore")
    instance = problems.get("exam-schools").build()
    reference = fm.reference_posterior(instance.model, instance.federation, instance.init,
                                       method=instance.reference_method, num_samples=20000,
                                       chains=4)
    mean, sd = np.asarray(reference.mean), np.asarray(reference.sd)
    surrogates = fm.FSGLD(step_size=1e-6, batch_size=20, local_steps=10).fit_surrogates(
        instance.model, instance.federation, instance.init)
    given = (np.asarray(surrogates.precision), np.asarray(surrogates.shift))
    families = {
        "SGLD": lambda private, **k: fm.SGLD(batch_size=20, **k),
        "DSGLD": lambda private, **k: fm.DSGLD(batch_size=20, local_steps=10, **k),
        # the private runs: the Laplace surrogates given, no trust region (privacy refuses it)
        "FSGLD": lambda private, **k: fm.FSGLD(
            batch_size=20, local_steps=10,
            **(dict(surrogate=given, trust_radius=None) if private else {}), **k),
        "FALD": lambda private, **k: fm.FALD(batch_size=20, local_steps=10, **k),
        "QLSD": lambda private, **k: fm.QLSD(batch_size=20, **k),
    }
    chosen = [name.strip() for name in args.algorithms.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(families))
    if unknown:
        raise ValueError(f"--algorithms: unknown {unknown}, choose among {sorted(families)}")
    rows = []
    for name in chosen:
        make = families[name]
        started = time.perf_counter()
        if given_settings is None:
            source = families[args.settings_from] if args.settings_from else make
            plain = fm.sample(instance.model, instance.federation,
                              source(False, step_size="auto"), init=instance.init,
                              num_samples=args.samples, burn_in="auto", thin="auto",
                              chains=args.chains, seed=1, progress=False)
            h, thin, burn_in = (float(plain.info["step_size"]), int(plain.info["thin"]),
                                int(plain.info["burn_in"]))
        else:
            h, thin, burn_in = given_settings
        print(f"{name}: --settings {h!r},{thin},{burn_in}", flush=True)
        budgets = [float(e) for e in args.epsilons.split(",") if e.strip()]
        own_plain_row = given_settings is None and not args.settings_from
        for epsilon in ([None] if own_plain_row else []) + budgets:
            if epsilon is None:
                result = plain
            else:
                result = fm.sample(
                    instance.model, instance.federation,
                    make(True, step_size=h, privacy=fm.Privacy(
                        epsilon=epsilon, delta=1e-5, clip_norm=args.clip)),
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
            print(rows[-1], f"{time.perf_counter() - started:.0f} s", flush=True)
    print("\n| algorithm | epsilon | max abs z | sd ratio | noise inflation (max) "
          "| epsilon spent (max) | h |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
