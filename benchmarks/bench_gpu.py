"""GPU against the same machine's CPU, and fedmcmc against BlackJAX on each, in one run.

Rows (each measured on every device found: the CPU, and the first accelerator when there is
one; steady state, compilation excluded, the fastest of a few repeats):

1. **SGLD kernel, fedmcmc against BlackJAX's** ``sgld`` on the same device, the same vmapped
   chains (logistic regression, d = 20, 10 clients x 1,000 rows, batch 50): time per
   chain-step at 1, 1,024 and 16,384 chains (``--quick``: 1 and 256).
2. **Many chains**: FSGLD on the section 5.1 problem (10 clients x 200 rows, d = 2), chain-steps
   per second at 1 to 131,072 chains (the CPU stops at 1,024: beyond it the time per
   chain-step no longer falls there); the ratio is the best of each device.
3. **FSGLD Table 1's regime**: DSGLD on an MLP 18-18-8 (the SUSY stand-in,
   ``fm.models.teacher_classification_clients``), 30 clients x ``--rows`` rows (the paper's
   90,000 by default; ``--quick`` 2,000), batch 50, 40 local steps, 10 chains: time per
   iteration (one update of every chain).

Without an accelerator it says so and prints the CPU rows. Every kernel is compiled as
``fm.sample`` compiles it: the rows are arguments of the program
(``cache.jit_with_constants_as_arguments``), and the random numbers of a block of updates
are drawn in one batched call.

Run:  python benchmarks/bench_gpu.py [--quick] [--rows N] [--steps N]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

import fedmcmc as fm
from fedmcmc import surrogates
from fedmcmc.cache import jit_with_constants_as_arguments, usable_cpus
from fedmcmc.engines import local
from fedmcmc.langevin import dsgld, fsgld, sgld
from fedmcmc.schedules import constant

# the problem of bench_langevin.py (a sibling script: run from this folder or as
# python benchmarks/bench_gpu.py)
from bench_langevin import BATCH, DIM, STEP, log_likelihood, log_prior, logistic_federation
from bench_langevin import MODEL as LOGISTIC


def accelerator():
    """The first non-CPU device, or None."""
    try:
        devices = jax.devices()
    except RuntimeError:
        return None
    others = [device for device in devices if device.platform != "cpu"]
    return others[0] if others else None



def vmapped(step: sgld.LangevinStep, chains: int) -> sgld.LangevinStep:
    """``chains`` copies of a fedmcmc kernel, as the in-process engine runs them (random
    numbers of a block drawn at once, the scheduler vectorised, ``apply`` vmapped)."""
    prepare = None
    if step.prepare is not None:
        prepare = lambda noises, states: jax.vmap(  # noqa: E731
            step.prepare, in_axes=(1, 0), out_axes=(1, 0))(noises, states)
    return sgld.LangevinStep(
        noise=lambda key: jax.vmap(step.noise)(jax.random.split(key, chains)),
        apply=lambda inputs, states: jax.vmap(step.apply)(inputs, states),
        prepare=prepare)


def stacked(state, chains):
    return jax.tree_util.tree_map(lambda leaf: jnp.broadcast_to(leaf, (chains,) + leaf.shape),
                                  state)


def seconds_per_step(step, state, steps, device, chains, repeats=3):
    """Seconds per update of ``step`` (a fedmcmc ``LangevinStep``, or any ``(key, state) ->
    state``) in a compiled loop of ``steps`` updates on ``device``: the fastest of
    ``repeats`` runs. Raises if the chains diverged (timing NaN arithmetic is no benchmark)."""

    def run(state, key):
        keys = jax.random.split(key, steps)
        if isinstance(step, sgld.LangevinStep):
            return sgld.run_updates(step, jax.vmap(step.noise)(keys), state)
        return jax.lax.scan(lambda s, k: (step(k, s), None), state, keys)[0]

    options = local.compiler_options(chains) if device.platform == "cpu" else {}
    program = jit_with_constants_as_arguments(run, compiler_options=options)
    state = jax.device_put(state, device)
    final = jax.block_until_ready(program(state, jax.device_put(jax.random.key(0), device)))
    position = final.position if hasattr(final, "position") else final
    if not np.all(np.isfinite(np.asarray(position))):
        raise RuntimeError("the timed chains diverged")
    times = []
    for r in range(repeats):
        key = jax.device_put(jax.random.key(r + 1), device)
        started = time.perf_counter()
        jax.block_until_ready(program(state, key))
        times.append(time.perf_counter() - started)
    return float(np.min(times)) / steps


def steps_for(chains, budget, minimum=20):
    """Updates per timing: about ``budget`` chain-steps, at least ``minimum``."""
    return max(minimum, budget // chains)


def sgld_rows(device, chain_counts, budget):
    """{chains: (fedmcmc, BlackJAX) seconds per chain-step} of SGLD on ``device``."""
    import blackjax

    with jax.default_device(device):
        federation = logistic_federation(10)
        flat = LOGISTIC.flatten(jnp.zeros(DIM))
        kernel = sgld.build_kernel(flat, federation.concatenated(), BATCH, constant(STEP))
        pooled = jax.tree_util.tree_map(jnp.asarray, federation.pooled())
        total = federation.total_size
        estimator = blackjax.sgmcmc.gradients.grad_estimator(log_prior, log_likelihood, total)
        algorithm = blackjax.sgld(estimator)

        def blackjax_step(key, position):
            key_batch, key_step = jax.random.split(key)
            rows = jax.random.randint(key_batch, (BATCH,), 0, total)
            batch = jax.tree_util.tree_map(lambda leaf: leaf[rows], pooled)
            return algorithm.step(key_step, position, batch, STEP / 2)  # eps = h / 2

        rows = {}
        for chains in chain_counts:
            steps = steps_for(chains, budget)
            ours = seconds_per_step(vmapped(kernel, chains), stacked(sgld.init(jnp.zeros(DIM)), chains),
                                    steps, device, chains) / chains
            theirs_step = lambda key, states, c=chains: jax.vmap(blackjax_step)(  # noqa: E731
                jax.random.split(key, c), states)
            theirs = seconds_per_step(theirs_step, stacked(jnp.zeros(DIM), chains), steps, device,
                                      chains) / chains
            rows[chains] = (ours, theirs)
    return rows


def many_chain_rows(device, chain_counts, budget):
    """{chains: chain-steps per second} of FSGLD on the section 5.1 problem on ``device``."""
    rng = np.random.default_rng(0)
    centres = rng.uniform(-6, 6, size=(10, 2))
    with jax.default_device(device):
        federation = fm.Federation(
            [rng.normal(c, 1.0, size=(200, 2)).astype(np.float32) for c in centres])
        model = fm.Model(log_prior=lambda mu: -0.5 * jnp.sum(mu ** 2),
                         log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2))
        flat = model.flatten(jnp.zeros(2))
        fitted = surrogates.fit_surrogates("exact", flat, federation, jnp.zeros(2))
        kernel = fsgld.build_kernel(
            flat, federation.concatenated(), jnp.asarray(federation.weights, jnp.float32), 10,
            200, constant(1e-4), fitted, surrogates.product(fitted),
            fsgld.alpha_schedule(1.0, 0))
        rows = {}
        for chains in chain_counts:
            seconds = seconds_per_step(vmapped(kernel, chains),
                                       stacked(dsgld.init(jnp.zeros(2), 10), chains),
                                       steps_for(chains, budget), device, chains)
            rows[chains] = chains / seconds
    return rows


def table1_row(device, rows_per_client, steps, chains=10):
    """Seconds per iteration (every chain one update) of DSGLD on Table 1's MLP."""
    federation = fm.models.teacher_classification_clients([0.5] * 30, rows_per_client, seed=0)
    model = fm.models.mlp_classifier(18)
    init = model.attributes["init"](jax.random.key(0))
    with jax.default_device(device):
        flat = model.flatten(init)
        data = federation.concatenated()
        weights = jnp.asarray(federation.weights, jnp.float32)
        kernel = dsgld.build_kernel(flat, data, weights, BATCH, 40, constant(1e-5))
        state = stacked(dsgld.init(flat.ravel(init), federation.num_clients), chains)
        return seconds_per_step(vmapped(kernel, chains), state, steps, device, chains)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer chains, rows and steps")
    parser.add_argument("--rows", type=int, default=None,
                        help="rows per client of the Table 1 row (default 90,000; quick 2,000)")
    parser.add_argument("--steps", type=int, default=None,
                        help="chain-steps per timing (default 2,000,000; quick 200,000)")
    args = parser.parse_args(argv)
    budget = args.steps or (200_000 if args.quick else 2_000_000)
    rows_per_client = args.rows or (2_000 if args.quick else 90_000)

    cpu = jax.devices("cpu")[0]
    gpu = accelerator()
    print(f"fedmcmc bench_gpu, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
          f"jax {jax.__version__}, Python {platform.python_version()}, {platform.machine()}")
    print(f"CPU: {cpu.device_kind or platform.processor()} ({jax.local_device_count('cpu')} "
          f"device(s); {usable_cpus()} cores usable)")
    if gpu is None:
        print("no accelerator found (jax.devices(): "
              f"{[d.platform for d in jax.devices()]}): the CPU rows only; "
              "pip install -e \".[cuda]\" on a machine with an NVIDIA GPU for the GPU rows")
    else:
        print(f"accelerator: {gpu.device_kind} ({gpu.platform})")
    devices = [cpu] + ([gpu] if gpu is not None else [])

    sgld_chains = (1, 256) if args.quick else (1, 1024, 16384)
    many_cpu = (1, 64, 1024) if not args.quick else (1, 64, 256)
    many_gpu = (1, 1024, 16384, 131072) if not args.quick else (1, 1024, 16384)

    print("\n1. SGLD kernel, fedmcmc against BlackJAX on the same device (logistic, d = 20)")
    print(f"   {'device':<8}{'chains':>8}{'fedmcmc us':>14}{'BlackJAX us':>14}"
          f"{'BlackJAX / fedmcmc':>20}   (per chain-step)")
    sgld_results = {}
    for device in devices:
        sgld_results[device.platform] = sgld_rows(device, sgld_chains, budget)
        for chains, (ours, theirs) in sgld_results[device.platform].items():
            print(f"   {device.platform:<8}{chains:>8}{ours * 1e6:>14.4f}{theirs * 1e6:>14.4f}"
                  f"{theirs / ours:>20.2f}")

    print("\n2. Many chains: FSGLD, section 5.1 problem (d = 2), chain-steps per second")
    best = {}
    for device in devices:
        counts = many_cpu if device.platform == "cpu" else many_gpu
        results = many_chain_rows(device, counts, budget)
        best[device.platform] = max(results.values())
        for chains, rate in results.items():
            print(f"   {device.platform:<8}{chains:>8} chains{rate:>14.3g} /s"
                  f"{1e6 / rate * chains:>12.2f} us per step of the batch")
    if gpu is not None:
        print(f"   best GPU / best CPU: {best[gpu.platform] / best['cpu']:.1f}x")

    table_steps = max(20, budget // 2000)
    print(f"\n3. Table 1's regime: DSGLD, MLP 18-18-8, 30 clients x {rows_per_client:,} rows, "
          f"batch 50, 40 local steps, 10 chains ({table_steps} iterations timed)")
    table = {}
    for device in devices:
        table[device.platform] = table1_row(device, rows_per_client, table_steps)
        print(f"   {device.platform:<8}{table[device.platform] * 1e6:>12.1f} us per iteration")
    if gpu is not None:
        print(f"   CPU / GPU: {table['cpu'] / table[gpu.platform]:.1f}x")
        print("\nGPU against the same machine's CPU (CPU time / GPU time):")
        for chains, (ours, _) in sgld_results[gpu.platform].items():
            cpu_time = sgld_results["cpu"].get(chains, (None,))[0]
            if cpu_time is not None:
                print(f"   SGLD kernel, {chains} chains: {cpu_time / ours:.2f}x")


if __name__ == "__main__":
    main()
