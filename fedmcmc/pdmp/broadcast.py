"""Fed-PDMC's server for the broadcast-and-gather run (Algorithm 2) over a
:class:`~fedmcmc.engines.comm.Transport`.

:class:`BroadcastDraw` is the server's side for all chains: rounds of
broadcast-and-gather with the failure policy (stop, or drop the worker and carry on),
composed from the family's server-side pieces (``fedmcmc.pdmp.federated.FedProtocol``:
the event keys and cap sent to the workers, the application of the earliest proposal,
the end of a draw). The chains are not held in step: each starts its next draw as soon
as it has ended the last. A run is :func:`fedmcmc.engines.driver.drive` over
``BroadcastDraw.advance`` (a chunk of draws per call; a diverged chain stops the run at
the end of the chunk, as on the in-process engine, and takes part in no round after its
diverged draw); the workers are the generic endpoints of
:class:`fedmcmc.engines.broadcast.BroadcastClient` running ``pdmp.distributed``'s
``WorkerFunctions``.

Random streams: event iteration ``i`` of draw ``k`` of chain ``c`` uses
``fold_in(split(fold_in(key, k), chains)[c], i)`` exactly as the in-process engine
does, so the two give the same draws up to float rounding of the per-worker sums.

Client failure: ``on_client_failure="stop"`` stops the run with every draw made so far
(``ClientFailureError``); ``"drop"`` continues without the worker (its answers are
replaced by the protocol's ``silent_proposal``): the target becomes the posterior given
the remaining workers' data (``info`` records it).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..engines.comm import ClientFailure, Transport, collect
from ..engines.driver import PartialDraws, check_draws
from ..rng import fold_in, split_key

__all__ = ["BroadcastDraw"]


class BroadcastDraw:
    """The server's side of a run: ``advance(states, first_draw, count) -> (states, draws
    (count, C, draw_dim), stats {name: (count, C)})``, the driver's ``advance`` (see
    :func:`fedmcmc.engines.driver.drive`). It makes the same draws as the in-process engine's
    vmapped ``draw_step``, but with every worker's proposal computed by that worker (one
    broadcast-and-gather per event iteration).

    The chains are not kept in step: a chain that reaches its next sample time starts its
    next draw in the following round while the others finish theirs, so a call of ``count``
    draws takes about the rounds of its slowest chain's ``count`` draws, not ``count`` times
    the slowest chain's rounds of each draw (2 chains of a Fed Zig-Zag run: about 15 % fewer
    rounds; more with more chains). Every chain's keys are its own (draw ``k`` of chain ``c``:
    ``split(fold_in(key, k), C)[c]``, iteration ``i``: ``fold_in`` of that by ``i``), so
    the draws do not depend on how the chains interleave.

    Rate diagnostics need every worker's gradient at a draw's end point. The chain does not
    move between the end of a draw and the next round's broadcast (the next draw begins at
    the same x, v and shares), so the workers send their gradients at the broadcast state
    with their proposals of the round after a draw ends; only the draws that end in a
    call's last round need a gradient broadcast of their own (one per call, not one per
    draw)."""

    def __init__(self, transport: Transport, num_workers: int, max_rounds_per_draw: int,
                 rate_diagnostics: bool, protocol, timeout: Optional[float],
                 on_client_failure: str, key, chains: int,
                 divergence_threshold: float = float("inf")):
        self.transport = transport
        self.divergence_threshold = divergence_threshold
        self.max_rounds_per_draw = int(max_rounds_per_draw)
        self.rate_diagnostics = bool(rate_diagnostics)
        self.timeout = timeout
        self.on_client_failure = on_client_failure
        self.dead: List[int] = []
        self.failures: List[Dict[str, Any]] = []
        self.event_rounds = 0
        self.gradient_rounds = 0
        self.key = key
        self.chains = int(chains)
        p = self.protocol = protocol
        self.num_workers = int(num_workers)

        def block_keys(key, draw_indices):
            # (count, C): the keys of draws first .. first + count - 1 of every chain, as
            # draw_by_draw and the in-process engine make them
            return jax.vmap(lambda k: split_key(fold_in(key, k), chains))(draw_indices)

        def prepare(draw_keys, j, i, st, t_next):
            worker_keys, _ = p.event_keys(fold_in(draw_keys[j], i))
            return jax.random.key_data(worker_keys), p.event_cap(st, t_next)

        def begin(st):
            st, t_next, counting, events_before = p.draw_begin(st)
            return st, t_next, counting, events_before, st.t < t_next

        def apply(draw_keys, j, i, st, res, t_next, counting, live):
            new = p.apply_proposals(fold_in(draw_keys[j], i), st, res, t_next, counting)
            new = _where(live, new, st)
            return new, new.t < t_next

        def close(over, has_next, st, t_next, counting, events_before):
            # the end of a draw (the state's draw counters) and, if the call has another draw
            # for this chain, the beginning of the next
            ended, draw, stats = p.draw_end(st, t_next, counting, events_before, None)
            begun, next_t, next_counting, next_before = p.draw_begin(ended)
            start = over & has_next
            st = _where(start, begun, _where(over, ended, st))
            t_next = jnp.where(start, next_t, t_next)
            counting = jnp.where(start, next_counting, counting)
            events_before = jnp.where(start, next_before, events_before)
            return st, t_next, counting, events_before, st.t < t_next, draw, stats["events"]

        def rates(st, g_workers):
            g = jnp.concatenate([g_workers, p.prior_gradient_row(st.x)])
            return p.rates_from_gradients(st.x, st.v, g, st.alpha)

        # a round runs two compiled calls (three when a draw ends) and no eager operation
        self._block_keys = jax.jit(block_keys)
        self._begin = jax.jit(jax.vmap(begin))
        self._prepare = jax.jit(jax.vmap(prepare, in_axes=(1, 0, 0, 0, 0)))
        self._apply = jax.jit(jax.vmap(apply, in_axes=(1, 0, 0, 0, 0, 0, 0, 0)))
        self._close = jax.jit(jax.vmap(close))
        self._rates = jax.jit(jax.vmap(rates))

    def _broadcast(self, method: str, per_worker_args: Callable[[int], tuple]) -> Dict[int, Any]:
        """Send ``method`` to every live worker and gather the replies; on a failure stop
        (raise) or drop the worker, by the user's choice."""
        live = [m for m in range(self.num_workers) if m not in self.dead]
        pendings = self.transport.call_each(live, method, per_worker_args)
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

    def advance(self, states, first_draw: int, count: int):
        """Draws ``first_draw .. first_draw + count - 1`` of every chain (the driver's
        ``advance``). A worker failure under ``on_client_failure="stop"`` raises
        :class:`~.comm.ClientFailure` carrying the draws each chain made
        (``failure.partial``), and so does a ``KeyboardInterrupt`` (Ctrl-C)."""
        C = self.chains
        keys = self._block_keys(self.key, np.arange(first_draw, first_draw + count,
                                                    dtype=np.uint32))
        states, t_next, counting, events_before, running = self._begin(states)
        running = np.asarray(running)
        draw_dim = 2 * int(np.shape(states.x)[-1])  # a draw: position, mean over its interval
        draws = np.full((count, C, draw_dim), np.nan)
        stats = {"events": np.zeros((count, C), np.int32)}
        if self.rate_diagnostics:
            stats.update({name: np.full((count, C), np.nan) for name in self.protocol.rate_names})
        j = np.zeros(C, np.int64)  # each chain's draw in this call
        i = np.zeros(C, np.int64)  # its event iteration in that draw
        waiting = np.full(C, -1, np.int64)  # first of its ended draws still without rates
        try:
            while True:
                # end the draws that reached their sample time (or the iteration cap) and
                # begin the next ones; a draw can end before any iteration
                over = (j < count) & (~running | (i >= self.max_rounds_per_draw))
                while over.any():
                    states, t_next, counting, events_before, running, draw, events = \
                        self._close(over, over & (j + 1 < count), states, t_next, counting,
                                    events_before)
                    chains = np.nonzero(over)[0]
                    draw = np.asarray(draw)
                    draws[j[chains], chains] = draw[chains]
                    stats["events"][j[chains], chains] = np.asarray(events)[chains]
                    waiting = np.where(over & (waiting < 0), j, waiting)
                    # a diverged chain makes no more draws (NaN rows): the driver stops the
                    # run after this call, and its rounds would be wasted
                    diverged = over & ~check_draws(draw, self.divergence_threshold)
                    j = np.where(diverged, count, np.where(over, j + 1, j))
                    i = np.where(over, 0, i)
                    running = np.asarray(running)
                    over = (j < count) & ~running
                live = j < count
                with_gradient = self.rate_diagnostics and bool((waiting >= 0).any())
                if not live.any():
                    if with_gradient:
                        self._rate_values(states, waiting, j, stats, self._gradients(states))
                    return states, draws, stats
                key_data, caps = self._prepare(keys, np.minimum(j, count - 1), i, states,
                                               t_next)
                key_data = np.asarray(key_data)  # (C, M, 2)
                caps = np.where(live, np.asarray(caps), 0.0)  # chains done: nothing to propose
                x, v = np.asarray(states.x), np.asarray(states.v)
                alpha, scale = np.asarray(states.alpha), np.asarray(states.scale)
                replies = self._broadcast(
                    "respond", lambda m: (key_data[:, m], x, v, caps, alpha[:, m], scale[:, m],
                                          with_gradient))
                self.event_rounds += 1
                proposals, gradients = self._stack(replies, scale, with_gradient, x)
                if with_gradient:  # the gradients at the broadcast state: the ended draws'
                    self._rate_values(states, waiting, j, stats, gradients)
                    waiting[:] = -1
                states, running = self._apply(keys, np.minimum(j, count - 1), i, states,
                                              proposals, t_next, counting, live)
                running = np.asarray(running)
                i = np.where(live, i + 1, i)
        except (ClientFailure, KeyboardInterrupt) as stop:
            # a worker failed, or Ctrl-C: the driver keeps each chain's draws made so far
            made = j.copy()
            rows = int(made.max())
            stop.partial = PartialDraws(states, draws[:rows],
                                        {name: value[:rows] for name, value in stats.items()},
                                        made)
            raise

    def _gradients(self, states) -> np.ndarray:
        """Every worker's gradient at every chain's state, ``(C, M, d)`` (zeros for a dropped
        worker): one broadcast of its own."""
        x, alpha = np.asarray(states.x), np.asarray(states.alpha)
        replies = self._broadcast("setup", lambda m: ("gradient", x, alpha[:, m]))
        self.gradient_rounds += 1
        return np.stack([replies[m] if m in replies else np.zeros_like(x)
                         for m in range(self.num_workers)], axis=1)

    def _rate_values(self, states, waiting, j, stats, gradients) -> None:
        """The rates of the draws ``waiting[c] .. j[c] - 1`` of every chain, all ended at the
        state ``states`` (nothing moved since), from the workers' gradients there."""
        values = [np.asarray(value) for value in self._rates(states, gradients)]
        for chain in np.nonzero(waiting >= 0)[0]:
            rows = slice(waiting[chain], j[chain])
            for name, value in zip(self.protocol.rate_names, values):
                stats[name][rows, chain] = value[chain]

    def _stack(self, replies: Dict[int, Any], scale: np.ndarray, with_gradient: bool,
               x: np.ndarray):
        """Answers stacked as the in-process vmap over workers gives them: (C, M, ...). A
        dropped worker's answer is the protocol's ``silent_proposal`` (no event) and a zero
        gradient. Returns ``(proposal fields, gradients (C, M, d) or None)``."""
        chains = scale.shape[0]
        rows = []
        for m in range(self.num_workers):
            if m in replies:
                rows.append(replies[m])
            else:
                silent = tuple(self.protocol.silent_proposal(chains, scale[:, m]))
                rows.append(silent + ((np.zeros_like(x),) if with_gradient else ()))
        fields = len(rows[0]) - (1 if with_gradient else 0)
        proposals = tuple(np.stack([row[k] for row in rows], axis=1) for k in range(fields))
        gradients = np.stack([row[fields] for row in rows], axis=1) if with_gradient else None
        return proposals, gradients


def _where(condition, new, old):
    """``new`` where ``condition`` (a scalar per chain) holds, else ``old``, leaf by leaf."""
    return jax.tree_util.tree_map(lambda a, b: jnp.where(condition, a, b), new, old)
