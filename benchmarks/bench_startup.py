"""Time to first draws in a fresh process: cold against warm compilation cache, in one run.

Each measurement is a new Python process that imports fedmcmc and then runs one small
``fm.sample``: Bayesian logistic regression (d = 3 plus a bias, as a pytree), 4 clients of
unequal size, 2 chains, 50 kept draws. The time reported is from after ``import fedmcmc`` to
the draws in hand (the issue's "time to first draw"); the import itself is printed apart.

* ``off``  -- ``FEDMCMC_COMPILATION_CACHE=0``: no persistent cache (fedmcmc before the cache);
* ``cold`` -- the cache on, in a new empty directory (``FEDMCMC_CACHE_DIR`` = a fresh temporary
  directory): every program compiled and written;
* ``warm`` -- the same directory again, in another new process: programs read back.

After the timed run each local-engine child runs once more with another seed (``next``): the
next ``fm.sample`` of a session, which finds its programs compiled in the process already
(``fm.cache.jit_with_constants_as_arguments``); ``lowered`` counts the programs it still had to
lower (0 when every one was shared).

For each family (FSGLD with its default Laplace surrogates, Fed Zig-Zag; ``--families
FSGLD-auto``: FSGLD with ``step_size="auto"``; ``DULA``: DULA with its "auto" settings on a
ring) the three are run in
turn ``--repeats`` times (default 2; a fresh directory for every cold run) and the fastest of
each is kept. Printed: seconds, the ratios warm/cold and cold/off, and from JAX's monitoring
events how many programs the run compiled or loaded, how many of those were cache hits, and
the seconds spent tracing, lowering and compiling-or-loading.

``--ray`` adds the Ray engine's set-up against the local engine: the same FSGLD run with
``engine="ray"`` (Ray started on loopback in the child; ``--clients-per-actor default``,
the engine's default placement: one actor per CPU when clients outnumber CPUs; ``auto``: the
same, asked for; or N, ``1`` for one actor per client) after a warm
local run, cold and warm cache, each in a fresh process; Ray's own start is included. The
child starts Ray itself, as a user's script would, and runs a second time with another seed:
that run's clients are hosted by the first run's actors (the engine option ``reuse_actors``),
and its time is printed against the local run's.
With it, ``floor``: a fresh process that starts Ray the same way and as many actors as the
run had, each only importing fedmcmc (hence JAX) and running one tiny compiled operation:
what the processes alone cost, before any client work. Its ratio to the local engine's warm
run is the lowest any set-up with one process per actor can reach on this machine.

    python benchmarks/bench_startup.py
    python benchmarks/bench_startup.py --repeats 3 --ray
    python benchmarks/bench_startup.py --repeats 1 --ray --ray-problem table1 --families FSGLD
    python benchmarks/bench_startup.py --repeats 1 --ray --ray-problem table1 --families FSGLD \
        --clients-per-actor 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

FAMILIES = ("FSGLD", "FedZigZag")
#: ``--families`` may also name these (not run by default): FSGLD with ``step_size="auto"``,
#: whose set-up compiles the clients' noise statistics
EXTRA_FAMILIES = ("FSGLD-auto", "DULA")
#: ``--ray-problem table1``: the issue's case, FSGLD Table 1's small-client set-up (30 clients,
#: MLP 18-18-8, SGLD surrogates of 3,000 draws per client) on 335 generated rows per client
RAY_PROBLEMS = ("toy", "table1")

CHILD = r"""
import contextlib, json, sys, time
started = time.perf_counter()
import fedmcmc as fm
imported = time.perf_counter()
import jax, jax.numpy as jnp, numpy as np
from jax import monitoring

counts, seconds = {}, {}
def on_event(name, **kwargs):
    counts[name] = counts.get(name, 0) + 1
def on_duration(name, duration, **kwargs):
    counts[name] = counts.get(name, 0) + 1
    seconds[name] = seconds.get(name, 0.0) + duration
monitoring.register_event_listener(on_event)
monitoring.register_event_duration_secs_listener(on_duration)

family, engine = sys.argv[1], sys.argv[2]
engine_options = {} if engine == "local" or sys.argv[3] == "default" else {
    "clients_per_actor": sys.argv[3] if sys.argv[3] == "auto" else int(sys.argv[3])}
rs = np.random.default_rng(1)
if family == "FSGLD-table1":
    from fedmcmc.models import synthetic
    model = fm.models.mlp_classifier(18, 2)
    init = model.attributes["init"](jax.random.key(0))
    federation = synthetic.teacher_classification_clients(rs.beta(0.5, 0.5, size=30), 335, seed=100)
    algorithm = fm.FSGLD(step_size=1e-4, batch_size=50, local_steps=40, surrogate="sgld", diagonal=True,
                         surrogate_draws=3000, surrogate_burn_in=1000)
    kwargs = dict(num_samples=10, burn_in=0, thin=40, chains=2)
else:
    kwargs = dict(num_samples=50, burn_in=10, chains=2)
if family != "FSGLD-table1":
  model = fm.Model(
    log_prior=lambda p: -0.5 * (jnp.sum(p["w"] ** 2) + p["b"] ** 2),
    log_likelihood=lambda p, ex: ex["y"] * (ex["x"] @ p["w"] + p["b"])
    - jnp.logaddexp(0.0, ex["x"] @ p["w"] + p["b"]),
)
  clients = []
  for s, n in enumerate((120, 200, 80, 40)):
    x = rs.normal(s - 1.5, 1, size=(n, 3)).astype(np.float32)
    y = (rs.random(n) < 1 / (1 + np.exp(-(x @ np.array([1.0, -1.0, 0.5]) + 0.3)))).astype(np.float32)
    clients.append({"x": x, "y": y})
  federation = fm.Federation(clients)
  init = {"w": jnp.zeros(3), "b": jnp.zeros(())}
  algorithm = {
    "FSGLD": fm.FSGLD(step_size=1e-3, batch_size=20, local_steps=10),
    "FSGLD-auto": fm.FSGLD(step_size="auto", batch_size=20, local_steps=10),
    "FedZigZag": fm.FedZigZag(sample_interval=0.5),
    "DULA": fm.DULA(),
  }[family]
again = len(sys.argv) > 4 and sys.argv[4] == "again"
session = contextlib.nullcontext()
if again:  # Ray started here, as a user's script does, so that it outlives the first run
    from fedmcmc.engines.ray_security import ray_session
    session = ray_session(None, None, False)
def run(seed=0):
    out = fm.sample(model, federation, algorithm, init=init, seed=seed, progress=False,
                    engine=engine, **kwargs, **engine_options)
    jax.block_until_ready(out.samples)
    return out
with session:
    result = run()
    finished = time.perf_counter()
    figures = {
        "import": imported - started,
        "run": finished - imported,
        "programs": counts.get("/jax/core/compile/backend_compile_duration", 0),
        "hits": counts.get("/jax/compilation_cache/cache_hits", 0),
        "traces": counts.get("/jax/core/compile/jaxpr_trace_duration", 0),
        "trace_s": seconds.get("/jax/core/compile/jaxpr_trace_duration", 0.0),
        "lower_s": seconds.get("/jax/core/compile/jaxpr_to_mlir_module_duration", 0.0),
        "compile_s": seconds.get("/jax/core/compile/backend_compile_duration", 0.0),
        "setup_phases": result.info.get("setup_phases"),
        "actors": len(result.info.get("ray_actors", [])),
    }
    if again:  # another seed, as a user's next run (the same seed would be a repeat)
        repeat = run(seed=1)
        figures.update(again=time.perf_counter() - finished,
                       reused=repeat.info.get("ray_actors_reused", 0))
    elif engine == "local":  # the next run in this process, with another seed
        lowered_before = counts.get("/jax/core/compile/jaxpr_to_mlir_module_duration", 0)
        run(seed=1)
        figures.update(next=time.perf_counter() - finished, next_lowered=counts.get(
            "/jax/core/compile/jaxpr_to_mlir_module_duration", 0) - lowered_before)
print(json.dumps(figures))
"""


# ``--ray``'s floor: Ray started as engine="ray" starts it, ``sys.argv[1]`` actors that each
# import fedmcmc and run one compiled operation; seconds from after `import fedmcmc` to all ready
FLOOR_CHILD = r"""
import json, sys, time
started = time.perf_counter()
import fedmcmc as fm
imported = time.perf_counter()
from fedmcmc.engines.ray_security import import_ray, ray_session

class Bare:
    def __init__(self):
        import fedmcmc  # what a client actor imports when its endpoint is unpickled
        import jax.numpy as jnp
        jnp.zeros(3).block_until_ready()

    def ready(self):
        return True

with ray_session(None, None, False):
    ray = import_ray()
    host = ray.remote(Bare)
    actors = [host.options(num_cpus=0, max_restarts=0).remote() for _ in range(int(sys.argv[1]))]
    ray.get([actor.ready.remote() for actor in actors])
    finished = time.perf_counter()
    for actor in actors:
        ray.kill(actor, no_restart=True)
print(json.dumps({"import": imported - started, "run": finished - imported}))
"""


def floor(actors: int, cache_dir: str) -> dict:
    """The processes' own cost: :data:`FLOOR_CHILD` in a fresh process (warm cache)."""
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", FEDMCMC_COMPILATION_CACHE="1",
               FEDMCMC_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", FLOOR_CHILD, str(actors)], env=env,
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"floor with {actors} actors failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def child(family: str, engine: str, mode: str, cache_dir: str | None,
          clients_per_actor: str = "default") -> dict:
    """Run one fresh process; ``mode`` is off, cold or warm. On Ray the child starts Ray
    itself and runs twice: ``again`` is the second run (another seed), on the first run's
    actors."""
    env = dict(os.environ)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if mode == "off":
        env["FEDMCMC_COMPILATION_CACHE"] = "0"
    else:
        env["FEDMCMC_COMPILATION_CACHE"] = "1"
        env["FEDMCMC_CACHE_DIR"] = cache_dir
    argv = [family, engine, clients_per_actor] + (["again"] if engine == "ray" else [])
    out = subprocess.run([sys.executable, "-c", CHILD, *argv], env=env,
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{family} {engine} {mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(family: str, engine: str, repeats: int, modes=("off", "cold", "warm"),
            clients_per_actor: str = "default") -> dict:
    best: dict[str, dict] = {}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="fedmcmc-bench-cache-") as cache_dir:
            for mode in modes:
                figures = child(family, engine, mode, cache_dir, clients_per_actor)
                if mode not in best or figures["run"] < best[mode]["run"]:
                    best[mode] = figures
    return best


def show(label: str, best: dict) -> None:
    print(f"\n{label}")
    print(f"  {'':6}{'import':>8}{'run':>8}{'programs':>10}{'hits':>6}{'traces':>8}"
          f"{'trace':>8}{'lower':>8}{'compile':>9}{'next':>7}{'lowered':>9}"
          "  (s; compile = compile or load; next: another seed in the same process, and the"
          " programs it lowered)")
    for mode, f in best.items():
        print(f"  {mode:6}{f['import']:8.2f}{f['run']:8.2f}{f['programs']:10d}{f['hits']:6d}"
              f"{f['traces']:8d}{f['trace_s']:8.2f}{f['lower_s']:8.2f}{f['compile_s']:9.2f}"
              + (f"{f['next']:7.2f}{f['next_lowered']:9d}" if "next" in f else ""))
    if "cold" in best and "warm" in best:
        print(f"  warm / cold = {best['warm']['run'] / best['cold']['run']:.2f}", end="")
    if "cold" in best and "off" in best:
        print(f";  cold / off = {best['cold']['run'] / best['off']['run']:.2f}", end="")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES),
                        choices=FAMILIES + EXTRA_FAMILIES)
    parser.add_argument("--ray", action="store_true", help="also Ray set-up against local")
    parser.add_argument("--ray-problem", default="toy", choices=RAY_PROBLEMS,
                        help="with --ray: the 4-client toy (default) or FSGLD Table 1's 30 clients")
    parser.add_argument("--clients-per-actor", default="default",
                        help="with --ray: the engine option clients_per_actor: default (the "
                             "engine's: one actor per CPU when clients outnumber CPUs), auto "
                             "(the same, asked for) or an integer (1: one actor per client)")
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"python {sys.version.split()[0]}; load average at start {os.getloadavg()[0]:.1f}; "
          f"fastest of {args.repeats}; time after `import fedmcmc` to 50 draws x 2 chains")
    for family in args.families:
        show(f"{family}, local engine", measure(family, "local", args.repeats))
    if args.ray:
        family = "FSGLD" if args.ray_problem == "toy" else "FSGLD-table1"
        local = measure(family, "local", args.repeats, modes=("cold", "warm"))
        ray = measure(family, "ray", args.repeats, modes=("cold", "warm"),
                      clients_per_actor=args.clients_per_actor)
        show(f"{family}, local engine", local)
        clients = 4 if family == "FSGLD" else 30
        show(f"{family}, Ray engine ({clients} clients in {ray['cold']['actors']} actors, "
             "Ray start included)", ray)
        for mode in ("cold", "warm"):
            print(f"  Ray set-up phases, {mode} cache: {ray[mode].get('setup_phases')}")
        for mode in ("cold", "warm"):
            print(f"  Ray / local, {mode} cache: "
                  f"{ray[mode]['run']:.2f} / {local[mode]['run']:.2f} s = "
                  f"{ray[mode]['run'] / local[mode]['run']:.1f}x")
        for mode in ("cold", "warm"):
            print(f"  Ray second run on the same instance, another seed "
                  f"({ray[mode]['reused']} actors reused), "
                  f"{mode} cache: {ray[mode]['again']:.2f} s = "
                  f"{ray[mode]['again'] / local[mode]['run']:.1f}x the local run")
        actors = ray["cold"]["actors"]
        with tempfile.TemporaryDirectory(prefix="fedmcmc-bench-cache-") as cache_dir:
            floor(actors, cache_dir)  # fills the cache with the tiny operation
            bare = min((floor(actors, cache_dir) for _ in range(args.repeats)),
                       key=lambda f: f["run"])
        print(f"  floor: Ray start and {actors} actors importing fedmcmc, nothing else: "
              f"{bare['run']:.2f} s = {bare['run'] / local['warm']['run']:.1f}x the local "
              "engine's warm run")
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}; "
          f"benchmark wall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
