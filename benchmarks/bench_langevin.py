"""Speed of the federated Langevin kernels, as ratios against peers measured in the same run.

Per-step time (compilation excluded, median of repeats) on logistic regression
(d = 20, 10 clients x 1,000 examples, batch 50):

1. fedmcmc SGLD vs BlackJAX's ``sgld`` kernel, both in a jitted ``lax.scan``;
2. FSGLD vs DSGLD (the cost of conducive gradients);
3. FSGLD with 1,000 clients vs 10 (the product surrogate is precomputed): with the total
   data held fixed (10 x 10,000 rows vs 1,000 x 100 rows), which isolates the number of
   clients, and with 1,000 rows per client (1,000 x 1,000 rows: 100 times the data, so the
   minibatch rows come from 84 MB instead of 0.8 MB and cache misses add to the step);
4. fedmcmc FSGLD vs a NumPy per-step loop in the style of the authors' notebook;
5. 256 vmapped FSGLD chains on the section 5.1 problem: time per chain-step.

Run:  python benchmarks/bench_langevin.py [--steps N] [--quick]
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

import fedmcmc as fm
from fedmcmc import surrogates
from fedmcmc.engines import local
from fedmcmc.langevin import dsgld, fsgld, sgld
from fedmcmc.schedules import constant

# STEP: FSGLD without its trust region (these are the bare kernels) and the NumPy loop both
# diverge at h = 1e-4 within a few thousand steps on this problem (measured), and timing NaN
# arithmetic is no benchmark; at 2e-5 both stay finite over the timed steps (checked below).
DIM, BATCH, STEP = 20, 50, 2e-5


def logistic_federation(num_clients, size=1000, seed=0):
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=DIM) / np.sqrt(DIM)
    clients = []
    for _ in range(num_clients):
        x = (rng.normal(size=(size, DIM)) + rng.normal(size=DIM) * 0.5).astype(np.float32)
        y = (rng.random(size) < 1 / (1 + np.exp(-x @ truth))).astype(np.float32)
        clients.append({"x": x, "y": y})
    return fm.Federation(clients)


def log_prior(w):
    return -0.5 * jnp.sum(w**2)


def log_likelihood(w, row):
    logit = jnp.dot(row["x"], w)
    return row["y"] * logit - jnp.logaddexp(0.0, logit)


MODEL = fm.Model(log_prior=log_prior, log_likelihood=log_likelihood)


def time_scan(step, state, steps, repeats=10, check_finite=None, options=None):
    """Seconds per step of ``step(key, state) -> state`` in a jitted scan: the fastest of
    ``repeats`` runs (timeit's rule; on a shared machine the slower runs measure the
    neighbours).

    A fedmcmc kernel (``LangevinStep``) is timed as ``fm.sample`` runs a block of updates:
    the random numbers of all steps drawn in one batched call (``step.noise`` vmapped over
    the keys), the federated scheduler run on them vectorised (``step.prepare``), then
    ``step.apply`` scanned (``sgld.run_updates``); ``fm.sample`` does this per kept draw
    (``thin`` updates). Any other step (BlackJAX's) draws its own numbers per step.
    ``check_finite(state)``: raise if the final state is not finite. ``options``: XLA
    compiler options of the jitted loop (default: none, what a plain ``jax.jit`` gets);
    fedmcmc's kernels are timed with ``engines.local.compiler_options(chains)``, the
    options ``fm.sample`` compiles a run of that many chains with.
    """

    @functools.partial(jax.jit, compiler_options=options or {})
    def run(state, key):
        keys = jax.random.split(key, steps)
        if hasattr(step, "noise") and hasattr(step, "apply"):
            return sgld.run_updates(step, jax.vmap(step.noise)(keys), state)
        return jax.lax.scan(lambda s, k: (step(k, s), None), state, keys)[0]

    final = jax.block_until_ready(run(state, jax.random.key(0)))  # compile
    if check_finite is not None and not check_finite(final):
        raise RuntimeError("the timed chain diverged: lower STEP")
    times = []
    for r in range(repeats):
        started = time.perf_counter()
        jax.block_until_ready(run(state, jax.random.key(r + 1)))
        times.append(time.perf_counter() - started)
    return float(np.min(times)) / steps


def fedmcmc_kernels(federation):
    flat = MODEL.flatten(jnp.zeros(DIM))
    data = federation.concatenated()
    weights = jnp.asarray(federation.weights, jnp.float32)
    theta0 = jnp.zeros(DIM)
    fitted = surrogates.fit_surrogates("laplace", flat, federation, theta0)
    kernels = {
        "sgld": (sgld.build_kernel(flat, data, BATCH, constant(STEP)), sgld.init(theta0)),
        "dsgld": (
            dsgld.build_kernel(flat, data, weights, BATCH, 50, constant(STEP)),
            dsgld.init(theta0, federation.num_clients),
        ),
        "fsgld": (
            fsgld.build_kernel(
                flat, data, weights, BATCH, 50, constant(STEP), fitted, surrogates.product(fitted),
                fsgld.alpha_schedule(1.0, 0),
            ),
            dsgld.init(theta0, federation.num_clients),
        ),
    }
    return kernels, fitted


def blackjax_sgld(federation):
    import blackjax

    pooled = jax.tree_util.tree_map(jnp.asarray, federation.pooled())
    total = federation.total_size
    estimator = blackjax.sgmcmc.gradients.grad_estimator(log_prior, log_likelihood, total)
    algorithm = blackjax.sgld(estimator)

    def step(key, position):
        key_batch, key_step = jax.random.split(key)
        rows = jax.random.randint(key_batch, (BATCH,), 0, total)
        batch = jax.tree_util.tree_map(lambda leaf: leaf[rows], pooled)
        # BlackJAX writes x + eps grad + N(0, 2 eps): eps = h / 2
        return algorithm.step(key_step, position, batch, STEP / 2)

    return step, algorithm.init(jnp.zeros(DIM))


def numpy_fsgld(federation, fitted, steps, local_steps=50, seed=0):
    """A plain NumPy FSGLD loop: one Python iteration per step, as in the authors' notebook."""
    rng = np.random.default_rng(seed)
    xs = [np.asarray(c["x"], np.float64) for c in federation.clients]
    ys = [np.asarray(c["y"], np.float64) for c in federation.clients]
    f = federation.weights
    precisions = np.asarray(fitted.precision, np.float64)
    shifts = np.asarray(fitted.shift, np.float64)
    total_precision, total_shift = precisions.sum(0), shifts.sum(0)
    theta = np.zeros(DIM)
    started = time.perf_counter()
    client = 0
    for t in range(steps):
        if t % local_steps == 0:
            client = rng.choice(len(xs), p=f)
        rows = rng.integers(0, xs[client].shape[0], BATCH)
        x, y = xs[client][rows], ys[client][rows]
        p = 1 / (1 + np.exp(-x @ theta))
        grad = -theta + xs[client].shape[0] / (f[client] * BATCH) * (x.T @ (y - p))
        conducive = (total_shift - total_precision @ theta) - (
            shifts[client] - precisions[client] @ theta
        ) / f[client]
        theta = theta + 0.5 * STEP * (grad + conducive) + np.sqrt(STEP) * rng.normal(size=DIM)
    elapsed = time.perf_counter() - started
    if not np.all(np.isfinite(theta)):
        raise RuntimeError("the NumPy chain diverged: lower STEP")
    return elapsed / steps


def many_chains_per_chain_step(chains=256, steps=2000):
    rng = np.random.default_rng(0)
    centres = rng.uniform(-6, 6, size=(10, 2))
    federation = fm.Federation([rng.normal(c, 1.0, size=(200, 2)).astype(np.float32) for c in centres])
    model = fm.Model(
        log_prior=lambda mu: -0.5 * jnp.sum(mu**2),
        log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2),
    )
    flat = model.flatten(jnp.zeros(2))
    fitted = surrogates.fit_surrogates("exact", flat, federation, jnp.zeros(2))
    step = fsgld.build_kernel(
        flat, federation.concatenated(), jnp.asarray(federation.weights, jnp.float32), 10, 200,
        constant(1e-4), fitted, surrogates.product(fitted), fsgld.alpha_schedule(1.0, 0),
    )
    state = jax.tree_util.tree_map(
        lambda leaf: jnp.broadcast_to(leaf, (chains,) + leaf.shape), dsgld.init(jnp.zeros(2), 10)
    )

    vmapped = sgld.LangevinStep(
        noise=lambda key: jax.vmap(step.noise)(jax.random.split(key, chains)),
        apply=lambda inputs, states: jax.vmap(step.apply)(inputs, states),
        # noises of a block: (steps, chains, ...); states: (chains, ...)
        prepare=lambda noises, states: jax.vmap(step.prepare, in_axes=(1, 0), out_axes=(1, 0))(
            noises, states),
    )
    return time_scan(vmapped, state, steps, options=local.compiler_options(chains)) / chains


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    steps = 2000 if args.quick else args.steps
    print(f"jax {jax.__version__}, devices {jax.devices()}, {steps} steps per timing")

    federation = logistic_federation(10)
    kernels, fitted = fedmcmc_kernels(federation)
    finite = lambda state: bool(np.all(np.isfinite(np.asarray(state.position))))  # noqa: E731
    one_chain = local.compiler_options(1)  # what fm.sample compiles a 1-chain run with
    times = {name: time_scan(step, state, steps, check_finite=finite, options=one_chain)
             for name, (step, state) in kernels.items()}
    bj_step, bj_state = blackjax_sgld(federation)
    times["blackjax_sgld"] = time_scan(bj_step, bj_state, steps)  # plain jax.jit
    times["blackjax_sgld_same_options"] = time_scan(bj_step, bj_state, steps, options=one_chain)

    big = logistic_federation(1000)
    big_kernels, _ = fedmcmc_kernels(big)
    times["fsgld_1000_clients"] = time_scan(*big_kernels["fsgld"], steps, options=one_chain)
    del big, big_kernels
    # same 100,000 rows split in 10 or in 1,000 clients
    for clients, size in ((10, 10_000), (1000, 100)):
        kernels_fixed, _ = fedmcmc_kernels(logistic_federation(clients, size=size))
        times[f"fsgld_{clients}x{size}"] = time_scan(*kernels_fixed["fsgld"], steps, options=one_chain)
    times["numpy_fsgld"] = float(np.min(
        [numpy_fsgld(federation, fitted, min(steps, 5000), seed=r) for r in range(3)]))
    # the whole of fm.sample (engine: draw recording, divergence check), one chain, a draw
    # kept every iteration or every 10; steady state, compilation excluded
    # (info["seconds_per_iteration"])
    fsgld_bare = fm.FSGLD(step_size=STEP, batch_size=BATCH, local_steps=50, trust_radius=None)
    for name, algorithm, thin in (
        ("fm.sample SGLD", fm.SGLD(step_size=STEP, batch_size=BATCH), 1),
        ("fm.sample FSGLD", fsgld_bare, 1),
        ("fm.sample FSGLD thin 10", fsgld_bare, 10),
        # FSGLD's default safeguard (trust_radius="auto"; the NumPy loop has none)
        ("fm.sample FSGLD trust thin 10",
         fm.FSGLD(step_size=STEP, batch_size=BATCH, local_steps=50), 10),
    ):
        times[name] = min(  # the faster of two runs, as for the kernels
            fm.sample(MODEL, federation, algorithm, jnp.zeros(DIM), num_samples=50 * steps // thin,
                      thin=thin, seed=0, progress=False).info["seconds_per_iteration"]
            for _ in range(2))
    per_chain = many_chains_per_chain_step(steps=max(200, steps // 10))

    print("\nper-step time (microseconds)")
    for name, value in times.items():
        print(f"  {name:<26}{value * 1e6:>10.2f}")
    print("\nratios (target in brackets)")
    print(f"  SGLD: BlackJAX / fedmcmc            {times['blackjax_sgld'] / times['sgld']:6.2f}  [>= 1]")
    print(f"    (BlackJAX compiled with fedmcmc's options: "
          f"{times['blackjax_sgld_same_options'] / times['sgld']:.2f})")
    print(f"  FSGLD / DSGLD                        {times['fsgld'] / times['dsgld']:6.2f}  [<= 1.2]")
    print(f"  FSGLD 1,000 / 10 clients, same data  {times['fsgld_1000x100'] / times['fsgld_10x10000']:6.2f}  [<= 1.2]")
    print(f"  FSGLD 1,000 x 1,000 / 10 x 1,000     {times['fsgld_1000_clients'] / times['fsgld']:6.2f}  "
          "(100x the data: memory, not clients)")
    print(f"  NumPy loop / fedmcmc FSGLD           {times['numpy_fsgld'] / times['fsgld']:6.1f}  [>= 20]")
    print(f"    (NumPy loop / whole fm.sample FSGLD, a draw kept every iteration: "
          f"{times['numpy_fsgld'] / times['fm.sample FSGLD']:.1f}; every 10th: "
          f"{times['numpy_fsgld'] / times['fm.sample FSGLD thin 10']:.1f}; every 10th with the "
          f"default trust region: {times['numpy_fsgld'] / times['fm.sample FSGLD trust thin 10']:.1f})")
    print(f"  256 vmapped chains: us per chain-step {per_chain * 1e6:6.3f}  [< 2]")


if __name__ == "__main__":
    main()
