"""Per-round latency of engine="flower" on loopback, against engine="ray" and engine="local".

One *round* = one DSGLD visit: the driver sends a chain's position to one client, which runs
``local_steps`` compiled updates on its own minibatches and replies with the position and the
visit's draws. The same run (3 clients, logistic regression, d = 10, 200 rows per client, one
chain, the same seed) on three engines:

* ``local``  -- the in-process engine (no messages): time per visit = the difference of the
                wall times of two runs (10 and 50 visits at --quick) / the visits between;
* ``ray``    -- one Ray actor per client on a local loopback instance;
* ``flower`` -- a SuperLink and one site per client on loopback (``engine="flower"`` with no
                address), Flower 1.42.

For Ray and Flower the latency is ``info["mean_visit_seconds"]`` (send to reply, measured by
the driver per visit), start-up and set-up excluded (printed apart). The last lines give the
compute time of one local step (from the local run) and the ``local_steps`` at which one
visit's computation equals the Flower round trip (break-even) and is 10x it (90% of the wall
time computing).

    python benchmarks/bench_flower.py           # 40 visits
    python benchmarks/bench_flower.py --quick   # 10 visits

Every process it starts is on 127.0.0.1 and ended before it returns.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import fedmcmc as fm  # noqa: E402

DIM, ROWS, CLIENTS, LOCAL_STEPS = 10, 200, 3, 20


def federation():
    rng = np.random.default_rng(0)
    theta = rng.normal(size=DIM)
    clients = []
    for _ in range(CLIENTS):
        x = rng.normal(size=(ROWS, DIM)).astype(np.float32)
        y = (rng.uniform(size=ROWS) < 1 / (1 + np.exp(-x @ theta))).astype(np.float32)
        clients.append({"x": x, "y": y})
    return fm.Federation(clients)


def run(engine: str, visits: int, **options):
    algorithm = fm.DSGLD(step_size=1e-3, batch_size=20, local_steps=LOCAL_STEPS)
    started = time.perf_counter()
    result = fm.sample(fm.models.logistic_regression(DIM), federation(), algorithm,
                       init=jnp.zeros(DIM), num_samples=visits, thin=LOCAL_STEPS, chains=1,
                       seed=0, engine=engine, progress=False, **options)
    return result, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    visits = 10 if args.quick else 40
    import warnings

    warnings.simplefilter("ignore", fm.ConvergenceWarning)
    run("local", visits)  # compile both lengths once: the runs below are the timed ones
    run("local", 5 * visits)
    local, local_wall = run("local", visits)
    _, longer_wall = run("local", 5 * visits)
    # a run's fixed costs (set-up, diagnostics) cancel in the difference of two lengths
    visit_seconds = max(longer_wall - local_wall, 0.0) / (4 * visits)
    step_seconds = max(visit_seconds / LOCAL_STEPS, 1e-9)
    ray_result, ray_wall = run("ray", visits, visit_timeout=300)
    flower_result, flower_wall = run("flower", visits, visit_timeout=300)
    np.testing.assert_allclose(flower_result.flat_samples(), local.flat_samples(), atol=1e-4)
    rows = [("local", visit_seconds, local_wall, 0.0),
            ("ray", ray_result.info["mean_visit_seconds"], ray_wall,
             ray_result.info["setup_time"]),
            ("flower", flower_result.info["mean_visit_seconds"], flower_wall,
             flower_result.info["setup_time"])]
    print(f"DSGLD, {CLIENTS} clients, d={DIM}, {ROWS} rows each, local_steps={LOCAL_STEPS}, "
          f"{visits} visits, 1 chain (draws of ray and flower equal local's)")
    print(f"{'engine':8} {'s / round':>10} {'run wall s':>11} {'set-up s':>9}")
    for name, per_round, wall, setup in rows:
        print(f"{name:8} {per_round:10.4f} {wall:11.1f} {setup:9.1f}")
    latency = rows[2][1]
    print(f"one local step computes in {step_seconds * 1e3:.3f} ms: a Flower round costs "
          f"{latency / step_seconds:,.0f} local steps (break-even local_steps); "
          f"local_steps >= {10 * latency / step_seconds:,.0f} keeps 90% of the time computing")


if __name__ == "__main__":
    main()
