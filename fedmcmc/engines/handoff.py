"""The hand-off engine: any :class:`~fedmcmc.protocols.HandoffProtocol` over a
:class:`~fedmcmc.engines.comm.Transport` (in-process objects or Ray actors).

Client side (:class:`HandoffClient`, one per client, a Ray actor on the Ray
engine): holds only its own data, runs the protocol's client-side set-up
functions on it (``setup``: FSGLD's surrogate fit, for instance), and keeps a
compiled *visit*: ``local_steps`` of the protocol's updates of the chain's carry
(DSGLD/FSGLD build them from the very kernels of the in-process engine on a
one-client data layout, so the algorithm is not written twice). A visit returns
the carry and the draws taken during the visit -- parameter-sized messages only.

Server side (:class:`HandoffServer`, run by :func:`~fedmcmc.engines.driver.drive`): draws the next client of each chain with
probability f_s, keeps several chains in flight at once (``transport.wait``),
collects the draw segments, checks divergence, and handles client failures
(per-visit timeout, dead actor): ``on_client_failure="stop"`` raises
:class:`~fedmcmc.engines.comm.ClientFailureError` carrying every draw received
so far; ``"drop"`` continues without the client, with f_s renormalised over the
remaining clients and the protocol's ``client_parameters`` recomputed over them
(FSGLD: the global surrogate and trust region) -- the target is then the
posterior given the remaining clients' data, which ``result.info`` records.
This module never imports a family and never looks at an algorithm's name.

Random streams: iteration ``t`` of chain ``c`` uses the key the in-process
engine uses, ``split(split(fold_in(key(seed), t // thin), chains)[c], thin)[t % thin]``.
The server draws the client with ``split(key, 3)[0]`` of a visit's first
iteration, as ``dsgld.build_federated_kernel`` does, and the client hands the
protocol's update the other two (``protocols.update_step``: its minibatch and noise
keys, with the iteration and whether it starts the visit); so with the same seed the
hand-off engine reproduces the in-process DSGLD/FSGLD draws (up to float
rounding of the data layout), which the tests check.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from typing import Any, Callable, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import messages as message_counts
from .. import rng
from .. import run_length
from ..cache import jit_with_constants_as_arguments
from ..arrays import device_array
from ..federation import Federation, describe_client
from ..model import unravel_draws_numpy
from ..protocols import (HandoffProtocol, ServerSide, client_context, client_function,
                         draw_client, update_step)
from .comm import ClientEndpoint, ClientFailure, Transport
from .driver import PartialDraws, check_draws
from .local import iteration_key
from .engine import InProcessEngine, ProtocolEngine
from .options import ENGINE_OPTIONS, RAY_ONLY_OPTIONS
from .ray_engine import RayEngine
from .session import finish_run, protocol_session

__all__ = ["HandoffClient", "HandoffServer", "sample_handoff", "sample_protocol",
           "protocol_engine"]


# ----------------------------------------------------------------------------- client side

#: the visits the clients of this process share, per protocol object (while it lives) and
#: per (flat model, run spec, row layout): HandoffClient._build_visit
_SHARED_VISITS: "weakref.WeakKeyDictionary[HandoffProtocol, Dict[tuple, Callable]]" = (
    weakref.WeakKeyDictionary())


class HandoffClient(ClientEndpoint):
    """One client of a hand-off protocol: its data, its protocol, its compiled visit.

    ``source``: the client's data or its loader (called here, in the client's process).
    ``protocol``: the :class:`~fedmcmc.protocols.HandoffProtocol` (pickled to the client).
    ``spec`` (plain dict): ``seed``, ``chains``, ``thin``, ``num_clients``; ``thin`` is
    ``None`` when the protocol's set-up resolves it (``thin="auto"``): then it comes with
    :meth:`configure`.
    """

    RUN_WIDE_ARGUMENTS = (2, 3, 4)  # model, init, protocol: the same for every client

    def __init__(self, index: int, source: Any, model, init: Any, protocol: HandoffProtocol,
                 spec: Dict[str, Any]):
        super().__init__(index, source)
        self.spec = dict(spec)
        self.protocol = protocol
        self._raw_data = self.data
        self.context = client_context(self.index, self._raw_data, self.size, model, init,
                                      spec["num_clients"], spec["seed"])
        self.parameters: Any = None  # the update's parameters (a pytree of device arrays)
        self._visit = None
        self._root = None  # the run's key, made when the visit is first configured

    def describe(self):
        return describe_client(self._raw_data)

    def setup(self, name: str, *args):
        """Run the protocol's client-side function ``client_<name>`` on this client's data."""
        function = client_function(self.protocol, name)
        with self.compiling_once(("setup", name), self.protocol, self.context.model):
            return function(self.context, *args)

    def configure(self, parameters: Any, thin: Optional[int] = None) -> int:
        """Set this client's update parameters (sent again after a client is dropped: f_s
        renormalised and whatever the protocol recomputes over the remaining clients), and
        ``thin`` when the protocol's set-up resolved it (``thin="auto"``)."""
        rethinned = thin is not None and int(thin) != self.spec["thin"]
        if rethinned:
            self.spec["thin"] = int(thin)
        if isinstance(parameters, dict):  # the protocol's own copy, whatever it adds
            parameters = dict(parameters)
        parameters = self.protocol.complete_parameters(self.context, parameters)
        # any pytree of arrays (a NamedTuple, a dictionary): its structure and leaf shapes
        # decide whether the compiled visit can be kept
        parameters = jax.tree_util.tree_map(device_array, parameters)
        leaves, treedef = jax.tree_util.tree_flatten(parameters)
        structure = (str(treedef), tuple((leaf.shape, str(leaf.dtype)) for leaf in leaves))
        changed = (self._visit is None or rethinned
                   or structure != getattr(self, "_structure", None))
        self.parameters, self._structure = parameters, structure
        if changed:
            with self.compiling_once(("configure", structure), self.protocol,
                                     self.context.model, self.spec):
                self._configure_visit()
        return self.index

    def _configure_visit(self) -> None:
        self._visit = self._build_visit()
        # compile now, so that a visit's time (and its timeout) does not include compilation
        carry = self.protocol.init_carry(
            np.zeros((self.context.flat_model.dim,), self.context.flat_model.dtype))
        jax.block_until_ready(self._visit(np.int32(0), carry, np.int32(0), self.parameters,
                                          self.context.data.data, self._root_key))

    def visit(self, chain: int, carry, iteration: int):
        """``local_steps`` updates of ``chain`` from ``carry`` at global iteration ``iteration``.

        Returns ``(carry, draws, first_draw)``: the final carry, the positions at the draw
        points inside the visit (k, d) (iterations t with (t + 1) % thin == 0), and the
        global index of the first of them.
        """
        thin = self.spec["thin"]
        steps = self.protocol.local_steps
        # NumPy arguments: no eager JAX op per call (each costs ~1 ms on a loaded machine)
        final, positions = self._visit(
            np.int32(chain), tuple(np.asarray(leaf) for leaf in carry), np.int32(iteration),
            self.parameters, self.context.data.data, self._root_key)
        ends = iteration + 1 + np.arange(steps)
        keep = ends % thin == 0
        draws = np.asarray(positions)[keep]
        first = int(ends[keep][0] // thin - 1) if keep.any() else -1
        return tuple(np.asarray(leaf) for leaf in final), draws, first

    def _build_visit(self):
        """The compiled visit: shared with the same-shaped clients of this process when the
        protocol allows it (``update_reads_only_rows``), else this client's own."""
        protocol = self.protocol
        if not getattr(protocol, "update_reads_only_rows", False):
            return self._new_visit()
        layout = self.context.data
        # not the seed: the run's key is an argument of the visit, so a reused actor's
        # clients keep their traced visit in a run with another seed
        key = (self.context.flat_model,
               tuple(sorted((name, value) for name, value in self.spec.items()
                            if name != "seed")),
               tuple(np.asarray(layout.offsets).tolist()),
               tuple(np.asarray(layout.sizes).tolist()))
        try:
            visits = _SHARED_VISITS.setdefault(protocol, {})
        except TypeError:  # a protocol class that is not hashable (or not weakly referable)
            return self._new_visit()
        if key not in visits:
            visits[key] = self._new_visit()
        return visits[key]

    @property
    def _root_key(self):
        """The run's key (from ``spec["seed"]``; one compiled program, not two eager ones)."""
        if self._root is None:
            self._root = rng.seed_key(self.spec["seed"])
        return self._root

    def _new_visit(self):
        protocol, context = self.protocol, self.context
        chains, thin, steps = self.spec["chains"], self.spec["thin"], protocol.local_steps

        layout = context.data

        # the rows are an argument, not constants of the program: clients of the same shapes
        # (and the same protocol and model) then lower to the same program, compiled once per
        # machine and read back from the compilation cache by the others; so is the run's key
        # (a run with another seed is the same traced visit) and what the visit closes over
        # (jit_with_constants_as_arguments): a run on other rows is the same program too
        @jit_with_constants_as_arguments
        def visit(chain, carry, iteration, parameters, rows, root):
            rows_layout = dataclasses.replace(layout, data=rows)
            update = protocol.build_update(context._replace(data=rows_layout), parameters)

            def body(carry, step):
                t = iteration + step
                carry = tuple(update(update_step(iteration_key(root, chains, thin, chain, t),
                                                 t, step == 0), carry))
                return carry, protocol.position(carry)

            return jax.lax.scan(body, tuple(carry), jnp.arange(steps, dtype=jnp.int32))

        return visit


# ----------------------------------------------------------------------------- server side


class HandoffServer:
    """The server of a hand-off run: it hands every chain from client to client and
    gives :func:`~fedmcmc.engines.driver.drive` its ``advance``.

    Chains travel independently: the server keeps one visit of every unfinished chain in
    flight (``transport.wait`` on all of them), so a chain does not wait for the others
    except at the end of a driver chunk, when ``advance`` returns the chunk's draws of
    every chain; chains that are ahead keep their extra draws for the next call. The next
    client of a chain is drawn with probability f_s (``weights``) from the key of the
    visit's first iteration.

    Client failures (a raised error, a dead actor, no reply within ``visit_timeout``):
    ``on_client_failure="stop"`` raises :class:`~fedmcmc.engines.comm.ClientFailure` with the
    draws received in the failed call attached (``failure.partial``, a
    :class:`~fedmcmc.engines.driver.PartialDraws`); ``"drop"`` renormalises f_s over the
    remaining clients, calls ``reconfigure(weights)`` (the protocol's client parameters
    recomputed over them) and sends the chains that were on the failed client elsewhere.
    """

    def __init__(self, transport: Transport, *, weights: np.ndarray, initial_carry: tuple,
                 position_of: Callable[[tuple], Any], chains: int, thin: int,
                 local_steps: int, total_draws: int, seed: int,
                 visit_timeout: Optional[float] = None, on_client_failure: str = "stop",
                 divergence_threshold: float = 1e10,
                 reconfigure: Optional[Callable[[np.ndarray], None]] = None):
        self.transport = transport
        self.divergence_threshold = float(divergence_threshold)
        self.position_of = position_of
        self.chains, self.thin, self.local_steps = int(chains), int(thin), int(local_steps)
        self.total_draws = int(total_draws)
        self.visit_timeout = visit_timeout
        self.on_client_failure = on_client_failure
        self.reconfigure = reconfigure
        initial_carry = tuple(np.asarray(leaf) for leaf in initial_carry)
        self.dim = dim = int(np.shape(position_of(initial_carry))[0])
        root = rng.seed_key(seed)

        # the run's key is an argument (another seed: same program); the cumulative f_s are
        # computed inside it, as inside the in-process kernel's compiled step (the same
        # float32 sums, hence the same clients), not by eager programs of their own
        @jit_with_constants_as_arguments
        def next_client(chain, t, weights):
            key_client = jax.random.split(iteration_key(root, chains, thin, chain, t), 3)[0]
            return draw_client(key_client, jnp.cumsum(weights))

        self._next_client = next_client
        self.original_weights = np.asarray(weights, np.float64)
        self.weights = self.original_weights.copy()
        self._scheduler_weights = self._float32(self.weights)
        num_clients = len(self.weights)
        # every draw of every chain as it arrives (NaN where not made yet)
        self.draws = np.full((chains, total_draws, dim), np.nan, np.float32)
        self.draw_clients = np.full((chains, total_draws), -1, np.int32)
        self.draw_rounds = np.full((chains, total_draws), -1, np.int32)
        self.done = np.zeros(chains, np.int64)  # draws received per chain
        self.carries = [initial_carry] * chains
        self.iterations = np.zeros(chains, np.int64)
        self.rounds = np.zeros(chains, np.int64)
        self.visits = np.zeros((chains, num_clients), np.int64)
        self.diverged = np.zeros(chains, bool)
        self.failures: List[dict] = []
        self.alive = set(range(num_clients))
        self.inflight: Dict[int, Any] = {}
        self.visit_seconds: List[float] = []

    @staticmethod
    def _float32(weights):
        """f_s as the scheduler takes them, converted on the host (round to nearest, as
        JAX's conversion)."""
        return np.asarray(weights, np.float32)

    # -- one chain

    def _submit(self, chain: int) -> None:
        client = int(self._next_client(np.int32(chain), np.int32(self.iterations[chain]),
                                       self._scheduler_weights))
        self.rounds[chain] += 1
        self.visits[chain, client] += 1
        self.inflight[chain] = self.transport.call(
            client, "visit", chain, self.carries[chain], int(self.iterations[chain]), tag=chain)

    def _accept(self, pending, reply) -> None:
        """Store a visit's draws; a non-finite or exploding one marks the chain diverged
        (its later draws stay NaN: the driver's check finds it and stops the run)."""
        chain = pending.tag
        self.visit_seconds.append(time.perf_counter() - pending.sent_at)
        carry, segment, first = reply
        segment = np.asarray(segment, np.float32).reshape(-1, self.dim)
        if first >= 0 and len(segment):
            stop = min(first + len(segment), self.total_draws)
            take = segment[: max(0, stop - first)]
            if len(take):
                rows = slice(first, first + len(take))
                self.draw_clients[chain, rows] = pending.client
                self.draw_rounds[chain, rows] = self.rounds[chain]
                ok = check_draws(take, self.divergence_threshold)
                if not ok.all():
                    self.diverged[chain] = True
                    take = take[: int(np.argmax(~ok)) + 1]  # up to the bad draw, kept as made
                self.draws[chain, first: first + len(take)] = take
                self.done[chain] = first + len(take)
        self.carries[chain] = tuple(np.asarray(leaf) for leaf in carry)
        self.iterations[chain] += self.local_steps

    def _revert(self, chain: int, client: int) -> None:
        self.rounds[chain] -= 1
        self.visits[chain, client] -= 1

    def _wants_visit(self, chain: int) -> bool:
        return not self.diverged[chain] and self.done[chain] < self.total_draws

    # -- the driver's advance

    def advance(self, states, first_draw: int, count: int):
        """Draws ``first_draw .. first_draw + count - 1`` of every chain (the driver's
        ``advance``; ``states`` is not used: the chains' carries stay here)."""
        target = first_draw + count
        for chain in range(self.chains):
            if chain not in self.inflight and self._wants_visit(chain):
                self._submit(chain)
        while any(not self.diverged[c] and self.done[c] < target for c in range(self.chains)):
            self._receive(first_draw)
        return states, self._rows(first_draw, target), self._row_stats(first_draw, target)

    def _rows(self, first: int, stop: int) -> np.ndarray:
        return self.draws[:, first:stop].transpose(1, 0, 2)

    def _row_stats(self, first: int, stop: int) -> Dict[str, np.ndarray]:
        return {"client": self.draw_clients[:, first:stop].T,
                "round": self.draw_rounds[:, first:stop].T}

    def _receive(self, first_draw: int) -> None:
        """Wait for the next visits to come back, accept them and send their chains on."""
        timeout = None
        if self.visit_timeout is not None:
            oldest = min(p.sent_at for p in self.inflight.values())
            timeout = max(0.0, oldest + self.visit_timeout - time.perf_counter())
        ready, _ = self.transport.wait(list(self.inflight.values()), timeout=timeout)
        failed_now = []
        for pending in ready:
            if self.inflight.get(pending.tag) is not pending:
                continue
            try:
                reply = self.transport.result(pending)
            except ClientFailure as failure:
                failed_now.append((failure.client, failure.reason))
                continue
            del self.inflight[pending.tag]
            self._accept(pending, reply)
            if self._wants_visit(pending.tag):
                self._submit(pending.tag)
        if self.visit_timeout is not None:
            now = time.perf_counter()
            for pending in list(self.inflight.values()):
                if now - pending.sent_at > self.visit_timeout and pending.client in self.alive:
                    failed_now.append(
                        (pending.client, f"no answer within visit_timeout={self.visit_timeout:g} s"))
        seen = set()
        for client, reason in failed_now:
            if client in seen or client not in self.alive:
                continue
            seen.add(client)
            self._fail(client, reason, first_draw)

    def _fail(self, client: int, reason: str, first_draw: int) -> None:
        self.failures.append(
            {"client": int(client), "reason": reason,
             "iteration": int(self.iterations.max()), "draws_done": int(self.done.min()),
             # per chain: iterations completed when the failure was handled (every draw
             # before iteration // thin was made under the original target)
             "chain_iterations": self.iterations.tolist()})
        self.alive.discard(client)
        self.transport.kill(client)
        hit = [c for c, p in self.inflight.items() if p.client == client]
        for chain in hit:
            self._revert(chain, client)
            del self.inflight[chain]
        if self.on_client_failure == "stop" or not self.alive:
            self._drain()
            failure = ClientFailure(client, reason)
            made = np.maximum(self.done - first_draw, 0)
            stop = first_draw + int(made.max())
            failure.partial = PartialDraws(None, self._rows(first_draw, stop),
                                           self._row_stats(first_draw, stop), made)
            failure.no_client_left = not self.alive
            raise failure
        kept = sorted(self.alive)
        self.weights[:] = 0.0
        self.weights[kept] = self.original_weights[kept] / self.original_weights[kept].sum()
        self._scheduler_weights = self._float32(self.weights)
        if self.reconfigure is not None:
            self.reconfigure(self.weights.copy())
        for chain in hit:
            self._submit(chain)

    def _drain(self) -> None:
        """Keep what the other clients are computing right now, then stop sending."""
        if not self.inflight:
            return
        ready, _ = self.transport.wait(list(self.inflight.values()),
                                       timeout=self.visit_timeout or 30.0)
        for pending in ready:
            try:
                self._accept(pending, self.transport.result(pending))
            except ClientFailure:
                self._revert(pending.tag, pending.client)
            del self.inflight[pending.tag]
        for chain, pending in list(self.inflight.items()):
            self._revert(chain, pending.client)
        self.inflight.clear()


# ----------------------------------------------------------------------------- protocol adapter

def sample_handoff(
    protocol: HandoffProtocol,
    model,
    federation: Federation,
    engine: ProtocolEngine,
    *,
    init,
    num_samples: int,
    burn_in: int,
    thin: int,
    chains: int,
    seed: int,
    progress: Optional[bool] = None,
    info: Optional[Dict[str, Any]] = None,
    **run_options,
):
    """Run a hand-off ``protocol`` on the client endpoints of the message-passing ``engine``
    (one :class:`HandoffClient` per client, in the engine's :func:`~fedmcmc.engines.session.
    protocol_session`; on Ray placed in actors as the engine's options ask).

    The protocol's :meth:`~fedmcmc.protocols.HandoffProtocol.prepare` and
    :meth:`~fedmcmc.protocols.HandoffProtocol.client_parameters` run here, in the
    driver, on the clients' replies; ``info``: entries to start ``Result.info`` with.
    ``run_options``: ``chunk_size`` and ``on_draws``, the run options of
    :func:`fedmcmc.engines.driver.drive` (the draws are flat positions, as on the
    in-process engine).
    """
    if not isinstance(protocol, HandoffProtocol):
        raise ValueError(f"protocol must be a fedmcmc.protocols.HandoffProtocol, got {protocol!r}")
    options = engine.session_options(run_options, protocol.name)
    flat_model = model.flatten(init)
    theta0 = np.asarray(flat_model.ravel(init))
    num_clients = federation.num_clients
    # thin / burn_in "auto": resolved by the protocol's set-up (HandoffProtocol.run_length),
    # the resolved thin sent with the clients' configuration
    thin_by_setup = run_length.is_auto(thin)
    spec = {"seed": int(seed), "chains": int(chains),
            "thin": None if thin_by_setup else int(thin), "num_clients": num_clients}
    info = dict(info or {})
    info.update(local_steps=protocol.local_steps, num_clients=num_clients)
    sources = federation.client_sources()
    specs = [(HandoffClient, (s, sources[s], model, init, protocol, spec))
             for s in range(num_clients)]
    with protocol_session(engine, specs, federation, model, init, name=protocol.name,
                          options=options, fault_point="visit") as session:
        federation = session.federation
        timeout = [None]  # set-up before sampling waits without a limit (it compiles)

        def ask(name, args_of_client, clients=None):
            return session.ask_each(name, args_of_client, clients, timeout[0])

        server = ServerSide(ask=ask, flat_model=flat_model, theta0=theta0,
                            num_clients=num_clients, seed=int(seed), info=info,
                            weights=np.asarray(federation.weights, np.float64),
                            weights_given=bool(federation.weights_given),
                            sizes=np.asarray(federation.sizes))
        prepared = protocol.prepare(server)
        thin, burn_in = protocol.run_length(server, prepared, thin, burn_in)
        for argument, value in (("thin", thin), ("burn_in", burn_in)):
            if run_length.is_auto(value):
                raise ValueError(f"{argument}='auto' is not resolved by {protocol.name}'s "
                                 f"set-up; give {argument} as an integer")
        thin, burn_in = int(thin), int(burn_in)
        session.phase("prepare")
        # after prepare: its set-up may have chosen the f_s (client_selection)
        weights = np.asarray(protocol.scheduler_weights(prepared, federation.weights),
                             np.float64)

        def configure(current_weights: np.ndarray) -> None:
            kept = [s for s in range(num_clients) if current_weights[s] > 0]
            parameters = protocol.client_parameters(server, prepared, current_weights, kept)
            if len(parameters) != len(kept):
                raise ValueError(f"{protocol.name}.client_parameters returned "
                                 f"{len(parameters)} entries for {len(kept)} clients")
            parameters_of = dict(zip(kept, parameters))
            extra = (thin,) if thin_by_setup else ()
            session.configure(lambda s: (parameters_of[s],) + extra, clients=kept,
                              timeout=timeout[0])

        configure(weights)
        session.phase("configure")
        timeout[0] = session.timeout  # after a drop, reconfiguring is bounded like a visit
        session.ready()
        total = burn_in + num_samples
        handoff = HandoffServer(
            session.transport, weights=weights, initial_carry=protocol.init_carry(theta0),
            position_of=protocol.position, chains=chains, thin=thin,
            local_steps=protocol.local_steps, total_draws=total, seed=seed,
            visit_timeout=session.timeout, on_client_failure=session.policy,
            divergence_threshold=protocol.divergence_threshold, reconfigure=configure)
        run = session.drive(handoff.advance, None, chains=chains, draw_dim=flat_model.dim,
                            burn_in=burn_in, num_samples=num_samples,
                            divergence_threshold=protocol.divergence_threshold,
                            progress=progress, iterations_per_draw=thin)
        info.update(session.figures())
        info.update(_server_figures(run, handoff, info, burn_in))
        # the pattern's count, as engine="local" makes it (the transport's: transport_messages)
        info.update(message_counts.figures(message_counts.handoff(info["rounds_per_chain"]),
                                           info.get("surrogate_messages", 0)))
    why = ("no client left" if getattr(run.failure, "no_client_left", False)
           else 'on_client_failure="stop"')
    return finish_run(
        run, name=protocol.name, label=engine.label, info=info, dim=flat_model.dim,
        thin=thin, burn_in=burn_in, unravel=lambda draws: unravel_draws_numpy(flat_model, draws),
        failure_detail=(f"{why}; per chain: {handoff.done.tolist()} of {total}; "
                        "on_client_failure='drop' continues without the client"),
        divergence_stats=("client", "round"),
        divergence_cause=("diverged (non-finite or |theta| > "
                          f"{protocol.divergence_threshold:g}); lower step_size"))


def _server_figures(run, server: HandoffServer, info: Dict[str, Any], burn_in: int):
    """The hand-off server's counts for ``Result.info`` (rounds, visits, failures, f_s after
    a drop); ``info``: the run's so far (its ``on_client_failure``)."""
    out = dict(
        rounds=int(server.rounds.max()),
        rounds_per_chain=server.rounds.tolist(),
        visits_per_client=server.visits.sum(axis=0).tolist(),
        draws_per_chain=np.maximum(np.minimum(server.done, run.draws_done) - burn_in,
                                   0).tolist(),
        mean_visit_seconds=(float(np.mean(server.visit_seconds)) if server.visit_seconds
                            else None),
    )
    if server.failures:
        out["client_failures"] = server.failures
        dropped = [f["client"] for f in server.failures]
        out["dropped_clients"] = dropped
        if info.get("on_client_failure") == "drop":
            out["target_changed"] = True
            out["target"] = (
                f"posterior given the data of clients "
                f"{[s for s in range(len(server.original_weights)) if s not in dropped]} only "
                f"(clients {dropped} dropped mid-run; f_s renormalised)"
            )
            out["weights_after_drop"] = server.weights.tolist()
    return out


def protocol_engine(engine: Any, options: Dict[str, Any]) -> ProtocolEngine:
    """The message-passing engine ``engine`` names: itself when it is a
    :class:`~fedmcmc.engines.engine.ProtocolEngine`; ``"ray"``: a
    :class:`~fedmcmc.engines.ray_engine.RayEngine` of the engine options among ``options``;
    ``"local"``: an :class:`~fedmcmc.engines.engine.InProcessEngine` of the options every
    message-passing engine takes. The engine options are removed from ``options`` (what stays
    are the run's); ``ValueError`` naming ``engine`` or a misplaced option otherwise."""
    if isinstance(engine, ProtocolEngine):
        return engine
    if isinstance(engine, str) and engine == "ray":
        return RayEngine.from_options({k: options.pop(k) for k in ENGINE_OPTIONS
                                       if k in options})
    if isinstance(engine, str) and engine == "local":
        ray_only = [k for k in RAY_ONLY_OPTIONS if options.get(k) not in (None, False, 0)]
        if ray_only:
            raise ValueError(f"{ray_only[0]} is a Ray option; engine='local' takes none")
        common = {k: options.pop(k) for k in ENGINE_OPTIONS
                  if k in options and k not in RAY_ONLY_OPTIONS}
        return InProcessEngine(**common)
    raise ValueError(f"engine must be 'local', 'ray' or a message-passing engine object "
                     f"such as fm.RayEngine(...), got {engine!r}")


def sample_protocol(protocol: HandoffProtocol, model, federation, *, engine: Any, init,
                    num_samples: int, burn_in: int, thin: int, chains: int, seed: int,
                    progress: Optional[bool] = None, info: Optional[Dict[str, Any]] = None,
                    **options):
    """Run a hand-off ``protocol`` on ``engine``: ``"local"`` (its clients as objects in this
    process, :class:`~fedmcmc.engines.comm.InProcessTransport`, message for message as on
    Ray), ``"ray"`` (client endpoints in Ray actors) or a message-passing engine object
    (``fm.RayEngine(...)``; :func:`protocol_engine`).

    This is what an algorithm defined outside the package calls from its ``sample``: it
    needs no edit of fedmcmc (``docs/development``, "Adding a hand-off algorithm").
    ``options``: with an engine named by a string, the engine options of
    ``fedmcmc.engines.options`` (``visit_timeout``, ``on_client_failure``,
    ``audit_messages``, and on Ray ``ray_address`` etc.); and the run options
    ``chunk_size`` and ``on_draws`` (``on_chunk`` is not called: no resume).
    """
    if not isinstance(protocol, HandoffProtocol):
        raise ValueError(f"protocol must be a fedmcmc.protocols.HandoffProtocol, got {protocol!r}")
    options = dict(options)
    engine = protocol_engine(engine, options)
    return sample_handoff(protocol, model, federation, engine, init=init,
                          num_samples=num_samples, burn_in=burn_in, thin=thin, chains=chains,
                          seed=seed, progress=progress, info=info, **options)
