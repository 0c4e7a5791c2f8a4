"""``engine="flower"``: client endpoints on Flower SuperNodes, one per site.

The driver (this process, running ``fm.sample``) is the Flower run's *ServerApp*: it
submits a run to the SuperLink (Control API ``StartRun``, with a small app bundle, FAB),
claims that run's ServerApp task itself (Runtime API ``AcquireTask``: the SuperLink runs
with ``--isolation process``, so no other process executes it) and then sends and receives
:class:`flwr.app.Message` s through Flower's :class:`~flwr.superlink.grid.HttpGrid`
(:class:`FlowerLink`). Each site runs ``python -m fedmcmc.engines.flower_site``: a stock
``flower-supernode`` and, in a long-lived process beside it, the executor of its tasks,
which holds the site's client endpoints (:mod:`fedmcmc.engines.flower_site`).
:class:`~fedmcmc.engines.flower_transport.FlowerTransport` carries the protocols' messages
(the same hand-off and broadcast protocols as the in-process and Ray engines), so the draws
equal the local engine's for the same seed.

Given no address, :func:`flower_transports` starts a SuperLink and one site per client as
subprocesses on loopback (:class:`LocalFlowerFederation`), without TLS -- acceptable only
because every socket is on 127.0.0.1 -- and ends them all after the run (also on errors, and
at interpreter exit; the children also receive SIGTERM when this process dies, on Linux).
Given ``flower_address``, it connects to a running SuperLink whose SuperNodes the sites
started; TLS is then required (``flower_root_certificates``) unless the address is loopback
or ``flower_insecure=True`` is passed.

Latency: Flower 1.42's SuperNode asks the SuperLink for messages every 3 s when idle and
checks for the reply to a message every 0.5 s (``flwr/supernode/start_client_internal.py``),
so one round trip costs about a second or more, against milliseconds on Ray
(``benchmarks/bench_flower.py`` measures it). The hand-off algorithms (SGLD, DSGLD, FSGLD)
and the broadcast baselines (FA-LD, QLSD, Consensus MC) amortise it over ``local_steps``;
Fed-PDMC (a message round per event) and the decentralised algorithms (a neighbour exchange
per iteration) are refused with a ``ValueError`` that points to ``engine="ray"``.

The engine is :class:`FlowerEngine` (``fm.FlowerEngine``), a
:class:`~fedmcmc.engines.engine.ProtocolEngine` carrying the patterns ``"handoff"`` and
``"broadcast"`` (an algorithm of another pattern is refused by ``fm.sample`` with
:class:`FlowerLatencyError`); ``fm.sample(..., engine="flower", **options)`` builds one from
the options below (``flower_<argument>`` sets its ``<argument>``; besides ``visit_timeout``,
``on_client_failure``, ``audit_messages``, ``fault_injection`` shared with Ray):

``flower_address``
    ``HOST:PORT`` of a running SuperLink (its HTTP API: Control, Runtime and Fleet share it
    in Flower 1.42). Default ``None``: a local federation on loopback.
``flower_root_certificates``
    Path of the CA certificate (PEM) that signed the SuperLink's TLS certificate.
``flower_insecure``
    ``True``: connect without TLS to a SuperLink that is not on loopback (refused otherwise).
``flower_superexec_auth_secret_file``
    The SuperLink's ``--superexec-auth-secret-file``, when it protects ``AcquireTask``.
``flower_sites``
    The site name of each client (default ``["0", "1", ...]``): client ``s`` runs on the
    SuperNode started with ``--site flower_sites[s]``.
``flower_connect_timeout``
    Seconds to wait for the SuperLink, the run's task and every site (default 600: a site
    starting on a loaded machine imports JAX and Flower).
``flower_log_dir``
    Local federation only: a folder for the SuperLink's and the sites' output (default: none).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import sys
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from ..algorithm import check_positive_float
from .engine import ProtocolEngine
from .flower_site import (flower_program, free_port, is_loopback, quiet_flower_environment,
                          site_command, start_child, wait_for_port)
from .options import FLOWER_ONLY_OPTIONS, RAY_ONLY_OPTIONS

__all__ = ["FlowerEngine", "flower_transports", "FlowerLink", "LocalFlowerFederation",
           "FLOWER_OPTIONS", "FlowerLatencyError", "latency_refusal", "FLOWER_ROUND_SECONDS",
           "import_flower"]

#: the options every message-passing engine takes (``ProtocolEngine``'s arguments)
SHARED_OPTIONS = ("visit_timeout", "on_client_failure", "audit_messages", "fault_injection")

#: ``fm.sample``'s keyword options of this engine (``engines.options.FLOWER_ONLY_OPTIONS``)
FLOWER_OPTIONS = FLOWER_ONLY_OPTIONS

#: the per-visit latency of Flower 1.42 on loopback (``info["mean_visit_seconds"]`` of DSGLD
#: with 3 sites and one chain, visits that compute in milliseconds), measured on the 2-core
#: development machine under load: 2.6 s, 3.1 s and 3.6 s by ``benchmarks/bench_flower.py
#: --quick``, 3.6 s and 4.0 s in the tests' runs (Ray: 1.4 ms; local: 0.9 ms). The number the
#: refusal of round-per-event algorithms quotes
FLOWER_ROUND_SECONDS = 3.0


class FlowerLatencyError(ValueError):
    """An algorithm that exchanges a message round per event or per iteration on Flower."""


def latency_refusal(name: str, needs: str) -> FlowerLatencyError:
    """The error refusing algorithm ``name``, too chatty for Flower's per-round latency:
    it needs ``needs`` (a description of ``fedmcmc.engines.engine.PATTERNS``)."""
    return FlowerLatencyError(
        f"engine='flower' is not available for {name}: it needs {needs}, and a Flower "
        f"1.42 round trip took about {FLOWER_ROUND_SECONDS:g} s on loopback (measured; the "
        "SuperNode polls the SuperLink every 3 s when idle and checks for replies every 0.5 s: "
        "benchmarks/bench_flower.py), so a run of thousands of rounds would take hours. "
        "Use engine='ray' (milliseconds per round) inside one trusted cluster, or a hand-off "
        "(DSGLD, FSGLD) or broadcast (FALD, QLSD, ConsensusMC) algorithm, which amortise the "
        "round over local_steps, across organisations")


def import_flower():
    """``flwr``, or an ``ImportError`` saying how to install it."""
    quiet_flower_environment()
    try:
        import flwr
    except ImportError:  # pragma: no cover - the extra is not installed
        raise ImportError("engine='flower' needs Flower: pip install 'fedmcmc[flower]' "
                          "(flwr==1.42.0)") from None
    return flwr


# ----------------------------------------------------------------------------- the app bundle

_FAB_PYPROJECT = b'''[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedmcmc-endpoints"
version = "1.0.0"
description = "fedmcmc client endpoints: executed by python -m fedmcmc.engines.flower_site"
license = "MIT"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedmcmc"

[tool.flwr.app.components]
serverapp = "fedmcmc_endpoints.apps:server"
clientapp = "fedmcmc_endpoints.apps:client"
'''

_FAB_APPS = b'''"""The app bundle of a fedmcmc run. Its messages are executed by the site's own
long-lived process (python -m fedmcmc.engines.flower_site: flower-supernode --isolation
process), and its ServerApp task by the fedmcmc driver; a SuperNode that runs this bundle
in Flower's own ClientApp process is misconfigured, and says so."""
from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp

server = ServerApp()
client = ClientApp()


@client.query()
def query(message, context):
    raise RuntimeError(
        "this SuperNode runs fedmcmc messages in a Flower ClientApp process; start the site "
        "with `python -m fedmcmc.engines.flower_site` (flower-supernode --isolation process)")
'''


def app_bundle() -> bytes:
    """The FAB every fedmcmc run submits (the same bytes every time: one hash)."""
    from flwr.cli.build import build_fab_from_files

    return build_fab_from_files({"pyproject.toml": _FAB_PYPROJECT,
                                 "fedmcmc_endpoints/__init__.py": b"",
                                 "fedmcmc_endpoints/apps.py": _FAB_APPS})[0]


# ----------------------------------------------------------------------------- the link

class FlowerLink:
    """This process as the ServerApp of one Flower run on the SuperLink at ``address``.

    ``StartRun`` (Control API) submits the run, ``AcquireTask`` (Runtime API) claims its
    ServerApp task, and :attr:`grid` (Flower's ``HttpGrid`` with the task's token) pushes
    and pulls the run's messages; a heartbeat keeps the task alive; :meth:`close` reports
    it completed. The SuperLink must run with ``--isolation process`` (no executor of its
    own takes the task)."""

    def __init__(self, address: str, *, insecure: bool, root_certificates: Optional[bytes],
                 superexec_auth_secret: Optional[bytes], timeout: float):
        import_flower()
        from flwr.common.serde import fab_to_proto, run_from_proto
        from flwr.proto.control_pb2 import StartRunRequest
        from flwr.proto.runtime_pb2 import AcquireTaskRequest, PullTaskInputRequest
        from flwr.supercore.control.control_http_client import ControlHttpClient
        from flwr.supercore.fab import Fab
        from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
        from flwr.supercore.interceptors import (RuntimeVersionHttpInterceptor,
                                                 SuperExecAuthHttpInterceptor)
        from flwr.supercore.runtime import RuntimeHttpClient
        from flwr.supercore.task_identity import TaskIdentity
        from flwr.superlink.grid import HttpGrid

        self.address = address
        deadline = time.monotonic() + timeout
        control = ControlHttpClient.from_server_address(
            address, insecure, root_certificates,
            [RuntimeVersionHttpInterceptor(component_name="flwr CLI")])
        try:
            fab = app_bundle()
            started = _retry(lambda: control.StartRun(StartRunRequest(
                fab=fab_to_proto(Fab(hashlib.sha256(fab).hexdigest(), fab, {})),
                federation="")), deadline, f"the SuperLink at {address}")
        finally:
            control.close()
        if not started.HasField("run_id"):
            raise RuntimeError(f"the SuperLink at {address} did not start a run: {started}")
        self.run_id = int(started.run_id)
        interceptors = [RuntimeVersionHttpInterceptor(component_name="SuperExec")]
        if superexec_auth_secret:
            interceptors.append(SuperExecAuthHttpInterceptor(
                master_secret=superexec_auth_secret,
                protected_methods=frozenset({"/flwr.proto.Runtime/AcquireTask"})))
        executor = RuntimeHttpClient.from_server_address(
            server_address=address, insecure=insecure, root_certificates=root_certificates,
            interceptors=interceptors)
        try:
            while True:
                acquired = executor.AcquireTask(
                    AcquireTaskRequest(supported_task_types=["flwr-serverapp"]))
                if acquired.HasField("task") and acquired.token:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"run {self.run_id}'s ServerApp task was not offered within "
                        f"{timeout:g} s: is the SuperLink at {address} started with "
                        "--isolation process (no other executor may take it)?")
                time.sleep(0.05)
        finally:
            executor.close()
        if int(acquired.task.run_id) != self.run_id:
            raise RuntimeError(
                f"the SuperLink at {address} offered the task of run {acquired.task.run_id}, "
                f"not of this run ({self.run_id}): it must serve fedmcmc runs only")
        self.grid = HttpGrid(runtime_api_address=address, insecure=insecure,
                             root_certificates=root_certificates, token=acquired.token)
        task_input = self.grid._runtime_client.PullTaskInput(PullTaskInputRequest())
        # the identity every Message this process creates is sent under (Flower's own
        # flwr-serverapp sets it the same way)
        TaskIdentity.task_id = task_input.task_id
        TaskIdentity.run_id = task_input.run.run_id
        TaskIdentity.node_id = task_input.context.node_id
        self.grid.set_run(run_from_proto(task_input.run))
        self._heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(self.grid._runtime_client))
        self._heartbeat.start()
        self._closed = False

    def node_ids(self) -> List[int]:
        return list(self.grid.get_node_ids())

    def close(self, failed: bool = False) -> None:
        """Report the run's ServerApp task finished and disconnect."""
        if self._closed:
            return
        self._closed = True
        from flwr.common.constant import SubStatus
        from flwr.proto.runtime_pb2 import PushTaskOutputRequest

        with contextlib.suppress(Exception):
            self.grid._retry_invoker.max_tries = 1
            self.grid._runtime_client.PushTaskOutput(PushTaskOutputRequest(
                sub_status=SubStatus.FAILED if failed else SubStatus.COMPLETED,
                details="fedmcmc run failed" if failed else ""))
        with contextlib.suppress(Exception):
            if self._heartbeat.is_running:
                self._heartbeat.stop()
        with contextlib.suppress(Exception):
            self.grid.close()


def _retry(call: Callable[[], Any], deadline: float, what: str):
    """``call()`` until it does not fail to connect (the SuperLink may still be starting)."""
    import httpx

    while True:
        try:
            return call()
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as error:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not reach {what}: {error}") from None
            time.sleep(0.2)


# ----------------------------------------------------------------------------- loopback

_LIVE_FEDERATIONS: "weakref.WeakSet[LocalFlowerFederation]" = weakref.WeakSet()


@atexit.register
def _end_live_federations() -> None:  # pragma: no cover - interpreter exit
    for federation in list(_LIVE_FEDERATIONS):
        federation.close()


class LocalFlowerFederation:
    """A SuperLink and ``num_sites`` sites (``flower_site``: a SuperNode and its executor),
    subprocesses on 127.0.0.1 without TLS (loopback only: for tests and for trying the
    engine on one machine). :meth:`close` ends them all (SIGTERM, then SIGKILL)."""

    def __init__(self, num_sites: int, log_dir: Optional[str] = None):
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_dir = log_dir
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
        self.processes: List[Any] = []
        self.sites: List[Any] = []
        _LIVE_FEDERATIONS.add(self)
        try:
            self.superlink = self._start(
                ["flower-superlink", "--insecure", "--isolation", "process",
                 "--host", "127.0.0.1", "--port", str(self.port),
                 "--disable-runtime-dependency-installation"], "superlink")
            for site in range(num_sites):
                self.sites.append(self._start(
                    site_command(self.address, str(site), insecure=True), f"site_{site}"))
        except BaseException:
            self.close()
            raise

    def _start(self, command: Sequence[str], name: str):
        log = os.path.join(self.log_dir, f"{name}.log") if self.log_dir else None
        if command[0].startswith("flower-"):
            command = [flower_program(command[0]), *command[1:]]
        # the sites import what this process can (the modules of its loaders and models,
        # as a local Ray instance's workers do): its sys.path
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in sys.path if p and os.path.isdir(p)))
        process = start_child(command, log, env)
        self.processes.append(process)
        return process

    def wait_ready(self, timeout: float) -> None:
        wait_for_port("127.0.0.1", self.port, timeout, self.superlink, "flower-superlink")

    def site_alive(self, site: int) -> bool:
        return self.sites[site].poll() is None

    def kill_site(self, site: int) -> None:
        """End site ``site``'s processes at once (SIGKILL of the executor: its SuperNode
        receives SIGTERM as its parent died), as in a crash."""
        with contextlib.suppress(Exception):
            self.sites[site].kill()
            self.sites[site].wait(10)

    def close(self) -> None:
        for process in self.processes:
            with contextlib.suppress(Exception):
                if process.poll() is None:
                    process.terminate()
        for process in self.processes:
            with contextlib.suppress(Exception):
                process.wait(10)
            with contextlib.suppress(Exception):
                if process.poll() is None:
                    process.kill()
                    process.wait(5)
        _LIVE_FEDERATIONS.discard(self)


# ----------------------------------------------------------------------------- the session

class FlowerSession:
    """One run's Flower resources: the local federation it started (if any) and the link;
    :meth:`make_transport` builds them when the number of clients is known."""

    def __init__(self, options: Dict[str, Any]):
        self.options = check_flower_options(options)  # FlowerEngine.engine_options()
        self.local: Optional[LocalFlowerFederation] = None
        self.link: Optional[FlowerLink] = None
        self.transport = None

    def make_transport(self, specs: Sequence[tuple]):
        from .flower_transport import FlowerTransport

        options = self.options
        timeout = options["flower_connect_timeout"]
        sites = options.get("flower_sites")
        if sites is None:
            sites = [str(s) for s in range(len(specs))]
        elif len(sites) != len(specs):
            raise ValueError(f"sites (flower_sites) must name one site per client "
                             f"({len(specs)}), got {len(sites)}")
        address = options.get("flower_address")
        if address is None:
            self.local = LocalFlowerFederation(len(specs), options.get("flower_log_dir"))
            self.local.wait_ready(timeout)
            address, insecure, certificates, secret = self.local.address, True, None, None
        else:
            insecure = options["flower_root_certificates"] is None
            certificates = (None if insecure else
                            _read(options["flower_root_certificates"],
                                  "flower_root_certificates"))
            secret_file = options.get("flower_superexec_auth_secret_file")
            secret = (_read(secret_file, "flower_superexec_auth_secret_file") if secret_file
                      else None)
        self.link = FlowerLink(address, insecure=insecure, root_certificates=certificates,
                               superexec_auth_secret=secret, timeout=timeout)
        self.transport = FlowerTransport(specs, self.link, sites=[str(s) for s in sites],
                                         timeout=timeout, local=self.local)
        return self.transport

    def close(self, failed: bool = False) -> None:
        try:
            if self.transport is not None:
                self.transport.close()
            if self.link is not None:
                self.link.close(failed)
        finally:
            if self.local is not None:
                self.local.close()


def _read(path: str, argument: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as error:
        raise ValueError(f"{argument}: cannot read {path!r} ({error})") from None


def check_flower_options(options: Dict[str, Any]) -> Dict[str, Any]:
    """The Flower options (``flower_*``) of ``options`` checked and with defaults: those of
    the :class:`FlowerEngine` they describe (``ValueError`` naming a bad one)."""
    flower = {k: options[k] for k in FLOWER_OPTIONS if k in options}
    return FlowerEngine.from_options(flower).flower_options()


@contextlib.contextmanager
def flower_transports(options: Dict[str, Any]) -> Iterator[Callable[[Sequence[tuple]], Any]]:
    """The Flower session of one run and, inside it, the ``make_transport(specs)`` a
    pattern's driver takes (the same shape as :func:`~fedmcmc.engines.ray_engine.ray_transports`):
    a :class:`~fedmcmc.engines.flower_transport.FlowerTransport` on the SuperLink at
    ``flower_address``, or on a local federation of one site per client that this context
    starts and ends."""
    session = FlowerSession(options)
    failed = True
    try:
        yield session.make_transport
        failed = False
    finally:
        session.close(failed)


# ----------------------------------------------------------------------------- the engine

#: ``fm.sample``'s keyword options of the Flower engine, by the :class:`FlowerEngine`
#: argument each sets (``flower_address`` is ``address``, ...)
RENAMED_OPTIONS = {option: option[len("flower_"):] for option in FLOWER_ONLY_OPTIONS}


class FlowerEngine(ProtocolEngine):
    """Client endpoints on Flower SuperNodes, one per site (this module's docstring: how a
    run reaches them). ``fm.sample(..., engine="flower", flower_address=..., ...)`` builds
    one from the keyword options ``flower_<argument>``.

    The hand-off and broadcast algorithms run on it (``patterns``); an algorithm whose
    message pattern needs a round per event or per iteration (Fed-PDMC, DULA, GT-DULA) is
    refused with :class:`FlowerLatencyError`, which quotes the measured round trip. Every
    bad value raises ``ValueError`` naming its argument; nothing of Flower is imported
    before a run.

    Parameters
    ----------
    address:
        ``HOST:PORT`` of a running SuperLink (its HTTP API). ``None`` (default): a local
        federation of one site per client on loopback, started and ended by each run.
    root_certificates:
        Path of the CA certificate (PEM) that signed the SuperLink's TLS certificate (with
        ``address`` only). Without it, a SuperLink that is not on loopback is refused
        unless ``insecure=True``.
    insecure:
        Connect without TLS to a SuperLink that is not on loopback (default False).
    superexec_auth_secret_file:
        The SuperLink's ``--superexec-auth-secret-file``, when it protects ``AcquireTask``.
    sites:
        The site name of each client (with ``address`` only; default ``"0", "1", ...``):
        client ``s`` runs on the SuperNode started with ``--site sites[s]``.
    connect_timeout:
        Seconds to wait for the SuperLink, the run's task and every site (default 600).
    log_dir:
        Local federation only: a folder for the SuperLink's and the sites' output.
    visit_timeout, on_client_failure, audit_messages, fault_injection:
        As for every message-passing engine (:class:`~fedmcmc.engines.engine.ProtocolEngine`).

    """

    label = "flower"
    renamed_options = RENAMED_OPTIONS
    loads_on_clients = True
    #: a round trip costs seconds: only the patterns that amortise it over local steps
    patterns = frozenset({"handoff", "broadcast"})

    def __init__(self, address: Optional[str] = None, *,
                 root_certificates: Optional[str] = None, insecure: bool = False,
                 superexec_auth_secret_file: Optional[str] = None,
                 sites: Optional[Sequence[Any]] = None, connect_timeout: float = 600.0,
                 log_dir: Optional[str] = None, visit_timeout: Optional[float] = None,
                 on_client_failure: str = "stop", audit_messages: bool = False,
                 fault_injection: Optional[dict] = None):
        super().__init__(visit_timeout=visit_timeout, on_client_failure=on_client_failure,
                         audit_messages=audit_messages, fault_injection=fault_injection)
        if address is not None and (not isinstance(address, str) or ":" not in address):
            raise ValueError(f"address must be 'HOST:PORT', got {address!r}")
        if not isinstance(insecure, bool):
            raise ValueError(f"insecure must be True or False, got {insecure!r}")
        for name, path in (("root_certificates", root_certificates),
                           ("superexec_auth_secret_file", superexec_auth_secret_file),
                           ("log_dir", log_dir)):
            if path is not None and not isinstance(path, (str, os.PathLike)):
                raise ValueError(f"{name} must be a path, got {path!r}")
        if root_certificates is not None and address is None:
            raise ValueError("root_certificates is for a running SuperLink (address); the "
                             "local federation runs on loopback")
        if address is not None and root_certificates is None and not (
                is_loopback(address) or insecure):
            raise ValueError(
                f"address={address!r} is not on loopback and no root_certificates were "
                "given: the connection would not be encrypted. Give the CA certificate of the "
                "SuperLink's TLS certificate, or insecure=True to accept an unencrypted "
                "connection")
        if sites is not None:
            if address is None:
                raise ValueError("sites names the sites of a running SuperLink (address); "
                                 "the local federation names its sites 0, 1, ...")
            if isinstance(sites, (str, bytes)) or not all(
                    isinstance(s, (str, int)) and not isinstance(s, bool) for s in sites):
                raise ValueError(f"sites must be a list of site names, got {sites!r}")
            sites = [str(s) for s in sites]
            if len(set(sites)) != len(sites):
                raise ValueError(f"sites must name distinct sites, got {sites!r}")
        if log_dir is not None and address is not None:
            raise ValueError("log_dir is for the local federation (no address): the sites of "
                             "a running SuperLink keep their own logs")
        self.address = address
        self.root_certificates = root_certificates
        self.insecure = insecure
        self.superexec_auth_secret_file = superexec_auth_secret_file
        self.sites = sites
        self.connect_timeout = check_positive_float(connect_timeout, "connect_timeout")
        self.log_dir = log_dir

    @classmethod
    def from_options(cls, options: Dict[str, Any]) -> "FlowerEngine":
        """The engine of ``fm.sample(..., engine="flower", **options)``: ``options`` holds
        the keyword options ``flower_<argument>`` and those of every message-passing engine
        (``visit_timeout``, ...); ``ValueError`` naming one of another engine."""
        for name in options:
            if name in RAY_ONLY_OPTIONS:
                raise ValueError(f"{name} is a Ray option; engine='flower' takes none")
            if name not in RENAMED_OPTIONS and name not in SHARED_OPTIONS:
                raise ValueError(f"{name} is not an option of engine='flower'")
        return cls(**{RENAMED_OPTIONS.get(k, k): v for k, v in options.items()})

    def flower_options(self) -> Dict[str, Any]:
        """This engine's Flower settings as the ``flower_*`` options :class:`FlowerSession`
        reads (defaults filled in)."""
        return {"flower_address": self.address,
                "flower_root_certificates": self.root_certificates,
                "flower_insecure": self.insecure,
                "flower_superexec_auth_secret_file": self.superexec_auth_secret_file,
                "flower_sites": self.sites,
                "flower_connect_timeout": self.connect_timeout,
                "flower_log_dir": self.log_dir}

    def engine_options(self) -> Dict[str, Any]:
        out = super().engine_options()
        out.update({k: v for k, v in self.flower_options().items() if v is not None})
        return out

    def pattern_refusal(self, name: str, needs: str) -> ValueError:
        return latency_refusal(name, needs)

    @contextlib.contextmanager
    def transports(self):
        with flower_transports(self.flower_options()) as make_transport:
            yield make_transport
