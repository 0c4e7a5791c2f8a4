"""The in-process engine: all clients and chains in one compiled JAX program.

Every algorithm reduces to a *draw step* for one chain::

    draw_step(key, state) -> (state, draw, stats)

which advances the chain from one kept draw to the next (``thin`` Langevin
iterations, or ``sample_interval`` units of PDMP time). This module ``vmap``s
it over chains, loops it over a chunk of draws under ``jit``, and runs the
chunks with the driver every engine shares (:func:`fedmcmc.engines.driver.drive`:
progress, divergence, callbacks, Ctrl-C). Keys are derived from the draw index (``fold_in``), so the draws do not
depend on how the run is cut into chunks -- which is what makes checkpoint and
resume exact. (``fedmcmc.rng``: ``jax.random``'s keys bit for bit, hash unrolled.)
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import rng
from ..cache import jit_with_constants_as_arguments
from .driver import ChainRun, default_chunk_size, drive

PyTree = Any

__all__ = ["ChainRun", "run_chains", "default_chunk_size", "shared_chunk_size", "compiler_options",
           "iteration_key"]


def iteration_key(root: jax.Array, chains: int, thin: int, chain, t):
    """The key of iteration ``t`` of ``chain`` in this engine: draw ``t // thin``'s key
    ``fold_in(root, t // thin)``, split over chains, split over its ``thin`` iterations. The
    protocol engines derive their iterations' keys with it, so their draws equal this
    engine's."""
    draw_key = jax.random.split(jax.random.fold_in(root, t // thin), chains)[chain]
    return jax.random.split(draw_key, thin)[t % thin]


# XLA's CPU compiler splits a fused loop into tasks on its intra-op thread pool when a cost
# model deems the loop large. The model charges a minibatch gather the size of the whole
# array it gathers from (every client's data), so on a 2-core machine each step of a single
# chain paid ~0.8 us of thread hand-off to copy 50 rows (a hand-written SGLD step: 1.70 us
# split, 0.90 us not). With many chains the vmapped loops really are large and the split pays
# off: per chain-step of the logistic FSGLD update on 2 cores, split against not, 2.1 against
# 1.5 us at 2 chains, 1.8-2.7 against 1.7 at 16, 1.5-2.5 against 1.7 at 64, 1.4 against
# 1.55-1.6 at 256 (`benchmarks/bench_overheads.py` measures both).
SPLIT_LOOPS_MIN_CHAINS = 64


def compiler_options(chains: int) -> Dict[str, Any]:
    """XLA options of the run's compiled program: without intra-op splitting of fused loops
    below :data:`SPLIT_LOOPS_MIN_CHAINS` chains on CPU (the draws are the same either way)."""
    if chains < SPLIT_LOOPS_MIN_CHAINS and jax.default_backend() == "cpu":
        return {"xla_disable_hlo_passes": "cpu-parallel-task-assigner"}
    return {}


def shared_chunk_size(total_draws: int) -> int:
    """This engine's default chunk length: about ``total_draws / 20``
    (:func:`~fedmcmc.engines.driver.default_chunk_size`) rounded down to a ``2^k`` or
    ``3 * 2^k`` (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, ...; at least 2/3 of it, so at most
    30 chunks, 20 to 30 from 1,000 draws on, and never more memory per chunk than the
    unrounded length).

    The compiled chunk's shapes depend on its length only, so runs of nearly the same length
    (another ``num_samples``, a resumed run) are the same program and come out of JAX's
    compilation caches, in memory and on disk, instead of compiling again; only the last
    chunk is shorter."""
    size = default_chunk_size(max(int(total_draws), 1))
    power = 1
    while 2 * power <= size:
        power *= 2
    return power * 3 // 2 if power >= 2 and power * 3 // 2 <= size else power


def run_chains(
    draw_step: Callable[[jax.Array, PyTree], tuple],
    initial_states: PyTree,
    key: jax.Array,
    *,
    burn_in: int,
    num_samples: int,
    position: Callable[[PyTree], jax.Array],
    divergence_threshold: float = 1e10,
    chunk_size: Optional[int] = None,
    progress: Optional[bool] = None,
    label: str = "sampling",
    iterations_per_draw: int = 1,
    start_draw: int = 0,
    on_chunk: Optional[Callable[[PyTree, int], None]] = None,
    on_draws: Optional[Callable[[np.ndarray, Dict[str, np.ndarray], int], None]] = None,
    draw_noise: Optional[Callable[[jax.Array], PyTree]] = None,
    noise_block_bytes: int = 4 << 20,
) -> ChainRun:
    """Run ``burn_in + num_samples`` draws of ``draw_step`` on every chain.

    Parameters
    ----------
    draw_step:
        ``(key, state) -> (state, draw, stats)`` for ONE chain; ``draw`` is the
        flat position to keep, ``stats`` a dict of scalars recorded per draw.
    initial_states:
        Chain states stacked on a leading chain axis.
    position:
        ``state -> flat vector`` used for the divergence check.
    divergence_threshold:
        A chain whose draw is non-finite or has an entry larger than this in
        absolute value is stopped as diverged.
    chunk_size:
        Draws per compiled call (progress, divergence checks and checkpoints happen between
        calls); default :func:`shared_chunk_size` of the draws to run.
    start_draw:
        Global index of the first draw to run (resume); draws with index below
        ``burn_in`` are discarded.
    on_chunk:
        Called with ``(states, draws_done)`` after every chunk (checkpoints).
    on_draws:
        Called after every chunk, before ``on_chunk``, with the chunk's KEPT
        draws ``(chains, k, dim)``, their stats ``{name: (chains, k)}`` and the
        global index of the first of them (checkpoints keep the draws so far).
    draw_noise:
        Optional ``key -> random numbers of one draw of one chain``. Then
        ``draw_step(noise, state)`` takes those numbers instead of a key, and the
        engine draws them for a block of draws and all chains in one batched call
        (blocks of at most ``noise_block_bytes``) -- the same numbers, from the same
        keys, as one call per draw, but without the per-call cost of the PRNG, which
        dominates a small model's update on CPU.
    """
    total = burn_in + num_samples
    chunk_size = chunk_size or shared_chunk_size(total - start_draw)
    chunk_size = max(1, min(chunk_size, total - start_draw))
    chains = jax.tree_util.tree_leaves(initial_states)[0].shape[0]

    def draw_keys(key, draw_index):
        return rng.split_key(rng.fold_in(key, draw_index), chains)

    def draw_all_chains(states, step_inputs):
        """One draw of every chain; ``step_inputs``: the chains' keys, or their random
        numbers (``draw_noise``)."""
        if chains == 1:
            # not vmapped: a batch axis of one still turned a small model's matrix-vector
            # products into batched ones with layout changes around them, two extra
            # operations per update in the compiled loop (same numbers either way)
            first = lambda tree: jax.tree_util.tree_map(lambda leaf: leaf[0], tree)  # noqa: E731
            stacked = lambda tree: jax.tree_util.tree_map(lambda leaf: leaf[None], tree)  # noqa: E731
            states, draws, stats = stacked(draw_step(first(step_inputs), first(states)))
        else:
            states, draws, stats = jax.vmap(draw_step)(step_inputs, states)
        return states, (draws, stats)

    # jitted so that its trace is cached: the chunk below traces it once for the shapes of
    # its outputs and calls it again in its loop with the same input types, and tracing a
    # large model's step twice was half of a warm start; inlined, so that the arrays the step
    # closes over become the chunk program's arguments (jit_with_constants_as_arguments)
    draw_all_chains = jax.jit(draw_all_chains, inline=True)

    def record(buffers, position, outputs):
        return jax.tree_util.tree_map(
            lambda buffer, value: jax.lax.dynamic_update_index_in_dim(buffer, value, position, 0),
            buffers, outputs)

    if draw_noise is not None:
        # the key made inside the shape evaluation: an eager key compiles a program
        one_chain_noise = jax.eval_shape(lambda: draw_noise(jax.random.key(0)))
        per_draw = chains * sum(
            int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
            for leaf in jax.tree_util.tree_leaves(one_chain_noise))
        block = min(chunk_size, max(1, int(noise_block_bytes // max(per_draw, 1))))

    # Every chunk is the same compiled program: the number of draws it makes (``count``,
    # at most ``chunk_size``; fewer in a run's last chunk) is an argument, the trip count
    # of its loops, and the outputs have ``chunk_size`` rows of which the first ``count``
    # are filled. (A fixed-length scan that skips the extra draws needs a conditional or
    # a select per draw, which on CPU cost more than a small model's whole update.)
    # The run's key is an argument, not a constant of the program: runs that differ only in
    # their seed are the same program (a compilation cache hit instead of a new compile).
    # (the chunk's other closed-over arrays, client data and fits, are arguments too)
    @functools.partial(jit_with_constants_as_arguments, compiler_options=compiler_options(chains))
    def run_chunk(states, key, first_draw, count):
        inputs = draw_keys(key, first_draw) if draw_noise is None else jax.vmap(draw_noise)(
            draw_keys(key, first_draw))
        shapes = jax.eval_shape(draw_all_chains, states, inputs)[1]
        buffers = jax.tree_util.tree_map(
            lambda leaf: jnp.zeros((chunk_size,) + leaf.shape, leaf.dtype), shapes)

        if draw_noise is None:
            def one_draw(i, carry):
                states, buffers = carry
                states, outputs = draw_all_chains(states, draw_keys(key, first_draw + i))
                return states, record(buffers, i, outputs)

            return jax.lax.fori_loop(0, count, one_draw, (states, buffers))

        def one_block(b, carry):
            # the random numbers of a block of draws and all chains in one batched call
            start = b * block
            noise = jax.vmap(
                lambda i: jax.vmap(draw_noise)(draw_keys(key, first_draw + start + i)))(
                jnp.arange(block, dtype=jnp.int32))

            def one_draw(j, carry):
                states, buffers = carry
                inputs = jax.tree_util.tree_map(lambda leaf: leaf[j], noise)
                states, outputs = draw_all_chains(states, inputs)
                return states, record(buffers, start + j, outputs)

            return jax.lax.fori_loop(0, jnp.minimum(block, count - start), one_draw, carry)

        blocks = (count + block - 1) // block
        return jax.lax.fori_loop(0, blocks, one_block, (states, buffers))

    def advance(states, first_draw, count):
        # NumPy scalars: jnp.int32(x) of a Python int compiles a conversion program
        states, (draws, stats) = run_chunk(states, key, np.int32(first_draw), np.int32(count))
        # sliced in NumPy: slicing the device arrays would compile a program per shape
        return states, np.asarray(draws)[:count], {k: np.asarray(v)[:count]
                                                   for k, v in stats.items()}

    # shapes only: indexing the states eagerly compiled one small program per leaf shape
    dim = int(jax.eval_shape(
        lambda states: position(jax.tree_util.tree_map(lambda x: x[0], states)),
        initial_states).shape[0])
    return drive(advance, initial_states, chains=chains, draw_dim=dim, burn_in=burn_in,
                 num_samples=num_samples, start_draw=start_draw, chunk_size=chunk_size,
                 divergence_threshold=divergence_threshold, progress=progress, label=label,
                 iterations_per_draw=iterations_per_draw, on_chunk=on_chunk, on_draws=on_draws)
