"""Fixed costs behind the Langevin and compilation figures of docs/reference/speed.md, in one run.

1. The minibatch gather in a single chain's step: a hand-written SGLD step for logistic
   regression (d = 20, batch 50) in a jitted scan, gathering random rows or on fixed rows,
   compiled by a plain ``jax.jit`` and with the options ``fm.sample`` uses for a run of
   fewer than 8 chains (``engines.local.compiler_options``: no intra-op splitting of
   fused loops; XLA's cost model charges a gather the whole array it gathers from and
   splits it over the thread pool, which costs more than the copy of 50 rows).
2. Where the federated scheduler runs: the FSGLD kernel on the same problem with the
   scheduler vectorised over a block of updates (``LangevinStep.prepare``, what
   ``fm.sample`` does per kept draw) against the scheduler inside every update (a block
   of one). On CPU, XLA runs a loop body of at most 8 operations sequentially and a
   longer one through a dependency-graph executor with a higher cost per operation.
   The same update vmapped over 1-256 chains, per chain-step, with and without the split:
   where ``engines.local.SPLIT_LOOPS_MIN_CHAINS`` comes from.
3. XLA compilation of one run's Langevin random numbers (13 draws x 2 chains x 5 updates,
   vmapped): ``jax.random`` against ``fedmcmc.rng`` (same numbers, checked).
4. Wall time of a whole small ``fm.sample`` (Bayesian logistic regression with a pytree
   parameter, 3 clients, 2 chains, 250 draws): compilation plus sampling, per algorithm.

Run:  python benchmarks/bench_overheads.py
"""

from __future__ import annotations

import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import fedmcmc as fm
from fedmcmc import rng, surrogates
from fedmcmc.engines import local
from fedmcmc.langevin import dsgld, fsgld, sgld
from fedmcmc.schedules import constant
from fedmcmc.langevin.sgld import StepNoise, step_noise

N, D, B, STEPS = 10_000, 20, 50, 20_000


def fastest_call(function, *args, repeats=5):
    """Seconds of the fastest of ``repeats`` calls, after one call that compiles."""
    jax.block_until_ready(function(*args))
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        jax.block_until_ready(function(*args))
        times.append(time.perf_counter() - started)
    return min(times)


def gather_cost():
    rs = np.random.default_rng(0)
    x_all = jnp.asarray(rs.normal(size=(N, D)).astype(np.float32))
    y_all = jnp.asarray((rs.random(N) < 0.5).astype(np.float32))

    def make(gather, options):
        def step(theta, z):
            u, noise = z
            rows = jnp.minimum((u * 1000).astype(jnp.int32), 999) + 3000
            x, y = (x_all[rows], y_all[rows]) if gather else (x_all[:B], y_all[:B])
            grad = -theta + (N / B) * (x.T @ (y - jax.nn.sigmoid(x @ theta)))
            return theta + 1e-6 * grad + 1e-3 * noise, None

        @functools.partial(jax.jit, compiler_options=options)
        def run(theta, u, noise):
            return jax.lax.scan(step, theta, (u, noise))[0]

        return run

    u = jax.random.uniform(jax.random.key(0), (STEPS, B))
    noise = jax.random.normal(jax.random.key(1), (STEPS, D))
    out = {}
    variants = (("random rows, jax.jit", True, {}),
                ("random rows, fm.sample's", True, local.compiler_options(1)),
                ("fixed rows, jax.jit", False, {}))
    for name, gather, options in variants:
        out[name] = fastest_call(make(gather, options), jnp.zeros(D), u, noise) / STEPS
    return out


def fsgld_kernel():
    """The FSGLD kernel on logistic regression (d = 20, 10 clients x 1,000 rows, batch 50)."""
    rs = np.random.default_rng(0)
    truth = rs.normal(size=D) / np.sqrt(D)
    clients = []
    for _ in range(10):
        x = (rs.normal(size=(1000, D)) + rs.normal(size=D) * 0.5).astype(np.float32)
        y = (rs.random(1000) < 1 / (1 + np.exp(-x @ truth))).astype(np.float32)
        clients.append({"x": x, "y": y})
    federation = fm.Federation(clients)

    def log_likelihood(w, row):
        logit = jnp.dot(row["x"], w)  # once: XLA does not merge two dots of the gradient
        return row["y"] * logit - jnp.logaddexp(0.0, logit)

    model = fm.Model(log_prior=lambda w: -0.5 * jnp.sum(w**2), log_likelihood=log_likelihood)
    flat = model.flatten(jnp.zeros(D))
    fitted = surrogates.fit_surrogates("laplace", flat, federation, jnp.zeros(D))
    step = fsgld.build_kernel(
        flat, federation.concatenated(), jnp.asarray(federation.weights, jnp.float32), B, 50,
        constant(2e-5), fitted, surrogates.product(fitted), fsgld.alpha_schedule(1.0, 0))
    return step, dsgld.init(jnp.zeros(D), federation.num_clients)


def scheduler_placement(steps=STEPS):
    """Seconds per update of FSGLD with the scheduler vectorised over the block of updates
    (``prepare``) and inside each update (blocks of one), compiled as ``fm.sample`` does."""
    step, state = fsgld_kernel()

    def block(state, noises):
        return sgld.run_updates(step, noises, state)

    def one_by_one(state, noises):
        return jax.lax.scan(lambda s, z: (sgld.run_updates(
            step, jax.tree_util.tree_map(lambda leaf: leaf[None], z), s), None), state, noises)[0]

    noises = jax.vmap(step.noise)(jax.random.split(jax.random.key(0), steps))
    out = {}
    for name, run in (("scheduler per block", block), ("scheduler per update", one_by_one)):
        compiled = jax.jit(run, compiler_options=local.compiler_options(1))
        out[name] = fastest_call(compiled, state, noises, repeats=7) / steps
    return out


def split_by_chains(chain_counts=(1, 2, 4, 16, 64, 256), updates=80_000):
    """Seconds per chain-step of the FSGLD update vmapped over chains, compiled with and
    without XLA's intra-op splitting of fused loops ({chains: (split, not split)})."""
    step, state = fsgld_kernel()
    out = {}
    for chains in chain_counts:
        steps = max(200, updates // chains)
        states = jax.tree_util.tree_map(lambda leaf: jnp.broadcast_to(leaf, (chains,) + leaf.shape), state)
        noises = jax.vmap(jax.vmap(step.noise))(
            jax.random.split(jax.random.key(0), (steps, chains)))

        def run(states, noises):
            inputs, states = jax.vmap(step.prepare, in_axes=(1, 0), out_axes=(1, 0))(noises, states)
            return jax.lax.scan(lambda s, z: (jax.vmap(step.apply)(z, s), None), states, inputs)[0]

        pair = []
        for options in ({}, {"xla_disable_hlo_passes": "cpu-parallel-task-assigner"}):
            compiled = jax.jit(run, compiler_options=options)
            pair.append(fastest_call(compiled, states, noises) / (steps * chains))
        out[chains] = tuple(pair)
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
    print("\n2. FSGLD update, same problem, random numbers drawn beforehand (us per update)")
    for name, value in scheduler_placement().items():
        print(f"  {name:<22}{value * 1e6:8.2f}")
    print("   per chain-step with chains vmapped (us): split / not split "
          f"(fm.sample splits from {local.SPLIT_LOOPS_MIN_CHAINS} chains)")
    for chains, (split, whole) in split_by_chains().items():
        print(f"  {chains:>3} chains            {split * 1e6:8.2f} {whole * 1e6:8.2f}")
    compile_times, same = noise_compile_times()
    print("\n3. XLA compilation of a run's Langevin random numbers (s)" + ("" if same else "  NUMBERS DIFFER"))
    for name, value in compile_times.items():
        print(f"  {name:<22}{value:8.2f}")
    print("\n4. a small fm.sample, compilation included (s)")
    for name, value in small_runs().items():
        print(f"  {name:<22}{value:8.2f}")
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
