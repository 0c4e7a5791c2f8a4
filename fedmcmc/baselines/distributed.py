"""FA-LD, QLSD and consensus Monte Carlo with one endpoint per client (a Ray actor on
``engine="ray"``): their client-side functions and their servers.

The engine's pieces, none of which knows these algorithms: the generic broadcast client
endpoint (:class:`~fedmcmc.engines.broadcast.BroadcastClient`, which loads the client's
rows in its own process -- ``Federation.from_loaders`` -- and runs the ``client_<name>``
functions below on them), the gather with its timeout (:func:`~fedmcmc.engines.comm.gather`),
the one run driver (:func:`~fedmcmc.engines.driver.drive`) and the result assembly
(:func:`~fedmcmc.results.assemble_result`). This module adds, per algorithm, what a client
computes on its own rows and what the server does with the replies:

* **FA-LD / VR-FALD*** (every-client rounds with averaging, :class:`FALDFunctions`,
  :func:`sample_fald`): at the start of a round the server averages the participants'
  chains (``fald.start_round``), draws the round's participants (``fald.round_participants``)
  and sends each participant the shared state; the client runs its local Langevin steps
  (``fald.local_direction``, ``fald.local_move``) on its own minibatches until the round
  ends or a draw is due, and sends its chain back.
* **QLSD / QLSD++** (:class:`QLSDFunctions`, :func:`sample_qlsd`): every iteration the server
  broadcasts theta, each client replies with its quantised stochastic gradient
  (``qlsd.client_gradient`` / ``qlsd.controlled_gradient``, ``qlsd.quantize``; QLSD++'s
  reference gradient and memory stay on the client, the server mirrors the memory), the
  server sums and steps (``qlsd.langevin_move``).
* **Consensus Monte Carlo** (one-shot, :class:`ConsensusFunctions`, :func:`sample_consensus`):
  each client warms up NUTS on its subposterior (``consensus.build_chains_warmup``) and
  samples it (``consensus.build_client_transition``); the draws go up chunk by chunk (so
  that a failure keeps what was made) and the server combines them once
  (``consensus.combine``).

Random streams are the in-process engine's: the server sends each client the keys of the
iterations it runs, and a client takes its own row of the numbers the in-process kernel
draws for all clients at once (its row of the ``(S, m)`` minibatch uniforms, of the
``(S, d)`` noise, of the ``(S, d)`` quantisation uniforms; client s's NUTS key
``split(key, S)[s]``) and pads its rows to the largest client's size as
``Federation.padded`` does. The draws therefore equal ``engine="local"``'s (the tests
compare them on the in-process transport and on Ray).

Client failures: ``on_client_failure="stop"`` (the only policy): the run stops and
:class:`~fedmcmc.engines.comm.ClientFailureError` carries every draw made before (for
consensus MC, the combination of the clients' draws received). VR-FALD* needs
``reference_point`` on this engine (the in-process engine's L-BFGS search for theta* runs
on the pooled data).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, List, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import messages as message_counts
from .. import rng
from ..cache import jit_with_constants_as_arguments
from ..engines.broadcast import BroadcastClient
from ..engines.comm import gather
from ..engines.driver import ChainRun, default_chunk_size, draw_by_draw, drive
from ..engines.options import protocol_run_options
from ..engines.session import protocol_session
from ..protocols import BroadcastProtocol, ClientContext
from . import consensus, fald, qlsd, tuning
from .common import batch_likelihood_gradients, client_likelihood_gradients, client_rows

__all__ = ["FALDFunctions", "QLSDFunctions", "ConsensusFunctions", "BaselineRun",
           "sample_fald", "sample_qlsd", "sample_consensus"]


class BaselineRun(NamedTuple):
    """What the ``sample_*`` functions return: the driver's run, the figures for
    ``Result.info`` (the transport's message counts included) and the run's final server
    state."""

    run: ChainRun
    info: Dict[str, Any]
    state: Any
    #: consensus MC with ``weighting="stein"``: the clients' weights, stacked
    #: (``ConsensusMC.stack_weights``); None otherwise or when a client failed
    client_weights: Any = None


# ----------------------------------------------------------------------------- client side


def _key_data(keys) -> np.ndarray:
    return np.asarray(jax.random.key_data(keys))


def _keys(key_data) -> jax.Array:
    return jax.random.wrap_key_data(jnp.asarray(key_data, jnp.uint32))


def _own_rows(context: ClientContext, settings: Dict[str, Any]):
    """The client's minibatch rule and gradient estimator on its own rows."""
    data = context.data
    gradients = batch_likelihood_gradients(context.flat_model, data)
    may_be_smaller = bool(settings["may_be_smaller"])
    s, num_clients, m = context.index, context.num_clients, int(settings["batch_size"])

    def rows(key_batch):
        uniforms = rng.uniform(key_batch, (num_clients, m))[s]
        return client_rows(uniforms[None], data, may_be_smaller)

    def likelihood(theta, picked):
        return gradients(theta[None], picked)[0]

    return rows, likelihood


class _LaplaceOnClient(BroadcastProtocol):
    """``client_laplace``: the client's Laplace fit on its own rows, for ``"auto"`` run
    lengths (:func:`fedmcmc.baselines.tuning.client_laplace`)."""

    def client_laplace(self, context: ClientContext, theta0):
        """Its ``(P_s, b_s)`` (d^2 + d floats; d + d above 500 parameters)."""
        return tuning.client_laplace(context, theta0)


def _resolve_on_clients(algorithm, clients, federation, flat, request, init, thin, burn_in,
                        num_samples, chains, info):
    """``(h, thin, burn_in, fit)``: ``"auto"`` step size and run lengths from the clients'
    Laplace fits (one set-up round, asked only when an ``"auto"`` is), resolved by the
    algorithm's ``resolve_settings`` as in process, recorded in ``info``."""
    theta0 = np.asarray(flat.ravel(init))
    fit = None
    if tuning.wants_fit(thin, burn_in, algorithm.step_size):
        fit = tuning.combine_client_laplace(flat, clients.setup("laplace", theta0), theta0)
    h, thin, burn_in = algorithm.resolve_settings(
        flat, fit, np.asarray(federation.sizes), np.asarray(federation.weights), request,
        thin=thin, burn_in=burn_in, num_samples=num_samples, chains=chains, theta0=theta0,
        info=info)
    info.update(step_size=h, thin=thin, burn_in=burn_in)
    return h, thin, burn_in, fit


class FALDFunctions(_LaplaceOnClient):
    """FA-LD / VR-FALD*'s client-side functions (``client_<name>(context, *args)``), run by
    the engine's generic endpoint in the client's process on its own rows. Stateless (it is
    pickled to every client); a client's chain for every chain of the run lives in its
    ``context.store``."""

    name = "FALD"

    def client_gradient(self, context: ClientContext, theta):
        """sum_i grad log p(x_i | theta) over its rows: its part of grad log pi(theta*) for
        VR-FALD*'s control variates (one round before sampling)."""
        flat = context.flat_model
        return np.asarray(client_likelihood_gradients(flat, context.data)(
            jnp.asarray(theta, flat.dtype))[0])

    def client_configure(self, context: ClientContext, settings: Dict[str, Any]) -> int:
        """Compile its local steps. ``settings``: ``weight`` (f_s), ``batch_size``,
        ``may_be_smaller`` (some client has fewer rows than the batch), ``step_size``,
        ``noise``, ``longest`` (the most iterations one call runs) and, for VR-FALD*,
        ``reference`` = (theta*, grad log pi(theta*))."""
        flat = context.flat_model
        dtype = flat.dtype
        rows, likelihood = _own_rows(context, settings)
        weight = jnp.asarray(np.asarray([settings["weight"]]), dtype)[0]
        h = jnp.asarray(settings["step_size"], dtype)
        s, num_clients, noise = context.index, context.num_clients, bool(settings["noise"])
        reference = settings.get("reference")
        if reference is not None:
            theta_star = jnp.asarray(reference[0], dtype)
            gradient_star = jnp.asarray(reference[1], dtype)
            prior_star = flat.grad_log_prior(theta_star)

        def one_step(local, key, present, scale):
            _, key_batch, key_noise = fald.iteration_keys(key)
            picked = rows(key_batch)
            control = None
            if reference is not None:
                control = (prior_star, likelihood(theta_star, picked), gradient_star)
            direction = fald.local_direction(flat.grad_log_prior(local),
                                             likelihood(local, picked), weight, control)
            xi = rng.normal(key_noise, (num_clients,) + local.shape, dtype)[s] if noise else None
            return fald.local_move(local, direction, h, scale, xi, present)

        all_chains = jax.vmap(one_step)

        def steps(local, keys, count, present, scale):
            # ``count`` of the ``keys``' iterations: one compiled program for every segment
            return jax.lax.fori_loop(0, count, lambda i, th: all_chains(
                th, keys[:, i], present, scale), local)

        # (jit_with_constants_as_arguments: the client's rows and f_s are arguments, so
        # another seed or other rows of the same shapes reuse the program; so below)
        context.store["fald"] = {"steps": jit_with_constants_as_arguments(steps), "local": None,
                                 "longest": int(settings["longest"])}
        return context.index

    def client_respond(self, context: ClientContext, start, present, scale, key_data):
        """Local steps of every chain from the iterations' keys ``key_data`` ``(chains, n,
        2)``: from ``start`` (the shared state, ``(chains, d)``) when a round starts, else
        from its chains where the last call left them; only the chains where it takes part
        (``present``) move, with noise sigma_s = ``scale``. Returns its chains ``(chains, d)``."""
        store = context.store["fald"]
        local = jnp.asarray(start) if start is not None else store["local"]
        count = int(np.shape(key_data)[1])
        padded = np.zeros((np.shape(key_data)[0], store["longest"], 2), np.uint32)
        padded[:, :count] = key_data
        store["local"] = store["steps"](local, _keys(padded), jnp.int32(count),
                                        jnp.asarray(present), jnp.asarray(scale))
        return np.asarray(store["local"])


class QLSDFunctions(_LaplaceOnClient):
    """QLSD / QLSD++'s client-side functions, run by the engine's generic endpoint in the
    client's process on its own rows. QLSD++'s reference point zeta, its exact gradient G_s
    there and its memory eta_s (every chain's) stay in its ``context.store``."""

    name = "QLSD"

    def client_configure(self, context: ClientContext, settings: Dict[str, Any]) -> int:
        """Compile its messages. ``settings``: ``weight`` (f_s), ``batch_size``,
        ``may_be_smaller``, ``levels`` (quantisation levels, ``None``: none), ``chains`` and,
        for QLSD++, ``reference_every`` and ``memory_rate``."""
        flat = context.flat_model
        dtype = flat.dtype
        rows, likelihood = _own_rows(context, settings)
        weight = jnp.asarray(np.asarray([settings["weight"]]), dtype)[0]
        levels, s, num_clients = settings["levels"], context.index, context.num_clients
        full_gradient = client_likelihood_gradients(flat, context.data)

        def send(key_quant, vector):
            uniforms = rng.uniform(key_quant, (num_clients,) + vector.shape)[s]
            return qlsd.quantize(uniforms, vector, levels)

        def plain(key, theta):
            key_batch, key_quant, _ = qlsd.iteration_keys(key)
            gradient = qlsd.client_gradient(flat.grad_log_prior(theta),
                                            likelihood(theta, rows(key_batch)), weight)
            return send(key_quant, gradient)

        store = {"plain": jit_with_constants_as_arguments(jax.vmap(plain)),
                 "every": settings.get("reference_every")}
        if store["every"] is not None:
            alpha = jnp.asarray(settings["memory_rate"], dtype)

            def refreshed(key, theta, zeta, exact, memory):
                _, key_quant, _ = qlsd.iteration_keys(key)
                exact = qlsd.client_gradient(flat.grad_log_prior(theta), full_gradient(theta)[0],
                                             weight)
                sent = send(key_quant, exact - memory)
                return sent, theta, exact, memory + alpha * sent

            def controlled(key, theta, zeta, exact, memory):
                key_batch, key_quant, _ = qlsd.iteration_keys(key)
                picked = rows(key_batch)
                gradient = qlsd.controlled_gradient(
                    exact, flat.grad_log_prior(theta) - flat.grad_log_prior(zeta),
                    likelihood(theta, picked) - likelihood(zeta, picked), weight)
                sent = send(key_quant, gradient - memory)
                return sent, zeta, exact, memory + alpha * sent

            zeros = jnp.zeros((int(settings["chains"]), flat.dim), dtype)
            store.update(refreshed=jit_with_constants_as_arguments(jax.vmap(refreshed)),
                         controlled=jit_with_constants_as_arguments(jax.vmap(controlled)),
                         zeta=zeros, exact=zeros, memory=zeros)
        context.store["qlsd"] = store
        return context.index

    def client_respond(self, context: ClientContext, iteration: int, theta, key_data):
        """Its compressed vector for every chain at iteration ``iteration``: C(H_s(theta))
        (QLSD) or C(H_s(theta) - eta_s) (QLSD++, which then updates eta_s and, every
        ``reference_every`` iterations, refreshes zeta and G_s); ``theta`` ``(chains, d)``,
        ``key_data`` the chains' iteration keys ``(chains, 2)``."""
        store = context.store["qlsd"]
        keys, theta = _keys(key_data), jnp.asarray(theta)
        if store["every"] is None:
            return np.asarray(store["plain"](keys, theta))
        step = store["refreshed"] if int(iteration) % store["every"] == 0 else store["controlled"]
        sent, store["zeta"], store["exact"], store["memory"] = step(
            keys, theta, store["zeta"], store["exact"], store["memory"])
        return np.asarray(sent)


def _pad_rows(raw_data, size: int):
    """Its rows padded to ``size`` by repeating row 0 (``Federation.padded``'s layout) and
    the 0/1 mask of its own rows."""
    def pad(leaf):
        leaf = np.asarray(leaf)
        return jnp.asarray(np.concatenate([leaf, np.repeat(leaf[:1], size - leaf.shape[0], 0)]))

    data = jax.tree_util.tree_map(pad, raw_data)
    own = int(np.shape(jax.tree_util.tree_leaves(raw_data)[0])[0])
    return data, jnp.asarray((np.arange(size) < own).astype(np.float32))


class ConsensusFunctions(BroadcastProtocol):
    """Consensus Monte Carlo's client-side functions: NUTS on the client's subposterior
    p(x_s | theta) p(theta)^(1/S), on its own rows; the NUTS states of every chain stay in
    its ``context.store``."""

    name = "ConsensusMC"

    def client_configure(self, context: ClientContext, settings: Dict[str, Any]) -> int:
        """Compile its warm-up and transitions. ``settings``: ``max_size`` (the largest
        client's rows: its rows are padded to it, as on the in-process engine), ``warmup``,
        ``target_acceptance``, ``step_size`` (untuned), ``max_num_doublings``, ``thin`` and
        ``longest`` (the most draws one call makes)."""
        flat = context.flat_model
        num_clients, thin = context.num_clients, int(settings["thin"])
        data, mask = _pad_rows(context.raw_data, int(settings["max_size"]))
        transition = consensus.build_client_transition(flat, num_clients,
                                                       settings["max_num_doublings"])
        store: Dict[str, Any] = {"settings": dict(settings), "data": data, "mask": mask}
        if settings["warmup"] > 0:
            store["warmup"] = consensus.build_chains_warmup(
                flat, num_clients, settings["warmup"], settings["target_acceptance"])
        log_density = consensus.subposterior_log_density(flat, num_clients)
        store["value_and_grad"] = jax.jit(jax.value_and_grad(log_density))
        if settings.get("weighting") == "stein":
            store["gradients"] = consensus.build_client_gradients(flat, num_clients)

        # the client's index and rows are arguments, not constants: every client runs the
        # same program (compiled once when the persistent compilation cache is on)
        def one_draw(carry, key, client, data, mask):  # one chain: ``thin`` transitions
            def one(carry, k):
                position, logdensity, grad, step_size, inverse_mass, divergences, acceptance = carry
                state, divergent, rate = transition(
                    jax.random.split(k, num_clients)[client], position, logdensity, grad,
                    step_size, inverse_mass, data, mask)
                return (state.position, state.logdensity, state.logdensity_grad, step_size,
                        inverse_mass, divergences + divergent.astype(jnp.int32),
                        acceptance + rate.astype(acceptance.dtype)), None

            return jax.lax.scan(one, carry, jax.random.split(key, thin))[0]

        all_chains = jax.vmap(one_draw, in_axes=(0, 0, None, None, None))

        def draws(carry, keys, count, client, data, mask):
            # keys (longest, chains): the first ``count`` rows are this call's draws
            buffer = jnp.zeros(keys.shape[:2] + (flat.dim,), flat.dtype)

            def body(i, state):
                carry, buffer = state
                carry = all_chains(carry, keys[i], client, data, mask)
                return carry, buffer.at[i].set(carry[0])

            return jax.lax.fori_loop(0, count, body, (carry, buffer))

        store["draws"] = jax.jit(draws)
        context.store["consensus"] = store
        return context.index

    def client_warmup(self, context: ClientContext, key_data, theta0):
        """Warm up (or, with no warm-up, start untuned at ``theta0``) every chain of its
        subposterior; ``key_data``: the chains' warm-up keys ``(chains, 2)``. Returns its
        step size per chain."""
        store = context.store["consensus"]
        settings = store["settings"]
        theta0 = jnp.asarray(theta0, context.flat_model.dtype)
        chains = int(np.shape(key_data)[0])
        if settings["warmup"] > 0:
            position, logdensity, grad, step_size, inverse_mass = store["warmup"](
                _keys(key_data), jnp.int32(context.index), store["data"], store["mask"],
                theta0)
        else:
            value, gradient = store["value_and_grad"](theta0, store["data"], store["mask"])
            tile = lambda a: jnp.broadcast_to(a, (chains,) + jnp.shape(a))  # noqa: E731
            position, logdensity, grad = tile(theta0), tile(value), tile(gradient)
            step_size = jnp.full((chains,), settings["step_size"], theta0.dtype)
            inverse_mass = tile(jnp.ones_like(theta0))
        store["carry"] = (position, logdensity, grad, step_size, inverse_mass,
                          jnp.zeros((chains,), jnp.int32), jnp.zeros((chains,), theta0.dtype))
        store["positions"] = []  # its draws, kept for its Stein weight (client_weights)
        return np.asarray(step_size)

    def client_respond(self, context: ClientContext, key_data):
        """Its next draws of every chain: ``key_data`` ``(count, chains, 2)`` the draws' keys
        (``thin`` NUTS transitions each). Returns ``(positions (count, chains, d),
        divergent transitions (chains,), summed acceptance rates (chains,))`` so far."""
        store = context.store["consensus"]
        count, chains = np.shape(key_data)[:2]
        padded = np.zeros((store["settings"]["longest"], chains, 2), np.uint32)
        padded[:count] = key_data
        store["carry"], positions = store["draws"](store["carry"], _keys(padded),
                                                   jnp.int32(count), jnp.int32(context.index),
                                                   store["data"], store["mask"])
        positions = np.asarray(positions[:count])
        if "gradients" in store:
            store["positions"].append(positions)
        return (positions, np.asarray(store["carry"][5]), np.asarray(store["carry"][6]))

    def client_weights(self, context: ClientContext, first: int, count: int):
        """Its Stein weight (``weighting="stein"``; :func:`consensus.client_weights`) from its
        draws ``first`` to ``first + count`` of every chain (the kept draws the server
        combines) and its subposterior's gradients there: d^2 (1 + 2 splits) floats, once."""
        store = context.store["consensus"]
        positions = np.concatenate(store["positions"], axis=0)[first:first + count]
        dim = context.flat_model.dim
        own = positions.transpose(1, 0, 2).reshape(-1, dim)  # chain after chain
        return consensus.client_weights(own, np.asarray(store["gradients"](
            own, store["data"], store["mask"])))


# ----------------------------------------------------------------------------- server side


class _Clients:
    """The run's endpoints (one per client) in its :class:`~fedmcmc.engines.session.Session`:
    set-up messages, the one gather of every round's replies, and the figures
    ``Result.info`` gets from them."""

    def __init__(self, session):
        self.session = session
        self.transport = session.transport
        self.timeout = session.timeout
        self.num_clients = session.num_clients

    def configure(self, settings_of: Callable[[int], Dict[str, Any]]) -> None:
        self.session.configure(lambda s: (settings_of(s),), timeout="visit")

    def setup(self, name: str, *args) -> List[Any]:
        return self.session.ask(name, *args)

    def ready(self) -> None:
        """Set-up is over: record where the clients run and how long it took."""
        self.session.ready()

    def respond(self, args_of: Dict[int, tuple]) -> Dict[int, Any]:
        """``respond`` to the clients of ``args_of`` with their arguments; a failure reaches
        the driver as :class:`~fedmcmc.engines.comm.ClientFailure` (the run stops)."""
        clients = sorted(args_of)
        pendings = self.transport.call_each(clients, "respond", lambda s: args_of[s])
        return dict(zip(clients, gather(self.transport, pendings, self.timeout)))

    def info(self) -> Dict[str, Any]:
        """The transport's message and byte counts and the run's engine figures."""
        out = self.session.figures()
        out["bytes_communicated"] = out["bytes_to_clients"] + out["bytes_from_clients"]
        return out


@contextlib.contextmanager
def _endpoints(functions, algorithm, model, federation, init, seed, engine,
               options: Dict[str, Any]):
    """``(clients, federation)`` for a run: the endpoints of ``functions`` in a
    :func:`~fedmcmc.engines.session.protocol_session` of ``engine`` and the driver's view of
    the federation (from_loaders: what the clients report); the session closes at the end.
    The failure policy is "stop" only (a lost client's data would leave the target)."""
    policy = options["on_client_failure"]
    if policy != "stop":
        raise ValueError(
            f"on_client_failure={policy!r} is not available for {algorithm.name} on "
            f"engine={engine.label!r} (a lost client's data would leave the target); use 'stop'")
    num_clients = federation.num_clients
    sources = federation.client_sources()
    specs = [(BroadcastClient, (s, sources[s], model, init, functions, num_clients, seed))
             for s in range(num_clients)]
    # fault_injection (tests only): the transport makes one client crash or hang
    with protocol_session(engine, specs, federation, model, init, name=algorithm.name,
                          options=options, fault_point="respond") as session:
        yield _Clients(session), session.federation


def _may_be_smaller(federation, batch_size: int) -> bool:
    return bool(np.min(np.asarray(federation.sizes)) < batch_size)


def sample_fald(algorithm, model, federation, engine, options: Dict[str, Any], *, init,
                num_samples, burn_in, thin, chains, seed,
                progress, run_request=None) -> BaselineRun:
    """FA-LD / VR-FALD* (``algorithm``: a :class:`fedmcmc.FALD`) with one endpoint per client
    in a protocol session of the message-passing ``engine``; ``options``: the run's checked
    engine options.
    ``"auto"`` run lengths are resolved from the clients' Laplace fits (``info["thin"]``,
    ``info["burn_in"]``: the values used)."""
    if algorithm.variance_reduction and algorithm.reference_point is None:
        raise ValueError(
            f"reference_point: VR-FALD* on engine={engine.label!r} needs theta* given (e.g. a "
            "MAP estimate); the search for the global mode runs on engine='local' only")
    with _endpoints(FALDFunctions(), algorithm, model, federation, init, seed, engine,
                    options) as (clients, federation):
        flat = model.flatten(init)
        dim, num_clients, L = flat.dim, federation.num_clients, algorithm.local_steps
        weights = np.asarray(federation.weights)
        f = jnp.asarray(weights, flat.dtype)
        cumulative = jnp.asarray(np.cumsum(np.asarray(weights, np.float64)), jnp.float32)
        k = algorithm.clients_per_round(num_clients)
        reference, setup_rounds = None, 0
        info = algorithm.settings_info(num_clients)
        step_size, thin, burn_in, fit = _resolve_on_clients(
            algorithm, clients, federation, flat, run_request, init, thin, burn_in,
            num_samples, chains, info)
        h = jnp.asarray(step_size, flat.dtype)
        if fit is not None:
            setup_rounds += 1
        if algorithm.variance_reduction:
            theta_star = jnp.asarray(flat.ravel(algorithm.reference_point), flat.dtype)
            gradients = clients.setup("gradient", np.asarray(theta_star))
            gradient_star = (flat.grad_log_prior(theta_star)
                             + jnp.asarray(np.stack(gradients)).sum(0))
            reference = (np.asarray(theta_star), np.asarray(gradient_star))
            setup_rounds += 1
            info.update(reference_point="given", mode_iterations=0,
                        reference_gradient_norm=float(jnp.linalg.norm(gradient_star)))
        base = dict(batch_size=algorithm.batch_size, step_size=step_size,
                    noise=algorithm.noise, reference=reference, longest=min(thin, L),
                    may_be_smaller=_may_be_smaller(federation, algorithm.batch_size))
        clients.configure(lambda s: dict(base, weight=float(weights[s])))
        clients.ready()

        new_round = jax.jit(jax.vmap(lambda key, state: fald.start_round(
            state, *fald.round_participants(key, f, cumulative, h, k))))
        finish = jax.jit(jax.vmap(lambda state: (
            lambda counted: (counted, fald.draw(counted), counted.rounds))(
                fald.count_draw(state, L))))
        split = jax.jit(jax.vmap(lambda key: rng.split_key(key, thin)))
        round_keys = jax.jit(jax.vmap(lambda key: fald.iteration_keys(key)[0]))

        def draw_all(draw_keys, states):
            """``thin`` iterations of every chain: one message to each participant per round
            (or part of a round) the draw spans."""
            keys = split(draw_keys)  # (chains, thin)
            first, done = int(states.iteration[0]), 0
            while done < thin:
                t = first + done
                starting = t % L == 0
                if starting:
                    states = new_round(round_keys(keys[:, done]), states)
                end = min(thin, done + L - t % L)
                states = states._replace(iteration=states.iteration + (end - done))
                present = np.asarray(states.coefficient) > 0  # (chains, S)
                scale = np.asarray(states.noise_scale)
                shared = np.asarray(states.local[:, 0]) if starting else None
                segment = _key_data(keys[:, done:end])
                replies = clients.respond({
                    s: (shared, present[:, s], scale[:, s], segment)
                    for s in range(num_clients) if present[:, s].any()})
                local = np.array(states.local)
                for s, chains_of_s in replies.items():
                    local[:, s] = chains_of_s
                states = states._replace(local=jnp.asarray(local))
                done = end
            states, draws, rounds = finish(states)
            return states, draws, {"round": rounds}

        states = jax.tree_util.tree_map(
            lambda leaf: jnp.broadcast_to(leaf, (chains,) + leaf.shape),
            fald.init(flat.ravel(init), f))
        run = drive(draw_by_draw(draw_all, jax.random.key(seed), chains), states, chains=chains,
                    draw_dim=dim, burn_in=burn_in, num_samples=num_samples, draws_per_call=1,
                    divergence_threshold=algorithm.divergence_threshold, progress=progress,
                    label=f"{algorithm.name} ({engine.label})", iterations_per_draw=thin,
                    **protocol_run_options(options))
        final = run.state
        rounds = np.asarray(final.rounds)
        mid_round = int(np.asarray(final.uploads_inside_rounds, np.int64).sum())
        info.update(
            rounds=int(rounds.max()) + setup_rounds,
            rounds_per_chain=(rounds + setup_rounds).tolist(),
            draws_inside_rounds_uploads=mid_round)
        info.update(clients.info())
        # the pattern's count, as engine="local" makes it (the transport's: transport_messages)
        info.update(message_counts.figures(
            message_counts.broadcast(int(np.asarray(final.client_rounds, np.int64).sum()),
                                     mid_round),
            message_counts.setup(num_clients, setup_rounds)))
    return BaselineRun(run, info, run.state)


class QLSDServer(NamedTuple):
    """The QLSD / QLSD++ server's state for all chains: theta, its mirror of every client's
    memory eta_s (QLSD++; zeros for QLSD) and the shared iteration counter."""

    position: jax.Array  # (chains, d)
    memory: jax.Array  # (chains, S, d)
    iteration: int


def sample_qlsd(algorithm, model, federation, engine, options: Dict[str, Any], *, init,
                num_samples, burn_in, thin, chains, seed,
                progress, run_request=None) -> BaselineRun:
    """QLSD / QLSD++ (``algorithm``: a :class:`fedmcmc.QLSD`) with one endpoint per client.
    Like the in-process engine, the chains run as one state (one draw of the driver is a
    ``(chains * d,)`` vector), so a diverged chain stops every chain."""
    with _endpoints(QLSDFunctions(), algorithm, model, federation, init, seed, engine,
                    options) as (clients, federation):
        flat = model.flatten(init)
        dim, num_clients = flat.dim, federation.num_clients
        weights = np.asarray(federation.weights)
        resolved: Dict[str, Any] = {}
        step_size, thin, burn_in, fit = _resolve_on_clients(
            algorithm, clients, federation, flat, run_request, init, thin, burn_in,
            num_samples, chains, resolved)
        levels, every, rate = algorithm.quantisation_settings(federation, dim)
        plus_plus = algorithm.variance_reduction
        base = dict(batch_size=algorithm.batch_size, levels=levels, chains=chains,
                    may_be_smaller=_may_be_smaller(federation, algorithm.batch_size),
                    reference_every=every if plus_plus else None, memory_rate=rate)
        clients.configure(lambda s: dict(base, weight=float(weights[s])))
        clients.ready()
        h = jnp.asarray(step_size, flat.dtype)
        alpha = jnp.asarray(rate, flat.dtype)
        noise = algorithm.noise

        @jax.jit
        def iteration_keys(key):
            chain_keys = rng.split_key(key, chains)
            parts = jax.vmap(qlsd.iteration_keys)(chain_keys)  # (chains, 3)
            return jax.random.key_data(chain_keys), parts[:, 2]

        def server_step(key_noise, theta, memory, sent):
            if plus_plus:
                direction = jnp.sum(memory + sent, axis=0)
                memory = memory + alpha * sent
            else:
                direction = jnp.sum(sent, axis=0)
            return qlsd.langevin_move(theta, direction, h, key_noise, noise), memory

        step = jax.jit(jax.vmap(server_step))
        split = jax.jit(lambda key: rng.split_key(key, thin))

        def draw_all(draw_keys, state):
            for key in split(draw_keys[0]):
                chain_keys, noise_keys = iteration_keys(key)
                theta = np.asarray(state.position)
                replies = clients.respond({s: (state.iteration, theta, chain_keys)
                                           for s in range(num_clients)})
                sent = jnp.asarray(np.stack([replies[s] for s in range(num_clients)], axis=1))
                position, memory = step(noise_keys, state.position, state.memory, sent)
                state = QLSDServer(position, memory, state.iteration + 1)
            return state, state.position.reshape(1, -1), {}

        state = QLSDServer(jnp.broadcast_to(flat.ravel(init), (chains, dim)),
                           jnp.zeros((chains, num_clients, dim), flat.dtype), 0)
        run_options = protocol_run_options(options)
        if run_options.get("on_draws") is not None:  # one row holds every chain's draw
            run_options["on_draws"] = qlsd.draws_per_chain(run_options["on_draws"], chains, dim)
        run = drive(draw_by_draw(draw_all, jax.random.key(seed), 1), state, chains=1,
                    draw_dim=chains * dim, burn_in=burn_in, num_samples=num_samples,
                    draws_per_call=1, divergence_threshold=algorithm.divergence_threshold,
                    progress=progress, label=f"{algorithm.name} ({engine.label})",
                    iterations_per_draw=thin * chains, **run_options)
        info = algorithm.settings_info(num_clients, levels, every, rate, step_size)
        info.update(resolved)
        iterations = run.draws_done * thin
        bits_per_vector = 32 * dim if levels is None else 32 + algorithm.bits * dim
        info.update(rounds=iterations + (0 if fit is None else 1),
                    bits_communicated=int(chains * iterations * num_clients
                                          * (32 * dim + bits_per_vector)
                                          + (0 if fit is None else 32 * num_clients * (
                                              dim + tuning.fit_floats(
                                                  dim, fit.precision.ndim == 1)))))
        info.update(clients.info())
        info.update(message_counts.figures(
            message_counts.broadcast(chains * iterations * num_clients),
            message_counts.setup(num_clients, 0 if fit is None else 1)))
    return BaselineRun(run, info, run.state)


def sample_consensus(algorithm, model, federation, engine, options: Dict[str, Any], *, init,
                     num_samples, burn_in, thin, chains, seed,
                     progress) -> BaselineRun:
    """Consensus Monte Carlo (``algorithm``: a :class:`fedmcmc.ConsensusMC`) with one endpoint
    per client: each samples its subposterior and sends its draws up (chunk by chunk); the
    combination is the caller's (``consensus.combine``). A draw of the driver is every
    client's draw, ``(S * d,)``, as on the in-process engine."""
    with _endpoints(ConsensusFunctions(), algorithm, model, federation, init, seed, engine,
                    options) as (clients, federation):
        flat = model.flatten(init)
        dim, num_clients = flat.dim, federation.num_clients
        warmup = algorithm.warmup_steps(burn_in, thin)
        discard = burn_in if algorithm.num_warmup is not None else 0
        chunk = options.get("chunk_size") or default_chunk_size(discard + num_samples)
        settings = dict(max_size=int(np.max(federation.sizes)), warmup=warmup, thin=thin,
                        longest=int(min(chunk, discard + num_samples)),
                        target_acceptance=algorithm.target_acceptance,
                        step_size=algorithm.step_size,
                        max_num_doublings=algorithm.max_num_doublings,
                        weighting=algorithm.weighting)
        clients.configure(lambda s: settings)
        key = jax.random.key(seed)
        warm_keys = _key_data(jax.random.split(jax.random.fold_in(key, 2**20), chains))
        theta0 = np.asarray(flat.ravel(init))
        step_sizes = clients.setup("warmup", warm_keys, theta0)
        clients.ready()
        # the key an argument (another seed: the same program)
        draw_keys = jax.jit(lambda key, first, count: jax.vmap(
            lambda i: rng.split_key(rng.fold_in(key, i), chains))(first + jnp.arange(count)),
            static_argnums=2)

        def advance(state, first_draw, count):
            keys = _key_data(draw_keys(key, first_draw, count))  # (count, chains, 2)
            replies = clients.respond({s: (keys,) for s in range(num_clients)})
            positions = np.stack([replies[s][0] for s in range(num_clients)], axis=2)
            state = {"divergences": np.stack([replies[s][1] for s in range(num_clients)], 1),
                     "acceptance": np.stack([replies[s][2] for s in range(num_clients)], 1)}
            return state, positions.reshape(count, chains, num_clients * dim), {}

        state = {"divergences": np.zeros((chains, num_clients), np.int64),
                 "acceptance": np.zeros((chains, num_clients))}
        run = drive(advance, state, chains=chains, draw_dim=num_clients * dim, burn_in=discard,
                    num_samples=num_samples,
                    divergence_threshold=algorithm.divergence_threshold, progress=progress,
                    label=f"{algorithm.name} ({engine.label})", iterations_per_draw=thin,
                    chunk_size=chunk)
        info = algorithm.settings_info(num_clients, warmup)
        info["step_size_per_client"] = np.stack(step_sizes, axis=1).mean(axis=0).tolist()
        weights = None
        if algorithm.weighting == "stein" and run.failure is None:
            usable = algorithm.usable_draws(run, discard)
            if chains * usable > dim:  # every client's weight from the draws combined
                weights = algorithm.stack_weights(clients.setup("weights", discard, usable),
                                                  info)
        info.update(clients.info())
        # one round, as engine="local" counts it: each chain's init down to every client,
        # its kept draws up (the transport's chunked uploads: transport_messages)
        info.update(message_counts.figures(message_counts.broadcast(chains * num_clients)))
    return BaselineRun(run, info, run.state, weights)
