"""DULA / GT-DULA with one endpoint per agent (a Ray actor on the Ray engine), neighbour exchange
agent to agent (``engines.neighbour``: the generic endpoint and ``Transport.relay``).

Each agent actor holds its own data and, for every chain at once, its state
(w_i and, for GT-DULA, the tracker d_i and last local gradient g_i). Iteration k
of agent i is the call ``agent_i.step(k, *messages_of_neighbours_at_k)``: the
arguments are Ray object references to the neighbours' outgoing messages of the
previous iteration, which Ray resolves from the object store of the neighbour's
node -- the driver only passes references, it never relays the states. The
reply is agent i's own outgoing message (w_i[, d_i] for all chains). Every
``thin`` iterations the driver reads the agents' messages (a gather) to form the
kept draw, the network average (1/n) sum_i w_i.

Gradient error (``gradient_error=True``, the in-process engine's
``kernels.tracking_error``, section 4.3): ||d - 1 (x) u_bar|| with
u_bar = (1/n) sum_i grad E_i(w_bar) and d_i the tracker (GT-DULA) or the exact
local gradient grad E_i(w_i) (DULA). At a kept draw the driver sends every agent
the draw w_bar (one vector of d floats per chain, the draw it has just formed);
agent i answers with d_i and grad E_i(w_bar), computed on its own full data
(two parameter-sized vectors per chain), and the driver forms u_bar and the
norm. The call is queued behind the kept iteration and ahead of the next one
(an actor runs one caller's calls in order) and its reply is read with the next
gather, so it does not add a round trip. These messages go through the
transport's counters (``messages_to_clients``, ``bytes_to_clients``,
``messages_from_clients``, ``bytes_from_clients``; ``audit_messages``).

The update of agent i is row i of the in-process kernels, through the same equation
functions (``kernels.consensus_langevin_step``, ``kernels.tracker_step``):
``w_i <- w_i - beta (L w)_i - alpha n g_i + sqrt(2 alpha n) v_i`` (DULA, eq. (3))
and, for GT-DULA, eq. (7)-(8) with the trackers. The random streams are the
in-process engine's (noise: row i of the (n, d) normal draw of that iteration's
key; minibatch: the i-th of the n keys split from it), so the draws equal
``engine="local"``'s up to float rounding.

Not here (yet): client failures other than stopping with an error.
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..diagnostics import bias_estimate
from .. import rng
from ..cache import jit_with_constants_as_arguments
from ..engines.comm import gather as comm_gather
from ..engines.driver import ChainRun
from ..engines.local import iteration_key
from ..engines.neighbour import NeighbourClient
from ..engines.session import protocol_session
from ..minibatch import likelihood_gradient, take_minibatch
from ..model import unravel_draws_numpy
from ..protocols import ClientContext, NeighbourProtocol
from .. import messages as message_counts
from ..results import finish_run
from ..schedules import decaying_schedule
from . import kernels

__all__ = ["AgentFunctions", "NeighbourRun", "run_neighbour", "sample_decentralised"]


class NeighbourRun(NamedTuple):
    """What :func:`run_neighbour` returns: the result, and the driver's run."""

    result: Any  # fedmcmc.results.Result
    run: ChainRun


class _Agent:
    """Agent i of DULA/GT-DULA in its own process: its data, its state for every chain, its
    row of the Laplacian (kept in the endpoint's ``context.store``)."""

    def __init__(self, context: ClientContext, spec: Dict[str, Any]):
        self.index, self.size = context.index, context.size
        self.spec = dict(spec)
        init = context.init
        flat = self.flat_model = context.flat_model
        self.data = context.data.data  # its rows, on the device
        n, chains, dim = spec["n"], spec["chains"], flat.dim
        self.schedule = decaying_schedule(spec["step_size"], spec["decay_every"], spec["decay_factor"])
        self.neighbours: List[int] = list(spec["neighbours"])
        self.own_coefficient = float(spec["laplacian_row"][self.index])
        self.neighbour_coefficients = np.asarray(
            [spec["laplacian_row"][j] for j in self.neighbours], np.float32
        )
        root = jax.random.key(spec["seed"])
        batch_size = spec["batch_size"]
        i = self.index

        def full_gradient(theta):
            """Row i of ``kernels.full_gradient_fn``: -grad log p(X_i|w) - grad log p(w)/n."""
            return -flat.grad_log_likelihood_sum(theta, self.data) - flat.grad_log_prior(theta) / n

        def gradient(key, theta):
            """Row i of ``kernels.local_gradient_fn``: -(M_i/min(m, M_i)) grad log p(X_hat_i|w) - grad log p(w)/n."""
            if batch_size is None:
                return full_gradient(theta)
            agent_key = rng.split_key(key, n)[i]
            u = rng.uniform(agent_key, (batch_size,))
            # the library's one minibatch rule (batch_size an upper bound: fedmcmc.minibatch)
            batch = take_minibatch(u, self.data, 0, jnp.int32(self.size),
                                   may_be_smaller=self.size < batch_size)
            return -likelihood_gradient(flat, theta, batch) - flat.grad_log_prior(theta) / n

        tracking, noise = spec["tracking"], spec["noise"]
        beta, gamma = spec["beta"], spec.get("gamma")
        own = self.own_coefficient
        thin = spec["thin"]

        def mix(x, neighbours_x, coefficient, weights):
            # (W x)_i = x_i - coefficient (L_ii x_i + sum_j L_ij x_j)
            lx = own * x + jnp.tensordot(weights, neighbours_x, axes=1) if neighbours_x.shape[0] else own * x
            return x - coefficient * lx

        def one_chain(chain, k, w, d, g, neighbours_w, neighbours_d, weights):
            key = iteration_key(root, chains, thin, chain, k)
            key_grad, key_noise = rng.split_key(key)
            alpha = jnp.asarray(self.schedule(k), w.dtype)
            drift = d if tracking else gradient(key_grad, w)
            # row i of the (n, d) normal draw the in-process kernel makes for this key
            v = rng.normal(key_noise, (n, dim), w.dtype)[i] if noise else None
            new_w = kernels.consensus_langevin_step(mix(w, neighbours_w, beta, weights), drift,
                                                    alpha, n, v)
            if tracking:
                new_g = gradient(key_grad, new_w)
                new_d = kernels.tracker_step(mix(d, neighbours_d, gamma, weights), new_g, g)
                return new_w, new_d, new_g
            return new_w, d, g

        # the run's key and the agent's rows are arguments of its programs, not constants:
        # another seed or other rows of the same shapes, the same programs
        @jit_with_constants_as_arguments
        def step(k, w, d, g, neighbours_w, neighbours_d, weights):
            # neighbours_*: (num_neighbours, chains, dim) -> per chain (num_neighbours, dim)
            return jax.vmap(one_chain, in_axes=(0, None, 0, 0, 0, 1, 1, None))(
                jnp.arange(chains), k, w, d, g, neighbours_w, neighbours_d, weights
            )

        @jit_with_constants_as_arguments
        def gradient_terms(w, d, w_bar):
            # this agent's part of kernels.tracking_error, per chain: its direction (the
            # tracker d_i, or DULA's exact local gradient grad E_i(w_i)) and grad E_i(w_bar)
            direction = d if tracking else jax.vmap(full_gradient)(w)
            return direction, jax.vmap(full_gradient)(w_bar)

        self._step = step
        self._gradient_terms = gradient_terms
        theta0 = flat.ravel(init)
        self.w = jnp.broadcast_to(theta0, (chains, dim))
        if tracking:
            init_keys = jax.random.split(jax.random.fold_in(root, 2**20), chains)
            self.g = jax.vmap(lambda key: gradient(key, theta0))(init_keys)
            self.d = self.g
        else:
            self.g = self.d = jnp.zeros((chains, dim), theta0.dtype)

    def message(self):
        """The outgoing message: w_i (and d_i for GT-DULA), for every chain."""
        if self.spec["tracking"]:
            return np.asarray(self.w), np.asarray(self.d)
        return np.asarray(self.w), None

    def step(self, k: int, *neighbour_messages):
        """Iteration k with the neighbours' messages of iteration k; returns the new message."""
        chains, dim = self.w.shape
        if neighbour_messages:
            nw = np.stack([m[0] for m in neighbour_messages])
            nd = np.stack([m[1] for m in neighbour_messages]) if self.spec["tracking"] else nw
        else:
            nw = nd = np.zeros((0, chains, dim), np.float32)
        self.w, self.d, self.g = self._step(
            np.int32(k), self.w, self.d, self.g, nw, nd, self.neighbour_coefficients
        )
        return self.message()

    def gradient_terms(self, w_bar):
        """For the gradient error at a kept draw: ``(d_i, grad E_i(w_bar))``, each ``(chains, d)``.

        ``w_bar``: the kept draw (network average) of every chain, ``(chains, d)``.
        """
        w_bar = jnp.asarray(w_bar, self.w.dtype)
        direction, at_average = self._gradient_terms(self.w, self.d, w_bar)
        return np.asarray(direction), np.asarray(at_average)


class AgentFunctions(NeighbourProtocol):
    """DULA/GT-DULA's client-side functions (``client_<name>(context, *args)``), run by the
    engine's generic endpoint (``engines.neighbour.NeighbourClient``) in the agent's process.
    ``spec``: the run's settings (beta, gamma, step size, batch, noise) and, per agent, its
    neighbours and Laplacian row (``client_start``)."""

    name = "DULA/GT-DULA"

    def __init__(self, spec: Dict[str, Any]):
        self.spec = dict(spec)

    def client_start(self, context: ClientContext, neighbours, laplacian_row) -> int:
        context.store["agent"] = _Agent(
            context, dict(self.spec, neighbours=list(neighbours),
                          laplacian_row=list(laplacian_row)))
        return context.index

    def client_message(self, context):
        return context.store["agent"].message()

    def client_step(self, context, k: int, *neighbour_messages):
        return context.store["agent"].step(k, *neighbour_messages)

    def client_gradient_terms(self, context, w_bar):
        return context.store["agent"].gradient_terms(w_bar)


def sample_decentralised(algorithm, model, federation, engine, *, init, num_samples, burn_in,
                         thin, chains, seed, progress=None, family_info=None,
                         divergence_error=None, **options):
    """DULA/GT-DULA with the agents as endpoints of the message-passing ``engine`` (on Ray,
    actors): :func:`run_neighbour` with the run's checked options; ``options``: the run
    options (``chunk_size``, ``on_draws``). Returns the :class:`NeighbourRun`."""
    return run_neighbour(algorithm, model, federation, engine,
                         engine.session_options(options, algorithm.name), init=init,
                         num_samples=num_samples, burn_in=burn_in, thin=thin, chains=chains,
                         seed=seed, progress=progress, family_info=family_info,
                         divergence_error=divergence_error)


def run_neighbour(algorithm, model, federation, engine, options: Dict[str, Any], *, init,
                  num_samples, burn_in, thin, chains, seed, progress=None, family_info=None,
                  divergence_error=None):
    """DULA/GT-DULA with one endpoint per agent in a :func:`~fedmcmc.engines.session.
    protocol_session` of ``engine``: every iteration each agent steps with its neighbours'
    messages of that iteration, relayed agent to agent (``Transport.relay``: on Ray the
    driver never sees them); the driver reads every agent's state once per kept draw.
    ``options``: the run's checked engine options (``engine.session_options``). The run ends
    in :func:`fedmcmc.results.finish_run`, with ``family_info`` (the family's figures: its
    settings, predictions, run lengths) over the run's, and the family's
    ``divergence_error(result, run)`` of stopped chains."""
    if options["on_client_failure"] != "stop":
        # an agent's neighbours mix with its state every iteration: leaving it out changes the
        # graph (and may disconnect it), so there is no run to continue
        raise ValueError(
            f"on_client_failure={options['on_client_failure']!r} is not available for "
            f"{algorithm.name} on engine={engine.label!r} (dropping an agent changes the "
            "graph); use 'stop'")
    n = federation.num_clients
    topo = algorithm.topology(n)
    flat_model = model.flatten(init)
    dim = flat_model.dim
    laplacian = np.asarray(topo.laplacian, np.float64)
    tracking = bool(algorithm.tracking)
    base = {
        "n": n, "chains": int(chains), "thin": int(thin), "seed": int(seed),
        "beta": float(algorithm.beta), "gamma": algorithm.fixed_gamma(), "tracking": tracking,
        "batch_size": algorithm.batch_size, "noise": algorithm.noise,
        "step_size": algorithm.step_size, "decay_every": algorithm.decay_every,
        "decay_factor": algorithm.decay_factor,
    }
    neighbours = [[j for j in range(n) if j != i and laplacian[i, j] != 0] for i in range(n)]
    sources = federation.client_sources()
    functions = AgentFunctions(base)
    specs = [(NeighbourClient, (i, sources[i], model, init, functions, n, seed,
                                (neighbours[i], laplacian[i].tolist()))) for i in range(n)]
    total = burn_in + num_samples
    floats_per_message = chains * dim * (2 if tracking else 1)
    track = bool(algorithm.gradient_error)
    timeout = options.get("visit_timeout")
    with protocol_session(engine, specs, federation, model, init, name=algorithm.name,
                          options=options, fault_point="step") as session:
        # from_loaders: the agents loaded their rows themselves and report their sizes
        federation, transport = session.federation, session.transport
        agents = np.full((chains, total, n, dim), np.nan, np.float32)
        gradient_error = np.full((chains, total), np.nan, np.float32) if track else None
        global_gradient = np.full((chains, total, dim), np.nan) if track else None
        # the spread check of fm.DULA/GTDULA (a consensus error past spread_limit x the Laplace
        # total variance after burn-in stops the run, as on engine="local"); None when off
        spread_limit = getattr(algorithm, "spread_limit_value", None)

        def gather(pendings):
            """The replies of ``pendings`` in order (each read and counted once); a failure
            reaches the driver as ClientFailure."""
            return comm_gather(transport, pendings, timeout)

        def record_gradient_terms(index, replies):
            # replies[i] = (d_i, grad E_i(w_bar)) of agent i, each (chains, dim)
            directions = np.stack([r[0] for r in replies], axis=1).astype(np.float64)
            u_bar = np.mean([r[1] for r in replies], axis=0, dtype=np.float64)  # (chains, dim)
            gradient_error[:, index] = np.sqrt(
                np.sum((directions - u_bar[:, None, :]) ** 2, axis=(1, 2)))
            # sum_i grad E_i(w_bar): the network average's bias estimate (info["bias_estimate"])
            global_gradient[:, index] = n * u_bar

        exchange = {"refs": None, "pending": None}  # last messages; gradient terms not read yet

        def one_draw(index: int):
            """``thin`` iterations of every agent, then the draw: the network average."""
            refs = exchange["refs"]
            for j in range(thin):
                k = index * thin + j
                refs = [transport.relay(i, "step", k, *[refs[a] for a in neighbours[i]])
                        for i in range(n)]
            exchange["refs"] = refs
            pending = exchange["pending"]
            if pending is None:
                messages = gather(refs)
            else:
                replies = gather(refs + pending[1])
                messages = replies[:n]
                record_gradient_terms(pending[0], replies[n:])
                exchange["pending"] = None
            w = np.stack([m[0] for m in messages], axis=1)  # (chains, n, dim)
            w_bar = w.mean(axis=1)
            agents[:, index] = w
            consensus = (np.sum((w - w_bar[:, None]) ** 2, axis=(1, 2)) / n).astype(np.float32)
            draw = w_bar.copy()
            if spread_limit is not None and index >= burn_in:
                draw[consensus > spread_limit] = np.nan  # the spread check stops these chains
            if track and index >= burn_in and np.all(np.isfinite(draw)):
                # queued after this draw's iterations and before the next one's: read with
                # the next gather
                exchange["pending"] = (index, [transport.call(i, "setup", "gradient_terms", w_bar)
                                               for i in range(n)])
            return draw, consensus

        def advance(states, first_draw, count):
            rows = [one_draw(index) for index in range(first_draw, first_draw + count)]
            return states, np.stack([r[0] for r in rows]), {
                "consensus_error": np.stack([r[1] for r in rows])}

        exchange["refs"] = [transport.relay(i, "message") for i in range(n)]
        # the draws are the network average, what on_draws gets in-process too
        run = session.drive(advance, None, chains=chains, draw_dim=dim, burn_in=burn_in,
                            num_samples=num_samples, draws_per_call=1,
                            divergence_threshold=algorithm.divergence_threshold,
                            progress=progress, iterations_per_draw=thin)
        if exchange["pending"] is not None and run.failure is None:
            record_gradient_terms(exchange["pending"][0], gather(exchange["pending"][1]))
        figures = session.figures()
    result = _result(algorithm, flat_model, run, agents, gradient_error, burn_in, thin,
                     topo, neighbours, floats_per_message, figures, engine.label, family_info,
                     None if divergence_error is None else (
                         lambda result: divergence_error(result, run)))
    done = run.draws_done
    if global_gradient is not None and done > burn_in:  # finish_run: no chain diverged
        estimate = bias_estimate(np.asarray(run.draws, np.float64),
                                 global_gradient[:, burn_in:done],
                                 getattr(algorithm, "laplace_cov", None))
        if estimate is not None:
            result.info["bias_estimate"] = estimate
    return NeighbourRun(result, run)


def _result(algorithm, flat_model, run, agents, gradient_error, burn_in, thin, topo,
            neighbours, floats_per_message, figures, label, family_info, divergence_error):
    """The run's result or its error (:func:`fedmcmc.results.finish_run`); ``figures``: the
    session's (the transport's counts of the driver's messages, the engine, where the agents
    ran); ``family_info``: the family's figures, over these."""
    iterations = run.draws_done * thin
    directed = sum(len(nb) for nb in neighbours)
    between = iterations * directed
    # the driver's messages (the transport's counts): the gathers of the kept draws (every
    # agent's w_i[, d_i] every thin iterations) and, with gradient_error, w_bar to every agent
    # and (d_i, grad E_i(w_bar)) back; the agents' messages to each other are relayed, so
    # counted here: one per directed edge and iteration (all chains' w_j[, d_j]), actor to actor
    info = dict(figures)
    info.update({
        "beta": algorithm.beta,
        "rounds": iterations,
        "messages_between_agents": int(between),
        "bytes_between_agents": int(between * floats_per_message * 4),
        # the pattern's count, as engine="local" makes it: one message per chain
        **message_counts.figures(message_counts.neighbour_exchange(iterations, directed,
                                                                  run.diverged.shape[0])),
        # what was really sent: the driver's messages and the relayed ones
        "transport_messages": int(between + figures["transport_messages"]),
        "floats_communicated": int(between * floats_per_message
                                   + figures["floats_communicated"]),
    })
    info.update(topo.describe())
    gamma = algorithm.fixed_gamma()
    if gamma is not None:
        info["gamma"] = gamma
    kept = slice(burn_in, run.draws_done)
    if algorithm.keep_agent_samples:
        info["agent_samples"] = unravel_draws_numpy(flat_model, agents[:, kept])
    stats = dict(run.stats)
    if gradient_error is not None:
        stats["gradient_error"] = gradient_error[:, kept]
    if family_info:
        info.update(family_info)
    return finish_run(run, name=algorithm.name, info=info, dim=flat_model.dim, thin=thin,
                      sample_stats=stats, label=label, role="agent",
                      divergence_error=divergence_error,
                      unravel=lambda draws: unravel_draws_numpy(flat_model, draws))
