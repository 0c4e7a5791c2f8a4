"""The broadcast-and-gather engine (Fed-PDMC's Algorithm 2) over a :class:`~.comm.Transport`.

The pattern: every round the server broadcasts the chains' state to every worker,
each worker answers from its own data, and the server combines the answers. This
module holds the pattern's pieces and knows no family:

* :class:`BroadcastClient`, the generic client endpoint (a Ray actor on the Ray
  engine, an object on the in-process transport): it holds its worker's data and
  runs the family's client-side functions on it (``setup`` for set-up questions,
  ``configure`` once, ``respond`` every round);
* :class:`BroadcastDraw`, the server's draw step for all chains: rounds of
  broadcast-and-gather with the failure policy (stop, or drop the worker and carry
  on), composed from the family's server-side pieces (for Fed-PDMC,
  ``fedmcmc.pdmp.federated.FedProtocol``: the event keys and cap sent to the workers,
  the application of the earliest proposal, the end of a draw);
* :func:`run_remote_chains`, the Python driver (divergence, progress, chunk
  callbacks, Ctrl-C) of a run whose draw step sends messages.

``fedmcmc.pdmp.distributed`` composes them into Fed-PDMC's distributed run. Random
streams: event iteration ``i`` of draw ``k`` of chain ``c`` uses
``fold_in(split(fold_in(key, k), chains)[c], i)`` exactly as the in-process engine
does, so the two give the same draws up to float rounding of the per-worker sums.

Client failure: ``on_client_failure="stop"`` raises
:class:`~.comm.ClientFailureError` with every draw made so far; ``"drop"``
continues without the worker (its answers are replaced by the protocol's
``silent_proposal``): the target becomes the posterior given the remaining
workers' data (``info`` records it).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..progress import progress_bar
from ..protocols import client_context, client_function
from .comm import ClientEndpoint, ClientFailure, Transport, collect
from .local import ChainRun, default_chunk_size

__all__ = ["BroadcastClient", "BroadcastDraw", "run_remote_chains"]


# ----------------------------------------------------------------------------- client side


class BroadcastClient(ClientEndpoint):
    """One worker of a broadcast-and-gather protocol: its data and the family's functions.

    ``functions`` is an object whose methods ``client_<name>(context, *args)`` run here, in
    the worker's process, on a :class:`~fedmcmc.protocols.ClientContext` holding only this
    worker's rows (and a private ``store`` kept between calls). The messages: ``setup(name,
    *args)`` (set-up questions, e.g. Newton terms or rate bounds), ``configure(*args)``
    (once, before sampling) and ``respond(*args)`` (every round's answer)."""

    def __init__(self, index: int, source: Any, model, init: Any, functions: Any,
                 num_clients: int, seed: int):
        super().__init__(index, source)
        self.functions = functions
        self.context = client_context(self.index, self.data, self.size, model, init,
                                      num_clients, seed)

    def setup(self, name: str, *args):
        return client_function(self.functions, name)(self.context, *args)

    def configure(self, *args):
        return client_function(self.functions, "configure")(self.context, *args)

    def respond(self, *args):
        return client_function(self.functions, "respond")(self.context, *args)


# ----------------------------------------------------------------------------- server side


class BroadcastDraw:
    """The server's draw step for all chains: ``(draw_keys (C,), states) -> (states, draws,
    stats)``, the same as the in-process engine's vmapped ``draw_step`` but with every
    worker's proposal computed by that worker (one broadcast-and-gather per event
    iteration)."""

    def __init__(self, transport: Transport, num_workers: int, max_rounds_per_draw: int,
                 rate_diagnostics: bool, protocol, timeout: Optional[float],
                 on_client_failure: str):
        self.transport = transport
        self.max_rounds_per_draw = int(max_rounds_per_draw)
        self.rate_diagnostics = bool(rate_diagnostics)
        self.timeout = timeout
        self.on_client_failure = on_client_failure
        self.dead: List[int] = []
        self.failures: List[Dict[str, Any]] = []
        self.event_rounds = 0
        p = self.protocol = protocol
        M = int(num_workers)

        def prepare(draw_key, i, st, t_next):
            worker_keys, _ = p.event_keys(jax.random.fold_in(draw_key, i))
            return jax.random.key_data(worker_keys), p.event_cap(st, t_next)

        def apply(draw_key, i, st, res, t_next, counting, active):
            new = p.apply_proposals(jax.random.fold_in(draw_key, i), st, res, t_next, counting)
            return jax.tree_util.tree_map(lambda a, b: jnp.where(active, a, b), new, st)

        def rates(st, g_workers):
            g = jnp.concatenate([g_workers, p.prior_gradient_row(st.x)])
            return p.rates_from_gradients(st.x, st.v, g, st.alpha)

        def end(st, t_next, counting, events_before, rate_values):
            return p.draw_end(st, t_next, counting, events_before, rate_values)

        self._begin = jax.jit(jax.vmap(p.draw_begin))
        self._prepare = jax.jit(jax.vmap(prepare, in_axes=(0, None, 0, 0)))
        self._apply = jax.jit(jax.vmap(apply, in_axes=(0, None, 0, 0, 0, 0, 0)))
        self._rates = jax.jit(jax.vmap(rates))
        self._end = jax.jit(jax.vmap(end))
        self.num_workers = M

    def _broadcast(self, method: str, per_worker_args: Callable[[int], tuple]) -> Dict[int, Any]:
        """Send ``method`` to every live worker and gather the replies; on a failure stop
        (raise) or drop the worker, by the user's choice."""
        live = [m for m in range(self.num_workers) if m not in self.dead]
        pendings = [self.transport.call(m, method, *per_worker_args(m)) for m in live]
        values, failures = collect(self.transport, pendings, self.timeout)
        for pending, reason in failures:
            self._fail(pending.client, reason)
        failed = {id(pending) for pending, _ in failures}
        return {pending.client: value for pending, value in zip(pendings, values)
                if id(pending) not in failed}

    def _fail(self, client: int, reason: str) -> None:
        self.failures.append({"client": int(client), "reason": reason,
                              "event_round": self.event_rounds})
        if self.on_client_failure == "stop":
            raise ClientFailure(client, reason)
        self.dead.append(int(client))
        self.transport.kill(client)
        if len(self.dead) == self.num_workers:
            raise ClientFailure(client, "every worker has failed")

    def __call__(self, draw_keys, states):
        M = self.num_workers
        states, t_next, counting, events_before = self._begin(states)
        i = 0
        active = np.asarray(states.t < t_next)
        while active.any() and i < self.max_rounds_per_draw:
            key_data, caps = self._prepare(draw_keys, i, states, t_next)
            key_data = np.asarray(key_data)  # (C, M, 2)
            caps = np.where(active, np.asarray(caps), 0.0)  # finished chains: nothing to propose
            x, v = np.asarray(states.x), np.asarray(states.v)
            alpha, scale = np.asarray(states.alpha), np.asarray(states.scale)
            replies = self._broadcast(
                "respond", lambda m: (key_data[:, m], x, v, caps, alpha[:, m], scale[:, m]))
            self.event_rounds += 1
            res = self._stack(replies, scale)
            states = self._apply(draw_keys, i, states, res, t_next, counting, jnp.asarray(active))
            i += 1
            active = np.asarray(states.t < t_next)
        rate_values = None
        if self.rate_diagnostics:
            x, alpha = np.asarray(states.x), np.asarray(states.alpha)
            grads = self._broadcast("setup", lambda m: ("gradient", x, alpha[:, m]))
            g = np.stack([grads[m] if m in grads else np.zeros_like(x) for m in range(M)], axis=1)
            rate_values = self._rates(states, jnp.asarray(g))
        return self._end(states, t_next, counting, events_before, rate_values)

    def _stack(self, replies: Dict[int, Any], scale: np.ndarray):
        """Answers stacked as the in-process vmap over workers gives them: (C, M, ...). A
        dropped worker's answer is the protocol's ``silent_proposal`` (no event)."""
        chains = scale.shape[0]
        rows = [replies[m] if m in replies else self.protocol.silent_proposal(chains, scale[:, m])
                for m in range(self.num_workers)]
        fields = len(rows[0])
        return tuple(jnp.asarray(np.stack([row[k] for row in rows], axis=1))
                     for k in range(fields))


def run_remote_chains(draw_all, initial_states, key, *, burn_in: int, num_samples: int,
                      position: Callable, divergence_threshold: float = 1e10,
                      progress: Optional[bool] = None, label: str = "sampling",
                      chunk_size: Optional[int] = None, on_chunk=None, on_draws=None):
    """The Python driver of a distributed run: ``draw_all(draw_keys, states)`` advances
    every chain by one draw (keys as :func:`fedmcmc.engines.local.run_chains` derives
    them); returns ``(ChainRun, failure)`` where ``failure`` is the
    :class:`ClientFailure` that stopped the run, if any. Draws are checked for divergence
    after every draw; the progress bar, Ctrl-C and the chunk callbacks behave as in the
    in-process engine."""
    total = burn_in + num_samples
    chunk_size = chunk_size or default_chunk_size(total)
    chains = jax.tree_util.tree_leaves(initial_states)[0].shape[0]
    if progress is None:
        progress = sys.stderr.isatty()
    states = initial_states
    draws_list, stats_list = [], []
    diverged = np.zeros(chains, bool)
    first_bad = np.full(chains, -1, np.int64)
    bad_stats: Dict[str, np.ndarray] = {}
    interrupted = False
    failure = None
    done = 0
    unreported = 0  # kept draws not yet passed to on_draws
    bar = progress_bar(progress, label, total)
    started = time.perf_counter()
    last_update = started
    try:
        while done < total:
            keys = jax.random.split(jax.random.fold_in(key, done), chains)
            try:
                states, draws, stats = draw_all(keys, states)
            except ClientFailure as error:
                failure = error
                break
            draws = np.array(draws)
            stats = {k: np.asarray(v) for k, v in stats.items()}
            finite = np.all(np.isfinite(draws), axis=-1) & np.all(
                np.abs(draws) < divergence_threshold, axis=-1)
            if done >= burn_in:
                draws_list.append(draws)
                stats_list.append(stats)
                unreported += 1
            if not finite.all():
                for chain in np.nonzero(~finite)[0]:
                    diverged[chain] = True
                    first_bad[chain] = done
                    for k, v in stats.items():
                        bad_stats.setdefault(k, np.full(chains, -1, dtype=v.dtype))
                        bad_stats[k][chain] = v[chain]
                done += 1
                break
            done += 1
            if done % chunk_size == 0 or done == total:
                if on_draws is not None and unreported:
                    on_draws(np.stack(draws_list[-unreported:], axis=1),
                             {k: np.stack([s[k] for s in stats_list[-unreported:]], axis=1)
                              for k in stats_list[-1]},
                             done - unreported)
                    unreported = 0
                if on_chunk is not None:
                    on_chunk(states, done)
            now = time.perf_counter()
            if bar is not None and (now - last_update > 0.5 or done == total):
                rate = done * chains / max(now - started, 1e-9)
                bar[0].update(bar[1], completed=done, rate=f"{rate:,.1f} chain-draws/s")
                last_update = now
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if bar is not None:
            bar[0].stop()
    dim = int(np.shape(position(jax.tree_util.tree_map(lambda a: a[0], states)))[0])
    if draws_list:
        all_draws = np.stack(draws_list, axis=1)
        all_stats = {k: np.stack([s[k] for s in stats_list], axis=1) for k in stats_list[0]}
    else:
        all_draws = np.zeros((chains, 0, 2 * dim))
        all_stats = {}
    run = ChainRun(state=states, draws=all_draws, stats=all_stats, diverged=diverged,
                   first_bad_draw=first_bad, bad_stats=bad_stats, draws_done=done,
                   interrupted=interrupted, wall_time=time.perf_counter() - started)
    return run, failure
