"""step_size="auto" against hand-picked step sizes on real federations (issue 15).

For each problem (real data, natural groupings, very unequal clients: mlmRev Exam by school,
mlmRev Contraception by district) and each of SGLD, DSGLD and FSGLD, runs

* ``step_size="auto"`` (the library's choice, control variates on where it chose them);
* a grid of hand-picked h around it (auto x 1/10 .. 10), without control variates, as a user
  without "auto" would run;
* FSGLD at the automatic h with control variates forced off (the effect of the variance
  reduction alone),
* with ``--variance-reduction``, DSGLD and FSGLD under "auto" with each variance reduction
  forced: control variates anchored at the global Laplace mode, at each client's own mode,
  none; client selection f_s proportional to size or chosen for variance. The set-up's
  predicted step-size gain of each (``info``) is printed with the accuracy it reached,

each for the same number of iterations per chain, and prints the accuracy against the
exact or NUTS posterior (max |z| of the means in posterior sd, sd ratios) and the wall time.
"Reaches accuracy" is max |z| < 0.15 with sd ratios in [0.85, 1.15] (issue 15's criterion).

    python benchmarks/bench_auto_step.py [--quick] [--iterations N] [--variance-reduction]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

import fedmcmc as fm
from fedmcmc.bench import problems
from fedmcmc.langevin.algorithms import StepSizeWarning


def accuracy(result, mean, sd, dim):
    draws = result.flat_samples().reshape(-1, dim)
    z = (draws.mean(axis=0) - mean) / sd
    ratio = draws.std(axis=0) / sd
    ok = bool(np.all(np.abs(z) < 0.15) and np.all((ratio > 0.85) & (ratio < 1.15)))
    return float(np.max(np.abs(z))), float(ratio.min()), float(ratio.max()), ok


def run(instance, algorithm, iterations, mean, sd):
    num_samples = 500
    thin = max(1, iterations // (2 * num_samples))
    started = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", StepSizeWarning)
            result = fm.sample(instance.model, instance.federation, algorithm, init=instance.init,
                               num_samples=num_samples, burn_in=num_samples, thin=thin, chains=4,
                               seed=0, progress=False)
    except fm.SamplingDivergedError:
        return None, time.perf_counter() - started
    return result, time.perf_counter() - started


#: the variance reductions, each forced, under step_size="auto" (--variance-reduction)
VARIANCE_REDUCTIONS = (
    ("auto, cv global, f_s size", dict(control_variates="global", client_selection="proportional")),
    ("auto, cv client, f_s size", dict(control_variates="client", client_selection="proportional")),
    ("auto, cv none, f_s size", dict(control_variates=False, client_selection="proportional")),
    ("auto, cv none, f_s variance", dict(control_variates=False, client_selection="variance")),
    ("auto, cv global, f_s variance", dict(control_variates="global", client_selection="variance")),
)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one problem, a short run")
    parser.add_argument("--iterations", type=int, default=None,
                        help="iterations per chain (default 400,000; --quick 100,000)")
    parser.add_argument("--variance-reduction", action="store_true",
                        help="also each variance reduction forced on and off under 'auto'")
    args = parser.parse_args()
    iterations = args.iterations or (100_000 if args.quick else 400_000)
    names = ["exam-schools"] if args.quick else ["exam-schools", "contraception"]
    makers = {
        "SGLD": lambda h, **kw: fm.SGLD(step_size=h, batch_size=10, **kw),
        "DSGLD": lambda h, **kw: fm.DSGLD(step_size=h, batch_size=10, local_steps=20, **kw),
        "FSGLD": lambda h, **kw: fm.FSGLD(step_size=h, batch_size=10, local_steps=20, **kw),
    }
    print(f"{iterations:,} iterations per chain, 4 chains; batch 10, 20 local steps")
    print(f"{'problem':14s} {'algorithm':6s} {'setting':46s} {'h':>10s} {'max|z|':>7s} "
          f"{'sd ratio':>13s} {'ok':>3s} {'seconds':>8s}")
    for name in names:
        instance = problems.get(name).build()
        reference = fm.reference_posterior(
            instance.model, instance.federation, instance.init, method=instance.reference_method,
            num_samples=5000 if instance.reference_method == "nuts" else 20000, chains=4)
        mean, sd = np.asarray(reference.mean), np.asarray(reference.sd)
        for label, make in makers.items():
            rows = []
            result, seconds = run(instance, make("auto"), iterations, mean, sd)
            auto_h = result.info["step_size"] if result is not None else None
            rows.append(("auto" + (f" + control variates {result.info['control_variates']}"
                                   if result is not None and result.info.get("control_variates")
                                   else "")
                          + (" + f_s variance" if result is not None
                             and result.info.get("client_selection") == "variance" else ""),
                         auto_h, result, seconds))
            if auto_h is not None:
                for factor in (0.1, 0.3, 3.0, 10.0):
                    kwargs = {"control_variates": False} if label != "SGLD" else {}
                    result, seconds = run(instance, make(auto_h * factor, **kwargs), iterations,
                                          mean, sd)
                    rows.append((f"hand-picked auto x {factor:g}", auto_h * factor, result, seconds))
                if label == "FSGLD":
                    result, seconds = run(instance, make(auto_h, control_variates=False),
                                          iterations, mean, sd)
                    rows.append(("auto h, control variates off", auto_h, result, seconds))
            if args.variance_reduction and label != "SGLD":
                for setting, kwargs in VARIANCE_REDUCTIONS:
                    result, seconds = run(instance, make("auto", **kwargs), iterations, mean, sd)
                    h = result.info["step_size"] if result is not None else None
                    if result is not None and "client_selection_step_gain" in result.info:
                        setting += f" (h x{result.info['client_selection_step_gain']:.3g})"
                    rows.append((setting, h, result, seconds))
            for setting, h, result, seconds in rows:
                if result is None:
                    print(f"{name:14s} {label:6s} {setting:46s} {h or float('nan'):10.3g} "
                          f"{'diverged':>25s} {seconds:8.1f}")
                    continue
                worst, low, high, ok = accuracy(result, mean, sd, instance.dim)
                print(f"{name:14s} {label:6s} {setting:46s} {h:10.3g} {worst:7.3f} "
                      f"{low:6.3f}-{high:5.3f} {'yes' if ok else 'no':>3s} {seconds:8.1f}")


if __name__ == "__main__":
    main()
