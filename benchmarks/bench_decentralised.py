"""Per-iteration time of DULA / GT-DULA: fedmcmc's compiled kernels against a NumPy loop
over agents in the style of the public DULA code (one optimiser step per agent, agent
by agent, neighbours summed in Python).

Logistic regression, d = 20 parameters, ``--rows`` examples per agent, ring graph,
full-batch local gradients; n = 10, 100, 1000 agents. Both sides run the same
iteration (equations (3) and (7)-(8)); the ratios are measured in the same run, each
side's time the best of several repeats (robust to other load on the machine), the
two sides' repeats interleaved so that a burst of load hits both. fedmcmc is timed
after compilation, over many iterations of one compiled scan, until block_until_ready.

    python benchmarks/bench_decentralised.py            # n = 10, 100, 1000
    python benchmarks/bench_decentralised.py --quick    # n = 10, 100, fewer repeats
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import fedmcmc as fm
from fedmcmc.decentralised import graphs, kernels
from fedmcmc.schedules import constant

DIM = 20
ALPHA, BETA, GAMMA = 1e-4, 0.3, 0.3


def make_problem(n: int, rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=DIM) / np.sqrt(DIM)
    clients = []
    for i in range(n):
        x = rng.normal(loc=0.3 * np.sin(i), size=(rows, DIM)).astype(np.float32)
        y = (rng.uniform(size=rows) < 1 / (1 + np.exp(-x @ w_true))).astype(np.float32)
        clients.append({"x": x, "y": y})

    def log_likelihood(w, example):
        logit = jnp.dot(example["x"], w)
        return example["y"] * logit - jnp.logaddexp(0.0, logit)

    model = fm.Model(log_prior=lambda w: -0.5 * jnp.sum(w**2), log_likelihood=log_likelihood)
    return model, fm.Federation(clients), clients


# ------------------------------------------------------------------ NumPy loop
class NumpyAgents:
    """Agent-by-agent DULA / GT-DULA, as the public DULA code does it with one
    optimiser per agent."""

    def __init__(self, clients, graph, tracking: bool, seed: int = 0):
        self.n = len(clients)
        self.clients = clients
        self.neighbours = [list(graph.neighbors(i)) for i in range(self.n)]
        self.rng = np.random.default_rng(seed)
        self.w = [np.zeros(DIM, np.float32) for _ in range(self.n)]
        self.tracking = tracking
        if tracking:
            self.g = [self.gradient(i, self.w[i]) for i in range(self.n)]
            self.d = [g.copy() for g in self.g]

    def gradient(self, i, w):
        """grad E_i = -grad log p(X_i|w) - (1/n) grad log p(w)."""
        x, y = self.clients[i]["x"], self.clients[i]["y"]
        p = 1.0 / (1.0 + np.exp(-(x @ w)))
        return -(x.T @ (y - p)) + w / self.n

    def step(self):
        n, w = self.n, self.w
        scale = np.sqrt(2 * ALPHA * n)
        new_w = []
        for i in range(n):
            consensus = sum(w[i] - w[j] for j in self.neighbours[i])
            direction = self.d[i] if self.tracking else self.gradient(i, w[i])
            noise = self.rng.standard_normal(DIM, dtype=np.float32)
            new_w.append(w[i] - BETA * consensus - ALPHA * n * direction + scale * noise)
        if self.tracking:
            new_g = [self.gradient(i, new_w[i]) for i in range(n)]
            new_d = []
            for i in range(n):
                mixing = sum(self.d[i] - self.d[j] for j in self.neighbours[i])
                new_d.append(self.d[i] - GAMMA * mixing + new_g[i] - self.g[i])
            self.g, self.d = new_g, new_d
        self.w = new_w


def numpy_burst(clients, graph, tracking, seconds):
    """``burst() -> seconds per iteration`` over about ``seconds`` of NumPy iterations."""
    agents = NumpyAgents(clients, graph, tracking)
    started = time.perf_counter()
    agents.step()
    per_burst = max(1, int(seconds / max(time.perf_counter() - started, 1e-6)))

    def burst():
        started = time.perf_counter()
        for _ in range(per_burst):
            agents.step()
        return (time.perf_counter() - started) / per_burst

    return burst


# ----------------------------------------------------------------- fedmcmc
def jax_burst(model, fed, topo, tracking, iterations):
    """``burst() -> seconds per iteration`` of one compiled scan of ``iterations`` steps
    (compiled and run once before)."""
    init = jnp.zeros(DIM)
    flat = model.flatten(init)
    local = kernels.local_gradient_fn(flat, fed.padded(), None)
    n = fed.num_clients
    if tracking:
        step = kernels.gtdula_kernel(local, topo.mixer(), BETA, GAMMA, constant(ALPHA), n)
        state = kernels.gtdula_init(jax.random.key(0), jnp.zeros((n, DIM)), local)
    else:
        step = kernels.dula_kernel(local, topo.mixer(), BETA, constant(ALPHA), n)
        state = kernels.dula_init(jnp.zeros((n, DIM)))

    @jax.jit
    def run(state, key):
        return jax.lax.scan(lambda s, k: (step(k, s), None), state, jax.random.split(key, iterations))[0]

    box = {"state": jax.block_until_ready(run(state, jax.random.key(1))), "repeat": 0}

    def burst():
        box["repeat"] += 1
        started = time.perf_counter()
        box["state"] = jax.block_until_ready(run(box["state"], jax.random.key(1 + box["repeat"])))
        return (time.perf_counter() - started) / iterations

    return burst


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, nargs="*", default=None)
    parser.add_argument("--rows", type=int, default=50, help="examples per agent")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sizes = args.agents or ([10, 100] if args.quick else [10, 100, 1000])
    numpy_seconds = 1.0 if args.quick else 3.0
    repeats = 3 if args.quick else 5

    print(f"logistic regression, d = {DIM}, {args.rows} rows per agent, ring, full-batch gradients")
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; times per iteration (all agents); "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    header = (f"{'algorithm':<8} {'n':>5} {'numpy loop':>12} {'fedmcmc':>10} {'ratio':>7} "
              f"{'fedmcmc/agent-step':>19} {'numpy/agent-step':>17}")
    print(header)
    print("-" * len(header))
    for tracking, name in [(False, "DULA"), (True, "GT-DULA")]:
        for n in sizes:
            model, fed, clients = make_problem(n, args.rows)
            topo = graphs.topology("ring", n)
            iterations = max(200, 200_000 // n)
            jax_step = jax_burst(model, fed, topo, tracking, iterations)
            numpy_step = numpy_burst(clients, topo.graph, tracking, numpy_seconds / repeats)
            t_jax = t_np = np.inf
            for _ in range(repeats):  # interleaved: a burst of load hits both sides
                t_jax = min(t_jax, jax_step())
                t_np = min(t_np, numpy_step())
            print(f"{name:<8} {n:>5} {t_np * 1e3:>10.3f}ms {t_jax * 1e3:>8.3f}ms {t_np / t_jax:>6.0f}x "
                  f"{t_jax / n * 1e6:>16.2f}us {t_np / n * 1e6:>15.1f}us", flush=True)


if __name__ == "__main__":
    main()
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
