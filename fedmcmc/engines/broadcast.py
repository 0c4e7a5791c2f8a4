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

and a run is :func:`fedmcmc.engines.driver.drive` over
:func:`~fedmcmc.engines.driver.draw_by_draw` of the ``BroadcastDraw`` (one draw per call,
so a diverged chain stops the run at once).

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

from typing import Any, Callable, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..protocols import client_context, client_function
from ..rng import fold_in
from .comm import ClientEndpoint, ClientFailure, Transport, collect

__all__ = ["BroadcastClient", "BroadcastDraw"]


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
        function = client_function(self.functions, name)
        with self.compiling_once(("setup", name), self.functions, self.context.model):
            return function(self.context, *args)

    def configure(self, *args):
        function = client_function(self.functions, "configure")
        with self.compiling_once("configure", self.functions, self.context.model, args):
            return function(self.context, *args)

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
            worker_keys, _ = p.event_keys(fold_in(draw_key, i))
            return jax.random.key_data(worker_keys), p.event_cap(st, t_next)

        def begin(st):
            st, t_next, counting, events_before = p.draw_begin(st)
            return st, t_next, counting, events_before, st.t < t_next

        def apply(draw_key, i, st, res, t_next, counting, active):
            new = p.apply_proposals(fold_in(draw_key, i), st, res, t_next, counting)
            new = jax.tree_util.tree_map(lambda a, b: jnp.where(active, a, b), new, st)
            return new, new.t < t_next

        def rates(st, g_workers):
            g = jnp.concatenate([g_workers, p.prior_gradient_row(st.x)])
            return p.rates_from_gradients(st.x, st.v, g, st.alpha)

        def end(st, t_next, counting, events_before, rate_values):
            return p.draw_end(st, t_next, counting, events_before, rate_values)

        # every round runs two compiled calls and no eager operation: the chains that are
        # still short of their next sample time come out of them (an eager comparison or
        # device transfer costs as much as a compiled call)
        self._begin = jax.jit(jax.vmap(begin))
        self._prepare = jax.jit(jax.vmap(prepare, in_axes=(0, None, 0, 0)))
        self._apply = jax.jit(jax.vmap(apply, in_axes=(0, None, 0, 0, 0, 0, 0)))
        self._rates = jax.jit(jax.vmap(rates))
        self._end = jax.jit(jax.vmap(end))
        self.num_workers = M

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

    def __call__(self, draw_keys, states):
        M = self.num_workers
        states, t_next, counting, events_before, active = self._begin(states)
        i = 0
        active = np.asarray(active)
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
            states, active = self._apply(draw_keys, i, states, res, t_next, counting, active)
            i += 1
            active = np.asarray(active)
        rate_values = None
        if self.rate_diagnostics:
            x, alpha = np.asarray(states.x), np.asarray(states.alpha)
            grads = self._broadcast("setup", lambda m: ("gradient", x, alpha[:, m]))
            g = np.stack([grads[m] if m in grads else np.zeros_like(x) for m in range(M)], axis=1)
            rate_values = self._rates(states, g)
        return self._end(states, t_next, counting, events_before, rate_values)

    def _stack(self, replies: Dict[int, Any], scale: np.ndarray):
        """Answers stacked as the in-process vmap over workers gives them: (C, M, ...). A
        dropped worker's answer is the protocol's ``silent_proposal`` (no event)."""
        chains = scale.shape[0]
        rows = [replies[m] if m in replies else self.protocol.silent_proposal(chains, scale[:, m])
                for m in range(self.num_workers)]
        fields = len(rows[0])
        return tuple(np.stack([row[k] for row in rows], axis=1) for k in range(fields))
