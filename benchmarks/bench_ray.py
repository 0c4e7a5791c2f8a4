"""Per-round latency of the DSGLD/FSGLD chain hand-off on the Ray engine against in-process.

One *round* = one visit: the server draws a client, sends it the chain's position,
the client runs ``local_steps`` compiled updates on its own minibatches and sends
back the position and the visit's draws. Three ways of running the same rounds,
measured in the same run on a local loopback Ray instance:

* ``local``      -- the in-process engine: the visit as one compiled scan (all
                    chains vmapped), no messages at all (time per visit of one chain
                    = compiled time of ``local_steps`` updates / chains);
* ``handoff``    -- the hand-off protocol over the in-process transport (client
                    objects in this process, same messages as on Ray, no Ray);
* ``ray``        -- the hand-off protocol with one Ray actor per client, ``chains``
                    chains in flight at once.

Per-round latency = wall time of the sampling loop (setup -- actor start, surrogate
fit, compilation -- excluded and printed separately) / rounds completed, for 4 and 16
clients. Logistic regression, d = 10, 200 rows per client, DSGLD, local_steps = 20.

    python benchmarks/bench_ray.py            # 4 and 16 clients
    python benchmarks/bench_ray.py --quick    # fewer rounds
    python benchmarks/bench_ray.py --skip-handoff    # only DULA's neighbour exchange

Also: per-iteration time of DULA's neighbour exchange (one actor per agent, object
references passed actor to actor) against the in-process engine.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import fedmcmc as fm  # noqa: E402
from fedmcmc.engines.comm import InProcessTransport  # noqa: E402
from fedmcmc.engines.handoff import sample_handoff  # noqa: E402
from fedmcmc.langevin import dsgld  # noqa: E402
from fedmcmc.langevin.schedules import constant  # noqa: E402

DIM = 10
ROWS = 200
LOCAL_STEPS = 20
STEP = 1e-4


def make_problem(num_clients: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=DIM) / np.sqrt(DIM)
    clients = []
    for s in range(num_clients):
        x = rng.normal(loc=0.3 * np.sin(s), size=(ROWS, DIM)).astype(np.float32)
        y = (rng.uniform(size=ROWS) < 1 / (1 + np.exp(-x @ w_true))).astype(np.float32)
        clients.append({"x": x, "y": y})

    def log_likelihood(w, example):
        logit = jnp.dot(example["x"], w)
        return example["y"] * logit - jnp.logaddexp(0.0, logit)

    model = fm.Model(log_prior=lambda w: -0.5 * jnp.sum(w**2), log_likelihood=log_likelihood)
    return model, fm.Federation(clients)


def local_round_seconds(model, federation, algorithm, chains, repeats=20):
    """Compiled time of one visit (local_steps updates) per chain, chains vmapped."""
    flat = model.flatten(jnp.zeros(DIM))
    step = dsgld.build_kernel(
        flat, federation.concatenated(), jnp.asarray(federation.weights, jnp.float32),
        algorithm.batch_size, algorithm.local_steps, constant(STEP),
    )
    states = jax.tree_util.tree_map(
        lambda leaf: jnp.broadcast_to(leaf, (chains,) + leaf.shape),
        dsgld.init(jnp.zeros(DIM), federation.num_clients),
    )

    @jax.jit
    def visit(states, key):
        keys = jax.random.split(key, (algorithm.local_steps, chains))
        return jax.lax.scan(lambda s, k: (jax.vmap(step)(k, s), None), states, keys)[0]

    states = jax.block_until_ready(visit(states, jax.random.key(0)))
    best = float("inf")
    for r in range(repeats):
        started = time.perf_counter()
        states = jax.block_until_ready(visit(states, jax.random.key(r)))
        best = min(best, time.perf_counter() - started)
    return best / chains


def protocol_round_seconds(model, federation, algorithm, chains, rounds, engine):
    """(per-round seconds, setup seconds, info) of the hand-off protocol."""
    kw = dict(init=jnp.zeros(DIM), num_samples=rounds * algorithm.local_steps, burn_in=0,
              thin=1, chains=chains, seed=0)
    started = time.perf_counter()
    if engine == "ray":
        result = fm.sample(model, federation, algorithm, engine="ray", visit_timeout=600, **kw)
    else:
        result = sample_handoff(
            algorithm, model, federation,
            lambda specs: InProcessTransport([cls(*args) for cls, args in specs]),
            engine_label="handoff", **kw,
        )
    total = time.perf_counter() - started
    info = result.info
    completed = sum(info["rounds_per_chain"])
    return info["wall_time"] / completed, total - info["wall_time"], info


def neighbour_iteration_seconds(model, federation, algorithm, chains, iterations, engine):
    """Per-iteration time of DULA (every agent updates once, one message per directed edge):
    the difference of two runs (``iterations`` and twice as many), so that start-up and
    compilation cancel."""
    times = []
    for factor in (1, 2):
        kw = dict(init=jnp.zeros(DIM), num_samples=factor * iterations, burn_in=0, thin=1,
                  chains=chains, seed=0)
        started = time.perf_counter()
        if engine == "ray":
            fm.sample(model, federation, algorithm, engine="ray", visit_timeout=600, **kw)
        else:
            fm.sample(model, federation, algorithm, **kw)
        times.append(time.perf_counter() - started)
    return max(times[1] - times[0], 1e-9) / iterations


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--clients", type=int, nargs="*", default=[4, 16])
    parser.add_argument("--skip-handoff", action="store_true")
    parser.add_argument("--skip-neighbour", action="store_true")
    args = parser.parse_args()
    rounds = 25 if args.quick else 100
    chains = 4

    import ray

    ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    try:
        print(f"DSGLD hand-off, d={DIM}, {ROWS} rows/client, local_steps={LOCAL_STEPS}, "
              f"{chains} chains in flight, {rounds} rounds per chain, cpus={os.cpu_count()}")
        header = (f"{'clients':>7} {'local ms':>9} {'handoff ms':>11} {'ray ms':>8} "
                  f"{'ray/local':>10} {'ray/handoff':>12} {'ray setup s':>12} {'B/round':>8}")
        print(header)
        for num_clients in ([] if args.skip_handoff else args.clients):
            model, federation = make_problem(num_clients)
            algorithm = fm.DSGLD(step_size=STEP, batch_size=10, local_steps=LOCAL_STEPS)
            local = local_round_seconds(model, federation, algorithm, chains)
            handoff, _, _ = protocol_round_seconds(
                model, federation, algorithm, chains, rounds, "handoff")
            on_ray, setup, info = protocol_round_seconds(
                model, federation, algorithm, chains, rounds, "ray")
            per_round_bytes = (info["bytes_to_clients"] + info["bytes_from_clients"]) / sum(
                info["rounds_per_chain"])
            print(f"{num_clients:>7} {local * 1e3:>9.3f} {handoff * 1e3:>11.3f} "
                  f"{on_ray * 1e3:>8.3f} {on_ray / local:>10.0f} {on_ray / handoff:>12.2f} "
                  f"{setup:>12.1f} {per_round_bytes:>8.0f}", flush=True)
        if not args.skip_neighbour:
            iterations = 50 if args.quick else 200
            print(f"\nDULA neighbour exchange (ring, full-batch gradients), {chains} chains, "
                  f"per iteration = every agent updates once")
            print(f"{'agents':>7} {'local ms':>9} {'ray ms':>8} {'ray/local':>10}")
            for num_clients in args.clients:
                model, federation = make_problem(num_clients)
                algorithm = fm.DULA(step_size=1e-5, beta=0.2)
                # the in-process iteration is ~1000x cheaper: many more iterations, so that
                # the difference of the two runs is above the noise of compilation
                local = neighbour_iteration_seconds(model, federation, algorithm, chains,
                                                    200 * iterations, "local")
                on_ray = neighbour_iteration_seconds(model, federation, algorithm, chains,
                                                     iterations, "ray")
                print(f"{num_clients:>7} {local * 1e3:>9.3f} {on_ray * 1e3:>8.3f} "
                      f"{on_ray / local:>10.0f}", flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
