"""The one run driver of every engine and family: chunks, divergence, progress, callbacks.

An engine hands :func:`drive` an *advance* function::

    advance(states, first_draw, count) -> (states, draws, stats)

that makes draws ``first_draw .. first_draw + count - 1`` of every chain: ``draws`` is
``(count, chains, draw_dim)``, ``stats`` a dict of ``(count, chains)`` arrays. How it makes
them is the engine's business -- one compiled program over all clients and chains (the
in-process engine), one broadcast-and-gather round per event (Fed-PDMC on a transport),
a chain handed from client to client (DSGLD/FSGLD), or agents stepping with their
neighbours' messages (DULA/GT-DULA). The driver does the rest, the same way for all:

* it cuts the run into chunks (``chunk_size`` draws; ``draws_per_call`` smaller calls
  inside a chunk for engines that can stop between draws);
* it checks every draw for divergence (a non-finite entry or one larger than
  ``divergence_threshold`` in absolute value), marks the chain, NaNs its later draws and
  stops the run after that call, keeping everything made before;
* it keeps the draws after ``burn_in`` (draws are indexed globally, so a resumed run,
  ``start_draw > 0``, continues where a checkpoint stopped);
* after every chunk it calls ``on_draws(kept draws, stats, first index)`` and
  ``on_chunk(states, draws_done)`` (checkpoints), and updates the progress bar;
* Ctrl-C ends the run with ``interrupted=True`` and the draws so far; a
  :class:`~fedmcmc.engines.comm.ClientFailure` raised by ``advance`` ends it with
  ``failure`` set. In both cases an engine may attach the draws it made in the call as
  ``partial``, a :class:`PartialDraws`, to the exception (the ``KeyboardInterrupt`` or the
  ``ClientFailure``): they are kept.

The driver returns a :class:`ChainRun`; :func:`fedmcmc.results.assemble_result` turns it
into the user's :class:`~fedmcmc.results.Result`.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import jax
import numpy as np

from ..progress import progress_bar
from .comm import ClientFailure

PyTree = Any

__all__ = ["ChainRun", "PartialDraws", "drive", "default_chunk_size", "check_draws",
           "draw_by_draw"]


class ChainRun(NamedTuple):
    """What :func:`drive` returns."""

    state: PyTree  # final states as ``advance`` returned them (leading axis = chains)
    draws: np.ndarray  # (chains, kept, draw_dim) kept draws
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
    # the ClientFailure that stopped the run, if one did
    failure: Optional[ClientFailure] = None
    # (chains,) draws made per chain (burn-in included) when chains stopped at different
    # draws (a failure in the middle of a hand-off chunk); None: every chain made draws_done
    draws_per_chain: Optional[np.ndarray] = None

    @property
    def seconds_per_draw(self) -> Optional[float]:
        """Wall time per draw (all chains together) once compiled; ``None`` if unmeasured."""
        return self.steady_time / self.steady_draws if self.steady_draws else None


class PartialDraws(NamedTuple):
    """The draws an ``advance`` call made before a client failed (attached to the
    :class:`ClientFailure` it raises as ``partial``): rows ``first_draw ..`` of every
    chain, NaN past ``made[c]``."""

    states: PyTree
    draws: np.ndarray  # (rows, chains, draw_dim)
    stats: Dict[str, np.ndarray]  # each (rows, chains)
    made: np.ndarray  # (chains,) rows really made per chain


def default_chunk_size(total_draws: int, target_chunks: int = 20) -> int:
    """About ``total_draws / target_chunks``, balanced so that the chunks are of nearly
    equal length: the last one makes fewer draws than the others by less than the number
    of chunks (progress and the steady-state timing advance evenly)."""
    size = max(1, math.ceil(total_draws / target_chunks))
    chunks = max(1, math.ceil(total_draws / size))
    return max(1, math.ceil(total_draws / chunks))


def check_draws(draws: np.ndarray, threshold: float) -> np.ndarray:
    """``(count, chains)`` True where a draw ``(count, chains, dim)`` is finite and below
    ``threshold`` in absolute value on every coordinate: the divergence rule of every
    engine."""
    return np.all(np.isfinite(draws), axis=-1) & np.all(np.abs(draws) < threshold, axis=-1)


def drive(
    advance: Callable[[PyTree, int, int], tuple],
    states: PyTree,
    *,
    chains: int,
    draw_dim: int,
    burn_in: int,
    num_samples: int,
    start_draw: int = 0,
    chunk_size: Optional[int] = None,
    draws_per_call: Optional[int] = None,
    divergence_threshold: float = 1e10,
    progress: Optional[bool] = None,
    label: str = "sampling",
    iterations_per_draw: int = 1,
    on_chunk: Optional[Callable[[PyTree, int], None]] = None,
    on_draws: Optional[Callable[[np.ndarray, Dict[str, np.ndarray], int], None]] = None,
) -> ChainRun:
    """Run draws ``start_draw .. burn_in + num_samples - 1`` of every chain with ``advance``.

    Parameters
    ----------
    advance:
        ``(states, first_draw, count) -> (states, draws (count, chains, draw_dim), stats)``.
    states:
        What ``advance`` takes first (chain states stacked on a leading chain axis, or
        whatever the engine keeps; the driver only hands it back and to ``on_chunk``).
    draw_dim:
        Length of one draw (for the shape of an empty result).
    chunk_size:
        Draws between callbacks (default: about a twentieth of the run).
    draws_per_call:
        At most this many draws per ``advance`` call (default: a whole chunk). Engines
        whose draws are Python round trips pass 1, so that a diverged chain stops the run
        at once.
    iterations_per_draw:
        Sampler iterations per draw, for the progress bar's rate.
    on_draws:
        Called after every chunk, before ``on_chunk``, with the chunk's KEPT draws
        ``(chains, k, draw_dim)``, their stats ``{name: (chains, k)}`` and the global index of
        the first of them (checkpoints keep the draws so far).
    on_chunk:
        Called with ``(states, draws_done)`` after every chunk.
    """
    total = burn_in + num_samples
    remaining = max(total - start_draw, 0)
    chunk_size = max(1, min(chunk_size or default_chunk_size(max(remaining, 1)),
                            max(remaining, 1)))
    if progress is None:
        progress = sys.stderr.isatty()
    kept_draws: List[np.ndarray] = []  # (k, chains, dim) blocks
    kept_stats: List[Dict[str, np.ndarray]] = []
    unreported = 0  # kept blocks not yet passed to on_draws
    diverged = np.zeros(chains, dtype=bool)
    first_bad = np.full(chains, -1, dtype=np.int64)
    bad_stats: Dict[str, np.ndarray] = {}
    interrupted, failure, made_per_chain = False, None, None
    done = start_draw
    steady_draws, steady_time, chunks_run = 0, 0.0, 0
    bar = progress_bar(progress, label, total)
    started = last_update = time.perf_counter()
    stopped = False

    def mark_diverged(first: int, draws: np.ndarray, stats: Dict[str, np.ndarray],
                      made: Optional[np.ndarray] = None) -> bool:
        """Stop the chains with a draw that fails :func:`check_draws` among ``draws`` (rows
        ``first ..``; with ``made``, only the rows each chain made: a stopped call's padding is
        not a divergence): record the first bad draw and its stats, and make the chain's draws
        NaN from there (in place). True if any chain diverged."""
        bad_rows = ~check_draws(draws, divergence_threshold)
        if made is not None:
            bad_rows &= np.arange(len(draws))[:, None] < np.asarray(made)[None, :]
        for chain in np.nonzero(bad_rows.any(axis=0))[0]:
            row = int(np.argmax(bad_rows[:, chain]))
            diverged[chain] = True
            first_bad[chain] = first + row
            for k, v in stats.items():
                bad_stats.setdefault(k, np.full(chains, -1, dtype=v.dtype))
                bad_stats[k][chain] = v[row, chain]
            draws[row:, chain] = np.nan
        return bool(bad_rows.any())

    def keep(first: int, draws: np.ndarray, stats: Dict[str, np.ndarray]) -> bool:
        """Keep the rows of draws ``first ..`` past the burn-in; True if any."""
        keep_from = max(0, burn_in - first)
        if keep_from >= len(draws):
            return False
        kept_draws.append(draws[keep_from:])
        kept_stats.append({k: v[keep_from:] for k, v in stats.items()})
        return True

    try:
        while done < total and not stopped:
            chunk_end = min(done + chunk_size, total)
            chunk_started = time.perf_counter()
            chunk_first = done
            while done < chunk_end:
                count = chunk_end - done if draws_per_call is None else min(
                    draws_per_call, chunk_end - done)
                try:
                    new_states, draws, stats = advance(states, done, count)
                except (ClientFailure, KeyboardInterrupt) as error:
                    if isinstance(error, KeyboardInterrupt):
                        interrupted = True
                    else:
                        failure = error
                    partial = getattr(error, "partial", None)
                    if partial is not None and len(partial.draws):
                        # the draws the call made before it stopped, checked as any others
                        partial_draws = np.array(partial.draws, dtype=partial.draws.dtype)
                        partial_stats = {k: np.asarray(v) for k, v in partial.stats.items()}
                        mark_diverged(done, partial_draws, partial_stats, partial.made)
                        keep(done, partial_draws, partial_stats)
                        made_per_chain = done + np.asarray(partial.made, np.int64)
                        states = partial.states
                        done += int(np.max(partial.made))
                    stopped = True
                    break
                draws = np.array(draws)  # writable copy
                stats = {k: np.asarray(v) for k, v in stats.items()}
                if mark_diverged(done, draws, stats):
                    keep(done, draws, stats)
                    done += count
                    states = new_states
                    stopped = True
                    break
                if keep(done, draws, stats):
                    unreported += 1
                states = new_states
                done += count
                now = time.perf_counter()
                if bar is not None and (now - last_update > 0.5 or done == chunk_end):
                    rate = (done - chunk_first) * chains * iterations_per_draw / max(
                        now - chunk_started, 1e-9)
                    bar[0].update(bar[1], completed=done, rate=f"{rate:,.1f} chain-it/s")
                    last_update = now
            if stopped:
                break
            chunks_run += 1
            if chunks_run > 1:
                steady_draws += chunk_end - chunk_first
                steady_time += time.perf_counter() - chunk_started
            if on_draws is not None and unreported:
                blocks = kept_draws[-unreported:]
                block_stats = kept_stats[-unreported:]
                on_draws(np.concatenate(blocks, axis=0).transpose(1, 0, 2),
                         {k: np.concatenate([s[k] for s in block_stats], axis=0).T
                          for k in block_stats[0]},
                         done - sum(len(b) for b in blocks))
            unreported = 0
            if on_chunk is not None:
                on_chunk(states, done)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if bar is not None:
            bar[0].stop()

    if kept_draws:
        all_draws = np.concatenate(kept_draws, axis=0).transpose(1, 0, 2)
        all_stats = {k: np.concatenate([s[k] for s in kept_stats], axis=0).T
                     for k in kept_stats[0]}
    else:
        all_draws = np.zeros((chains, 0, draw_dim))
        all_stats = {}
    return ChainRun(
        state=states, draws=all_draws, stats=all_stats, diverged=diverged,
        first_bad_draw=first_bad, bad_stats=bad_stats, draws_done=done,
        interrupted=interrupted, wall_time=time.perf_counter() - started,
        steady_draws=steady_draws, steady_time=steady_time, failure=failure,
        draws_per_chain=made_per_chain,
    )


def draw_by_draw(draw_all: Callable[[Any, PyTree], tuple], key, chains: int):
    """The ``advance`` of an engine whose draws are made one at a time from Python:
    ``draw_all(draw_keys, states) -> (states, draws (chains, dim), stats {name: (chains,)})``
    advances every chain by one draw. Draw ``k`` of chain ``c`` gets the key
    ``split(fold_in(key, k), chains)[c]``, the in-process engine's, so the two engines
    give the same draws."""

    def advance(states, first_draw, count):
        rows, row_stats = [], []
        for index in range(first_draw, first_draw + count):
            keys = jax.random.split(jax.random.fold_in(key, index), chains)
            states, draws, stats = draw_all(keys, states)
            rows.append(np.asarray(draws))
            row_stats.append({k: np.asarray(v) for k, v in stats.items()})
        return states, np.stack(rows), {k: np.stack([s[k] for s in row_stats])
                                        for k in row_stats[0]}

    return advance
