"""Draws of every algorithm at a tiny size on engine="local" and engine="ray", saved or compared
bit for bit (issue 43: the engine refactor must not change a draw).

    python benchmarks/check_identity.py save  /tmp/draws_before.npz   # on the code before
    python benchmarks/check_identity.py check /tmp/draws_before.npz   # on the code after

``check`` exits 1 when any array differs (np.array_equal on the draws and the sample stats).
Ray runs on a 2-CPU instance bound to loopback that the script starts and shuts down.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import fedmcmc as fm  # noqa: E402

DIM = 2
SIZES = (12, 20, 30, 16)
MODEL = fm.Model(
    log_prior=lambda mu: -0.5 * jnp.sum(mu**2) / 10.0,
    log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2),
)


def federation():
    rng = np.random.default_rng(7)
    return fm.Federation([rng.normal(rng.uniform(-1, 1, DIM), 1.0, size=(n, DIM))
                          .astype(np.float32) for n in SIZES])


def cases():
    """(name, algorithm, run keywords, whether it runs on Ray)."""
    langevin = dict(num_samples=30, burn_in=5, thin=2, chains=2)
    return [
        ("SGLD", fm.SGLD(step_size=1e-3, batch_size=5), langevin, False),
        ("SGLD-auto", fm.SGLD(step_size="auto", batch_size=5), langevin, False),
        ("DSGLD", fm.DSGLD(step_size=1e-3, batch_size=5, local_steps=3), langevin, True),
        ("FSGLD", fm.FSGLD(step_size=1e-3, batch_size=5, local_steps=3), langevin, True),
        ("FSGLD-auto", fm.FSGLD(step_size="auto", batch_size=5, local_steps=3), langevin, True),
        # control_variates=False: the draws pinned before "auto" became the default (this
        # script checks engine and refactor identity, not the default's choice)
        ("FedZigZag", fm.FedZigZag(sample_interval=0.3, control_variates=False),
         dict(num_samples=30, burn_in=5, chains=2), True),
        ("FedBPS", fm.FedBPS(sample_interval=0.3, control_variates=False), dict(num_samples=30, burn_in=5, chains=2),
         True),
        # start="init": the chains at init, as before start="reference" became the default
        ("FedBoomerang", fm.FedBoomerang(sample_interval=0.3, refresh_rate=0.2,
                                         control_variates=False, start="init"),
         dict(num_samples=30, burn_in=5, chains=2), True),
        ("DULA", fm.DULA(step_size=1e-3, beta=0.3), langevin, True),
        ("GTDULA", fm.GTDULA(step_size=1e-3, beta=0.3, gamma=0.3, batch_size=5), langevin, True),
        ("FALD", fm.FALD(step_size=1e-3, batch_size=5, local_steps=2, participation=0.5),
         langevin, True),
        ("QLSD", fm.QLSD(step_size=1e-3, batch_size=5, bits=4, variance_reduction=True),
         langevin, True),
        # "precision" pinned: the weighting this case ran with before "stein" became the
        # default (issue 44); the default has its own case
        ("ConsensusMC", fm.ConsensusMC(weighting="precision", num_warmup=20),
         dict(num_samples=30, chains=2), True),
        ("ConsensusMC-stein", fm.ConsensusMC(num_warmup=20), dict(num_samples=30, chains=2),
         True),
    ]


def run_all(engines) -> dict:
    arrays = {}
    for name, algorithm, run, on_ray in cases():
        for engine in engines:
            if engine == "ray" and not on_ray:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = fm.sample(MODEL, federation(), algorithm, init=np.zeros(DIM, np.float32),
                                   seed=3, engine=engine, progress=False, **run)
            arrays[f"{name}/{engine}/draws"] = np.asarray(result.flat_samples())
            for stat, values in sorted(result.sample_stats.items()):
                arrays[f"{name}/{engine}/stats/{stat}"] = np.asarray(values)
            print(f"{name:14s} {engine:6s} done", flush=True)
    return arrays


def main(argv):
    mode, path = argv[1], argv[2]
    engines = argv[3].split(",") if len(argv) > 3 else ["local", "ray"]
    if "ray" in engines:
        import ray
        ray.init(address="local", include_dashboard=False, num_cpus=2,
                 _temp_dir=tempfile.mkdtemp(prefix="ray-identity-"),
                 _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        arrays = run_all(engines)
    finally:
        if "ray" in engines:
            ray.shutdown()
    if mode == "save":
        np.savez(path, **arrays)
        print(f"saved {len(arrays)} arrays to {path}")
        return 0
    before = np.load(path)
    differ = [k for k in before.files if k not in arrays or
              not np.array_equal(before[k], arrays[k], equal_nan=True)]
    missing = [k for k in arrays if k not in before.files]
    for key in differ:
        print(f"DIFFERS: {key}")
    print(f"compared {len(before.files)} arrays: {len(differ)} differ; new keys: {missing}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
