"""Where ``engine="ray"`` puts the clients: which clients each actor hosts
(:func:`actor_groups`, the engine option ``clients_per_actor``) and the
:class:`PlacementWarning`. The engine's options are described in
:mod:`fedmcmc.engines.ray_engine`."""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

__all__ = ["actor_groups", "PlacementWarning", "ACTORS_PER_CPU_HINT", "placement_hint"]


def actor_groups(num_clients: int, clients_per_actor, resources: Optional[Sequence[dict]],
                 cluster_cpus: float) -> List[List[int]]:
    """The clients each actor hosts (see the option ``clients_per_actor``): contiguous blocks
    of at most ``clients_per_actor`` clients, among clients with equal ``resources``; ``None``
    one client per actor; ``"auto"`` one client per actor with ``resources``, else
    ``ceil(num_clients / cluster_cpus)`` per actor, that is one actor per CPU of the cluster."""
    if clients_per_actor is None:
        clients_per_actor = 1
    elif clients_per_actor == "auto":
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
    """``engine="ray"`` is about to start many more client actors than the Ray instance has
    CPUs, each a process that imports JAX and compiles its client's programs (see
    :func:`placement_hint`)."""


#: actors per CPU of the Ray instance beyond which the default placement (one actor per client)
#: gets a :class:`PlacementWarning`
ACTORS_PER_CPU_HINT = 4


def placement_hint(num_actors: int, cluster_cpus: float, clients_per_actor,
                   resources: Optional[Sequence[dict]]) -> Optional[str]:
    """The text of a :class:`PlacementWarning`, or None: only for the default placement (the
    user did not choose ``clients_per_actor`` nor pin clients with ``client_resources``) and
    more than :data:`ACTORS_PER_CPU_HINT` actors per CPU. FSGLD's Table 1, 30 clients on a
    2-CPU machine, a whole run with a warm compilation cache: 57-76 s in 30 actors against
    18-22 s in 2 (``clients_per_actor="auto"``), the same draws (docs/reference/speed.md)."""
    if clients_per_actor is not None or resources is not None:
        return None
    cpus = max(float(cluster_cpus), 1.0)
    if num_actors <= ACTORS_PER_CPU_HINT * cpus:
        return None
    return (f"engine='ray' starts one actor per client: {num_actors} processes, each importing "
            f"JAX and compiling its client's programs, on a Ray instance with {cpus:g} CPUs. "
            f"clients_per_actor='auto' hosts the clients in one actor per CPU (the same messages "
            f"and draws, much less set-up time); pass clients_per_actor=1 to keep one process "
            f"per client and silence this warning")
