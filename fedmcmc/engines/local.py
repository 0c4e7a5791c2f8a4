"""The in-process engine: all clients and chains in one compiled JAX program.

Every algorithm reduces to a *draw step* for one chain::

    draw_step(key, state) -> (state, draw, stats)

which advances the chain from one kept draw to the next (``thin`` Langevin
iterations, or ``sample_interval`` units of PDMP time). This module ``vmap``s
it over chains, ``scan``s it over a chunk of draws under ``jit``, and runs the
chunks from Python only to report progress, check for divergence and honour
Ctrl-C. Keys are derived from the draw index (``fold_in``), so the draws do not
depend on how the run is cut into chunks -- which is what makes checkpoint and
resume exact. (``fedmcmc.rng``: ``jax.random``'s keys bit for bit, hash unrolled.)
"""

from __future__ import annotations

import functools
import math
import sys
import time
from typing import Any, Callable, Dict, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import rng
from ..progress import progress_bar

PyTree = Any

__all__ = ["ChainRun", "run_chains", "default_chunk_size", "compiler_options", "iteration_key"]


class ChainRun(NamedTuple):
    """What :func:`run_chains` returns."""

    state: PyTree  # final states, leading axis = chains
    draws: np.ndarray  # (chains, kept, dim) kept draws
    stats: Dict[str, np.ndarray]  # each (chains, kept)
    diverged: np.ndarray  # (chains,) bool
    first_bad_draw: np.ndarray  # (chains,) global draw index of the first bad draw, -1 if none
    bad_stats: Dict[str, np.ndarray]  # stats at the first bad draw per chain
    draws_done: int  # global draws completed (burn-in included)
    interrupted: bool
    wall_time: float
    # draws and seconds of the chunks after the first (which also compiles the program):
    # the steady-state speed, ``None`` when the run fitted in one chunk
    steady_draws: int = 0
    steady_time: float = 0.0

    @property
    def seconds_per_draw(self) -> Optional[float]:
        """Wall time per draw (all chains together) once compiled; ``None`` if unmeasured."""
        return self.steady_time / self.steady_draws if self.steady_draws else None


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


def default_chunk_size(total_draws: int, target_chunks: int = 20) -> int:
    """About ``total_draws / target_chunks``, balanced so that the chunks are of nearly
    equal length: the last one makes fewer draws than the others by less than the number
    of chunks (progress and the steady-state timing advance evenly)."""
    size = max(1, math.ceil(total_draws / target_chunks))
    chunks = max(1, math.ceil(total_draws / size))
    return max(1, math.ceil(total_draws / chunks))


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
    chunk_size = chunk_size or default_chunk_size(total - start_draw)
    chunk_size = max(1, min(chunk_size, total - start_draw))
    chains = jax.tree_util.tree_leaves(initial_states)[0].shape[0]
    if progress is None:
        progress = sys.stderr.isatty()

    def draw_keys(draw_index):
        return rng.split_key(rng.fold_in(key, draw_index), chains)

    def advance(states, step_inputs):
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
        finite = jnp.all(jnp.isfinite(draws), axis=-1) & jnp.all(
            jnp.abs(draws) < divergence_threshold, axis=-1
        )
        return states, (draws, stats, finite)

    def record(buffers, position, outputs):
        return jax.tree_util.tree_map(
            lambda buffer, value: jax.lax.dynamic_update_index_in_dim(buffer, value, position, 0),
            buffers, outputs)

    if draw_noise is not None:
        one_chain_noise = jax.eval_shape(draw_noise, jax.random.key(0))
        per_draw = chains * sum(
            int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
            for leaf in jax.tree_util.tree_leaves(one_chain_noise))
        block = min(chunk_size, max(1, int(noise_block_bytes // max(per_draw, 1))))

    # Every chunk is the same compiled program: the number of draws it makes (``count``,
    # at most ``chunk_size``; fewer in a run's last chunk) is an argument, the trip count
    # of its loops, and the outputs have ``chunk_size`` rows of which the first ``count``
    # are filled. (A fixed-length scan that skips the extra draws needs a conditional or
    # a select per draw, which on CPU cost more than a small model's whole update.)
    @functools.partial(jax.jit, compiler_options=compiler_options(chains))
    def run_chunk(states, first_draw, count):
        inputs = draw_keys(first_draw) if draw_noise is None else jax.vmap(draw_noise)(
            draw_keys(first_draw))
        shapes = jax.eval_shape(advance, states, inputs)[1]
        buffers = jax.tree_util.tree_map(
            lambda leaf: jnp.zeros((chunk_size,) + leaf.shape, leaf.dtype), shapes)

        if draw_noise is None:
            def one_draw(i, carry):
                states, buffers = carry
                states, outputs = advance(states, draw_keys(first_draw + i))
                return states, record(buffers, i, outputs)

            return jax.lax.fori_loop(0, count, one_draw, (states, buffers))

        def one_block(b, carry):
            # the random numbers of a block of draws and all chains in one batched call
            start = b * block
            noise = jax.vmap(lambda i: jax.vmap(draw_noise)(draw_keys(first_draw + start + i)))(
                jnp.arange(block, dtype=jnp.int32))

            def one_draw(j, carry):
                states, buffers = carry
                inputs = jax.tree_util.tree_map(lambda leaf: leaf[j], noise)
                states, outputs = advance(states, inputs)
                return states, record(buffers, start + j, outputs)

            return jax.lax.fori_loop(0, jnp.minimum(block, count - start), one_draw, carry)

        blocks = (count + block - 1) // block
        return jax.lax.fori_loop(0, blocks, one_block, (states, buffers))

    states = initial_states
    kept_draws, kept_stats = [], []
    diverged = np.zeros(chains, dtype=bool)
    first_bad = np.full(chains, -1, dtype=np.int64)
    bad_stats: Dict[str, np.ndarray] = {}
    interrupted = False
    done = start_draw
    steady_draws, steady_time, chunks_run = 0, 0.0, 0
    bar = progress_bar(progress, label, total)
    started = time.perf_counter()
    try:
        while done < total:
            n = min(chunk_size, total - done)
            chunk_start = time.perf_counter()
            try:
                new_states, (draws, stats, finite) = run_chunk(
                    states, jnp.int32(done), jnp.int32(n))
                draws = np.array(draws[:n])  # (n, chains, dim), writable
                finite = np.asarray(finite[:n])  # (n, chains)
            except KeyboardInterrupt:
                interrupted = True
                break
            stats = {k: np.asarray(v[:n]) for k, v in stats.items()}
            keep_from = max(0, burn_in - done)
            if not finite.all():
                bad_rows = ~finite
                for chain in np.nonzero(bad_rows.any(axis=0))[0]:
                    row = int(np.argmax(bad_rows[:, chain]))
                    diverged[chain] = True
                    first_bad[chain] = done + row
                    for k, v in stats.items():
                        bad_stats.setdefault(k, np.full(chains, -1, dtype=v.dtype))
                        bad_stats[k][chain] = v[row, chain]
                    draws[row:, chain] = np.nan
                if keep_from < n:
                    kept_draws.append(draws[keep_from:])
                    kept_stats.append({k: v[keep_from:] for k, v in stats.items()})
                done += n
                states = new_states
                break
            if keep_from < n:
                kept_draws.append(draws[keep_from:])
                kept_stats.append({k: v[keep_from:] for k, v in stats.items()})
                if on_draws is not None:
                    on_draws(
                        draws[keep_from:].transpose(1, 0, 2),
                        {k: v[keep_from:].T for k, v in stats.items()},
                        done + keep_from,
                    )
            states = new_states
            done += n
            chunks_run += 1
            if chunks_run > 1:
                steady_draws += n
                steady_time += time.perf_counter() - chunk_start
            if on_chunk is not None:
                on_chunk(states, done)
            if bar is not None:
                elapsed = time.perf_counter() - chunk_start
                rate = n * chains * iterations_per_draw / max(elapsed, 1e-9)
                bar[0].update(bar[1], completed=done, rate=f"{rate:,.0f} chain-it/s")
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if bar is not None:
            bar[0].stop()

    dim = int(np.asarray(jax.eval_shape(lambda s: position(s), jax.tree_util.tree_map(lambda x: x[0], initial_states)).shape[0]))
    if kept_draws:
        all_draws = np.concatenate(kept_draws, axis=0).transpose(1, 0, 2)
        all_stats = {
            k: np.concatenate([s[k] for s in kept_stats], axis=0).T for k in kept_stats[0]
        }
    else:
        all_draws = np.zeros((chains, 0, dim))
        all_stats = {}
    return ChainRun(
        state=states,
        draws=all_draws,
        stats=all_stats,
        diverged=diverged,
        first_bad_draw=first_bad,
        bad_stats=bad_stats,
        draws_done=done,
        interrupted=interrupted,
        wall_time=time.perf_counter() - started,
        steady_draws=steady_draws,
        steady_time=steady_time,
    )
