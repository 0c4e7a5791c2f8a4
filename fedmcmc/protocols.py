"""Protocol types: what a federated sampler's clients and server do, without the engine.

A family describes its algorithm once, as a protocol: named client-side
functions (they run where the client's data are and reply with a few floats)
and server-side functions (they run in the driver and see only replies). An
engine (``fedmcmc.engines``) runs any protocol of a given communication pattern
over any transport (in-process objects, Ray actors); it never imports a family
and never branches on an algorithm's name.

This module holds one protocol class per pattern: :class:`HandoffProtocol`,
:class:`BroadcastProtocol` (every client answers every round: Fed-PDMC, the baselines)
and :class:`NeighbourProtocol` (agents exchange with their neighbours: DULA, GT-DULA).
The hand-off pattern (DSGLD, FSGLD, or a sampler defined outside the package, such as
SGHMC whose momentum travels with the chain):

* the **chain carry** is a tuple of arrays that travels from client to client
  (DSGLD/FSGLD: the position; SGHMC: position and momentum);
* a **visit** is ``local_steps`` updates of the carry on one client, with the
  client's own data: :meth:`HandoffProtocol.build_update` gives one update,
  the engine scans it;
* the **server** draws the next client of each chain with probability f_s and
  hands the carry on.

Keys: iteration ``t`` of chain ``c`` has the key
``fedmcmc.engines.local.iteration_key(root, chains, thin, c, t)`` on every engine,
split in three (:func:`update_step`): the first is the scheduler's (the client of a
visit is drawn with that of the visit's first iteration), the other two are the
update's own, handed to it in an :class:`UpdateStep` with the iteration and whether
the update starts a visit. An update never sees the scheduler's key, so what it
draws cannot correlate with the choice of client, and a protocol's draws do not
depend on the transport.

A protocol needs nothing from a family: the minibatch estimators are in
:mod:`fedmcmc.minibatch` (``client_gradient_estimate``: equation (4) on the client's
own rows), and ``fedmcmc.HandoffAlgorithm(protocol)`` runs it through
``fedmcmc.sample`` on every engine (``docs/development/writing-a-sampler.md``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from . import rng
from .arrays import device_array
from .federation import ConcatenatedData
from .model import FlatModel

__all__ = ["ClientContext", "client_context", "client_function", "HandoffProtocol",
           "BroadcastProtocol", "NeighbourProtocol", "ServerSide", "UpdateStep", "update_step",
           "ClientParameters", "draw_client", "client_from_uniform"]


class UpdateStep(NamedTuple):
    """What the engine hands one update of a hand-off protocol (traced values).

    ``iteration``: the chain's global iteration t (int32; the draw after update t is
    kept when ``(t + 1) % thin == 0``). ``visit_start``: whether this update is the
    first of a visit, the chain having just arrived on this client (bool).
    ``minibatch_key`` and ``noise_key``: the update's own two keys (the second and
    third of ``split(iteration key, 3)``; the first is the scheduler's), for its
    minibatch and its injected noise; split them further when more is needed.
    """

    iteration: Any
    visit_start: Any
    minibatch_key: Any
    noise_key: Any


def update_step(iteration_key, iteration, visit_start) -> UpdateStep:
    """The :class:`UpdateStep` of the update whose iteration key is ``iteration_key``:
    the key split in three as every engine splits it (scheduler, minibatch, noise;
    ``jax.random.split`` bit for bit), the scheduler's key left out."""
    _, minibatch_key, noise_key = rng.split_key(iteration_key, 3)
    return UpdateStep(iteration=iteration, visit_start=visit_start,
                      minibatch_key=minibatch_key, noise_key=noise_key)


class ClientParameters(NamedTuple):
    """The default per-client parameters of a hand-off update: ``weight``, the client's
    selection probability f_s (float32), by which the estimator (4) divides its minibatch
    gradient (``fedmcmc.minibatch.client_gradient_estimate``)."""

    weight: Any


class ClientContext(NamedTuple):
    """What a client-side function of a protocol sees: its own data and nothing else.

    ``data`` is the client's rows in the one-client layout of the kernels
    (:class:`~fedmcmc.federation.ConcatenatedData` with a single client, so the
    in-process kernels run unchanged); ``raw_data`` the rows as loaded; ``init``
    the run's initial parameters (a family that works in float64 flattens them again);
    ``store`` a dictionary private to this client, kept between calls (for
    example a surrogate fitted in one call and used in the next).
    """

    index: int
    flat_model: FlatModel
    model: Any  # fedmcmc.Model
    init: Any  # the run's initial parameter pytree (its structure and dtypes)
    data: ConcatenatedData
    raw_data: Any
    size: int
    num_clients: int
    seed: int
    store: Dict[str, Any]


def client_context(index: int, data: Any, size: int, model, init: Any, num_clients: int,
                   seed: int) -> ClientContext:
    """The :class:`ClientContext` of client ``index`` holding ``data`` (``size`` rows), as
    every engine's client endpoint builds it: the rows as loaded and in the kernels'
    one-client layout, the model flattened at ``init``, an empty ``store``."""
    # host -> device without eager programs (each would be traced, lowered and compiled or
    # loaded in every new client process)
    layout = ConcatenatedData(data=jax.tree_util.tree_map(device_array, data),
                              offsets=device_array(np.zeros((1,), np.int32)),
                              sizes=device_array(np.full((1,), size, np.int32)))
    return ClientContext(index=int(index), flat_model=model.flatten(init), model=model,
                         init=init, data=layout, raw_data=data, size=int(size),
                         num_clients=int(num_clients), seed=int(seed), store={})


def client_function(functions: Any, name: str) -> Callable:
    """The client-side function ``client_<name>`` of a protocol (or a family's functions
    object); ``ValueError`` naming it when there is none."""
    function = getattr(functions, f"client_{name}", None) if name.isidentifier() else None
    if function is None:
        owner = getattr(functions, "name", type(functions).__name__)
        raise ValueError(f"{owner} has no client-side function {name!r}")
    return function


class ServerSide(NamedTuple):
    """What a protocol's server-side set-up may use in the driver.

    ``ask(name, args_of_client, clients)`` runs the protocol's client-side method
    ``client_<name>`` on every client of ``clients`` (all when ``None``) with the
    arguments ``args_of_client(client)`` and returns their replies in order; a
    failing client raises :class:`~fedmcmc.engines.comm.ClientFailureError`.
    ``flat_model`` and ``theta0`` (the flat initial position) describe the
    parameter, ``num_clients`` and ``seed`` the federation and the run; ``info`` is the
    run's ``Result.info``, to which set-up adds what it chose. ``weights``: the federation's
    f_s (for data that stay on the clients, from the sizes they reported) and
    ``weights_given`` whether the user gave them; :meth:`HandoffProtocol.scheduler_weights`
    is asked with what :meth:`HandoffProtocol.prepare` returned, so a set-up may choose
    other f_s. ``sizes``: the clients' numbers of rows N_s (as they reported them).
    """

    ask: Callable[[str, Callable[[int], tuple], Optional[Sequence[int]]], List[Any]]
    flat_model: FlatModel
    theta0: Any
    num_clients: int
    seed: int
    info: Dict[str, Any]
    weights: Any = None
    weights_given: bool = False
    sizes: Any = None


class HandoffProtocol:
    """A sampler whose chain is handed from client to client (FSGLD equations (3)-(4)).

    Subclass it to define a hand-off sampler; instances are pickled to the
    clients, so keep configuration in plain attributes. Override:

    * :meth:`init_carry` / :meth:`position`: what travels with the chain;
    * :meth:`build_update`: one update of the carry on one client (pure, jittable);
    * optionally client-side functions, methods named ``client_<name>(context, *args)``
      (set-up that needs the client's data: a surrogate fit, gradient-noise
      moments; they run in the client's process and reply with a few floats),
      with :meth:`prepare`, which asks for them by ``<name>`` and returns what it
      chose, and :meth:`client_parameters`: the per-client parameters of the update
      (a NamedTuple of arrays), computed by the server from what :meth:`prepare`
      returned (and again, over the remaining clients, when a client is dropped).

    Nothing here mutates the protocol: the server's set-up returns its choices and
    the client keeps what is its own in ``context.store``, so one protocol object
    serves every client of a process and every run of a reused Ray actor.

    Attributes
    ----------
    name:
        The algorithm's name, used in ``Result.info`` and messages.
    local_steps:
        Updates per visit before the chain is handed on.
    divergence_threshold:
        A draw with a non-finite coordinate or one above this in absolute value
        stops its chain (the draws before it are kept).
    """

    name: str = "handoff"
    local_steps: int = 1
    divergence_threshold: float = 1e10
    #: ``True`` promises that :meth:`build_update` reads nothing of its context but
    #: ``flat_model`` and ``data`` (no ``index``, ``seed``, ``store`` or ``raw_data``): clients
    #: of the same shapes in one process (several clients in one Ray actor, or the clients of
    #: a reused actor's next run, whatever its seed) then share one traced visit. Leave
    #: ``False`` (every client traces its own) when unsure.
    update_reads_only_rows: bool = False

    # ------------------------------------------------------------------ chain carry
    def init_carry(self, position) -> Tuple[Any, ...]:
        """The arrays that travel with a chain that starts at ``position`` (flat, (d,))."""
        return (position,)

    def position(self, carry: Tuple[Any, ...]):
        """The position (flat, (d,)) of a carry: the draw the engine records."""
        return carry[0]

    # ------------------------------------------------------------------ server side
    def prepare(self, server: ServerSide) -> Any:
        """Set-up done once, before sampling (e.g. ask every client for its surrogate).

        Returns what the set-up chose, ``prepared``, which the engine hands back to
        :meth:`run_length`, :meth:`scheduler_weights` and :meth:`client_parameters`: set-up
        returns what it resolves and never changes the protocol object (which the clients
        share, and which a reused Ray actor keeps for the next run). Default: ``None``."""
        return None

    def run_length(self, server: ServerSide, prepared: Any, thin, burn_in) -> Tuple[Any, Any]:
        """The run's ``thin`` and ``burn_in``, asked after :meth:`prepare` and before the
        clients' visits are configured: a protocol whose set-up resolves ``"auto"`` run
        lengths (``fm.sample(thin="auto")``) returns the integers it chose. The default
        returns them as given (an ``"auto"`` left unresolved is then refused by the engine)."""
        return thin, burn_in

    def scheduler_weights(self, prepared: Any, federation_weights):
        """The client selection probabilities f_s the scheduler draws with: the
        federation's (default), or ones the protocol's set-up chose (``prepared``)."""
        return federation_weights

    def client_parameters(self, server: ServerSide, prepared: Any, weights,
                          clients: Sequence[int]) -> List[Any]:
        """The parameters of each client's update, one per client of ``clients`` (those
        still taking part), for the scheduler weights ``weights`` (f_s, renormalised over
        ``clients``): a pytree of arrays (a NamedTuple, so the update reads them as
        attributes). The default gives f_s only, as :class:`ClientParameters`: the
        estimator of equation (4) scales the client's minibatch gradient by 1 / f_s."""
        return [ClientParameters(weight=np.float32(weights[s])) for s in clients]

    def complete_parameters(self, context: ClientContext, parameters: Any):
        """Client side, after :meth:`client_parameters`' entry arrives: add what the
        client keeps to itself (e.g. its own surrogate, never sent back). Default: as is."""
        return parameters

    # ------------------------------------------------------------------ the update
    def build_update(self, context: ClientContext, parameters: Any) -> Callable:
        """``update(step, carry) -> carry``: one update of the carry on this client.

        ``step`` is the :class:`UpdateStep` the engine hands every update: its iteration,
        whether it starts a visit, and its own keys (never the scheduler's). Called inside
        the compiled visit with ``parameters`` (what :meth:`complete_parameters` returned)
        as traced arrays, so a new f_s after a drop does not recompile."""
        raise NotImplementedError


# ----------------------------------------------------------------------------- the scheduler

def draw_client(key, cumulative_weights):
    """The scheduler: client s with probability f_s (binary search on the cumulative weights)."""
    return client_from_uniform(
        jax.random.uniform(key, (), dtype=cumulative_weights.dtype), cumulative_weights)


def client_from_uniform(uniform, cumulative_weights):
    """:func:`draw_client` from its uniform on [0, 1) (drawn in bulk by the engine)."""
    u = uniform * cumulative_weights[-1]
    # the same index either way; comparing against all S weights is one fused vector
    # operation, cheaper inside a compiled step than the binary search's loop for small S
    method = "compare_all" if cumulative_weights.shape[0] <= 256 else "scan"
    index = jnp.searchsorted(cumulative_weights, u, side="right", method=method)
    return jnp.minimum(index, cumulative_weights.shape[0] - 1).astype(jnp.int32)


class BroadcastProtocol:
    """A broadcast-and-gather sampler's protocol: every iteration the server sends the
    chains' state to every client, each client answers from its own rows, and the server
    combines the answers (Fed-PDMC's Algorithm 2, FA-LD, QLSD, consensus Monte Carlo).

    Client side (run where the client's data are, by the engine's generic endpoint
    :class:`fedmcmc.engines.broadcast.BroadcastClient`, on a :class:`ClientContext` holding
    only that client's rows; what a client keeps between messages goes in
    ``context.store``): :meth:`client_configure` once before sampling,
    :meth:`client_respond` every round, and set-up questions ``client_<name>(context,
    *args)``, asked by name (a session's ``ask(name, ...)``).

    Server side, for :func:`fedmcmc.engines.broadcast.sample_broadcast` (a family with a
    server of its own, such as Fed-PDMC's event rounds, leaves them out):
    :meth:`init_state`, :meth:`message`, :meth:`update` and :meth:`position`. Iteration
    ``t`` uses ``fold_in(key(seed), t)`` on every engine, so the draws do not depend on the
    transport. Instances are pickled to the clients: hold configuration only.
    """

    name: str = "broadcast protocol"
    divergence_threshold: float = 1e10

    # ------------------------------------------------------------------ client side
    def client_configure(self, context: ClientContext, *parameters) -> Any:
        """Before sampling, with this client's parameters (``sample_broadcast``: its f_s);
        keep what :meth:`client_respond` needs in ``context.store``."""
        return 0

    def client_respond(self, context: ClientContext, *message) -> Any:
        """This client's answer to one round's ``message``, from its own rows."""
        raise NotImplementedError

    # ------------------------------------------------------------------ server side
    def init_state(self, position, chains: int) -> Any:
        """The server's state of every chain from the flat initial position ``(d,)``."""
        raise NotImplementedError

    def message(self, state, key) -> Tuple[Any, ...]:
        """What every client receives in the round of iteration key ``key`` (a tuple of
        arrays: the chains' positions, keys, ...)."""
        raise NotImplementedError

    def update(self, state, replies: List[Any], key) -> Any:
        """The next state from the clients' ``replies`` (in client order)."""
        raise NotImplementedError

    def position(self, state) -> Any:
        """The draw of every chain, ``(chains, d)``, flat."""
        raise NotImplementedError


class NeighbourProtocol:
    """A decentralised sampler's agent side: agents on a graph exchange messages with their
    neighbours every iteration, with no server in between (DULA, GT-DULA). Run by the
    engine's generic endpoint :class:`fedmcmc.engines.neighbour.NeighbourClient` on a
    :class:`ClientContext` holding only the agent's rows; the messages of iteration ``k``
    travel agent to agent (``Transport.relay``). Set-up questions are ``client_<name>``
    methods, asked by name."""

    name: str = "neighbour protocol"

    def client_start(self, context: ClientContext, neighbours: List[int],
                     laplacian_row: List[float]) -> Any:
        """Once, before the first iteration: the agent's neighbours and its row of the
        graph's Laplacian."""
        raise NotImplementedError

    def client_message(self, context: ClientContext) -> Any:
        """What the agent sends its neighbours (its state after the last iteration)."""
        raise NotImplementedError

    def client_step(self, context: ClientContext, k: int, *neighbour_messages) -> Any:
        """Iteration ``k`` of the agent, with its neighbours' messages of iteration
        ``k - 1``; returns its new message."""
        raise NotImplementedError
