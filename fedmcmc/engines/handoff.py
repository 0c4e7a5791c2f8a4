"""The chain hand-off protocol of DSGLD/FSGLD over a :class:`~fedmcmc.engines.comm.Transport`.

Client side (:class:`HandoffClient`, one per client, a Ray actor on the Ray
engine): holds only its own data, fits its own surrogate (FSGLD), and keeps a
compiled *visit*: ``local_steps`` updates of the chain with its own minibatches,
built from the very kernels of the in-process engine (``dsgld.build_kernel`` /
``fsgld.build_kernel`` on a one-client data layout, so the algorithm is not
written twice). A visit returns the chain's position and the draws taken during
the visit -- parameter-sized messages only.

Server side (:func:`run_handoff`): draws the next client of each chain with
probability f_s, keeps several chains in flight at once (``transport.wait``),
collects the draw segments, checks divergence, and handles client failures
(per-visit timeout, dead actor): ``on_client_failure="stop"`` raises
:class:`~fedmcmc.engines.comm.ClientFailureError` carrying every draw received
so far; ``"drop"`` continues without the client, with f_s renormalised over the
remaining clients (and, for FSGLD, the global surrogate and trust region
recomputed over them) -- the target is then the posterior given the remaining
clients' data, which ``result.info`` records.

Random streams: iteration ``t`` of chain ``c`` uses the key the in-process
engine uses, ``split(split(fold_in(key(seed), t // thin), chains)[c], thin)[t % thin]``,
split in three (client draw, minibatch, noise) exactly as ``dsgld.build_federated_kernel``
does. The server draws the client with the first third, the client the
minibatch and the noise with the others; so with the same seed the hand-off
engine reproduces the in-process draws (up to float rounding of the data
layout), which the tests check.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..federation import ConcatenatedData, Federation
from ..federation import describe_client
from ..progress import progress_bar
from ..schedules import as_schedule, describe_step_size
from .local import iteration_key
from .options import check_engine_options
from .comm import ClientEndpoint, ClientFailure, ClientFailureError, Transport, describe_federation

__all__ = ["HandoffClient", "run_handoff", "HandoffRun", "sample_handoff", "sample_on_ray"]


# ----------------------------------------------------------------------------- client side


class HandoffClient(ClientEndpoint):
    """One client of DSGLD/FSGLD: its data, its surrogate, its compiled visit.

    ``source``: the client's data or its loader (called here, in the client's process).
    ``spec`` (plain dict): ``algorithm`` ("DSGLD" | "FSGLD"), ``batch_size``,
    ``local_steps``, ``step_size`` (number or schedule), ``noise``, ``seed``,
    ``chains``, ``thin``, ``num_clients`` and, for FSGLD, ``alpha``,
    ``alpha_warmup``.
    """

    def __init__(self, index: int, source: Any, model, init: Any, spec: Dict[str, Any]):
        super().__init__(index, source)
        self.spec = dict(spec)
        self.model = model
        self.flat_model = model.flatten(init)
        self._raw_data = self.data
        self.data = ConcatenatedData(
            data=jax.tree_util.tree_map(jnp.asarray, self._raw_data),
            offsets=jnp.zeros((1,), jnp.int32),
            sizes=jnp.full((1,), self.size, jnp.int32),
        )
        self.schedule = as_schedule(spec["step_size"])
        self.params: Dict[str, Any] = {}
        self._own_surrogate = None
        self._visit = None

    def describe(self):
        return describe_client(self._raw_data)

    def fit_surrogate(self, kind: str, theta0, options: Dict[str, Any]):
        """Fit q_s on this client's data only; returns its natural parameters (P_s, b_s).

        Same objective as the in-process fit (``fedmcmc.surrogates``): the
        client's log likelihood plus 1/S of the log prior.
        """
        from .. import surrogates as surrogate_module
        from ..model import Model

        num_clients = self.spec["num_clients"]
        prior = self.model.log_prior
        share = Model(
            log_prior=lambda params: prior(params) / num_clients,
            log_likelihood=self.model.log_likelihood,
        )
        flat_share = share.flatten(self.flat_model.unravel(jnp.asarray(theta0)))
        one_client = Federation([self._raw_data])
        key = jax.random.split(
            jax.random.fold_in(jax.random.key(self.spec["seed"]), 2**20), num_clients
        )[self.index]
        # key[None]: this client's own key, used as is (the in-process engine's key for it)
        fitted = surrogate_module.fit_surrogates(
            kind, flat_share, one_client, jnp.asarray(theta0), key[None], **options
        )
        precision, shift = np.asarray(fitted.precision[0]), np.asarray(fitted.shift[0])
        self._own_surrogate = (precision, shift)
        return precision, shift

    def estimator_moments(self, weight: float, global_surrogate: tuple, center, probes: int):
        """The d + 1 moments of this client's FSGLD estimator at ``center`` over ``probes`` of
        its own minibatches (for ``trust_radius="auto"``; ``estimators.estimator_moments``),
        with the in-process engine's key for this client."""
        from ..langevin.estimators import estimator_moments
        from ..surrogates import GaussianSurrogates, ProductSurrogate

        if self._own_surrogate is None:
            raise ValueError("estimator_moments before this client's surrogate is known")
        precision, shift = self._own_surrogate
        key = jax.random.fold_in(
            jax.random.fold_in(jax.random.fold_in(jax.random.key(self.spec["seed"]), 2**20), 7),
            self.index)
        flat_model, data, spec = self.flat_model, self.data, self.spec

        @jax.jit
        def moments(weight, own, product, center, key):
            return estimator_moments(flat_model, data, jnp.int32(0), weight, spec["batch_size"],
                                     spec["alpha"], own, product, center, key, int(probes))

        mean, second = moments(
            jnp.asarray(weight, jnp.float32),
            GaussianSurrogates(jnp.asarray(precision)[None], jnp.asarray(shift)[None]),
            ProductSurrogate(jnp.asarray(global_surrogate[0]), jnp.asarray(global_surrogate[1])),
            jnp.asarray(center), key)
        return np.asarray(mean), float(second)

    def configure(self, weight: float, surrogate: Optional[tuple] = None,
                  global_surrogate: Optional[tuple] = None, trust: Optional[tuple] = None) -> int:
        """Set f_s and, for FSGLD, q_s (if the server holds it), q and the trust region.

        Sent again after a client is dropped (f_s renormalised, q over the remaining clients).
        """
        params = {"weight": jnp.asarray(weight, jnp.float32)}
        if self.spec["algorithm"] == "FSGLD":
            if surrogate is not None:
                self._own_surrogate = (np.asarray(surrogate[0]), np.asarray(surrogate[1]))
            if self._own_surrogate is None:
                raise ValueError("FSGLD client configured before its surrogate is known")
            params["precision"] = jnp.asarray(self._own_surrogate[0])
            params["shift"] = jnp.asarray(self._own_surrogate[1])
            params["global_precision"] = jnp.asarray(global_surrogate[0])
            params["global_shift"] = jnp.asarray(global_surrogate[1])
            if trust is not None:
                params["trust_center"] = jnp.asarray(trust[0])
                params["trust_precision"] = jnp.asarray(trust[1])
                params["trust_radius"] = jnp.asarray(trust[2], jnp.float32)
        structure_changed = self._visit is None or set(params) != set(self.params)
        self.params = params
        if structure_changed:
            self._visit = self._build_visit("trust_center" in params)
            # compile now, so that a visit's time (and its timeout) does not include compilation
            position = jnp.zeros((self.flat_model.dim,), jnp.float32)
            jax.block_until_ready(self._visit(np.int32(0), np.asarray(position), np.int32(0), self.params))
        return self.index

    def visit(self, chain: int, position, iteration: int):
        """``local_steps`` updates of ``chain`` from ``position`` at global iteration ``iteration``.

        Returns ``(position, draws, first_draw)``: the final position (d,), the
        positions at the draw points inside the visit (k, d) (iterations t with
        (t + 1) % thin == 0), and the global index of the first of them.
        """
        thin = self.spec["thin"]
        steps = self.spec["local_steps"]
        self._visits_served = getattr(self, "_visits_served", 0) + 1
        fault = self.spec.get("fault_injection")
        if fault and fault["client"] == self.index and self._visits_served > fault["after_visits"]:
            if fault["kind"] == "exit":  # the actor's process dies mid-run
                os._exit(1)
            time.sleep(fault.get("seconds", 3600.0))  # "hang": never answers in time
        # NumPy arguments: no eager JAX op per call (each costs ~1 ms on a loaded machine)
        final, positions = self._visit(
            np.int32(chain), np.asarray(position, np.float32), np.int32(iteration), self.params
        )
        ends = iteration + 1 + np.arange(steps)
        keep = ends % thin == 0
        draws = np.asarray(positions)[keep]
        first = int(ends[keep][0] // thin - 1) if keep.any() else -1
        return np.asarray(final), draws, first

    def _build_visit(self, with_trust: bool):
        from ..langevin import dsgld, fsgld
        from ..surrogates import GaussianSurrogates, ProductSurrogate

        spec = self.spec
        flat_model, data = self.flat_model, self.data
        root = jax.random.key(spec["seed"])
        chains, thin, steps = spec["chains"], spec["thin"], spec["local_steps"]
        batch_size, schedule, noise = spec["batch_size"], self.schedule, spec["noise"]
        is_fsgld = spec["algorithm"] == "FSGLD"
        alpha = fsgld.alpha_schedule(spec.get("alpha", 1.0), spec.get("alpha_warmup", 0)) if is_fsgld else None

        @jax.jit
        def visit(chain, position, iteration, params):
            weights = params["weight"][None]
            if is_fsgld:
                trust = None
                if with_trust:
                    trust = fsgld.TrustRegion(
                        center=params["trust_center"],
                        precision=params["trust_precision"],
                        radius=params["trust_radius"],
                    )
                step = fsgld.build_kernel(
                    flat_model, data, weights, batch_size, steps, schedule,
                    GaussianSurrogates(params["precision"][None], params["shift"][None]),
                    ProductSurrogate(params["global_precision"], params["global_shift"]),
                    alpha, noise, trust,
                )
            else:
                step = dsgld.build_kernel(flat_model, data, weights, batch_size, steps, schedule, noise)
            state = dsgld.init(position, 1)._replace(iteration=iteration)

            def body(s, _):
                s = step(iteration_key(root, chains, thin, chain, s.iteration), s)
                return s, s.position

            final, positions = jax.lax.scan(body, state, None, length=steps)
            return final.position, positions

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
    theta0: np.ndarray,
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
            transport, weights, theta0, chains, thin, local_steps, total_draws, seed,
            visit_timeout, on_client_failure, divergence_threshold, reconfigure, make_result, bar)
    finally:
        if bar is not None:
            bar[0].stop()


def _run_handoff(transport, weights, theta0, chains, thin, local_steps, total_draws, seed,
                 visit_timeout, on_client_failure, divergence_threshold, reconfigure, make_result,
                 bar) -> HandoffRun:
    from ..langevin.estimators import draw_client

    started = time.perf_counter()
    num_clients = len(weights)
    dim = int(np.shape(theta0)[0])
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
    positions = np.broadcast_to(np.asarray(theta0, np.float32), (chains, dim)).copy()
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
            client, "visit", chain, positions[chain], int(iterations[chain]), tag=chain
        )

    def accept(pending, reply) -> None:
        chain = pending.tag
        visit_seconds.append(time.perf_counter() - pending.sent_at)
        position, segment, first = reply
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
        positions[chain] = np.asarray(position, np.float32)
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


# ----------------------------------------------------------------------------- algorithm adapter

def sample_handoff(
    algorithm,
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
):
    """DSGLD/FSGLD through the hand-off protocol on the transport ``make_transport`` builds.

    ``make_transport(specs)`` receives one ``(HandoffClient, args)`` per client
    and returns a :class:`Transport` whose endpoints are those clients.
    """
    from .. import surrogates as surrogate_module
    from ..results import Result, SamplingDivergedError

    is_fsgld = algorithm.name == "FSGLD"
    flat_model = model.flatten(init)
    theta0 = np.asarray(flat_model.ravel(init))
    num_clients = federation.num_clients
    spec = {
        "algorithm": algorithm.name,
        "batch_size": algorithm.batch_size,
        "local_steps": algorithm.local_steps,
        "step_size": algorithm.step_size,
        "noise": algorithm.noise,
        "seed": int(seed),
        "chains": int(chains),
        "thin": int(thin),
        "num_clients": num_clients,
    }
    if fault_injection:
        spec["fault_injection"] = dict(fault_injection)
    if is_fsgld:
        spec.update(alpha=algorithm.alpha, alpha_warmup=algorithm.alpha_warmup)
    info: Dict[str, Any] = {
        "engine": engine_label,
        "step_size": describe_step_size(algorithm.step_size),
        "batch_size": algorithm.batch_size,
        "local_steps": algorithm.local_steps,
        "num_clients": num_clients,
        "on_client_failure": on_client_failure,
        "visit_timeout": visit_timeout,
    }
    sources = federation.client_sources()
    specs = [(HandoffClient, (s, sources[s], model, init, spec)) for s in range(num_clients)]
    transport = make_transport(specs)
    try:
        # from_loaders: each client loaded its rows in its own process; the driver learns
        # their sizes (hence the default f_s) from the clients' descriptions
        federation = describe_federation(transport, federation, model, init)
        weights = np.asarray(federation.weights, np.float64)
        transport.audit = bool(audit_messages)
        setup_started = time.perf_counter()
        surrogates = None
        given = None
        if is_fsgld:
            if isinstance(algorithm.surrogate, str):
                step = algorithm.surrogate_step_size
                if step is None:
                    step = (
                        algorithm.step_size
                        if not callable(algorithm.step_size)
                        else float(algorithm.step_size(0))
                    )
                options = {"diagonal": algorithm.diagonal}
                if algorithm.surrogate == "sgld":
                    options.update(
                        step_size=step, batch_size=algorithm.batch_size,
                        draws=algorithm.surrogate_draws, burn_in=algorithm.surrogate_burn_in,
                    )
                pendings = [
                    transport.call(s, "fit_surrogate", algorithm.surrogate, theta0, options)
                    for s in range(num_clients)
                ]
                fitted = [_wait_result(transport, p, None) for p in pendings]
                surrogates = surrogate_module.GaussianSurrogates(
                    precision=jnp.stack([jnp.asarray(p) for p, _ in fitted]),
                    shift=jnp.stack([jnp.asarray(b) for _, b in fitted]),
                )
            else:
                surrogates = surrogate_module.as_surrogates(
                    algorithm.surrogate, flat_model.dim, num_clients
                )
                given = surrogates
            info.update(
                surrogate=algorithm.surrogate if isinstance(algorithm.surrogate, str) else "given",
                surrogate_diagonal=surrogates.diagonal,
                alpha=algorithm.alpha,
                alpha_warmup=algorithm.alpha_warmup,
            )

        def configure(current_weights: np.ndarray, timeout: Optional[float] = visit_timeout) -> None:
            kept = [s for s in range(num_clients) if current_weights[s] > 0]
            global_surrogate = trust = None
            if is_fsgld:
                subset = surrogate_module.GaussianSurrogates(
                    precision=surrogates.precision[np.asarray(kept)],
                    shift=surrogates.shift[np.asarray(kept)],
                )
                product = surrogate_module.product(subset)
                global_surrogate = (np.asarray(product.precision), np.asarray(product.shift))
                if algorithm.trust_radius is not None:
                    center, metric = surrogate_module.laplace_of_product(
                        flat_model, subset, jnp.asarray(theta0)
                    )
                    radius = algorithm.trust_radius
                    if radius == "auto":
                        radius = _auto_radius(algorithm, transport, flat_model, current_weights,
                                              kept, global_surrogate, center, timeout)
                    trust = (np.asarray(center), np.asarray(metric), float(radius))
                    info["trust_radius"] = radius
                else:
                    info["trust_radius"] = None
            pendings = []
            for s in kept:
                own = None
                if given is not None:
                    own = (np.asarray(given.precision[s]), np.asarray(given.shift[s]))
                pendings.append(
                    transport.call(s, "configure", float(current_weights[s]), own,
                                   global_surrogate, trust)
                )
            for p in pendings:
                _wait_result(transport, p, timeout)

        configure(weights, timeout=None)
        info["client_locations"] = [
            _wait_result(transport, p, None)
            for p in [transport.call(s, "location") for s in range(num_clients)]
        ]
        info["setup_time"] = time.perf_counter() - setup_started
        total = burn_in + num_samples

        def to_result(run: HandoffRun):
            return _result_of(run, algorithm, flat_model, info, transport, burn_in, chains, thin,
                              weights)

        run = run_handoff(
            transport,
            weights=weights,
            theta0=theta0,
            chains=chains,
            thin=thin,
            local_steps=algorithm.local_steps,
            total_draws=total,
            seed=seed,
            visit_timeout=visit_timeout,
            on_client_failure=on_client_failure,
            divergence_threshold=algorithm.divergence_threshold,
            reconfigure=configure,
            make_result=to_result,
            progress=progress,
            label=f"{algorithm.name} ({engine_label})",
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
            f"{algorithm.name} (engine={engine_label!r}): {len(details)} chain(s) diverged. "
            "The draws made before are in error.result; lower step_size",
            result, result.info["diverged_chains"], details,
        )
    return result


def _auto_radius(algorithm, transport, flat_model, weights, kept, global_surrogate, center,
                 timeout) -> float:
    """FSGLD's ``trust_radius="auto"`` from the clients' own estimator moments (d + 1 floats
    each, computed in the client from its data; the in-process engine computes the same
    moments with the same keys, so the radius is the same)."""
    from ..langevin import fsgld

    center = np.asarray(center)
    probes = int(getattr(algorithm, "radius_probes_per_client", 64))
    pendings = [transport.call(s, "estimator_moments", float(weights[s]), global_surrogate, center,
                               probes) for s in kept]
    replies = [_wait_result(transport, p, timeout) for p in pendings]
    means = np.stack([np.asarray(m) for m, _ in replies])
    second = np.array([v for _, v in replies])
    w = np.asarray(weights, np.float64)[np.asarray(kept)]
    trace = fsgld.noise_trace_from_moments(w / w.sum(), means, second)
    h = algorithm.step_size if not callable(algorithm.step_size) else float(algorithm.step_size(0))
    return fsgld.auto_trust_radius(flat_model.dim, h, trace)


def _wait_result(transport: Transport, pending, timeout: Optional[float]):
    ready, _ = transport.wait([pending], timeout=timeout)
    if not ready:
        raise ClientFailureError(
            f"client {pending.client} did not answer {pending.method!r} within {timeout} s",
            None, pending.client, "timeout",
        )
    try:
        return transport.result(pending)
    except ClientFailure as failure:
        raise ClientFailureError(
            f"client {failure.client} failed during {pending.method!r} before sampling "
            f"started: {failure.reason}", None, failure.client, failure.reason,
        ) from None


def _result_of(run: HandoffRun, algorithm, flat_model, base_info, transport, burn_in, chains,
               thin, original_weights):
    from ..results import Result

    total = run.draws.shape[1]
    kept = run.draws[:, burn_in:]
    info = dict(base_info)
    draws_done = int(run.draws_done.max()) if len(run.draws_done) else 0
    info.update(
        algorithm=algorithm.name,
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
    if kept.shape[1] < total - burn_in:  # pragma: no cover - defensive
        pass
    stats = {"client": run.clients[:, burn_in:].copy(), "round": run.rounds_at_draw[:, burn_in:].copy()}
    samples = flat_model.unravel_draws(jnp.asarray(kept))
    return Result(samples=samples, info=info, sample_stats=stats, algorithm=algorithm.name)


def sample_on_ray(algorithm, model, federation, *, init, num_samples, burn_in, thin, chains, seed,
           progress=None, **options):
    """DSGLD/FSGLD on Ray, one actor per client (called by their ``sample`` when
    ``engine="ray"``)."""
    from .ray_engine import RayTransport, ray_session
    from .ray_security import record_ray_authentication

    options = check_engine_options(options, algorithm.name)
    resources = options.get("client_resources")
    num_cpus = options.get("client_num_cpus", 0)

    def make_transport(specs):
        return RayTransport(specs, resources=resources, num_cpus=num_cpus)

    with ray_session(options.get("ray_address"), options.get("ray_init_options"),
                     options.get("allow_unauthenticated_cluster", False)):
        return record_ray_authentication(sample_handoff(
            algorithm, model, federation, make_transport,
            init=init, num_samples=num_samples, burn_in=burn_in, thin=thin, chains=chains,
            seed=seed, engine_label="ray",
            visit_timeout=options.get("visit_timeout"),
            on_client_failure=options["on_client_failure"],
            audit_messages=bool(options.get("audit_messages", False)),
            fault_injection=options.get("fault_injection"),
            progress=progress,
        ))
