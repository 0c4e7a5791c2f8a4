"""Token authentication of the Ray instances ``engine="ray"`` starts or joins (issue 21).

Ray 2.60 authenticates every gRPC request between its processes (GCS, raylets, workers,
drivers) with a shared bearer token when ``RAY_AUTH_MODE=token`` is in the environment of
each process; the token comes from ``RAY_AUTH_TOKEN`` (the token itself), else the file named
by ``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``. With authentication disabled, anyone
who reaches the cluster's ports can connect as a driver and run code on it, which here means
reading every client's data. What this module does:

Starting a local instance (:class:`LocalAuthentication`): a fresh 256-bit token
(``secrets.token_hex(32)``, as Ray's own generator) is written to a file created with mode
0600 in a new directory of mode 0700 (``tempfile.mkdtemp``); ``RAY_AUTH_MODE=token`` and
``RAY_AUTH_TOKEN_PATH=<that file>`` are set in this process's environment before
``ray.init`` (Ray's processes inherit them) and restored after ``ray.shutdown``, then the
directory is removed. A token the user chose (``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH``
already set) is used instead and left alone. ``RAY_AUTH_MODE=disabled`` set by the user is
refused (:class:`UnauthenticatedClusterError`) unless ``allow_unauthenticated_cluster=True``.

Joining a cluster (:func:`check_cluster_authentication`): a zero-CPU task pinned to every
alive node reports the authentication mode that node's Ray processes run with (a worker
inherits its raylet's environment); if any node runs without token authentication the run is
refused with :class:`UnauthenticatedClusterError`, which says how to enable it, unless the
user passed ``allow_unauthenticated_cluster=True``. The check is needed because Ray lets a
driver in token mode connect to a cluster without authentication, silently (measured). With
the opt-out, a connection fedmcmc made in token mode is remade without token authentication
for the run (the cluster's calls back to a token-mode driver are rejected and the actors die);
a ``ray.init`` of the user's in token mode is refused with an error that says so.
``result.info["ray_authentication"]`` records ``"token"``, ``"disabled (allowed by user)"``
or, if a node did not answer the check in time, ``"not verified (allowed by user)"``;
``result.info["ray_instance"]`` records ``"started"`` or ``"joined"``.

This authenticates; it does not encrypt. Traffic between nodes is plain gRPC unless Ray's TLS
is configured (``RAY_USE_TLS=1`` and certificates, see ``docs/security.md``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from typing import Any, Dict, List, Optional

__all__ = [
    "AUTH_ENV_VARS",
    "AuthEnvironment",
    "LOOPBACK",
    "UnauthenticatedClusterError",
    "LocalAuthentication",
    "authentication_mode",
    "check_allow_unauthenticated",
    "check_cluster_authentication",
    "import_ray",
    "node_authentication_modes",
    "ray_session",
    "record_ray_authentication",
    "refresh_ray_authentication_config",
    "session_authentication",
]

LOOPBACK = "127.0.0.1"

AUTH_ENV_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")

TOKEN = "token"
DISABLED_ALLOWED = "disabled (allowed by user)"

ENABLE_TOKEN_AUTHENTICATION = (
    "Start the head, every node and the driver with RAY_AUTH_MODE=token and the same token "
    "(RAY_AUTH_TOKEN_PATH=<file> or RAY_AUTH_TOKEN=<token>; `ray get-auth-token --generate` "
    "writes a new one to ~/.ray/auth_token); see docs/security.md."
)
OPT_OUT = (
    "Or pass allow_unauthenticated_cluster=True to fm.sample to run on it anyway (recorded "
    "in result.info['ray_authentication'])."
)


class UnauthenticatedClusterError(RuntimeError):
    """The Ray instance ``engine="ray"`` would use runs without token authentication."""


def check_allow_unauthenticated(value) -> bool:
    """``allow_unauthenticated_cluster`` must be a bool (ValueError naming it otherwise)."""
    if not isinstance(value, bool):
        raise ValueError(
            f"allow_unauthenticated_cluster must be True or False, got {value!r}"
        )
    return value


def authentication_mode() -> str:
    """``"token"`` or ``"disabled"``: the mode Ray's processes in this process use."""
    from ray._raylet import AuthenticationMode, get_authentication_mode

    return TOKEN if get_authentication_mode() == AuthenticationMode.TOKEN else "disabled"


def refresh_ray_authentication_config() -> None:
    """Make this process's Ray see the current ``RAY_AUTH_*`` environment.

    Ray caches its configuration and the token; the configuration is refreshed before the
    token cache is dropped (the order Ray's own test helpers use: a core-worker thread still
    draining after a shutdown would otherwise reload a token that is gone and abort).
    """
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


class AuthEnvironment:
    """Set ``RAY_AUTH_*`` variables of this process for a while, then put them back.

    ``set(NAME=value or None)`` (``None`` removes the variable) saves the original values the
    first time; ``restore()`` puts them back. Both refresh Ray's cached configuration
    (:func:`refresh_ray_authentication_config`).
    """

    def __init__(self):
        self._saved: Optional[Dict[str, Optional[str]]] = None

    def set(self, **values: Optional[str]) -> None:
        unknown = set(values) - set(AUTH_ENV_VARS)
        if unknown:
            raise ValueError(f"not a Ray authentication variable: {sorted(unknown)}")
        if self._saved is None:
            self._saved = {name: os.environ.get(name) for name in AUTH_ENV_VARS}
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        refresh_ray_authentication_config()

    def restore(self) -> None:
        if self._saved is None:
            return
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved = None
        refresh_ray_authentication_config()


class LocalAuthentication:
    """Token authentication for one local Ray instance (see the module docstring).

    ``enter()`` before ``ray.init``, ``exit()`` after ``ray.shutdown``. Attributes after
    ``enter()``: ``mode`` (``"token"`` or ``"disabled (allowed by user)"``),
    ``token_source`` (``"per-instance"``, ``"RAY_AUTH_TOKEN"``, ``"RAY_AUTH_TOKEN_PATH"`` or
    ``None``) and ``token_path`` (the per-instance file, ``None`` otherwise).
    """

    def __init__(self, allow_unauthenticated_cluster: bool = False):
        self.allow_unauthenticated = check_allow_unauthenticated(allow_unauthenticated_cluster)
        self.mode: Optional[str] = None
        self.token_source: Optional[str] = None
        self.token_path: Optional[str] = None
        self._directory: Optional[str] = None
        self._environment = AuthEnvironment()

    def enter(self) -> "LocalAuthentication":
        requested = os.environ.get("RAY_AUTH_MODE")
        if requested is not None and requested.strip().lower() == "disabled":
            if not self.allow_unauthenticated:
                raise UnauthenticatedClusterError(
                    "RAY_AUTH_MODE=disabled is set, so the local Ray instance engine='ray' "
                    "starts would accept connections without a token from any process on "
                    "this machine. Unset RAY_AUTH_MODE (engine='ray' then enables token "
                    "authentication with a token of its own) or set it to 'token'; or pass "
                    "allow_unauthenticated_cluster=True to start it without authentication."
                )
            self.mode = DISABLED_ALLOWED
            return self
        values: Dict[str, Optional[str]] = {"RAY_AUTH_MODE": TOKEN}
        if os.environ.get("RAY_AUTH_TOKEN"):
            self.token_source = "RAY_AUTH_TOKEN"
        elif os.environ.get("RAY_AUTH_TOKEN_PATH"):
            self.token_source = "RAY_AUTH_TOKEN_PATH"
        else:
            self._directory = tempfile.mkdtemp(prefix="fedmcmc-ray-auth-")  # mode 0700
            os.chmod(self._directory, 0o700)
            path = os.path.join(self._directory, "auth_token")
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as handle:
                handle.write(secrets.token_hex(32))
            self.token_path = path
            self.token_source = "per-instance"
            values.update(RAY_AUTH_TOKEN_PATH=path, RAY_AUTH_TOKEN=None)
        self._environment.set(**values)
        self.mode = TOKEN
        return self

    def exit(self) -> None:
        """Restore the ``RAY_AUTH_*`` environment and remove the per-instance token."""
        self._environment.restore()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None


def _report_authentication_mode() -> str:
    return authentication_mode()


def node_authentication_modes(ray, timeout: float = 120.0) -> Dict[str, str]:
    """Node id -> ``"token"``/``"disabled"``, as reported by a task pinned to each alive node.

    A worker inherits the environment of its node's raylet, so the mode it reports is the
    one that node's Ray processes enforce. Raises ``TimeoutError`` if a node does not answer
    within ``timeout`` seconds.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    report = ray.remote(num_cpus=0, max_retries=0)(_report_authentication_mode)
    node_ids = [node["NodeID"] for node in ray.nodes() if node.get("Alive")]
    refs = [
        report.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
        ).remote()
        for node_id in node_ids
    ]
    ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    if pending:
        for ref in pending:
            ray.cancel(ref, force=True)
        missing = [node_ids[refs.index(ref)] for ref in pending]
        raise TimeoutError(
            f"Ray nodes {missing} did not report their authentication mode within {timeout} s"
        )
    return dict(zip(node_ids, ray.get(refs)))


def check_cluster_authentication(ray, allow_unauthenticated_cluster: bool = False,
                                 address: Optional[str] = None,
                                 timeout: float = 120.0) -> str:
    """Refuse a joined cluster any of whose nodes runs without token authentication.

    Returns ``"token"``, or ``"disabled (allowed by user)"`` when the user allowed it.
    Raises :class:`UnauthenticatedClusterError` (a ``RuntimeError``) otherwise.
    """
    allow = check_allow_unauthenticated(allow_unauthenticated_cluster)
    try:
        modes = node_authentication_modes(ray, timeout=timeout)
    except TimeoutError as error:
        if allow:
            return "not verified (allowed by user)"
        raise UnauthenticatedClusterError(
            f"could not verify that the Ray cluster uses token authentication: {error}. "
            "Pass allow_unauthenticated_cluster=True to run without this check."
        ) from None
    unauthenticated: List[str] = [node for node, mode in modes.items() if mode != TOKEN]
    if not unauthenticated:
        return TOKEN
    if allow:
        return DISABLED_ALLOWED
    where = f"at {address} " if address else ""
    raise UnauthenticatedClusterError(
        f"the Ray cluster {where}runs without token authentication on "
        f"{len(unauthenticated)} of its {len(modes)} node(s) ({', '.join(unauthenticated)}): "
        "anyone who can reach its ports can run code on it and read every client's data. "
        + ENABLE_TOKEN_AUTHENTICATION + " " + OPT_OUT
    )


def import_ray():
    """``import ray`` with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` set first.

    It must be set before Ray starts its processes: otherwise Ray replaces 127.0.0.1 by the
    external address of the machine (measured).
    """
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError as error:  # pragma: no cover - depends on the install
        raise ImportError(
            "engine='ray' needs Ray: pip install 'fedmcmc[ray]' (ray==2.60.0)"
        ) from error
    return ray


# what the active ray_session calls use, innermost last (info["ray_authentication"], ...)
_ACTIVE_SESSIONS: List[Dict[str, str]] = []


def session_authentication() -> Dict[str, str]:
    """The innermost active :func:`ray_session`'s entries for ``result.info``.

    Keys: ``ray_authentication`` (``"token"``, ``"disabled (allowed by user)"`` or
    ``"not verified (allowed by user)"``) and ``ray_instance`` (``"started"``: a local
    instance on loopback started for this run; ``"joined"``). Empty outside a session.
    """
    return dict(_ACTIVE_SESSIONS[-1]) if _ACTIVE_SESSIONS else {}


def record_ray_authentication(result):
    """Add :func:`session_authentication` to ``result.info`` (if it has one); returns ``result``."""
    info = getattr(result, "info", None)
    if isinstance(info, dict):
        info.update(session_authentication())
    return result


@contextlib.contextmanager
def ray_session(address: Optional[str] = None, init_options: Optional[Dict[str, Any]] = None,
                allow_unauthenticated_cluster: bool = False):
    """Use the running Ray instance, join ``address``, or start one on loopback; yields ``ray``.

    A started instance uses token authentication (:class:`LocalAuthentication`); a running
    or joined one is checked with :func:`check_cluster_authentication`. Shuts down only what
    it started (or joined) and then removes the per-instance token. A local instance it starts
    keeps its session files (logs, sockets) in a new temporary folder, removed after the
    shutdown, unless ``init_options`` names one (``_temp_dir``: kept). An error raised inside
    the session that carries a ``result`` (``ClientFailureError``,
    ``SamplingDivergedError``) gets the session's authentication in ``result.info``.
    """
    allow = check_allow_unauthenticated(allow_unauthenticated_cluster)
    if init_options is not None and "address" in init_options:
        raise ValueError(
            "ray_init_options must not contain 'address' (they apply to the local instance "
            "engine='ray' starts); pass ray_address=... to join a cluster"
        )
    ray = import_ray()
    local: Optional[LocalAuthentication] = None
    driver_environment = AuthEnvironment()
    started = False
    session_files: Optional[str] = None  # the started instance's folder, removed at the end
    try:
        if not ray.is_initialized():
            options: Dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if address is None:
                local = LocalAuthentication(allow).enter()
                options.update(address="local", _node_ip_address=LOOPBACK)
                options.update(init_options or {})
                if "_temp_dir" not in options:
                    # Ray's default, /tmp/ray/session_*, is never cleaned up
                    session_files = tempfile.mkdtemp(prefix="fedmcmc-ray-")
                    options["_temp_dir"] = session_files
            else:
                options.update(address=address)
            try:
                ray.init(**options)
            except ConnectionError as error:
                if address is None or authentication_mode() == TOKEN:
                    raise
                raise ConnectionError(
                    f"{error} (this process runs Ray without token authentication; if the "
                    "cluster uses it, set RAY_AUTH_MODE=token and the cluster's token "
                    "(RAY_AUTH_TOKEN_PATH=<file> or RAY_AUTH_TOKEN) in this process's "
                    "environment before Ray is imported)"
                ) from error
            started = True
        if local is not None:
            status = {"ray_authentication": local.mode, "ray_instance": "started"}
        else:
            status = {"ray_authentication": check_cluster_authentication(ray, allow, address),
                      "ray_instance": "joined"}
            if status["ray_authentication"] == DISABLED_ALLOWED and authentication_mode() == TOKEN:
                # A driver in token mode rejects the unauthenticated cluster's calls back to
                # it (fetching actor arguments it owns), so the actors die (measured): the
                # driver must run without token authentication too.
                if not started:
                    raise UnauthenticatedClusterError(
                        "this process runs Ray with RAY_AUTH_MODE=token but the cluster it is "
                        "connected to runs without token authentication, and Ray cannot run "
                        "actors across that mismatch. " + ENABLE_TOKEN_AUTHENTICATION
                        + " Or call ray.init with RAY_AUTH_MODE=disabled in this process's "
                        "environment, or let fm.sample connect (ray_address=...)."
                    )
                ray.shutdown()
                started = False
                driver_environment.set(RAY_AUTH_MODE="disabled")
                ray.init(**options)
                started = True
        _ACTIVE_SESSIONS.append(status)
        try:
            yield ray
        except BaseException as error:
            record_ray_authentication(getattr(error, "result", None))
            raise
        finally:
            _ACTIVE_SESSIONS.pop()
    finally:
        if started:
            ray.shutdown()
        if session_files is not None:
            shutil.rmtree(session_files, ignore_errors=True)
        driver_environment.restore()
        if local is not None:
            local.exit()
