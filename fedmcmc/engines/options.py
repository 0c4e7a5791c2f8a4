"""The engine options as a dict: the keyword options of ``fm.sample(..., engine="ray",
**options)`` (mapped onto ``fm.RayEngine``'s constructor; the list and their meaning:
``ray_engine.py``'s module docstring), and the check of one message-passing run's options
(``ProtocolEngine.session_options``: the engine's settings and the run options it honours)."""

from __future__ import annotations

from typing import Any, Dict

import numpy as np

from ..algorithm import check_positive_float, check_positive_int
from ..checkpoint import RUN_OPTIONS, split_run_options

__all__ = ["ENGINE_OPTIONS", "PROTOCOL_RUN_OPTIONS", "check_engine_options",
           "protocol_run_options"]


ENGINE_OPTIONS = (
    "ray_address",
    "visit_timeout",
    "on_client_failure",
    "client_resources",
    "client_num_cpus",
    "clients_per_actor",  # client endpoints per Ray actor (default "auto": one actor per CPU)
    "reuse_actors",  # keep client actors for the next run on a Ray instance that outlives this one
    "direct_channel",  # driver messages through an authenticated socket per actor (channel.py)
    "channel_ports",  # (first, last): the ports the actors' channels listen on
    "audit_messages",
    "ray_init_options",
    "allow_unauthenticated_cluster",  # ray_security.py: run on a cluster without token auth
    # testing only: {"client": s, "after_visits": k, "kind": "exit" | "hang"[, "seconds": t]}
    # makes client s die (os._exit) or hang during its (k+1)-th visit
    "fault_injection",
    # engine="flower" (flower_engine.py)
    "flower_address",
    "flower_root_certificates",
    "flower_insecure",
    "flower_superexec_auth_secret_file",
    "flower_sites",
    "flower_connect_timeout",
    "flower_log_dir",
)


#: the run options (``fedmcmc.checkpoint``) every protocol engine honours: draws between the
#: driver's callbacks, and the callback that receives each chunk's kept draws (laid out as on
#: the in-process engine). ``on_chunk`` is accepted and not called: these runs are not resumed.
PROTOCOL_RUN_OPTIONS = ("chunk_size", "on_draws")

#: the options that only the Ray engine reads
RAY_ONLY_OPTIONS = ("ray_address", "ray_init_options", "client_resources", "client_num_cpus",
                    "clients_per_actor", "reuse_actors", "direct_channel", "channel_ports",
                    "allow_unauthenticated_cluster")


#: the options that only the Flower engine reads
FLOWER_ONLY_OPTIONS = ("flower_address", "flower_root_certificates", "flower_insecure",
                       "flower_superexec_auth_secret_file", "flower_sites",
                       "flower_connect_timeout", "flower_log_dir")


def check_engine_options(options: Dict[str, Any], name: str, engine: str = "ray") -> Dict[str, Any]:
    """Keep the engine options of ``options`` and the run options of
    :data:`PROTOCOL_RUN_OPTIONS` (``ValueError`` naming any other, a bad value, or a resume
    option, which the protocol engines do not support), with defaults filled in. ``engine``
    names the engine in the messages."""
    unknown = sorted(set(options) - set(ENGINE_OPTIONS) - set(RUN_OPTIONS))
    if unknown:
        raise ValueError(
            f"unknown options for {name} on engine={engine!r}: {unknown}; "
            f"engine options are {list(ENGINE_OPTIONS)}"
        )
    # Resuming needs chain states at a draw index, which this engine does not checkpoint:
    # reject it. The checkpoint callbacks (fedmcmc run passes them) are accepted and not
    # called: the run is not checkpointed and restarts from the beginning on --resume.
    used = [k for k in ("start_draw", "resume_state") if options.get(k) not in (None, 0)]
    if used:
        raise ValueError(
            f"options {used} (resume) are not supported with engine={engine!r} for {name}; "
            "use engine='local' with an algorithm of the package"
        )
    if engine != "ray":
        ray_only = [k for k in RAY_ONLY_OPTIONS if options.get(k) not in (None, False, 0)]
        if ray_only:
            raise ValueError(f"{ray_only[0]} is a Ray option; engine={engine!r} takes none")
    if engine != "flower":
        flower_only = [k for k in FLOWER_ONLY_OPTIONS if options.get(k) not in (None, False)]
        if flower_only:
            raise ValueError(f"{flower_only[0]} is a Flower option; engine={engine!r} "
                             "takes none")
    out = {k: options[k] for k in ENGINE_OPTIONS if k in options}
    run = split_run_options({k: options[k] for k in PROTOCOL_RUN_OPTIONS if k in options}, name)
    out.update({k: run[k] for k in PROTOCOL_RUN_OPTIONS if run.get(k) is not None})
    policy = out.get("on_client_failure", "stop")
    if policy not in ("stop", "drop"):
        raise ValueError(f"on_client_failure must be 'stop' or 'drop', got {policy!r}")
    out["on_client_failure"] = policy
    per_actor = out.get("clients_per_actor")
    if per_actor is not None and not (isinstance(per_actor, str) and per_actor == "auto"):
        try:
            out["clients_per_actor"] = check_positive_int(per_actor, "clients_per_actor")
        except ValueError:
            raise ValueError("clients_per_actor must be a positive integer or 'auto', "
                             f"got {per_actor!r}") from None
    for switch in ("reuse_actors", "direct_channel"):
        if switch in out:
            if not isinstance(out[switch], (bool, np.bool_)):
                raise ValueError(f"{switch} must be True or False, got {out[switch]!r}")
            out[switch] = bool(out[switch])
    if out.get("channel_ports") is not None:
        out["channel_ports"] = check_channel_ports(out["channel_ports"])
    timeout = out.get("visit_timeout")
    if timeout is not None:
        out["visit_timeout"] = check_positive_float(timeout, "visit_timeout")
    return out


def check_channel_ports(value) -> tuple:
    """The engine option ``channel_ports``: ``(first, last)``, integers with
    ``1 <= first <= last <= 65535``; ``ValueError`` naming it otherwise."""
    try:
        first, last = value
        if any(isinstance(p, (bool, np.bool_)) or int(p) != p for p in (first, last)):
            raise TypeError
        first, last = int(first), int(last)
    except (TypeError, ValueError):
        raise ValueError(f"channel_ports must be a pair (first, last) of port numbers, got "
                         f"{value!r}") from None
    if not 1 <= first <= last <= 65535:
        raise ValueError(f"channel_ports must satisfy 1 <= first <= last <= 65535, got "
                         f"{value!r}")
    return first, last


def protocol_run_options(checked: Dict[str, Any]) -> Dict[str, Any]:
    """The run options among options checked by :func:`check_engine_options` that a protocol
    engine passes to :func:`fedmcmc.engines.driver.drive` (:data:`PROTOCOL_RUN_OPTIONS`)."""
    return {k: checked[k] for k in PROTOCOL_RUN_OPTIONS if k in checked}
