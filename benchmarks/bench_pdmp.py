"""Fed-PDMC speed: fedmcmc's Zig-Zag / BPS against pdmp-jax (same run), and Fed Zig-Zag per-event cost.

    pip install --no-deps pdmp-jax==0.1.1 jax-tqdm chex toolz seaborn tqdm   # keeps the pinned jax
    python benchmarks/bench_pdmp.py [--quick]

Standard Gaussian targets (d = 10, 50), one worker, one chain. Both samplers
are jitted and run twice; the second (compiled) call is timed. pdmp-jax uses
its default grid bound (grid_size 10, tmax 1, float32); fedmcmc runs float64
and is timed twice: exact affine inversion (what it uses for a quadratic
potential) and Poisson thinning against the Hessian bound |H| <= I (what a
general model gets). ESS is ArviZ's bulk ESS (minimum over coordinates) of the
positions at unit time steps, computed the same way for both. Then Fed Zig-Zag
on logistic regression (N = 10,000, d = 5) with 1, 4, 16, 64 workers: wall time
per event of the compiled draw loop (in-process engine, workers vmapped).
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


def per_event_cost(workers, draws):
    clients, _ = models.logistic_data(0, 10_000, 5, num_workers=workers)
    fed = fm.Federation(clients)
    alg = fm.FedZigZag(sample_interval=0.01)
    with jax.enable_x64(True):
        cfg, draw_step, states, key, *_ = alg.build(models.logistic_model(), fed,
                                                    np.zeros(5, np.float32), rate_diagnostics=False)
        state = jax.tree_util.tree_map(lambda leaf: leaf[0], states)

        @jax.jit
        def run(state, keys):
            return jax.lax.scan(lambda s, k: (draw_step(k, s)[0], None), state, keys)[0]

        final, seconds = timed_twice(run, state, jax.random.split(key, draws))
    events = int(final.events.sum() + final.excess_events.sum())
    return seconds / max(events, 1), events / float(final.t), float(final.rejections.sum()) / max(events, 1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    events = 20_000 if args.quick else 200_000
    print("Standard Gaussian, one worker, one chain: events/s and ESS/s (ratio = fedmcmc / pdmp-jax)")
    for d in (10, 50):
        for kind in ("zigzag", "bps"):
            ev_ref, ess_ref, _ = theirs(kind, d, events)
            ev_x, ess_x, _ = ours(kind, d, events, exact=True)
            ev_t, ess_t, _ = ours(kind, d, events, exact=False)
            print(f"d={d:3d} {kind:6s} pdmp-jax {ev_ref:9.0f} ev/s {ess_ref:9.1f} ESS/s | fedmcmc "
                  f"exact {ev_x:9.0f} ev/s {ess_x:9.1f} ESS/s (x{ev_x / ev_ref:.2f}, x{ess_x / ess_ref:.2f})"
                  f" | thinning {ev_t:9.0f} ev/s {ess_t:9.1f} ESS/s (x{ev_t / ev_ref:.2f}, "
                  f"x{ess_t / ess_ref:.2f})", flush=True)
    print("Fed Zig-Zag, logistic regression N=10,000, d=5, Hessian bound (in-process, compiled)")
    for m in (1, 4, 16, 64):
        cost, rate, rejections = per_event_cost(m, 100 if args.quick else 500)
        print(f"M={m:3d}: {1e6 * cost:9.1f} us/event, switching rate {rate:.0f}/unit time, "
              f"rejections/event {rejections:.2f}", flush=True)


if __name__ == "__main__":
    main()
