"""Fed-PDMC speed: fedmcmc's Zig-Zag / BPS against pdmp-jax (same run), and Fed Zig-Zag per-event cost.

    pip install --no-deps pdmp-jax==0.1.1 jax-tqdm chex toolz seaborn tqdm   # keeps the pinned jax
    python benchmarks/bench_pdmp.py [--quick]
    python benchmarks/bench_pdmp.py --quick --federated-only   # no pdmp-jax needed

Standard Gaussian targets (d = 10, 50), one worker, one chain. Both samplers
are jitted and run twice; the second (compiled) call is timed. pdmp-jax uses
its default grid bound (grid_size 10, tmax 1, float32); fedmcmc runs float64
and is timed twice: exact affine inversion (what it uses for a quadratic
potential) and Poisson thinning against the Hessian bound |H| <= I (what a
general model gets). ESS is ArviZ's bulk ESS (minimum over coordinates) of the
positions at unit time steps, computed the same way for both. Then Fed Zig-Zag
on logistic regression (N = 10,000, d = 5) with 1, 4, 16, 64 workers: wall time
per event of the compiled draw loop (in-process engine, a chain's workers side by side),
with equal client sizes and one chain, then client sizes ~ 1/rank and 4 chains; and on
Bayesian linear regression (exact event times) with sizes ~ 1/rank and 4 chains.

``--real`` (issue 48): Fed Zig-Zag, Fed BPS and Fed Boomerang on the benchmark's real
federations (``fedmcmc bench`` problems: exam-schools, 65 clients; contraception, 60;
grouseticks) with per-worker thinning (Algorithm 3) against superposition thinning (one
thinning of the summed bounds): events per second, thinning proposals per event, bulk ESS
(minimum over parameters) per second. ``sample_interval="auto"``, short runs; each run is
made twice and the second (compiled) one timed, ``info["wall_time"]``. On exam-schools (linear
regression, a quadratic potential) Zig-Zag and BPS draw exact event times: no thinning.
"""

from __future__ import annotations

import argparse
import time

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np

import fedmcmc as fm
from fedmcmc.pdmp import bps, models, zigzag


def min_ess(draws):
    draws = np.asarray(draws, dtype=np.float64)
    return min(float(az.ess(draws[None, :, i], method="bulk")) for i in range(draws.shape[1]))


def timed_twice(fn, *args):
    out = fn(*args)
    jax.block_until_ready(out)
    started = time.perf_counter()
    out = fn(*args)
    jax.block_until_ready(out)
    return out, time.perf_counter() - started


def unit_grid(t, x, v):
    grid = np.arange(1.0, t[-1])
    k = np.searchsorted(t, grid, side="right") - 1
    return x[k] + v[k] * (grid - t[k])[:, None]


def ours(kind, d, events, exact):
    with jax.enable_x64(True):
        logd = lambda x: -0.5 * jnp.sum(x * x)  # noqa: E731
        bound = None if exact else np.eye(d)
        if kind == "zigzag":
            kernel = zigzag.build_kernel(logd, exact=exact, hessian_bound=bound)
        else:
            kernel = bps.build_kernel(logd, exact=exact, hessian_bound=bound, refresh_rate=1.0)
        state = kernel.init(jnp.ones(d), jax.random.key(0))

        @jax.jit
        def run(state, keys):
            def body(s, k):
                s = kernel.step(k, s)
                return s, (s.t, s.x, s.v)

            return jax.lax.scan(body, state, keys)[1]

        (t, x, v), seconds = timed_twice(run, state, jax.random.split(jax.random.key(1), events))
    draws = unit_grid(np.asarray(t), np.asarray(x), np.asarray(v))
    return events / seconds, min_ess(draws[len(draws) // 10:]) / seconds, seconds


def theirs(kind, d, events):
    import pdmp_jax

    grad = lambda x: x  # noqa: E731  U = |x|^2 / 2
    if kind == "zigzag":
        sampler = pdmp_jax.ZigZag(d, grad, grid_size=10, tmax=1.0)
    else:
        sampler = pdmp_jax.BouncyParticle(d, grad, grid_size=10, tmax=1.0, refresh_rate=1.0)
    run = jax.jit(lambda x0, v0: sampler.sample_skeleton(events, x0, v0, 1, verbose=False))
    out, seconds = timed_twice(run, jnp.ones(d), jnp.ones(d))
    draws = unit_grid(np.asarray(out.t), np.asarray(out.x), np.asarray(out.v))
    return events / seconds, min_ess(draws[len(draws) // 10:]) / seconds, seconds


def per_event_cost(workers, draws, unequal=False, chains=1, exact=False):
    """Seconds per event, events per unit time, rejections and thinning proposals per event
    of Fed Zig-Zag's compiled draw loop. ``unequal``: client sizes proportional to 1/rank
    (Zipf) instead of equal; ``chains`` vmapped (they advance in lock-step). ``exact``:
    Bayesian linear regression (a quadratic potential: exact event times, no thinning)
    instead of logistic regression."""
    if exact:
        rows, _ = fm.models.synthetic.linear_regression_data(10_000, 5, noise_std=1.0, seed=0)
        clients = [rows] if unequal else [
            {k: v for k, v in zip(rows, parts)}
            for parts in zip(*(np.array_split(value, workers) for value in rows.values()))]
        model = fm.models.linear_regression(5, noise_std=1.0)
    else:
        clients, _ = models.logistic_data(0, 10_000, 5, num_workers=1 if unequal else workers)
        model = models.logistic_model()
    if unequal:
        weights = 1.0 / np.arange(1, workers + 1)
        bounds = np.round(np.cumsum(weights) / weights.sum() * 10_000).astype(int)[:-1]
        clients = [{k: v for k, v in zip(clients[0], parts)}
                   for parts in zip(*(np.split(value, bounds) for value in clients[0].values()))]
    fed = fm.Federation(clients)
    alg = fm.FedZigZag(sample_interval=0.01)
    with jax.enable_x64(True):
        cfg, draw_step, states, key, *_ = alg.build(model, fed,
                                                    np.zeros(5, np.float32), chains=chains,
                                                    rate_diagnostics=False)

        @jax.jit
        def run(states, keys):
            def one_draw(s, k):
                return jax.vmap(draw_step)(jax.random.split(k, chains), s)[0], None

            return jax.lax.scan(one_draw, states, keys)[0]

        final, seconds = timed_twice(run, states, jax.random.split(key, draws))
    final = jax.tree_util.tree_map(np.asarray, final)  # float64 sums outside the x64 context
    events = int(final.events.sum() + final.excess_events.sum())
    per_event = lambda total: float(total) / max(events, 1)  # noqa: E731
    return (seconds / max(events, 1), events / float(final.t.sum()),
            per_event(final.rejections.sum()), per_event(final.thinning.sum()))


def real_federation_rows(problem_names, num_samples, chains, samplers, variants, seed=0):
    """Per sampler and variant ``(thinning, control_variates)`` on each real federation:
    (events/s, thinning proposals per event, min bulk ESS, ESS/s, wall seconds, the thinning
    used, ...)."""
    from fedmcmc.bench import problems

    classes = {"zigzag": fm.FedZigZag, "bps": fm.FedBPS, "boomerang": fm.FedBoomerang}
    for name in problem_names:
        instance = problems.get(name).build()
        for sampler in samplers:
            for thinning, control_variates in variants:
                algorithm = classes[sampler](sample_interval="auto", thinning=thinning,
                                             control_variates=control_variates)
                for _ in range(2):  # the second run reuses the compiled program
                    result = fm.sample(instance.model, instance.federation, algorithm,
                                       init=instance.init, num_samples=num_samples,
                                       burn_in=max(num_samples // 5, 1), chains=chains,
                                       seed=seed, progress=False, rate_diagnostics=False)
                info = result.info
                seconds = info["wall_time"]
                events = info["gradient_events"] + info["excess_events"]
                ess = float(info["diagnostics"]["min_ess_bulk"])
                label = thinning + ("+cv" if info["control_variates"] else "") + (
                    "(auto)" if control_variates == "auto" else "")
                yield (name, sampler, label, info["thinning"], events / seconds,
                       info["thinning_proposals"] / max(events, 1), ess, ess / seconds, seconds,
                       info["num_workers"], info["sample_interval"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--federated-only", action="store_true",
                        help="only the Fed Zig-Zag per-event cost (pdmp-jax not needed)")
    parser.add_argument("--real", action="store_true",
                        help="only per-worker against superposition thinning on the benchmark's "
                             "real federations (issue 48)")
    parser.add_argument("--problems", nargs="+",
                        default=["exam-schools", "contraception", "grouseticks"])
    parser.add_argument("--samplers", nargs="+", default=["zigzag", "bps", "boomerang"])
    parser.add_argument("--control-variates", action="store_true",
                        help="with --real: also superposition thinning with control variates")
    parser.add_argument("--cv-auto", action="store_true",
                        help="with --real: superposition thinning only, control_variates=False "
                             "against the default 'auto'")
    args = parser.parse_args()
    if args.real:
        draws, chains = (100, 2) if args.quick else (400, 4)
        print(f"Real federations, {chains} chains x {draws} draws (sample_interval='auto'), "
              "compiled run timed; per-worker against superposition thinning", flush=True)
        variants = [("per_worker", False), ("superposition", False)]
        if args.cv_auto:
            variants = [("superposition", False), ("superposition", "auto")]
        elif args.control_variates:
            variants.append(("superposition", True))
        for row in real_federation_rows(args.problems, draws, chains, args.samplers, variants):
            name, sampler, asked, used, ev_s, per_event, ess, ess_s, seconds, m, interval = row
            print(f"{name:14s} M={m:3d} {sampler:9s} {asked:16s} (used {used:13s}) "
                  f"{ev_s:9.0f} ev/s {per_event:7.2f} proposals/event  ESS {ess:7.1f} "
                  f"{ess_s:8.2f} ESS/s  {seconds:6.1f} s  (interval {interval:.3g})", flush=True)
        return
    events = 20_000 if args.quick else 200_000
    if not args.federated_only:
        print("Standard Gaussian, one worker, one chain: events/s and ESS/s "
              "(ratio = fedmcmc / pdmp-jax)")
    for d in (() if args.federated_only else (10, 50)):
        for kind in ("zigzag", "bps"):
            ev_ref, ess_ref, _ = theirs(kind, d, events)
            ev_x, ess_x, _ = ours(kind, d, events, exact=True)
            ev_t, ess_t, _ = ours(kind, d, events, exact=False)
            print(f"d={d:3d} {kind:6s} pdmp-jax {ev_ref:9.0f} ev/s {ess_ref:9.1f} ESS/s | fedmcmc "
                  f"exact {ev_x:9.0f} ev/s {ess_x:9.1f} ESS/s (x{ev_x / ev_ref:.2f}, x{ess_x / ess_ref:.2f})"
                  f" | thinning {ev_t:9.0f} ev/s {ess_t:9.1f} ESS/s (x{ev_t / ev_ref:.2f}, "
                  f"x{ess_t / ess_ref:.2f})", flush=True)
    print("Fed Zig-Zag, N=10,000, d=5 (in-process, compiled): logistic regression with the "
          "Hessian bound, then linear regression (exact event times)")
    for unequal, chains, exact in ((False, 1, False), (True, 4, False), (True, 4, True)):
        print(f"{'linear' if exact else 'logistic'} regression, "
              f"{'client sizes ~ 1/rank' if unequal else 'equal client sizes'}, {chains} "
              f"chain{'s' if chains > 1 else ''}")
        for m in (1, 4, 16, 64):
            cost, rate, rejections, proposals = per_event_cost(
                m, 100 if args.quick else 500, unequal=unequal, chains=chains, exact=exact)
            print(f"M={m:3d}: {1e6 * cost:9.1f} us/event, switching rate {rate:.0f}/unit time, "
                  f"rejections/event {rejections:.2f}, thinning proposals/event {proposals:.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
