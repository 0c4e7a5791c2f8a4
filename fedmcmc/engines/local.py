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

import math
import sys
import time
from typing import Any, Callable, Dict, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import rng

PyTree = Any

__all__ = ["ChainRun", "run_chains", "default_chunk_size"]


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


def default_chunk_size(total_draws: int, target_chunks: int = 20) -> int:
    return max(1, math.ceil(total_draws / target_chunks))


def _progress(enabled: bool, label: str, total: int):
    if not enabled:
        return None
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        transient=False,
    )
    progress.start()
    task = progress.add_task(label, total=total, rate="compiling")
    return progress, task


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
    chunk_size = chunk_size or default_chunk_size(total)
    # Every chunk has the same length, so the chunk is compiled once: the last chunk of a
    # run whose length is not a multiple of chunk_size runs its draws past ``total`` as
    # no-ops (``lax.cond`` on the draw index) instead of compiling a shorter program.
    chunk_size = max(1, min(chunk_size, total - start_draw))
    chains = jax.tree_util.tree_leaves(initial_states)[0].shape[0]
    if progress is None:
        progress = sys.stderr.isatty()

    def draw_keys(draw_index):
        return rng.split_key(rng.fold_in(key, draw_index), chains)

    def advance(states, step_inputs):
        """One draw of every chain; ``step_inputs``: the chains' keys, or their random
        numbers (``draw_noise``)."""
        states, draws, stats = jax.vmap(draw_step)(step_inputs, states)
        finite = jnp.all(jnp.isfinite(draws), axis=-1) & jnp.all(
            jnp.abs(draws) < divergence_threshold, axis=-1
        )
        return states, (draws, stats, finite)

    def advance_before_end(states, step_inputs, draw_index):
        """:func:`advance` for draws before ``total``; past it the states are kept and the
        outputs are placeholders (dropped on the host)."""
        placeholder = jax.eval_shape(advance, states, step_inputs)[1]

        def skip(states, _):
            return states, jax.tree_util.tree_map(
                lambda leaf: jnp.ones(leaf.shape, leaf.dtype), placeholder)

        return jax.lax.cond(draw_index < total, advance, skip, states, step_inputs)

    def one_draw(states, draw_index):
        return advance_before_end(states, draw_keys(draw_index), draw_index)

    def one_draw_with(states, inputs):
        noise, draw_index = inputs
        return advance_before_end(states, noise, draw_index)

    def noise_block(states, indices):
        noise = jax.vmap(lambda i: jax.vmap(draw_noise)(draw_keys(i)))(indices)
        return jax.lax.scan(one_draw_with, states, (noise, indices))

    if draw_noise is not None:
        one_chain_noise = jax.eval_shape(draw_noise, jax.random.key(0))
        per_draw = chains * sum(
            int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
            for leaf in jax.tree_util.tree_leaves(one_chain_noise))
        block = max(1, int(noise_block_bytes // max(per_draw, 1)))

    @jax.jit
    def run_chunk(states, draw_indices):
        if draw_noise is None:
            return jax.lax.scan(one_draw, states, draw_indices)
        n = draw_indices.shape[0]
        size = min(block, n)
        full, rest = divmod(n, size)
        head = draw_indices[: full * size].reshape(full, size)
        states, out = jax.lax.scan(noise_block, states, head)
        out = jax.tree_util.tree_map(lambda a: a.reshape((full * size,) + a.shape[2:]), out)
        if rest:
            states, tail = noise_block(states, draw_indices[full * size:])
            out = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b]), out, tail)
        return states, out

    states = initial_states
    kept_draws, kept_stats = [], []
    diverged = np.zeros(chains, dtype=bool)
    first_bad = np.full(chains, -1, dtype=np.int64)
    bad_stats: Dict[str, np.ndarray] = {}
    interrupted = False
    done = start_draw
    bar = _progress(progress, label, total)
    started = time.perf_counter()
    try:
        while done < total:
            n = min(chunk_size, total - done)
            indices = jnp.arange(done, done + chunk_size, dtype=jnp.int32)
            chunk_start = time.perf_counter()
            try:
                new_states, (draws, stats, finite) = run_chunk(states, indices)
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
    )
