"""Fixed costs behind the README's Langevin and compilation figures, in one run.

1. The minibatch gather in a single chain's step: a hand-written SGLD step for logistic
   regression (d = 20, batch 50) in a jitted scan, once gathering random rows and once on
   fixed rows (what is left of fedmcmc's single-chain step besides the gather).
2. XLA compilation of one run's Langevin random numbers (13 draws x 2 chains x 5 updates,
   vmapped): ``jax.random`` against ``fedmcmc.rng`` (same numbers, checked).
3. Wall time of a whole small ``fm.sample`` (Bayesian logistic regression with a pytree
   parameter, 3 clients, 2 chains, 250 draws): compilation plus sampling, per algorithm.

Run:  python benchmarks/bench_overheads.py
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import fedmcmc as fm
from fedmcmc import rng
from fedmcmc.langevin.sgld import StepNoise, step_noise

N, D, B, STEPS = 10_000, 20, 50, 20_000


def gather_cost():
    rs = np.random.default_rng(0)
    x_all = jnp.asarray(rs.normal(size=(N, D)).astype(np.float32))
    y_all = jnp.asarray((rs.random(N) < 0.5).astype(np.float32))

    def make(gather):
        def step(theta, z):
            u, noise = z
            rows = jnp.minimum((u * 1000).astype(jnp.int32), 999) + 3000
            x, y = (x_all[rows], y_all[rows]) if gather else (x_all[:B], y_all[:B])
            grad = -theta + (N / B) * (x.T @ (y - jax.nn.sigmoid(x @ theta)))
            return theta + 1e-6 * grad + 1e-3 * noise, None

        @jax.jit
        def run(theta, u, noise):
            return jax.lax.scan(step, theta, (u, noise))[0]

        return run

    u = jax.random.uniform(jax.random.key(0), (STEPS, B))
    noise = jax.random.normal(jax.random.key(1), (STEPS, D))
    out = {}
    for name, gather in (("random rows (gather)", True), ("fixed rows", False)):
        run = make(gather)
        jax.block_until_ready(run(jnp.zeros(D), u, noise))
        times = []
        for _ in range(5):
            started = time.perf_counter()
            jax.block_until_ready(run(jnp.zeros(D), u, noise))
            times.append(time.perf_counter() - started)
        out[name] = min(times) / STEPS
    return out


def noise_compile_times():
    def with_jax_random(key, batch_size, dim):
        k_client, k_batch, k_noise = jax.random.split(key, 3)
        return StepNoise(jax.random.uniform(k_client, ()), jax.random.uniform(k_batch, (batch_size,)),
                         jax.random.normal(k_noise, (dim,), jnp.float32))

    out, values = {}, {}
    for name, noise in (("jax.random", with_jax_random),
                        ("fedmcmc.rng", lambda k, b, d: step_noise(k, b, d, jnp.float32))):
        @jax.jit
        def draws(indices, noise=noise):
            def one(i):
                keys = rng.split_key(rng.fold_in(jax.random.key(0), i), 2)
                return jax.vmap(lambda k: jax.vmap(lambda kk: noise(kk, 20, 4))(
                    jax.random.split(k, 5)))(keys)
            return jax.vmap(one)(indices)

        started = time.perf_counter()
        compiled = draws.lower(jnp.arange(13)).compile()
        out[name] = time.perf_counter() - started
        values[name] = compiled(jnp.arange(13))
    same = all(np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(values["jax.random"], values["fedmcmc.rng"]))
    return out, same


def small_runs():
    rs = np.random.default_rng(1)
    model = fm.Model(
        log_prior=lambda p: -0.5 * (jnp.sum(p["w"] ** 2) + p["b"] ** 2),
        log_likelihood=lambda p, ex: ex["y"] * (ex["x"] @ p["w"] + p["b"])
        - jnp.logaddexp(0.0, ex["x"] @ p["w"] + p["b"]),
    )
    clients = []
    for s, n in enumerate((120, 200, 80)):
        x = rs.normal(s - 1, 1, size=(n, 3)).astype(np.float32)
        y = (rs.random(n) < 1 / (1 + np.exp(-(x @ np.array([1.0, -1.0, 0.5]) + 0.3)))).astype(np.float32)
        clients.append({"x": x, "y": y})
    federation = fm.Federation(clients)
    init = {"w": jnp.zeros(3), "b": jnp.zeros(())}
    algorithms = {
        "SGLD": fm.SGLD(step_size=1e-3, batch_size=20),
        "FSGLD (laplace)": fm.FSGLD(step_size=1e-3, batch_size=20, local_steps=10),
        "FedZigZag": fm.FedZigZag(sample_interval=0.5),
        "DULA": fm.DULA(step_size=1e-4, beta=0.3),
    }
    out = {}
    for name, algorithm in algorithms.items():
        started = time.perf_counter()
        fm.sample(model, federation, algorithm, init=init, num_samples=200, burn_in=50, thin=5,
                  chains=2, seed=0, progress=False)
        out[name] = time.perf_counter() - started
    return out


def main():
    print(f"jax {jax.__version__}; load average at start {os.getloadavg()[0]:.1f}")
    gather = gather_cost()
    print("\n1. single-chain SGLD step, logistic regression d=20, batch 50 (us per step)")
    for name, value in gather.items():
        print(f"  {name:<22}{value * 1e6:8.2f}")
    compile_times, same = noise_compile_times()
    print("\n2. XLA compilation of a run's Langevin random numbers (s)" + ("" if same else "  NUMBERS DIFFER"))
    for name, value in compile_times.items():
        print(f"  {name:<22}{value:8.2f}")
    print("\n3. a small fm.sample, compilation included (s)")
    for name, value in small_runs().items():
        print(f"  {name:<22}{value:8.2f}")
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
