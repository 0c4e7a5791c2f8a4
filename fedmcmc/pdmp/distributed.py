"""Fed-PDMC with one endpoint per worker: its client-side functions and its server.

The engine provides the pattern's pieces, none of which knows Fed-PDMC: a generic client
endpoint that holds a worker's data and runs the functions below on it
(``fedmcmc.engines.broadcast``), the protocol session (``fedmcmc.engines.session``) and
the driver. This module and ``pdmp/broadcast.py`` (the server's broadcast-and-gather
rounds with their failure policy, :class:`~fedmcmc.pdmp.broadcast.BroadcastDraw`) are
what Fed-PDMC adds to them:

* **client side** (:class:`WorkerFunctions`, a :class:`~fedmcmc.protocols.BroadcastProtocol`
  run in the worker's process on its own
  rows): the Newton terms of its potential at a point (gradient and Hessian, for the
  Boomerang's Laplace reference and the control variates), its rate bounds,
  coordinates and control-variate gradient (``setup.worker_summaries``), and at every
  event iteration its own first event time by Poisson thinning for all chains at once
  (``federated.build``'s ``propose``, the very function the in-process engine vmaps);
* **server side** (:class:`RemoteWorkers` for the set-up, :func:`sample_pdmp` for
  the run): the same set-up as in-process (``setup.build_sampler``), with the workers' answers
  arriving as messages.

Random streams are the in-process engine's, so both give the same draws (the tests
compare them on the in-process transport and on Ray).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..cache import jit_with_constants_as_arguments
from ..federation import Federation
from ..protocols import BroadcastProtocol, ClientContext
from ..engines.broadcast import BroadcastClient
from ..engines.comm import ClientFailure
from ..engines.session import protocol_session
from . import federated
from .broadcast import BroadcastDraw
from .setup import newton, potential_programs, worker_summaries

__all__ = ["WorkerFunctions", "RemoteWorkers", "DistributedRun", "sample_pdmp"]


class DistributedRun(NamedTuple):
    """What :func:`sample_pdmp` returns."""

    run: Any  # engines.local.ChainRun: the draws made, per chain
    failure: Any  # the ClientFailure that stopped the run, or None
    built: Any  # setup.BuiltSampler (config, output model, info, ...)
    messages: Dict[str, Any]  # the transport's message counts and the failures, for info


def _float64(tree):
    return jax.tree_util.tree_map(lambda leaf: jnp.asarray(leaf, jnp.float64), tree)


class _WorkerState:
    """What a worker keeps between calls (in ``context.store``): its float64 model, its rows
    in the padded layout, its compiled potential terms, and once configured its proposal."""

    def __init__(self, context: ClientContext):
        with jax.enable_x64(True):
            self.flat_model = context.model.flatten(_float64(context.init))
            self.padded = Federation([context.raw_data]).padded()  # (1, n_m, ...): its rows only
            flat_model = self.flat_model
            rows = jax.tree_util.tree_map(lambda leaf: leaf[0], self.padded.data)
            mask = self.padded.mask[0]

            def potential(theta):
                return -flat_model.log_likelihood_sum(theta, rows, mask)

            self.terms, self.value = potential_programs(potential)
        self.summaries = None
        self.propose = None
        self.gradient = None


class WorkerFunctions(BroadcastProtocol):
    """Fed-PDMC's client-side functions (``client_<name>(context, *args)``), run by the
    engine's generic endpoint in the worker's process. Stateless itself (it is pickled to
    every worker); a worker's state lives in its ``context.store``."""

    name = "Fed-PDMC"

    @staticmethod
    def _state(context: ClientContext) -> _WorkerState:
        if "pdmp" not in context.store:
            context.store["pdmp"] = _WorkerState(context)
        return context.store["pdmp"]

    def client_newton_terms(self, context, x):
        """``(U_m, grad U_m, Hess U_m)`` of its data potential at ``x`` (one Newton round)."""
        state = self._state(context)
        with jax.enable_x64(True):
            u, g, h = state.terms(jnp.asarray(x, jnp.float64))
            return float(u), np.asarray(g), np.asarray(h)

    def client_newton_value(self, context, x) -> float:
        state = self._state(context)
        with jax.enable_x64(True):
            return float(state.value(jnp.asarray(x, jnp.float64)))

    def client_summaries(self, context, options: Dict[str, Any]):
        """Its rate bounds, coordinates and control-variate gradient (``worker_summaries``);
        returns ``(l, lw, coords, g_ref)`` and keeps the elementwise bound ``q`` to itself."""
        state = self._state(context)
        with jax.enable_x64(True):
            q, l, lw, coords, g_ref = worker_summaries(state.flat_model, state.padded, **options)
        state.summaries = (q[0], l[0], lw[0], coords[0], g_ref[0])
        return float(l[0]), float(lw[0]), coords[0], g_ref[0]

    def client_configure(self, context, cfg, prior_part, rho: float, cv_weight: float) -> int:
        """Build the compiled proposal of this worker for all chains at once."""
        state = self._state(context)
        if state.summaries is None:
            raise RuntimeError("configure before summaries")
        q, l, lw, coords, g_ref = state.summaries
        padded = state.padded
        with jax.enable_x64(True):
            worker = federated.Workers(
                data=padded.data, mask=jnp.asarray(padded.mask, jnp.float64),
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

            # the worker's rows, bounds and shares are arguments of these programs, not
            # constants: another seed or other rows of the same shapes, the same programs
            state.propose = jit_with_constants_as_arguments(jax.vmap(propose))
            state.gradient = jit_with_constants_as_arguments(jax.vmap(gradient))
        return context.index

    def client_respond(self, context, key_data, x, v, cap, alpha, scale, with_gradient=False):
        """Its first event time for every chain (``(chains, ...)`` arrays in, the fields of
        its :class:`~fedmcmc.pdmp.federated.WorkerProposal` out); with ``with_gradient``,
        also its gradient at every chain's ``x`` (the rate diagnostics of the draws that
        ended there)."""
        state = self._state(context)
        with jax.enable_x64(True):
            # NumPy arguments go straight to the compiled call (an eager jnp.asarray each
            # would cost about as much as the call itself, every event round)
            out = tuple(np.asarray(a) for a in state.propose(key_data, x, v, cap, alpha, scale))
            if with_gradient:
                out += (np.asarray(state.gradient(x, alpha)),)
            return out

    def client_gradient(self, context, x, alpha):
        """Its gradient at every chain's position (the rate diagnostics of a draw)."""
        state = self._state(context)
        with jax.enable_x64(True):
            return np.asarray(state.gradient(x, alpha))


class RemoteWorkers:
    """What ``setup.build_sampler`` asks of the workers, answered by messages (set-up phase).

    ``ask(name, *args)`` runs the client-side function ``client_<name>`` on every worker
    and returns the replies in order; a failure there stops the run (nothing has been
    sampled yet)."""

    data = None
    mask = None

    def __init__(self, ask: Callable[..., List[Any]], sizes, flat_model, drops_workers=False):
        self.ask = ask
        #: the run drops failed workers (on_client_failure="drop"): control_variates="auto"
        #: stays off (setup.resolve_control_variates)
        self.drops_workers = bool(drops_workers)
        self.sizes = np.asarray(sizes, np.float64)
        self.num_workers = len(self.sizes)
        self.flat_model = flat_model
        self.newton_rounds = 0
        self._newton_cache: Dict[bytes, tuple] = {}
        self._prior_terms, self._prior_value = potential_programs(
            lambda th: -flat_model.log_prior(th))

    def newton(self, theta0):
        """Federated Newton (``setup.newton``): each round every worker sends the gradient
        and Hessian of its own potential; the server adds the prior's."""
        key = np.asarray(theta0, np.float64).tobytes()
        if key in self._newton_cache:
            return self._newton_cache[key]

        def value_grad_hess(x):
            x = np.asarray(x, np.float64)
            u, g, h = (np.asarray(a, np.float64) for a in self._prior_terms(jnp.asarray(x)))
            for uw, gw, hw in self.ask("newton_terms", x):
                u, g, h = u + uw, g + gw, h + hw
            self.newton_rounds += 1
            return u, jnp.asarray(g), jnp.asarray(h)

        def value(x):
            x = np.asarray(x, np.float64)
            return float(self._prior_value(jnp.asarray(x))) + sum(self.ask("newton_value", x))

        out = newton(value_grad_hess, value, theta0)
        self._newton_cache[key] = out
        return out

    def worker_terms(self, theta):
        """Every worker's data-potential gradient and Hessian at ``theta`` (one Newton round
        of messages), for the relaxation-time prediction."""
        replies = self.ask("newton_terms", np.asarray(theta, np.float64))
        self.newton_rounds += 1
        return (np.stack([np.asarray(r[1], np.float64) for r in replies]),
                np.stack([np.asarray(r[2], np.float64) for r in replies]))

    def summaries(self, **options):
        replies = self.ask("summaries", options)
        l = np.array([r[0] for r in replies], np.float64)
        lw = np.array([r[1] for r in replies], np.float64)
        coords = np.stack([np.asarray(r[2], np.float64) for r in replies])
        g_ref = np.stack([np.asarray(r[3], np.float64) for r in replies])
        return None, l, lw, coords, g_ref


def sample_pdmp(algorithm, model, federation, engine, options: Dict[str, Any], *, init,
                num_samples, burn_in, chains, seed, progress, skeleton_size, init_jitter,
                rate_diagnostics, run_sums=None, run_request=None):
    """Fed Zig-Zag / BPS / Boomerang with one endpoint per worker (one
    ``(BroadcastClient, args)`` per worker) in a :func:`~fedmcmc.engines.session.
    protocol_session` of the message-passing ``engine`` (called by
    ``_FedPDMP.sample_distributed`` under ``jax.enable_x64``); ``options``: the run's checked
    engine options. ``run_sums(burn_in) -> (accumulate, initial_sums)``: the family's
    per-chain run sums carried next to the state (``output.run_sums``), made once the
    set-up has resolved ``burn_in``. ``run_request``: fm.sample's
    :class:`~fedmcmc.run_length.RunRequest` (``"auto"`` run lengths, resolved by ``build``
    from the workers' Newton terms, as in process)."""
    policy = options["on_client_failure"]
    # control_variates="auto" is turned off under "drop" (setup.resolve_control_variates)
    cv_given = not (algorithm.control_variates is False
                    or (isinstance(algorithm.control_variates, str)
                        and algorithm.control_variates == "auto"))
    if policy == "drop" and (cv_given or algorithm.redistribution_rate > 0):
        raise ValueError(
            "on_client_failure='drop' is not available with control_variates or "
            "redistribution_rate > 0 (dropping a worker would bias the remaining ones' "
            "shifted potentials); use on_client_failure='stop'")
    M = federation.num_clients
    sources = federation.client_sources()
    functions = WorkerFunctions()
    specs = [(BroadcastClient, (m, sources[m], model, init, functions, M, seed))
             for m in range(M)]
    # fault_injection (tests only): the transport makes one worker crash or hang at a proposal
    with protocol_session(engine, specs, federation, model, init, name=algorithm.name,
                          options=options, fault_point="respond") as session:
        # from_loaders: the workers loaded their rows themselves and report their sizes
        federation = session.federation
        flat_model = model.flatten(_float64(init))
        access = RemoteWorkers(session.ask, federation.sizes, flat_model,
                               drops_workers=policy == "drop")
        built = algorithm.build(model, federation, init, burn_in=burn_in, chains=chains,
                                seed=seed, skeleton_size=skeleton_size, init_jitter=init_jitter,
                                rate_diagnostics=rate_diagnostics, workers_access=access,
                                with_protocol=True, num_samples=num_samples,
                                run_request=run_request)
        cfg, fed_states, k_run, info = (built.config, built.initial_states, built.key,
                                        built.info)
        protocol, prior_part, workers = built.protocol, built.prior_part, built.workers
        session.phase("prepare")
        session.configure(lambda m: (cfg, prior_part, float(workers.rho[m]),
                                     float(workers.cv_weight[m])))
        session.phase("configure")
        session.ready()
        info["newton_rounds_messages"] = access.newton_rounds
        draw = BroadcastDraw(session.transport, cfg.num_workers, cfg.max_iterations_per_draw,
                             cfg.rate_diagnostics, protocol, session.timeout, policy, k_run,
                             chains, algorithm.divergence_threshold)

        burn_in = cfg.burn_in  # resolved ("auto")
        if run_sums is None:
            states = fed_states
            advance = draw.advance
        else:
            accumulate, initial_sums = run_sums(burn_in)
            states = (fed_states, initial_sums)
            advance = _with_run_sums(draw.advance, accumulate)
        dim = int(np.shape(fed_states.x)[-1])
        run = session.drive(
            advance, states, chains=chains,
            draw_dim=2 * dim,  # a draw: the position and the mean over its interval
            burn_in=burn_in, num_samples=num_samples,
            divergence_threshold=algorithm.divergence_threshold, progress=progress)
        failure = run.failure
        # the transport's real message and byte counts (``transport_messages``; the event
        # rounds' ``messages`` are counted as in-process), the session's figures, the failures
        messages = session.figures()
        messages["event_rounds_broadcast"] = draw.event_rounds
        messages["gradient_rounds_broadcast"] = draw.gradient_rounds
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
    return DistributedRun(run=run, failure=failure, built=built, messages=messages)


def _with_run_sums(advance, accumulate):
    """``advance`` carrying the family's per-chain run sums next to the states: ``accumulate(
    n_draws_before, sums, draw, stats)`` of one chain is applied to each draw an ``advance``
    call made, in order (and to the draws made before a worker failure or Ctrl-C stopped
    it)."""

    @jax.jit
    def add_rows(n_before, sums, draws, stats, made):
        def one_row(sums, row):
            index, draw, row_stats = row
            new = jax.vmap(accumulate)(n_before + index, sums, draw, row_stats)
            keep = index < made  # (C,): rows past a chain's failure are not draws
            return federated.select_lanes(keep, new, sums), None

        rows = jnp.arange(draws.shape[0], dtype=n_before.dtype)
        return jax.lax.scan(one_row, sums, (rows, draws, stats))[0]

    def advance_with_sums(carry, first_draw, count):
        st, sums = carry
        n_before = st.n_draws
        try:
            st, draws, stats = advance(st, first_draw, count)
        except (ClientFailure, KeyboardInterrupt) as stop:
            partial = getattr(stop, "partial", None)
            if partial is not None:
                sums = add_rows(n_before, sums, partial.draws, partial.stats,
                                np.asarray(partial.made, np.int32))
                stop.partial = partial._replace(states=(partial.states, sums))
            raise
        made = np.full(np.shape(n_before), count, np.int32)
        return (st, add_rows(n_before, sums, draws, stats, made)), draws, stats

    return advance_with_sums
