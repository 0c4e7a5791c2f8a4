"""Fed-PDMC's broadcast-and-gather protocol (Algorithm 2) over a :class:`~.comm.Transport`.

Client side (:class:`PDMPWorker`, one per worker, a Ray actor on the Ray engine):
holds only its own data; computes, on that data alone, the Newton terms the
server asks for (gradient and Hessian of its potential at a point), its rate
bounds, its coordinates and its control-variate gradient; and, at every event
iteration, simulates its own first event time by Poisson thinning
(:func:`fedmcmc.pdmp.federated.build`'s ``propose``, the very function the
in-process engine vmaps) for all chains at once.

Server side (:class:`RemoteWorkers` for the set-up, :class:`BroadcastDraw` for
the sampling): one event iteration broadcasts ``(x, v, cap, alpha_m, scale_m)``
and the worker's key for every chain, gathers every worker's proposal
``(tau_m, kind, channel, gradient at the event, ...)`` and applies the earliest
together with the server's own clocks (``apply_proposals``). Chains advance in
lock-step, one broadcast per event iteration for all chains still short of their
next sample time. Messages are parameter-sized: per chain ``d`` floats and a
few scalars (set-up: ``d x d`` Newton Hessians and rate bounds' whitening).

Random streams: event iteration ``i`` of draw ``k`` of chain ``c`` uses
``fold_in(split(fold_in(key, k), chains)[c], i)`` exactly as the in-process
engine does, and worker ``m`` gets the same sub-key there as here; so the two
engines give the same draws up to float rounding of the per-worker sums (the
tests check this on a Gaussian target).

Client failure: ``on_client_failure="stop"`` raises
:class:`~.comm.ClientFailureError` with every draw made so far;
``"drop"`` continues without the worker (its proposals never win): the target
becomes the posterior given the remaining workers' data (``info`` records it).
"drop" is refused with control variates (the shifts would no longer sum to zero)
and with prior redistribution.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..federation import Federation
from ..progress import progress_bar
from .comm import (ClientEndpoint, ClientFailure, ClientFailureError, Transport,
                   describe_federation, with_fault_injection)

__all__ = ["PDMPWorker", "RemoteWorkers", "BroadcastDraw", "run_remote_chains", "sample_pdmp"]


def _f64(tree):
    return jax.tree_util.tree_map(lambda leaf: jnp.asarray(leaf, jnp.float64), tree)


# ----------------------------------------------------------------------------- client side


class PDMPWorker(ClientEndpoint):
    """One worker of Fed-PDMC: its data, its bounds, its compiled event simulation.

    ``source``: the worker's data or its loader (called here, in the worker's process)."""

    def __init__(self, index: int, source: Any, model, init: Any):
        super().__init__(index, source)
        with jax.enable_x64(True):
            init64 = _f64(init)
            self.flat_model = model.flatten(init64)
            self.padded = Federation([self.data]).padded()  # (1, n_m, ...): its own rows only
            flat_model = self.flat_model
            rows = jax.tree_util.tree_map(lambda leaf: leaf[0], self.padded.data)
            mask = self.padded.mask[0]

            def potential(theta):
                return -flat_model.log_likelihood_sum(theta, rows, mask)

            self._terms = jax.jit(lambda th: (potential(th), jax.grad(potential)(th),
                                              jax.hessian(potential)(th)))
            self._value = jax.jit(potential)
        self._summaries = None
        self._propose = None
        self._gradient = None

    def newton_terms(self, x):
        """``(U_m, grad U_m, Hess U_m)`` of its data potential at ``x`` (one Newton round)."""
        with jax.enable_x64(True):
            u, g, h = self._terms(jnp.asarray(x, jnp.float64))
            return float(u), np.asarray(g), np.asarray(h)

    def newton_value(self, x) -> float:
        with jax.enable_x64(True):
            return float(self._value(jnp.asarray(x, jnp.float64)))

    def summaries(self, options: Dict[str, Any]):
        """Its rate bounds, coordinates and control-variate gradient (``worker_summaries``);
        returns ``(l, lw, coords, g_ref)`` and keeps the elementwise bound ``q`` to itself."""
        from ..pdmp.setup import worker_summaries

        with jax.enable_x64(True):
            q, l, lw, coords, g_ref = worker_summaries(self.flat_model, self.padded, **options)
        self._summaries = (q[0], l[0], lw[0], coords[0], g_ref[0])
        return float(l[0]), float(lw[0]), coords[0], g_ref[0]

    def configure(self, cfg, prior_part, rho: float, cv_weight: float) -> int:
        """Build the compiled proposal of this worker for all chains at once."""
        from ..pdmp import federated

        if self._summaries is None:
            raise RuntimeError("configure() before summaries()")
        q, l, lw, coords, g_ref = self._summaries
        with jax.enable_x64(True):
            worker = federated.Workers(
                data=self.padded.data, mask=jnp.asarray(self.padded.mask, jnp.float64),
                coords=jnp.asarray(coords)[None], q=jnp.asarray(q)[None],
                l=jnp.asarray(l)[None], lw=jnp.asarray(lw)[None],
                rho=jnp.full((1,), rho, jnp.float64), cv_weight=jnp.full((1,), cv_weight),
                g_ref=jnp.asarray(g_ref)[None])
            own = jax.tree_util.tree_map(lambda leaf: leaf[0], worker)
            protocol = federated.build(cfg, worker, prior_part, with_protocol=True)[3]

            def propose(key_data, x, v, cap, alpha, scale):
                key = jax.random.wrap_key_data(key_data)
                return protocol.propose(key, x, v, cap, own, alpha, scale)

            def gradient(x, alpha):
                return protocol.worker_gradient(x, own.data, own.mask, own.g_ref, own.cv_weight,
                                                alpha)

            self._propose = jax.jit(jax.vmap(propose))
            self._gradient = jax.jit(jax.vmap(gradient))
        return self.index

    # -- sampling messages
    def propose(self, key_data, x, v, cap, alpha, scale):
        """Its first event time for every chain (``(chains, ...)`` arrays in, proposals out)."""
        with jax.enable_x64(True):
            out = self._propose(jnp.asarray(key_data), jnp.asarray(x), jnp.asarray(v),
                                jnp.asarray(cap), jnp.asarray(alpha), jnp.asarray(scale))
            return tuple(np.asarray(a) for a in out)

    def gradient(self, x, alpha):
        """Its gradient at every chain's position (the rate diagnostics of a draw)."""
        with jax.enable_x64(True):
            return np.asarray(self._gradient(jnp.asarray(x), jnp.asarray(alpha)))


# ----------------------------------------------------------------------------- server side


def _gather(transport: Transport, pendings, timeout: Optional[float]) -> Dict[int, Any]:
    """Replies by client; a client that fails or does not answer in time raises
    :class:`ClientFailure` (the caller decides between stopping and dropping it)."""
    replies: Dict[int, Any] = {}
    waiting = list(pendings)
    deadline = None if timeout is None else time.perf_counter() + timeout
    while waiting:
        left = None if deadline is None else max(0.0, deadline - time.perf_counter())
        ready, waiting = transport.wait(waiting, timeout=left)
        if not ready:
            raise ClientFailure(waiting[0].client, f"no answer within {timeout:g} s")
        for pending in ready:
            replies[pending.client] = transport.result(pending)
    return replies


class RemoteWorkers:
    """What ``_FedPDMP.build`` asks of the workers, answered by messages (set-up phase).
    A failure here stops the run (nothing has been sampled yet)."""

    data = None
    mask = None

    def __init__(self, transport: Transport, sizes, flat_model, model, timeout: Optional[float]):
        self.transport = transport
        self.sizes = np.asarray(sizes, np.float64)
        self.num_workers = len(self.sizes)
        self.flat_model = flat_model
        self.timeout = timeout
        self.newton_rounds = 0
        self._newton_cache: Dict[bytes, tuple] = {}
        prior = lambda th: -flat_model.log_prior(th)  # noqa: E731
        self._prior_terms = jax.jit(lambda th: (prior(th), jax.grad(prior)(th), jax.hessian(prior)(th)))
        self._prior_value = jax.jit(prior)

    def _all(self, method: str, *args) -> List[Any]:
        pendings = [self.transport.call(m, method, *args) for m in range(self.num_workers)]
        try:
            replies = _gather(self.transport, pendings, self.timeout)
        except ClientFailure as failure:
            raise ClientFailureError(
                f"worker {failure.client} failed during {method!r} before sampling started: "
                f"{failure.reason}", None, failure.client, failure.reason) from None
        return [replies[m] for m in range(self.num_workers)]

    def newton(self, theta0):
        """Federated Newton (``setup.newton``): each round every worker sends the gradient
        and Hessian of its own potential; the server adds the prior's."""
        from ..pdmp.setup import newton

        key = np.asarray(theta0, np.float64).tobytes()
        if key in self._newton_cache:
            return self._newton_cache[key]

        def value_grad_hess(x):
            x = np.asarray(x, np.float64)
            u, g, h = (np.asarray(a, np.float64) for a in self._prior_terms(jnp.asarray(x)))
            for uw, gw, hw in self._all("newton_terms", x):
                u, g, h = u + uw, g + gw, h + hw
            self.newton_rounds += 1
            return u, jnp.asarray(g), jnp.asarray(h)

        def value(x):
            x = np.asarray(x, np.float64)
            return float(self._prior_value(jnp.asarray(x))) + sum(self._all("newton_value", x))

        out = newton(value_grad_hess, value, theta0)
        self._newton_cache[key] = out
        return out

    def summaries(self, **options):
        replies = self._all("summaries", options)
        l = np.array([r[0] for r in replies], np.float64)
        lw = np.array([r[1] for r in replies], np.float64)
        coords = np.stack([np.asarray(r[2], np.float64) for r in replies])
        g_ref = np.stack([np.asarray(r[3], np.float64) for r in replies])
        return None, l, lw, coords, g_ref


class BroadcastDraw:
    """The server's draw step for all chains: ``(draw_keys (C,), states) -> (states, draws,
    stats)``, the same as the in-process engine's vmapped ``draw_step`` but with every
    worker's proposal computed by that worker (one broadcast-and-gather per event
    iteration)."""

    def __init__(self, transport: Transport, cfg, protocol, timeout: Optional[float],
                 on_client_failure: str):
        self.transport = transport
        self.cfg = cfg
        self.timeout = timeout
        self.on_client_failure = on_client_failure
        self.dead: List[int] = []
        self.failures: List[Dict[str, Any]] = []
        self.event_rounds = 0
        p = protocol
        M = cfg.num_workers

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
        replies: Dict[int, Any] = {}
        waiting = list(pendings)
        deadline = None if self.timeout is None else time.perf_counter() + self.timeout
        while waiting:
            left = None if deadline is None else max(0.0, deadline - time.perf_counter())
            ready, waiting = self.transport.wait(waiting, timeout=left)
            failed = []
            if not ready:
                failed = [(p.client, f"no answer to {method!r} within visit_timeout="
                                     f"{self.timeout:g} s") for p in waiting]
                waiting = []
            for pending in ready:
                try:
                    replies[pending.client] = self.transport.result(pending)
                except ClientFailure as failure:
                    failed.append((failure.client, failure.reason))
            for client, reason in failed:
                self._fail(client, reason)
        return replies

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
        cfg = self.cfg
        M = self.num_workers
        states, t_next, counting, events_before = self._begin(states)
        i = 0
        active = np.asarray(states.t < t_next)
        while active.any() and i < cfg.max_iterations_per_draw:
            key_data, caps = self._prepare(draw_keys, i, states, t_next)
            key_data = np.asarray(key_data)  # (C, M, 2)
            caps = np.where(active, np.asarray(caps), 0.0)  # finished chains: nothing to propose
            x, v = np.asarray(states.x), np.asarray(states.v)
            alpha, scale = np.asarray(states.alpha), np.asarray(states.scale)
            replies = self._broadcast(
                "propose", lambda m: (key_data[:, m], x, v, caps, alpha[:, m], scale[:, m]))
            self.event_rounds += 1
            res = self._stack(replies, scale)
            states = self._apply(draw_keys, i, states, res, t_next, counting, jnp.asarray(active))
            i += 1
            active = np.asarray(states.t < t_next)
        rate_values = None
        if cfg.rate_diagnostics:
            x, alpha = np.asarray(states.x), np.asarray(states.alpha)
            grads = self._broadcast("gradient", lambda m: (x, alpha[:, m]))
            g = np.stack([grads[m] if m in grads else np.zeros_like(x) for m in range(M)], axis=1)
            rate_values = self._rates(states, jnp.asarray(g))
        return self._end(states, t_next, counting, events_before, rate_values)

    def _stack(self, replies: Dict[int, Any], scale: np.ndarray):
        """Proposals stacked as the in-process vmap over workers gives them: (C, M, ...).
        A dropped worker proposes nothing (tau = inf)."""
        C = scale.shape[0]
        d = self.cfg.dim
        rows = []
        for m in range(self.num_workers):
            if m in replies:
                rows.append(replies[m])
            else:
                rows.append((np.full(C, np.inf), np.zeros(C, np.int32), np.zeros(C, np.int32),
                             np.zeros((C, d)), scale[:, m], np.zeros(C, np.int32),
                             np.zeros(C, np.int32), np.zeros(C, np.int32), np.zeros(C, bool)))
        return tuple(jnp.asarray(np.stack([row[k] for row in rows], axis=1)) for k in range(9))


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
    import sys

    from .local import ChainRun, default_chunk_size

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


def sample_pdmp(algorithm, model, federation, *, init, num_samples, burn_in, chains, seed,
                progress, skeleton_size, init_jitter, rate_diagnostics, make_transport,
                engine_label: str, options: Dict[str, Any], accumulate=None, initial_sums=None):
    """Fed Zig-Zag / BPS / Boomerang with one endpoint per worker (called by
    ``_FedPDMP.sample`` under ``jax.enable_x64``). ``make_transport(specs)`` builds the
    transport from one ``(PDMPWorker, args)`` per worker. ``accumulate`` / ``initial_sums``:
    the family's per-chain run sums carried next to the state (see ``pdmp/algorithms.py``)."""
    policy = options["on_client_failure"]
    timeout = options.get("visit_timeout")
    if policy == "drop" and (algorithm.control_variates is not False
                             or algorithm.redistribution_rate > 0):
        raise ValueError(
            "on_client_failure='drop' is not available with control_variates or "
            "redistribution_rate > 0 (dropping a worker would bias the remaining ones' "
            "shifted potentials); use on_client_failure='stop'")
    M = federation.num_clients
    sources = federation.client_sources()
    specs = [(PDMPWorker, (m, sources[m], model, init)) for m in range(M)]
    # fault_injection (tests only): the transport makes one worker crash or hang at a proposal
    transport = with_fault_injection(make_transport(specs), options.get("fault_injection"),
                                     "propose")
    try:
        # from_loaders: the workers loaded their rows themselves and report their sizes
        federation = describe_federation(transport, federation, model, init)
        transport.audit = bool(options.get("audit_messages", False))
        setup_started = time.perf_counter()
        init64 = _f64(init)
        flat_model = model.flatten(init64)
        access = RemoteWorkers(transport, federation.sizes, flat_model, model, timeout)
        built = algorithm.build(model, federation, init, burn_in=burn_in, chains=chains,
                                seed=seed, skeleton_size=skeleton_size, init_jitter=init_jitter,
                                rate_diagnostics=rate_diagnostics, workers_access=access,
                                with_protocol=True)
        (cfg, _, fed_states, k_run, out_model, info, on_violation, protocol, prior_part,
         workers) = built
        pendings = [transport.call(m, "configure", cfg, prior_part, float(workers.rho[m]),
                                   float(workers.cv_weight[m])) for m in range(M)]
        try:
            _gather(transport, pendings, None)
            locations = _gather(transport, [transport.call(m, "location") for m in range(M)],
                                None)
        except ClientFailure as failure:
            raise ClientFailureError(
                f"worker {failure.client} failed while being configured: {failure.reason}",
                None, failure.client, failure.reason) from None
        info.update(
            engine=engine_label, on_client_failure=policy, visit_timeout=timeout,
            client_locations=[locations[m] for m in range(M)],
            setup_time=time.perf_counter() - setup_started,
            newton_rounds_messages=access.newton_rounds)
        draw = BroadcastDraw(transport, cfg, protocol, timeout, policy)

        if accumulate is None:
            states = fed_states
            draw_all = draw
            position = lambda s: s.x  # noqa: E731
        else:
            states = (fed_states, initial_sums)
            accumulate_all = jax.jit(jax.vmap(accumulate))

            def draw_all(keys, carry):
                st, sums = carry
                n_before = st.n_draws
                st, draws, stats = draw(keys, st)
                sums = accumulate_all(n_before, sums, draws, stats)
                return (st, sums), draws, stats

            position = lambda s: s[0].x  # noqa: E731
        run_options = {k: options[k] for k in ("chunk_size", "on_chunk", "on_draws") if k in options}
        run, failure = run_remote_chains(
            draw_all, states, k_run, burn_in=burn_in, num_samples=num_samples,
            position=position, divergence_threshold=algorithm.divergence_threshold,
            progress=progress, label=f"{algorithm.name} (ray)" if engine_label == "ray"
            else algorithm.name, **run_options)
        messages = transport.info()
        messages["event_rounds_broadcast"] = draw.event_rounds
        if draw.failures:
            messages["client_failures"] = draw.failures
            messages["dropped_clients"] = list(draw.dead)
            if policy == "drop" and draw.dead:
                messages["target_changed"] = True
                kept = [m for m in range(M) if m not in draw.dead]
                messages["target"] = (
                    f"posterior given the data of workers {kept} only (workers {draw.dead} "
                    "dropped mid-run" + (
                        "; with prior='split' their prior shares are lost too" if
                        algorithm.prior == "split" else "") + ")")
    finally:
        transport.close()
    # ``messages``: the transport's real message and byte counts (they replace the
    # analytic accounting of the in-process engine in ``info``) and the failures.
    return run, failure, (cfg, out_model, info, on_violation, messages)
