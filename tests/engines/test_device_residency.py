"""What a run on a GPU needs of the in-process engine (issue 45), checked on any backend.

* **No host round trip inside a run's chunk**: the compiled programs of a run call no host
  callback and exchange nothing with the host (no infeed/outfeed, send/recv); the draws come
  back once per chunk (``engines.local.run_chains``: one ``np.asarray`` per chunk, at most about
  30 per run), which is when the driver checks divergence and reports progress.
* **PDMP times and positions stay float64**: the federated Zig-Zag and BPS simulate their
  trajectories under ``jax.enable_x64`` whatever the model's dtype; the event times and the
  positions of a draw step's output are float64 (checked by tracing, so on whatever backend the
  suite runs: on a GPU machine, on the GPU).
"""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from compiled_programs import dump_programs_to

GAUSSIAN = fm.Model(
    log_prior=lambda p: -0.5 * jnp.sum(p ** 2),
    log_likelihood=lambda p, ex: -0.5 * jnp.sum((ex["x"] - p) ** 2),
)
# host-side operations a compiled program could contain (custom calls of JAX's callbacks)
HOST_TRAFFIC = re.compile(r"callback|infeed|outfeed|stablehlo\.send|stablehlo\.recv|"
                          r"host_compute|SendToHost|RecvFromHost", re.IGNORECASE)


def _federation(sizes=(17, 19, 13), dim=2):
    clients = []
    for client, rows in enumerate(sizes):
        rs = np.random.default_rng(client)
        clients.append({"x": rs.normal(client, 1.0, size=(rows, dim)).astype(np.float32)})
    return fm.Federation(clients)


ALGORITHMS = {
    "FSGLD": lambda: fm.FSGLD(step_size=1e-3, batch_size=5, local_steps=4, surrogate="exact"),
    "FedZigZag": lambda: fm.FedZigZag(sample_interval=0.2),
}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_run_programs_exchange_nothing_with_the_host(tmp_path, name):
    with dump_programs_to(tmp_path), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a short run does not converge
        fm.sample(GAUSSIAN, _federation(), algorithm=ALGORITHMS[name](), init=jnp.zeros(2),
                  num_samples=6, burn_in=2, chains=2, seed=3, progress=False,
                  chunk_size=3)
    modules = sorted(tmp_path.glob("*.mlir"))
    assert modules, "no module was lowered: the check would pass vacuously"
    traffic = {path.name: sorted(set(HOST_TRAFFIC.findall(path.read_text())))
               for path in modules}
    assert not {name: found for name, found in traffic.items() if found}


def test_the_check_sees_a_host_callback(tmp_path):
    """The same pattern finds a callback when a program has one."""
    with dump_programs_to(tmp_path):
        jax.jit(lambda x: jax.pure_callback(np.sin, jax.ShapeDtypeStruct((), x.dtype), x))(
            jnp.float32(1.0)).block_until_ready()
    assert any(HOST_TRAFFIC.search(path.read_text()) for path in tmp_path.glob("*.mlir"))


@pytest.mark.parametrize("algorithm", [fm.FedZigZag(sample_interval=0.2),
                                       fm.FedBPS(sample_interval=0.2)], ids=["ZigZag", "BPS"])
def test_pdmp_times_and_positions_are_float64(algorithm):
    federation = _federation()
    init = jnp.zeros(2, jnp.float32)  # the model's dtype: float32
    with jax.enable_x64(True):
        built = algorithm.build(GAUSSIAN, federation, init, chains=2, seed=0)
        states = built.initial_states
        for field in ("t", "x", "v", "kept_time", "sum_x"):
            assert getattr(states, field).dtype == jnp.float64, field
        one_chain = jax.tree_util.tree_map(lambda leaf: leaf[0], states)
        state, draw, _ = jax.eval_shape(built.draw_step, built.key, one_chain)
        assert state.t.dtype == jnp.float64 and state.x.dtype == jnp.float64
        assert draw.dtype == jnp.float64
