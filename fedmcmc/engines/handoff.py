"""The hand-off engine: any :class:`~fedmcmc.protocols.HandoffProtocol` over a
:class:`~fedmcmc.engines.comm.Transport` (in-process objects or Ray actors).

Client side (:class:`HandoffClient`, one per client, a Ray actor on the Ray
engine): holds only its own data, runs the protocol's client-side set-up
functions on it (``setup``: FSGLD's surrogate fit, for instance), and keeps a
compiled *visit*: ``local_steps`` of the protocol's updates of the chain's carry
(DSGLD/FSGLD build them from the very kernels of the in-process engine on a
one-client data layout, so the algorithm is not written twice). A visit returns
the carry and the draws taken during the visit -- parameter-sized messages only.

Server side (:func:`run_handoff`): draws the next client of each chain with
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
iteration, as ``dsgld.build_federated_kernel`` does, and the protocol's update
the minibatch and the noise from the other two; so with the same seed the
hand-off engine reproduces the in-process DSGLD/FSGLD draws (up to float
rounding of the data layout), which the tests check.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..federation import Federation, describe_client
from ..progress import progress_bar
from ..protocols import HandoffProtocol, ServerSide, client_context, client_function, draw_client
from ..results import Result, SamplingDivergedError
from .comm import (ClientEndpoint, ClientFailure, ClientFailureError, InProcessTransport,
                   Transport, call_all, describe_federation, gather_before_sampling,
                   with_fault_injection)
from .local import iteration_key
from .options import check_engine_options
from .ray_engine import RayTransport, ray_session
from .ray_security import record_ray_authentication

__all__ = ["HandoffClient", "run_handoff", "HandoffRun", "sample_handoff", "sample_protocol",
           "sample_on_ray"]


# ----------------------------------------------------------------------------- client side


class HandoffClient(ClientEndpoint):
    """One client of a hand-off protocol: its data, its protocol, its compiled visit.

    ``source``: the client's data or its loader (called here, in the client's process).
    ``protocol``: the :class:`~fedmcmc.protocols.HandoffProtocol` (pickled to the client).
    ``spec`` (plain dict): ``seed``, ``chains``, ``thin``, ``num_clients``.
    """

    def __init__(self, index: int, source: Any, model, init: Any, protocol: HandoffProtocol,
                 spec: Dict[str, Any]):
        super().__init__(index, source)
        self.spec = dict(spec)
        self.protocol = protocol
        self._raw_data = self.data
        self.context = client_context(self.index, self._raw_data, self.size, model, init,
                                      spec["num_clients"], spec["seed"])
        self.parameters: Dict[str, Any] = {}
        self._visit = None

    def describe(self):
        return describe_client(self._raw_data)

    def setup(self, name: str, *args):
        """Run the protocol's client-side function ``client_<name>`` on this client's data."""
        return client_function(self.protocol, name)(self.context, *args)

    def configure(self, parameters: Dict[str, Any]) -> int:
        """Set this client's update parameters (sent again after a client is dropped: f_s
        renormalised and whatever the protocol recomputes over the remaining clients)."""
        parameters = self.protocol.complete_parameters(self.context, dict(parameters))
        parameters = {name: jnp.asarray(value) for name, value in parameters.items()}
        structure = {name: (value.shape, value.dtype) for name, value in parameters.items()}
        changed = self._visit is None or structure != getattr(self, "_structure", None)
        self.parameters, self._structure = parameters, structure
        if changed:
            self._visit = self._build_visit()
            # compile now, so that a visit's time (and its timeout) does not include compilation
            carry = self.protocol.init_carry(
                np.zeros((self.context.flat_model.dim,), self.context.flat_model.dtype))
            jax.block_until_ready(self._visit(np.int32(0), carry, np.int32(0), self.parameters))
        return self.index

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
            self.parameters)
        ends = iteration + 1 + np.arange(steps)
        keep = ends % thin == 0
        draws = np.asarray(positions)[keep]
        first = int(ends[keep][0] // thin - 1) if keep.any() else -1
        return tuple(np.asarray(leaf) for leaf in final), draws, first

    def _build_visit(self):
        protocol, context = self.protocol, self.context
        root = jax.random.key(self.spec["seed"])
        chains, thin, steps = self.spec["chains"], self.spec["thin"], protocol.local_steps

        @jax.jit
        def visit(chain, carry, iteration, parameters):
            update = protocol.build_update(context, parameters)

            def body(carry, step):
                t = iteration + step
                carry = tuple(update(iteration_key(root, chains, thin, chain, t), carry, t))
                return carry, protocol.position(carry)

            return jax.lax.scan(body, tuple(carry), jnp.arange(steps, dtype=jnp.int32))

        return visit


# ----------------------------------------------------------------------------- server side


class HandoffRun(NamedTuple):
    draws: np.ndarray  # (chains, total, d), NaN where not made
    clients: np.ndarray  # (chains, total) client of each draw, -1 where not made
    rounds_at_draw: np.ndarray  # (chains, total)
    draws_done: np.ndarray  # (chains,) draws received per chain
    positions: np.ndarray  # (chains, d)
    iterations: np.ndarray  # (chains,)
    rounds: np.ndarray  # (chains,)
    visits: np.ndarray  # (chains, S)
    diverged: np.ndarray  # (chains,) bool
    first_bad_draw: np.ndarray  # (chains,)
    failures: list  # [{client, reason, iteration}]
    weights: np.ndarray  # final f_s (0 for dropped clients)
    wall_time: float
    visit_seconds: list  # wall time of each completed visit round trip


def run_handoff(
    transport: Transport,
    *,
    weights: np.ndarray,
    initial_carry: tuple,
    position_of: Callable[[tuple], Any],
    chains: int,
    thin: int,
    local_steps: int,
    total_draws: int,
    seed: int,
    visit_timeout: Optional[float] = None,
    on_client_failure: str = "stop",
    divergence_threshold: float = 1e10,
    reconfigure: Optional[Callable[[np.ndarray], None]] = None,
    make_result: Optional[Callable[["HandoffRun"], Any]] = None,
    progress: Optional[bool] = None,
    label: str = "sampling",
) -> HandoffRun:
    """Run every chain to ``total_draws`` draws by handing it from client to client.

    ``reconfigure(weights)`` is called after a client is dropped, with the
    renormalised f_s (0 for dropped clients); it must send the clients their
    new configuration. ``make_result(run)`` builds the partial ``Result``
    carried by :class:`ClientFailureError`. ``progress``: a progress bar of the
    draws received over all chains (default: when stderr is a terminal).
    """
    bar = progress_bar(progress, label, chains * total_draws)
    try:
        return _run_handoff(
            transport, weights, initial_carry, position_of, chains, thin, local_steps,
            total_draws, seed,
            visit_timeout, on_client_failure, divergence_threshold, reconfigure, make_result, bar)
    finally:
        if bar is not None:
            bar[0].stop()


def _run_handoff(transport, weights, initial_carry, position_of, chains, thin, local_steps,
                 total_draws, seed,
                 visit_timeout, on_client_failure, divergence_threshold, reconfigure, make_result,
                 bar) -> HandoffRun:
    started = time.perf_counter()
    num_clients = len(weights)
    initial_carry = tuple(np.asarray(leaf) for leaf in initial_carry)
    dim = int(np.shape(position_of(initial_carry))[0])
    root = jax.random.key(seed)
    original_weights = np.asarray(weights, np.float64)
    current_weights = original_weights.copy()

    @jax.jit
    def next_client(chain, t, cumulative):
        key_client = jax.random.split(iteration_key(root, chains, thin, chain, t), 3)[0]
        return draw_client(key_client, cumulative)

    def cumulative_of(w):
        return jnp.cumsum(jnp.asarray(w, jnp.float32))

    cumulative = cumulative_of(current_weights)
    draws = np.full((chains, total_draws, dim), np.nan, np.float32)
    draw_clients = np.full((chains, total_draws), -1, np.int32)
    draw_rounds = np.full((chains, total_draws), -1, np.int32)
    done = np.zeros(chains, np.int64)
    carries = [initial_carry] * chains
    positions = np.broadcast_to(np.asarray(position_of(initial_carry), np.float32),
                                (chains, dim)).copy()
    iterations = np.zeros(chains, np.int64)
    rounds = np.zeros(chains, np.int64)
    visits = np.zeros((chains, num_clients), np.int64)
    diverged = np.zeros(chains, bool)
    first_bad = np.full(chains, -1, np.int64)
    failures: List[dict] = []
    alive = set(range(num_clients))
    inflight: Dict[int, Any] = {}
    visit_seconds: List[float] = []

    def snapshot() -> HandoffRun:
        return HandoffRun(
            draws, draw_clients, draw_rounds, done.copy(), positions.copy(), iterations.copy(),
            rounds.copy(), visits.copy(), diverged.copy(), first_bad.copy(), list(failures),
            current_weights.copy(), time.perf_counter() - started, visit_seconds,
        )

    def submit(chain: int) -> None:
        client = int(next_client(np.int32(chain), np.int32(iterations[chain]), cumulative))
        rounds[chain] += 1
        visits[chain, client] += 1
        inflight[chain] = transport.call(
            client, "visit", chain, carries[chain], int(iterations[chain]), tag=chain
        )

    def accept(pending, reply) -> None:
        chain = pending.tag
        visit_seconds.append(time.perf_counter() - pending.sent_at)
        carry, segment, first = reply
        segment = np.asarray(segment, np.float32).reshape(-1, dim)
        if first >= 0 and len(segment):
            stop = min(first + len(segment), total_draws)
            take = segment[: max(0, stop - first)]
            if len(take):
                ok = np.all(np.isfinite(take), axis=1) & np.all(
                    np.abs(take) < divergence_threshold, axis=1
                )
                if not ok.all():
                    bad = int(np.argmax(~ok))
                    diverged[chain] = True
                    first_bad[chain] = first + bad
                    take = take[:bad]
                draws[chain, first: first + len(take)] = take
                draw_clients[chain, first: first + len(take)] = pending.client
                draw_rounds[chain, first: first + len(take)] = rounds[chain]
                done[chain] = first + len(take)
        carries[chain] = tuple(np.asarray(leaf) for leaf in carry)
        positions[chain] = np.asarray(position_of(carries[chain]), np.float32)
        iterations[chain] += local_steps

    def revert(chain: int, client: int) -> None:
        rounds[chain] -= 1
        visits[chain, client] -= 1

    def fail(client: int, reason: str) -> None:
        nonlocal cumulative
        failures.append(
            {"client": int(client), "reason": reason,
             "iteration": int(iterations.max()), "draws_done": int(done.min()),
             # per chain: iterations completed when the failure was handled (every draw
             # before iteration // thin was made under the original target)
             "chain_iterations": iterations.tolist()}
        )
        alive.discard(client)
        transport.kill(client)
        hit = [c for c, p in inflight.items() if p.client == client]
        for chain in hit:
            revert(chain, client)
            del inflight[chain]
        if on_client_failure == "stop" or not alive:
            # keep what the other clients are computing right now
            if inflight:
                ready, _ = transport.wait(list(inflight.values()), timeout=visit_timeout or 30.0)
                for pending in ready:
                    try:
                        accept(pending, transport.result(pending))
                    except ClientFailure:
                        revert(pending.tag, pending.client)
                    del inflight[pending.tag]
                for chain, pending in list(inflight.items()):
                    revert(chain, pending.client)
                inflight.clear()
            run = snapshot()
            result = make_result(run) if make_result else None
            why = "no client left" if not alive else 'on_client_failure="stop"'
            raise ClientFailureError(
                f"client {client} failed ({reason}); the run stopped ({why}). "
                f"Draws received so far are in error.result (per chain: {done.tolist()} "
                f"of {total_draws}); on_client_failure='drop' continues without the client",
                result, client, reason,
            )
        current_weights[:] = 0.0
        kept = sorted(alive)
        current_weights[kept] = original_weights[kept] / original_weights[kept].sum()
        cumulative = cumulative_of(current_weights)
        if reconfigure is not None:
            reconfigure(current_weights.copy())
        for chain in hit:
            submit(chain)

    for chain in range(chains):
        if done[chain] < total_draws:
            submit(chain)
    last_update = started
    while inflight:
        now = time.perf_counter()
        if bar is not None and now - last_update > 0.5:
            received = int(done.sum())
            bar[0].update(bar[1], completed=received,
                          rate=f"{received / max(now - started, 1e-9):,.1f} draws/s, "
                               f"{int(rounds.sum())} visits")
            last_update = now
        timeout = None
        if visit_timeout is not None:
            oldest = min(p.sent_at for p in inflight.values())
            timeout = max(0.0, oldest + visit_timeout - time.perf_counter())
        ready, _ = transport.wait(list(inflight.values()), timeout=timeout)
        failed_now = []
        for pending in ready:
            if inflight.get(pending.tag) is not pending:
                continue
            try:
                reply = transport.result(pending)
            except ClientFailure as failure:
                failed_now.append((failure.client, failure.reason))
                continue
            del inflight[pending.tag]
            accept(pending, reply)
            chain = pending.tag
            if not diverged[chain] and done[chain] < total_draws:
                submit(chain)
        if visit_timeout is not None:
            now = time.perf_counter()
            for pending in list(inflight.values()):
                if now - pending.sent_at > visit_timeout and pending.client in alive:
                    failed_now.append(
                        (pending.client, f"no answer within visit_timeout={visit_timeout:g} s")
                    )
        seen = set()
        for client, reason in failed_now:
            if client in seen or client not in alive:
                continue
            seen.add(client)
            fail(client, reason)
    if bar is not None:
        bar[0].update(bar[1], completed=int(done.sum()), rate=f"{int(rounds.sum())} visits")
    return snapshot()


# ----------------------------------------------------------------------------- protocol adapter

def sample_handoff(
    protocol: HandoffProtocol,
    model,
    federation: Federation,
    make_transport: Callable[[List[tuple]], Transport],
    *,
    init,
    num_samples: int,
    burn_in: int,
    thin: int,
    chains: int,
    seed: int,
    engine_label: str,
    visit_timeout: Optional[float] = None,
    on_client_failure: str = "stop",
    audit_messages: bool = False,
    fault_injection: Optional[dict] = None,
    progress: Optional[bool] = None,
    info: Optional[Dict[str, Any]] = None,
):
    """Run a hand-off ``protocol`` on the transport ``make_transport`` builds.

    ``make_transport(specs)`` receives one ``(HandoffClient, args)`` per client and
    returns a :class:`Transport` whose endpoints are those clients. The protocol's
    :meth:`~fedmcmc.protocols.HandoffProtocol.prepare` and
    :meth:`~fedmcmc.protocols.HandoffProtocol.client_parameters` run here, in the
    driver, on the clients' replies; ``info``: entries to start ``Result.info`` with.
    """
    if not isinstance(protocol, HandoffProtocol):
        raise ValueError(f"protocol must be a fedmcmc.protocols.HandoffProtocol, got {protocol!r}")
    flat_model = model.flatten(init)
    theta0 = np.asarray(flat_model.ravel(init))
    num_clients = federation.num_clients
    spec = {"seed": int(seed), "chains": int(chains), "thin": int(thin),
            "num_clients": num_clients}
    info = dict(info or {})
    info.update(engine=engine_label, local_steps=protocol.local_steps, num_clients=num_clients,
                on_client_failure=on_client_failure, visit_timeout=visit_timeout)
    sources = federation.client_sources()
    specs = [(HandoffClient, (s, sources[s], model, init, protocol, spec))
             for s in range(num_clients)]
    # fault_injection (tests only): the transport makes one client crash or hang
    transport = with_fault_injection(make_transport(specs), fault_injection, "visit")
    try:
        # from_loaders: each client loaded its rows in its own process; the driver learns
        # their sizes (hence the default f_s) from the clients' descriptions
        federation = describe_federation(transport, federation, model, init)
        weights = np.asarray(federation.weights, np.float64)
        transport.audit = bool(audit_messages)
        setup_started = time.perf_counter()
        timeout = [None]  # set-up before sampling waits without a limit (it compiles)

        def ask(name, args_of_client, clients=None):
            clients = list(range(num_clients)) if clients is None else list(clients)
            pendings = [transport.call(s, "setup", name, *args_of_client(s)) for s in clients]
            return gather_before_sampling(transport, pendings, timeout[0])

        server = ServerSide(ask=ask, flat_model=flat_model, theta0=theta0,
                            num_clients=num_clients, seed=int(seed), info=info)
        prepared = protocol.prepare(server)

        def configure(current_weights: np.ndarray) -> None:
            kept = [s for s in range(num_clients) if current_weights[s] > 0]
            parameters = protocol.client_parameters(server, prepared, current_weights, kept)
            if len(parameters) != len(kept):
                raise ValueError(f"{protocol.name}.client_parameters returned "
                                 f"{len(parameters)} entries for {len(kept)} clients")
            gather_before_sampling(
                transport, [transport.call(s, "configure", p) for s, p in zip(kept, parameters)],
                timeout[0])

        configure(weights)
        timeout[0] = visit_timeout  # after a drop, reconfiguring is bounded like a visit
        info["client_locations"] = call_all(transport, "location")
        info["setup_time"] = time.perf_counter() - setup_started
        total = burn_in + num_samples

        def to_result(run: HandoffRun):
            return _result_of(run, protocol.name, flat_model, info, transport, burn_in, chains,
                              thin, weights)

        run = run_handoff(
            transport,
            weights=weights,
            initial_carry=protocol.init_carry(theta0),
            position_of=protocol.position,
            chains=chains,
            thin=thin,
            local_steps=protocol.local_steps,
            total_draws=total,
            seed=seed,
            visit_timeout=visit_timeout,
            on_client_failure=on_client_failure,
            divergence_threshold=protocol.divergence_threshold,
            reconfigure=configure,
            make_result=to_result,
            progress=progress,
            label=f"{protocol.name} ({engine_label})",
        )
        result = to_result(run)
    finally:
        transport.close()
    if run.diverged.any():
        details = [
            {"chain": int(c), "iteration": int((run.first_bad_draw[c] + 1) * thin)}
            for c in np.nonzero(run.diverged)[0]
        ]
        result.info["diverged_chains"] = [d["chain"] for d in details]
        raise SamplingDivergedError(
            f"{protocol.name} (engine={engine_label!r}): {len(details)} chain(s) diverged. "
            "The draws made before are in error.result; lower step_size",
            result, result.info["diverged_chains"], details,
        )
    return result


def _result_of(run: HandoffRun, name: str, flat_model, base_info, transport, burn_in, chains,
               thin, original_weights):
    kept = run.draws[:, burn_in:]
    info = dict(base_info)
    draws_done = int(run.draws_done.max()) if len(run.draws_done) else 0
    info.update(
        algorithm=name,
        chains=chains,
        iterations=int(draws_done * thin),
        draws_kept=int(kept.shape[1]),
        wall_time=run.wall_time,
        interrupted=False,
        dim=flat_model.dim,
        rounds=int(run.rounds.max()),
        rounds_per_chain=run.rounds.tolist(),
        visits_per_client=run.visits.sum(axis=0).tolist(),
        draws_per_chain=np.maximum(run.draws_done - burn_in, 0).tolist(),
        mean_visit_seconds=float(np.mean(run.visit_seconds)) if run.visit_seconds else None,
    )
    info.update(transport.info())
    if run.failures:
        info["client_failures"] = run.failures
        dropped = [f["client"] for f in run.failures]
        info["dropped_clients"] = dropped
        if base_info.get("on_client_failure") == "drop":
            info["target_changed"] = True
            info["target"] = (
                f"posterior given the data of clients "
                f"{[s for s in range(len(original_weights)) if s not in dropped]} only "
                f"(clients {dropped} dropped mid-run; f_s renormalised)"
            )
            info["weights_after_drop"] = run.weights.tolist()
    stats = {"client": run.clients[:, burn_in:].copy(),
             "round": run.rounds_at_draw[:, burn_in:].copy()}
    samples = flat_model.unravel_draws(jnp.asarray(kept))
    return Result(samples=samples, info=info, sample_stats=stats, algorithm=name)


def sample_protocol(protocol: HandoffProtocol, model, federation, *, engine: str, init,
                    num_samples: int, burn_in: int, thin: int, chains: int, seed: int,
                    progress: Optional[bool] = None, info: Optional[Dict[str, Any]] = None,
                    **options):
    """Run a hand-off ``protocol`` on ``engine``: ``"local"`` (its clients as objects in this
    process, :class:`~fedmcmc.engines.comm.InProcessTransport`, message for message as on
    Ray) or ``"ray"`` (one Ray actor per client, :func:`sample_on_ray`).

    This is what an algorithm defined outside the package calls from its ``sample``: it
    needs no edit of fedmcmc (``docs/development``, "Adding a hand-off algorithm").
    ``options``: the engine options of ``fedmcmc.engines.options`` (``visit_timeout``,
    ``on_client_failure``, ``audit_messages``, and on Ray ``ray_address`` etc.).
    """
    if not isinstance(protocol, HandoffProtocol):
        raise ValueError(f"protocol must be a fedmcmc.protocols.HandoffProtocol, got {protocol!r}")
    common = dict(init=init, num_samples=num_samples, burn_in=burn_in, thin=thin,
                  chains=chains, seed=seed, progress=progress, info=info)
    if engine == "ray":
        return sample_on_ray(protocol, model, federation, **common, **options)
    if engine != "local":
        raise ValueError(f"engine must be 'local' or 'ray', got {engine!r}")
    options = check_engine_options(options, protocol.name, engine="local")
    return sample_handoff(
        protocol, model, federation,
        lambda specs: InProcessTransport([cls(*args) for cls, args in specs]),
        engine_label="local", visit_timeout=options.get("visit_timeout"),
        on_client_failure=options["on_client_failure"],
        audit_messages=bool(options.get("audit_messages", False)),
        fault_injection=options.get("fault_injection"), **common)


def sample_on_ray(protocol: HandoffProtocol, model, federation, *, init, num_samples, burn_in,
                  thin, chains, seed, progress=None, info=None, **options):
    """A hand-off protocol (DSGLD, FSGLD, or one defined outside the package) on Ray, one
    actor per client."""
    options = check_engine_options(options, protocol.name)
    resources = options.get("client_resources")
    num_cpus = options.get("client_num_cpus", 0)

    def make_transport(specs):
        return RayTransport(specs, resources=resources, num_cpus=num_cpus)

    with ray_session(options.get("ray_address"), options.get("ray_init_options"),
                     options.get("allow_unauthenticated_cluster", False)):
        return record_ray_authentication(sample_handoff(
            protocol, model, federation, make_transport,
            init=init, num_samples=num_samples, burn_in=burn_in, thin=thin, chains=chains,
            seed=seed, engine_label="ray",
            visit_timeout=options.get("visit_timeout"),
            on_client_failure=options["on_client_failure"],
            audit_messages=bool(options.get("audit_messages", False)),
            fault_injection=options.get("fault_injection"),
            progress=progress, info=info,
        ))
