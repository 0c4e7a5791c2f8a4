"""Where ``engine="ray"`` puts the clients: which clients each actor hosts
(:func:`actor_groups`, the engine option ``clients_per_actor``) and the
:class:`PlacementWarning`. The engine's options are described in
:mod:`fedmcmc.engines.ray_engine`."""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

__all__ = ["DEFAULT_CLIENTS_PER_ACTOR", "actor_groups", "PlacementWarning", "ACTORS_PER_CPU_HINT", "placement_hint"]


#: the engine option's default: clients packed into one actor per CPU when there are more
#: clients than CPUs (``"auto"``), else one actor per client
DEFAULT_CLIENTS_PER_ACTOR = "auto"


def actor_groups(num_clients: int, clients_per_actor, resources: Optional[Sequence[dict]],
                 cluster_cpus: float) -> List[List[int]]:
    """The clients each actor hosts (see the option ``clients_per_actor``): contiguous blocks
    of at most ``clients_per_actor`` clients, among clients with equal ``resources``;
    ``"auto"`` (and ``None``, the default, which is ``"auto"``) one client per actor with
    ``resources``, else ``ceil(num_clients / cluster_cpus)`` per actor, that is one actor per
    CPU of the cluster (one per client when there are no more clients than CPUs)."""
    if clients_per_actor is None:
        clients_per_actor = DEFAULT_CLIENTS_PER_ACTOR
    if clients_per_actor == "auto":
        if resources is not None:
            clients_per_actor = 1
        else:
            actors = max(1, min(num_clients, int(cluster_cpus)))
            clients_per_actor = math.ceil(num_clients / actors)
    # balanced blocks: 30 clients on 4 actors are 8, 8, 7, 7 rather than 8, 8, 8, 6
    keys: Dict[tuple, List[int]] = {}
    for client in range(num_clients):
        key = () if resources is None else tuple(sorted(dict(resources[client]).items()))
        keys.setdefault(key, []).append(client)
    groups: List[List[int]] = []
    for members in keys.values():
        count = math.ceil(len(members) / clients_per_actor)
        base, extra = divmod(len(members), count)
        start = 0
        for block in range(count):
            size = base + (1 if block < extra else 0)
            groups.append(members[start:start + size])
            start += size
    return sorted(groups)


class PlacementWarning(UserWarning):
    """``engine="ray"``'s default placement is about to start many more client actors than
    the Ray instance has CPUs, each a process that imports JAX and compiles its client's
    programs (see :func:`placement_hint`)."""


#: actors per CPU of the Ray instance beyond which the default placement gets a
#: :class:`PlacementWarning`
ACTORS_PER_CPU_HINT = 4


def placement_hint(num_actors: int, cluster_cpus: float, clients_per_actor,
                   resources: Optional[Sequence[dict]]) -> Optional[str]:
    """The text of a :class:`PlacementWarning`, or None: only for the default placement
    (``clients_per_actor`` left unset) that still gives more than :data:`ACTORS_PER_CPU_HINT`
    actors per CPU. Without ``client_resources`` it packs the clients into one actor per CPU,
    so that happens only with ``client_resources`` (each client then gets its own actor):
    ``clients_per_actor=k`` lets clients with equal resource dicts share an actor, and
    ``clients_per_actor=1`` keeps one actor per client without the warning. Why it matters
    (FSGLD's Table 1 in 30 actors on 2 CPUs): docs/reference/speed.md."""
    if clients_per_actor is not None:
        return None
    cpus = max(float(cluster_cpus), 1.0)
    if num_actors <= ACTORS_PER_CPU_HINT * cpus:
        return None
    why = ("client_resources gives every client an actor of its own" if resources is not None
           else "the default placement")
    return (f"engine='ray' starts {num_actors} client actors ({why}), each a process importing "
            f"JAX and compiling its client's programs, on a Ray instance with {cpus:g} CPUs. "
            f"clients_per_actor=k hosts up to k clients (with equal client_resources) in one "
            f"actor (the same messages and draws, much less set-up time); pass "
            f"clients_per_actor=1 to keep one process per client and silence this warning")
