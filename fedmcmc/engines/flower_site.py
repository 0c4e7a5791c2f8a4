"""The site side of ``engine="flower"``: what one organisation runs beside its data.

A site runs one command::

    python -m fedmcmc.engines.flower_site --superlink HOST:PORT --site NAME \\
        --root-certificates ca.pem --auth-supernode-private-key site.key \\
        [--data NAME=package.module:function]

It starts Flower's own ``flower-supernode`` (outbound connections only, to the SuperLink's
Fleet API) in ``--isolation process`` mode, with its node configuration ``site=NAME``, and
runs, in this long-lived process, the *task executor* of that SuperNode
(:class:`SiteWorker`): it claims each task the SuperNode creates for a message of the driver
(Flower's Runtime API, ``AcquireTask``, on loopback), reads the message, answers it and
reports the task done, as ``flwr-clientapp`` would -- but without starting a process per
message, so the client endpoints (``HandoffClient``, ``BroadcastClient``: their data, their
compiled programs) persist between messages, as in a Ray actor.

The messages (:func:`encode_request`) carry one pickled request each in a
:class:`flwr.app.ConfigRecord` (bytes): ``create`` builds a client endpoint from the
``(EndpointClass, args)`` the driver sends (its loader, ``Federation.from_loaders``, is
called here, in this process: no row leaves the site), ``call`` runs one of its methods
and replies with the return value, ``hello`` names the site. A site keeps the endpoints of
its last :data:`KEPT_RUNS` runs. Executing what the driver sends is what a ClientApp is
(Flower's FAB runs the server's code too): a site trusts the driver it lets in; TLS, SuperNode
authentication and a restricted port keep everyone else out
(docs/guide/deploying-across-organisations.md).

Data the site holds already: ``--data NAME=module:function`` registers a zero-argument
function of the site's own code; a federation names it with :class:`SiteData`
(``fm.Federation.from_loaders([SiteData("NAME"), ...])``) and the site calls its own
function: it never runs a loader it did not write.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["SiteData", "SiteWorker", "encode_request", "decode_reply", "PAYLOAD_KEY",
           "RECORD_KEY", "site_command", "main"]

#: the record and the key of the one bytes value every fedmcmc message carries
RECORD_KEY = "fedmcmc"
PAYLOAD_KEY = "payload"
#: the message type of every fedmcmc message (Flower's ``"query"`` kind)
MESSAGE_TYPE = "query"

#: how many runs' endpoints a site keeps (the most recent ones: concurrent runs)
KEPT_RUNS = 4

#: the data sources this site registered (``--data``), by name
_SITE_SOURCES: Dict[str, Any] = {}


class SiteData:
    """A loader that names data a site holds already: called on a site whose worker was
    started with ``--data NAME=module:function``, it calls that function of the site's own
    code; anywhere else it raises ``ValueError`` naming the data. Picklable (only the
    name travels)."""

    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            raise ValueError(f"SiteData name must be a non-empty string, got {name!r}")
        self.name = name

    def __call__(self):
        if self.name not in _SITE_SOURCES:
            raise ValueError(
                f"SiteData({self.name!r}): this process serves no data named {self.name!r} "
                f"(it serves {sorted(_SITE_SOURCES)}); a site registers it with "
                f"`python -m fedmcmc.engines.flower_site --data {self.name}=module:function`")
        return _SITE_SOURCES[self.name]()

    def __repr__(self):
        return f"SiteData({self.name!r})"


def register_data(spec: str) -> str:
    """``NAME=module:function``: register the site's function as :class:`SiteData` NAME."""
    name, sep, target = spec.partition("=")
    module, colon, function = target.partition(":")
    if not (sep and colon and name and module and function):
        raise ValueError(f"--data must be NAME=module:function, got {spec!r}")
    _SITE_SOURCES[name] = getattr(importlib.import_module(module), function)
    return name


def _dumps(value: Any) -> bytes:
    import cloudpickle

    return cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def encode_request(request: tuple):
    """A Flower :class:`~flwr.app.RecordDict` carrying ``request`` pickled."""
    from flwr.app import ConfigRecord, RecordDict

    return RecordDict({RECORD_KEY: ConfigRecord({PAYLOAD_KEY: _dumps(request)})})


def decode_reply(message) -> Tuple[str, Any]:
    """``("ok", value)`` or ``("error", reason)`` of a reply :class:`~flwr.app.Message`
    (a Flower error reply, e.g. the node went offline, is an ``"error"``)."""
    if message.has_error():
        error = message.error
        return "error", f"Flower error {error.code}: {error.reason}"
    return pickle.loads(message.content[RECORD_KEY][PAYLOAD_KEY])


class SiteWorker:
    """The executor of one SuperNode's tasks, in this long-lived process.

    ``runtime_address``: the SuperNode's Runtime API (``--host``/``--port`` of
    ``flower-supernode``, loopback); ``site``: the name this site answers ``hello`` with
    (default: the node configuration's ``site``). Endpoints live in :attr:`endpoints`,
    keyed by (run key, client index), between messages.
    """

    def __init__(self, runtime_address: str, *, insecure: bool = True,
                 root_certificates: Optional[bytes] = None,
                 superexec_auth_secret: Optional[bytes] = None, poll_interval: float = 0.05):
        from flwr.supercore.interceptors import (RuntimeVersionHttpInterceptor,
                                                 SuperExecAuthHttpInterceptor)
        from flwr.supercore.runtime import RuntimeHttpClient

        self.address = runtime_address
        self.insecure = bool(insecure)
        self.certificates = root_certificates
        self.poll_interval = float(poll_interval)
        interceptors = [RuntimeVersionHttpInterceptor(component_name="SuperExec")]
        if superexec_auth_secret:
            interceptors.append(SuperExecAuthHttpInterceptor(
                master_secret=superexec_auth_secret,
                protected_methods=frozenset({"/flwr.proto.Runtime/AcquireTask"})))
        self._executor = RuntimeHttpClient.from_server_address(
            server_address=runtime_address, insecure=self.insecure,
            root_certificates=root_certificates, interceptors=interceptors)
        self.endpoints: Dict[tuple, Any] = {}
        self.failed: Dict[tuple, str] = {}
        self.runs: List[str] = []  # the runs whose endpoints are kept, oldest first

    # -- one request
    def handle(self, request: tuple, node_config: Dict[str, Any]) -> Tuple[str, Any]:
        kind = request[0]
        if kind == "hello":
            return "ok", {"site": str(node_config.get("site", "")), "pid": os.getpid(),
                          "host": socket.gethostname()}
        if kind == "create":
            # the run-wide arguments came as interning.Interned: unpickled to the object this
            # process built from the same bytes before (its traced programs are reused)
            _, run_key, client, cls, args = request
            self._keep_run(run_key)
            try:
                self.endpoints[(run_key, client)] = cls(*args)
            except Exception as error:  # noqa: BLE001 - reported with every call to it
                self.failed[(run_key, client)] = f"{type(error).__name__}: {error}"
                return "error", self.failed[(run_key, client)]
            return "ok", None
        if kind == "call":
            _, run_key, client, method, args = request
            if (run_key, client) in self.failed:
                return "error", f"failed to start: {self.failed[(run_key, client)]}"
            endpoint = self.endpoints.get((run_key, client))
            if endpoint is None:
                return "error", f"client {client} has no endpoint on this site"
            try:
                return "ok", getattr(endpoint, method)(*args)
            except Exception as error:  # noqa: BLE001 - the driver's ClientFailure
                return "error", f"{type(error).__name__}: {error}"
        return "error", f"unknown request {kind!r}"

    def _keep_run(self, run_key: str) -> None:
        """A run's first ``create``: its endpoints are kept; those of the runs before the
        last :data:`KEPT_RUNS` are dropped (a message after its run ended could not be
        answered -- the SuperNode would wait for the reply for ever -- so no run sends one)."""
        if run_key in self.runs:
            return
        self.runs.append(run_key)
        for old in self.runs[:-KEPT_RUNS]:
            for table in (self.endpoints, self.failed):
                for key in [k for k in table if k[0] == old]:
                    del table[key]
        del self.runs[:-KEPT_RUNS]

    # -- one task of the SuperNode: what flwr-clientapp does, in this process
    def run_task(self, token: str) -> None:
        from flwr.app import ConfigRecord, Message, RecordDict
        from flwr.common.constant import SubStatus
        from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
        from flwr.supercore.interceptors import (RuntimeTokenHttpInterceptor,
                                                 RuntimeVersionHttpInterceptor)
        from flwr.supercore.runtime import RuntimeHttpClient
        from flwr.supernode.runtime.run_clientapp import (pull_task_input, push_message,
                                                          push_task_output)

        client = RuntimeHttpClient.from_server_address(
            server_address=self.address, insecure=self.insecure,
            root_certificates=self.certificates,
            interceptors=[RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                          RuntimeTokenHttpInterceptor(token)])
        heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
        heartbeat.start()
        context = None
        try:
            message, context, _run, _fab = pull_task_input(client)
            try:
                request = pickle.loads(message.content[RECORD_KEY][PAYLOAD_KEY])
                status, value = self.handle(request, dict(context.node_config))
            except Exception as error:  # noqa: BLE001 - an unreadable request
                status, value = "error", f"{type(error).__name__}: {error}"
            try:
                payload = _dumps((status, value))
            except Exception as error:  # noqa: BLE001 - an unpicklable reply
                payload = _dumps(("error", f"reply not picklable: {error}"))
            reply = Message(RecordDict({RECORD_KEY: ConfigRecord({PAYLOAD_KEY: payload})}),
                            reply_to=message)
            push_message(client, reply, context)
            push_task_output(client, context, SubStatus.COMPLETED, "")
        finally:
            if heartbeat.is_running:
                heartbeat.stop()
            client.close()

    def serve(self, stop_after: Optional[float] = None, stop_when=None) -> None:
        """Claim and run the SuperNode's tasks until the process ends, ``stop_when()`` is
        true (the SuperNode ended) or ``stop_after`` seconds have passed (tests)."""
        from flwr.proto.runtime_pb2 import AcquireTaskRequest

        deadline = None if stop_after is None else time.monotonic() + stop_after
        while deadline is None or time.monotonic() < deadline:
            if stop_when is not None and stop_when():
                return
            try:
                acquired = self._executor.AcquireTask(
                    AcquireTaskRequest(supported_task_types=["flwr-clientapp"]))
            except Exception:  # noqa: BLE001 - the SuperNode is restarting: try again
                time.sleep(0.5)
                continue
            if acquired.HasField("task") and acquired.token:
                try:
                    self.run_task(acquired.token)
                except Exception as error:  # noqa: BLE001 - one task's failure ends no site
                    print(f"fedmcmc site: a task failed: {type(error).__name__}: {error}",
                          file=sys.stderr, flush=True)
                continue
            time.sleep(self.poll_interval)


#: runs a command in a process that receives SIGTERM when the process that started it ends
#: (Linux ``PR_SET_PDEATHSIG``, kept across ``exec``), so that a killed parent leaves no
#: Flower process behind; set in a fresh interpreter, not in a forked child of this one
#: (``preexec_fn`` would fork a multithreaded JAX process)
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)\n"
    "except OSError:\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n")


#: Flower's own switches for the processes fedmcmc starts (and set before it imports flwr):
#: no telemetry and no update check, so nothing leaves a machine but the federation's messages
FLOWER_QUIET_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}


def quiet_flower_environment() -> None:
    """Set :data:`FLOWER_QUIET_ENV` in this process where the user has not set them (called
    before flwr is first imported by the engine or a site; ``import fedmcmc`` sets nothing)."""
    for name, value in FLOWER_QUIET_ENV.items():
        os.environ.setdefault(name, value)


def is_loopback(address: str) -> bool:
    """Whether ``HOST[:PORT]`` names this machine's loopback interface."""
    import ipaddress

    host = address.rsplit(":", 1)[0] if address.count(":") == 1 or "]" in address else address
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def start_child(command: Sequence[str], log_path: Optional[str] = None,
                env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    """``command`` as a child process that ends with this one (SIGTERM on Linux when this
    process ends, however it ends); its output to ``log_path`` (default: discarded). The child
    gets ``env`` (default: this process's environment) with :data:`FLOWER_QUIET_ENV` where
    ``env`` does not set those names."""
    output = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    launcher = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid())]
    if not sys.platform.startswith("linux"):
        launcher = []
    try:
        return subprocess.Popen(launcher + list(command), stdout=output,
                                env={**FLOWER_QUIET_ENV, **(os.environ if env is None else env)},
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    finally:
        if log_path:
            output.close()


def wait_for_port(host: str, port: int, timeout: float, process=None, what: str = "") -> None:
    """Wait until ``host:port`` accepts connections (``TimeoutError`` after ``timeout`` s,
    ``RuntimeError`` when ``process`` ended first)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            socket.create_connection((host, port), 0.5).close()
            return
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what or 'the process'} ended with code {process.returncode} "
                               f"before listening on {host}:{port}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what or 'nothing'} listening on {host}:{port} after "
                               f"{timeout:g} s")
        time.sleep(0.1)


def flower_program(name: str) -> str:
    """Flower's command ``name`` of this interpreter's environment (beside ``sys.executable``,
    where pip installs it), else as found on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), name)
    return beside if os.path.exists(beside) else name


def _security_flags(insecure: bool, root_certificates: Optional[str],
                    private_key: Optional[str]) -> list:
    """The TLS and SuperNode-authentication flags a site and its SuperNode take alike
    (``--insecure``, ``--root-certificates``, ``--auth-supernode-private-key``)."""
    flags = ["--insecure"] if insecure else []
    if root_certificates:
        flags += ["--root-certificates", root_certificates]
    if private_key:
        flags += ["--auth-supernode-private-key", private_key]
    return flags


def supernode_command(superlink: str, site: str, runtime_port: int, *, insecure: bool,
                      root_certificates: Optional[str] = None,
                      private_key: Optional[str] = None,
                      superexec_auth_secret_file: Optional[str] = None) -> list:
    """The ``flower-supernode`` command of a site: process isolation (this module executes
    its tasks), its Runtime API on loopback, ``site=NAME`` in its node configuration."""
    command = [flower_program("flower-supernode"), "--superlink", superlink,
               "--isolation", "process",
               "--host", "127.0.0.1", "--port", str(int(runtime_port)),
               "--node-config", f'site="{site}"']
    command += _security_flags(insecure, root_certificates, private_key)
    if superexec_auth_secret_file:
        command += ["--superexec-auth-secret-file", superexec_auth_secret_file]
    return command


def site_command(superlink: str, site: str, *, insecure: bool = False,
                 root_certificates: Optional[str] = None, private_key: Optional[str] = None,
                 runtime_port: Optional[int] = None, data: Sequence[str] = ()) -> list:
    """The command line of one site (this module as a script)."""
    command = [sys.executable, "-m", "fedmcmc.engines.flower_site", "--superlink", superlink,
               "--site", str(site)]
    command += _security_flags(insecure, root_certificates, private_key)
    if runtime_port is not None:
        command += ["--runtime-port", str(int(runtime_port))]
    for spec in data:
        command += ["--data", spec]
    return command


def free_port() -> int:
    """A TCP port of loopback that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fedmcmc.engines.flower_site",
        description="One site of a fedmcmc federation on Flower: a SuperNode and the "
                    "executor of its tasks, which keeps this site's data and client "
                    "endpoints in this process.")
    parser.add_argument("--superlink", required=True, help="the SuperLink's HOST:PORT")
    parser.add_argument("--site", required=True, help="this site's name (the driver's "
                        "flower_sites option maps clients to site names)")
    parser.add_argument("--insecure", action="store_true",
                        help="no TLS: only for a SuperLink on loopback (tests)")
    parser.add_argument("--root-certificates", help="CA certificate (PEM) of the SuperLink")
    parser.add_argument("--auth-supernode-private-key",
                        help="this site's private key (SuperNode authentication)")
    parser.add_argument("--runtime-port", type=int, default=None,
                        help="loopback port of the SuperNode's Runtime API (default: free)")
    parser.add_argument("--data", action="append", default=[],
                        help="NAME=module:function: data this site serves as SiteData(NAME)")
    parser.add_argument("--log", default=None, help="file for the SuperNode's output")
    args = parser.parse_args(argv)
    quiet_flower_environment()
    for spec in args.data:
        register_data(spec)
    if args.insecure and not is_loopback(args.superlink):
        parser.error("--insecure is refused for a SuperLink that is not on loopback: give "
                     "--root-certificates (TLS)")
    port = args.runtime_port or free_port()
    supernode = start_child(supernode_command(
        args.superlink, args.site, port, insecure=args.insecure,
        root_certificates=args.root_certificates,
        private_key=args.auth_supernode_private_key), args.log)

    def stop(*_, code: int = 0):
        with contextlib.suppress(Exception):
            supernode.terminate()
            supernode.wait(10)
        os._exit(code)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    code = 0
    try:
        wait_for_port("127.0.0.1", port, 600.0, supernode, "flower-supernode")
        # the SuperNode's Runtime API is on loopback, without TLS (nothing leaves the host);
        # a SuperNode that ends (refused by the SuperLink, say) ends the site
        SiteWorker(f"127.0.0.1:{port}", insecure=True).serve(
            stop_when=lambda: supernode.poll() is not None)
        print(f"flower-supernode ended with code {supernode.returncode}", file=sys.stderr)
        code = 1
    finally:
        stop(code=code)
    return code


if __name__ == "__main__":
    # run the package's own module (python -m loads this file a second time as __main__):
    # SiteData reads the sources registered there
    from fedmcmc.engines.flower_site import main as _main

    sys.exit(_main())
