"""The broadcast-and-gather pattern's client endpoint (Fed-PDMC's Algorithm 2, the baselines).

The pattern: every round the server broadcasts the chains' state to every worker,
each worker answers from its own data, and the server combines the answers. This
module holds the pattern's pieces and knows no family:

* :class:`BroadcastClient`, the generic client endpoint (a Ray actor on the Ray
  engine, an object on the in-process transport): it holds its worker's data and
  runs the family's client-side functions on it (``setup`` for set-up questions,
  ``configure`` once, ``respond`` every round);
* :func:`sample_broadcast`, the generic server of a
  :class:`~fedmcmc.protocols.BroadcastProtocol` with a server side (one message to every
  client per iteration, the replies combined by the protocol): what a broadcast-pattern
  algorithm defined outside the package runs on. A family may have a server of its own:
  Fed-PDMC's event rounds (``fedmcmc.pdmp.broadcast.BroadcastDraw``), the baselines'
  rounds (``fedmcmc.baselines.distributed``); every server runs in a
  :func:`fedmcmc.engines.session.protocol_session` and is driven by
  :func:`fedmcmc.engines.driver.drive`.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from .. import messages as message_counts
from ..model import unravel_draws_numpy
from ..protocols import BroadcastProtocol, client_context, client_function
from ..rng import fold_in, seed_key
from .comm import ClientEndpoint, gather
from .session import finish_run, protocol_session

__all__ = ["BroadcastClient", "sample_broadcast"]


# ----------------------------------------------------------------------------- client side


class BroadcastClient(ClientEndpoint):
    """One worker of a broadcast-and-gather protocol: its data and the family's functions.

    ``functions`` is a :class:`~fedmcmc.protocols.BroadcastProtocol`, whose client-side
    methods run here, in the worker's process, on a :class:`~fedmcmc.protocols.ClientContext`
    holding only this worker's rows (and a private ``store`` kept between calls). The
    messages: ``configure(*args)`` (once, before sampling: ``client_configure``),
    ``respond(*args)`` (every round's answer: ``client_respond``) and ``setup(name, *args)``
    (set-up questions, e.g. Newton terms or rate bounds: ``client_<name>``, by name)."""

    RUN_WIDE_ARGUMENTS = (2, 3, 4)  # model, init, functions: the same for every client

    def __init__(self, index: int, source: Any, model, init: Any, functions: Any,
                 num_clients: int, seed: int):
        if not isinstance(functions, BroadcastProtocol):
            raise ValueError(f"functions must be a fedmcmc.protocols.BroadcastProtocol, got "
                             f"{functions!r}")
        super().__init__(index, source)
        self.functions = functions
        self.context = client_context(self.index, self.data, self.size, model, init,
                                      num_clients, seed)

    def setup(self, name: str, *args):
        function = client_function(self.functions, name)
        with self.compiling_once(("setup", name), self.functions, self.context.model):
            return function(self.context, *args)

    def configure(self, *args):
        with self.compiling_once("configure", self.functions, self.context.model, args):
            return self.functions.client_configure(self.context, *args)

    def respond(self, *args):
        return self.functions.client_respond(self.context, *args)


def sample_broadcast(protocol: BroadcastProtocol, model, federation, engine, *, init,
                     num_samples: int, burn_in: int, thin: int, chains: int, seed: int,
                     progress=None, info: Optional[Dict[str, Any]] = None, **run_options):
    """Run a broadcast-and-gather ``protocol`` (its server side: :meth:`~fedmcmc.protocols.
    BroadcastProtocol.init_state`, ``message``, ``update``, ``position``) on the client
    endpoints of the message-passing ``engine`` (an ``InProcessEngine`` or
    ``fm.RayEngine(...)``), one :class:`BroadcastClient` per client.

    Each client is configured with its f_s (``client_configure(context, weight)``); every
    iteration ``t`` the server sends ``protocol.message(state, key_t)`` to every client,
    gathers the ``client_respond`` replies and applies ``protocol.update(state, replies,
    key_t)``, with ``key_t = fold_in(key(seed), t)``; a draw every ``thin`` iterations is
    ``protocol.position(state)``. ``run_options``: ``chunk_size``, ``on_draws``. Returns the
    :class:`~fedmcmc.results.Result`; a failed client or a diverged chain raises
    (:func:`~fedmcmc.engines.session.finish_run`)."""
    if not isinstance(protocol, BroadcastProtocol):
        raise ValueError(f"protocol must be a fedmcmc.protocols.BroadcastProtocol, got "
                         f"{protocol!r}")
    options = engine.session_options(run_options, protocol.name)
    if options["on_client_failure"] != "stop":
        raise ValueError(f"on_client_failure={options['on_client_failure']!r} is not "
                         f"available for {protocol.name}: every round needs every client; "
                         "use 'stop'")
    flat_model = model.flatten(init)
    num_clients = federation.num_clients
    sources = federation.client_sources()
    specs = [(BroadcastClient, (s, sources[s], model, init, protocol, num_clients, seed))
             for s in range(num_clients)]
    root = seed_key(seed)
    with protocol_session(engine, specs, federation, model, init, name=protocol.name,
                          options=options, fault_point="respond") as session:
        weights = np.asarray(session.federation.weights, np.float64)
        session.configure(lambda s: (float(weights[s]),))
        session.phase("configure")
        session.ready()
        transport, clients = session.transport, list(range(num_clients))

        def advance(state, first_draw, count):
            draws = []
            for index in range(first_draw, first_draw + count):
                for step in range(thin):
                    key = fold_in(root, index * thin + step)
                    message = tuple(protocol.message(state, key))
                    replies = gather(transport, transport.call_each(
                        clients, "respond", lambda s: message), session.timeout)
                    state = protocol.update(state, replies, key)
                draws.append(np.asarray(protocol.position(state)))
            return state, np.stack(draws), {}

        run = session.drive(advance, protocol.init_state(np.asarray(flat_model.ravel(init)),
                                                         chains),
                            chains=chains, draw_dim=flat_model.dim, burn_in=burn_in,
                            num_samples=num_samples,
                            divergence_threshold=protocol.divergence_threshold,
                            progress=progress, iterations_per_draw=thin, draws_per_call=1)
        info = dict(info or {}, num_clients=num_clients, rounds=run.draws_done * thin)
        info.update(session.figures())
        # every iteration: each chain's message down to every client and its reply back
        info.update(message_counts.figures(message_counts.broadcast(
            chains * info["rounds"] * num_clients)))
    return finish_run(run, name=protocol.name, label=engine.label, info=info,
                      dim=flat_model.dim, thin=thin, burn_in=burn_in,
                      unravel=lambda draws: unravel_draws_numpy(flat_model, draws))
