"""Token authentication of the Ray instances engine="ray" starts or joins (issue 21).

Everything binds loopback (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` before Ray is imported,
``_node_ip_address="127.0.0.1"``), in Ray temp directories of its own, and shuts down what it
starts: the instance fedmcmc starts is held by a class-scoped fixture (one Ray start), the
unauthenticated cluster to join runs in a child process held by another (one more start);
every child process has a timeout. Processes that must fail to connect use
``RAY_NUM_REDIS_GET_RETRIES=3`` so that they give up after ~3 s instead of ~20 s.

What is checked (each claim of docs/security.md and the README's Ray section):
- the token fedmcmc generates is 256 random bits in a 0600 file in a 0700 directory that is
  removed, and the ``RAY_AUTH_*`` environment restored, at shutdown;
- Ray reports token authentication in the driver and inside the client actors of an
  ``fm.sample(engine="ray")`` run (recorded at trace time in the actor processes, matched by
  pid against ``info["client_locations"]``);
- a process without the token, or with another one, cannot connect (GCS answers
  ``Unauthenticated``) and so cannot submit work; with the token it can;
- a cluster without token authentication is refused by default -- also when the driver itself
  runs in token mode, which Ray lets connect to it silently -- and accepted with
  ``allow_unauthenticated_cluster=True``, recorded in ``info["ray_authentication"]``.
"""

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from certificates import openssl_certificate

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray", reason="engine='ray' needs ray (pip install 'fedmcmc[ray]')")

import jax.numpy as jnp  # noqa: E402

import fedmcmc as fm  # noqa: E402
from fedmcmc.engines.comm import ClientFailureError  # noqa: E402
from fedmcmc.engines.options import check_engine_options  # noqa: E402
from fedmcmc.engines.ray_security import (  # noqa: E402
    AUTH_ENV_VARS,
    LocalAuthentication,
    UnauthenticatedClusterError,
    authentication_mode,
    ray_session,
    refresh_ray_authentication_config,
    session_authentication,
)

# its runs start Ray instances of their own (conftest: the shared one is shut down first)
pytestmark = pytest.mark.own_ray

CHILD_TIMEOUT = 120  # seconds any child process may take
RUN_OPTIONS = dict(visit_timeout=120.0)
FAST_FAIL = {"RAY_NUM_REDIS_GET_RETRIES": "3"}


def _short_temp_dir():
    return tempfile.mkdtemp(prefix="fmauth", dir="/tmp")  # Ray's AF_UNIX paths: < 108 bytes


def _env_without_auth(**extra):
    env = {k: v for k, v in os.environ.items() if k not in AUTH_ENV_VARS}
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    env.update(extra)
    return env


class _AuthEnvironment:
    """Save the RAY_AUTH_* variables, clear them, and put them back (with Ray's caches)."""

    def __init__(self):
        self.saved = {name: os.environ.get(name) for name in AUTH_ENV_VARS}

    def clear(self, **values):
        for name in AUTH_ENV_VARS:
            os.environ.pop(name, None)
        os.environ.update(values)
        refresh_ray_authentication_config()

    def restore(self):
        for name, value in self.saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        refresh_ray_authentication_config()


@pytest.fixture
def no_auth_env():
    environment = _AuthEnvironment()
    environment.clear()
    yield environment
    environment.restore()


# --------------------------------------------------------------------- a small problem

DIM = 2


def _federation(num_clients=2):
    rng = np.random.default_rng(0)
    return fm.Federation([rng.normal(1.0, 1.0, (12 + 8 * s, DIM)).astype(np.float32)
                          for s in range(num_clients)])


def _gaussian_model():
    return fm.Model(log_prior=lambda theta: -0.5 * jnp.sum(theta ** 2) / 100.0,
                    log_likelihood=lambda theta, row: -0.5 * jnp.sum((row - theta) ** 2))


def _recording_model(record_path):
    """A Gaussian-mean model whose log-likelihood, when traced, appends to ``record_path``
    the pid of the tracing process, the authentication mode Ray reports there and its
    RAY_AUTH_TOKEN_PATH. Client actors trace it when they compile their visit."""

    def log_prior(theta):
        return -0.5 * jnp.sum(theta ** 2) / 100.0

    def log_likelihood(theta, row):
        from fedmcmc.engines.ray_security import authentication_mode as mode

        line = f"{os.getpid()} {mode()} {os.environ.get('RAY_AUTH_TOKEN_PATH', '-')}\n"
        with open(record_path, "a") as handle:
            handle.write(line)
        return -0.5 * jnp.sum((row - theta) ** 2)

    return fm.Model(log_prior=log_prior, log_likelihood=log_likelihood)


def _dsgld_run(model, **options):
    return fm.sample(model, _federation(), fm.DSGLD(step_size=1e-3, batch_size=4, local_steps=5),
                     init=jnp.zeros(DIM), num_samples=4, burn_in=0, thin=5, chains=1, seed=0,
                     engine="ray", **RUN_OPTIONS, **options)


def _recorded(record_path):
    """pid -> set of (mode, token path) recorded by the processes that traced the model."""
    out = {}
    with open(record_path) as handle:
        for line in handle:
            pid, mode, path = line.split()
            out.setdefault(int(pid), set()).add((mode, path))
    return out


# --------------------------------------------------------------------- no Ray processes

def test_local_authentication_writes_a_private_token_and_removes_it(no_auth_env):
    local = LocalAuthentication().enter()
    try:
        directory = os.path.dirname(local.token_path)
        assert local.mode == "token" and local.token_source == "per-instance"
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(local.token_path).st_mode) == 0o600
        with open(local.token_path) as handle:
            token = handle.read()
        assert len(token) == 64 and int(token, 16) >= 0  # 256 bits, hex
        assert os.environ["RAY_AUTH_MODE"] == "token"
        assert os.environ["RAY_AUTH_TOKEN_PATH"] == local.token_path
        assert authentication_mode() == "token"  # Ray's cached configuration was refreshed
    finally:
        local.exit()
    assert not os.path.exists(directory)
    assert all(name not in os.environ for name in AUTH_ENV_VARS)
    assert authentication_mode() == "disabled"
    # two instances never share a token
    first, second = LocalAuthentication().enter(), None
    try:
        first_token = open(first.token_path).read()
        first.exit()
        second = LocalAuthentication().enter()
        assert open(second.token_path).read() != first_token
    finally:
        first.exit()
        if second is not None:
            second.exit()


def test_a_token_the_user_set_is_used_and_left_alone(no_auth_env, tmp_path):
    path = tmp_path / "my_token"
    path.write_text("c" * 64)
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(path)
    local = LocalAuthentication().enter()
    try:
        assert local.token_source == "RAY_AUTH_TOKEN_PATH" and local.token_path is None
        assert os.environ["RAY_AUTH_TOKEN_PATH"] == str(path)
        assert os.environ["RAY_AUTH_MODE"] == "token"
    finally:
        local.exit()
    assert os.environ["RAY_AUTH_TOKEN_PATH"] == str(path) and path.exists()
    assert "RAY_AUTH_MODE" not in os.environ


def test_ray_auth_mode_disabled_is_refused_for_the_local_instance_unless_allowed(no_auth_env):
    os.environ["RAY_AUTH_MODE"] = "disabled"
    with pytest.raises(UnauthenticatedClusterError, match="allow_unauthenticated_cluster=True"):
        LocalAuthentication().enter()
    local = LocalAuthentication(allow_unauthenticated_cluster=True).enter()
    assert local.mode == "disabled (allowed by user)" and local.token_path is None
    local.exit()
    assert os.environ["RAY_AUTH_MODE"] == "disabled"


def test_allow_unauthenticated_cluster_is_an_engine_option_and_must_be_a_bool():
    assert check_engine_options({"allow_unauthenticated_cluster": True}, "DSGLD") == {
        "allow_unauthenticated_cluster": True, "on_client_failure": "stop"}
    assert issubclass(UnauthenticatedClusterError, RuntimeError)
    with pytest.raises(ValueError, match="allow_unauthenticated_cluster"):
        with ray_session(allow_unauthenticated_cluster="yes"):
            pass
    # through fm.sample: refused before any Ray process starts
    with pytest.raises(ValueError, match="allow_unauthenticated_cluster"):
        _dsgld_run(_recording_model(os.devnull), allow_unauthenticated_cluster=1)
    with pytest.raises(ValueError, match="ray_address"):
        with ray_session(init_options={"address": "127.0.0.1:6379"}):
            pass
    assert not ray.is_initialized()


# --------------------------------------------------------------------- the instance fedmcmc starts

CLIENT = r"""
import os, sys
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
import ray
address, marker = sys.argv[1], sys.argv[2]
try:
    ray.init(address=address, log_to_driver=False, include_dashboard=False)
except Exception as error:
    print("CONNECT FAILED", type(error).__name__)
    sys.exit(3)

@ray.remote(num_cpus=0)
def write_marker(path):
    with open(path, "w") as handle:
        handle.write(str(os.getpid()))
    return os.getpid()

print("TASK RAN", ray.get(write_marker.remote(marker), timeout=60))
ray.shutdown()
"""


def _client(address, marker, env):
    return subprocess.run([sys.executable, "-c", CLIENT, address, marker], env=env,
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT)


class TestStartedInstance:
    """One local instance started by ray_session() (what engine='ray' does without a cluster)."""

    @pytest.fixture(scope="class")
    def started(self):
        if ray.is_initialized():
            ray.shutdown()
        environment = _AuthEnvironment()
        environment.clear()
        temp_dir = _short_temp_dir()
        session = ray_session(init_options={"num_cpus": 2, "_temp_dir": temp_dir})
        try:
            session.__enter__()
            state = dict(token_path=os.environ["RAY_AUTH_TOKEN_PATH"],
                         address=ray.get_runtime_context().gcs_address,
                         status=session_authentication(), temp_dir=temp_dir)
            yield state
        finally:
            session.__exit__(None, None, None)
            environment_after = {name: os.environ.get(name) for name in AUTH_ENV_VARS}
            environment.restore()
            shutil.rmtree(temp_dir, ignore_errors=True)
        assert not ray.is_initialized()
        assert environment_after == {name: None for name in AUTH_ENV_VARS}
        assert not os.path.exists(os.path.dirname(state["token_path"]))

    def test_the_started_instance_runs_with_a_per_instance_token(self, started):
        assert started["status"] == {"ray_authentication": "token", "ray_instance": "started"}
        assert authentication_mode() == "token"
        assert os.path.basename(os.path.dirname(started["token_path"])).startswith(
            "fedmcmc-ray-auth-")
        assert started["address"].startswith("127.0.0.1:")

    def test_client_actors_of_fm_sample_report_token_authentication(self, started, tmp_path):
        record = str(tmp_path / "traced")
        result = _dsgld_run(_recording_model(record))
        assert result.info["ray_authentication"] == "token"
        assert result.info["ray_instance"] == "joined"  # the instance the fixture holds
        assert np.isfinite(result.flat_samples()).all()
        recorded = _recorded(record)
        client_pids = [where["pid"] for where in result.info["client_locations"]]
        assert len(set(client_pids)) == 2 and os.getpid() not in client_pids
        for pid in client_pids:
            assert recorded.get(pid) == {("token", started["token_path"])}, (pid, recorded)

    @pytest.mark.parametrize("auth_env", [
        {},  # no token at all (RAY_AUTH_MODE unset)
        {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0123456789abcdef" * 4},  # another token
    ], ids=["no-token", "wrong-token"])
    def test_a_process_without_the_token_cannot_connect_or_submit_work(self, started, tmp_path,
                                                                         auth_env):
        marker = tmp_path / "marker"
        out = _client(started["address"], str(marker), _env_without_auth(**auth_env, **FAST_FAIL))
        assert out.returncode == 3, (out.stdout, out.stderr[-2000:])
        assert "CONNECT FAILED" in out.stdout
        assert "Unauthenticated" in out.stderr, out.stderr[-2000:]
        assert not marker.exists()

    def test_a_process_with_the_token_can_submit_work(self, started, tmp_path):
        marker = tmp_path / "marker"
        env = _env_without_auth(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=started["token_path"])
        out = _client(started["address"], str(marker), env)
        assert out.returncode == 0, (out.stdout, out.stderr[-2000:])
        assert "TASK RAN" in out.stdout and marker.exists()

    @pytest.mark.slow
    def test_every_ray_protocol_records_the_authentication(self, started):
        """Neighbour exchange (DULA), broadcast (Fed Zig-Zag) and a hand-off run that stops
        on a failed client (the error's partial result) all record it."""
        model, federation = _gaussian_model(), _federation(3)
        expected = {"ray_authentication": "token", "ray_instance": "joined"}
        dula = fm.sample(model, federation, fm.DULA(step_size=1e-3, beta=0.3), init=jnp.zeros(DIM),
                         num_samples=10, thin=2, chains=2, seed=1, engine="ray", **RUN_OPTIONS)
        zigzag = fm.sample(model, federation, fm.FedZigZag(sample_interval=0.5),
                           init=np.zeros(DIM, np.float32), num_samples=10, chains=2, seed=1,
                           engine="ray", progress=False, **RUN_OPTIONS)
        with pytest.raises(ClientFailureError) as failure:
            _dsgld_run(model, fault_injection={"client": 1, "after_visits": 0, "kind": "exit"})
        for info in (dula.info, zigzag.info, failure.value.result.info):
            assert {key: info.get(key) for key in expected} == expected


# --------------------------------------------------------------------- joining a cluster without auth

HOLD_UNAUTHENTICATED = r"""
import os, sys
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_AUTH_MODE"] = "disabled"
import ray
ray.init(address="local", include_dashboard=False, num_cpus=2, _node_ip_address="127.0.0.1",
         _temp_dir=sys.argv[1], log_to_driver=False)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()  # until the test closes stdin
ray.shutdown()
"""


class TestUnauthenticatedCluster:
    """A cluster started with RAY_AUTH_MODE=disabled in a child process, joined from here."""

    @pytest.fixture(scope="class")
    def unauthenticated(self):
        if ray.is_initialized():
            ray.shutdown()
        temp_dir = _short_temp_dir()
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD_UNAUTHENTICATED, temp_dir], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=_env_without_auth())
        environment = _AuthEnvironment()
        try:
            address = holder.stdout.readline().strip()
            assert address.startswith("127.0.0.1:"), address
            # the driver believes it is safe: token mode, with a token of its own
            environment.clear(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="fedcba9876543210" * 4)
            yield address
        finally:
            if ray.is_initialized():
                ray.shutdown()
            environment.restore()
            holder.stdin.close()
            try:
                holder.wait(timeout=CHILD_TIMEOUT)
            except subprocess.TimeoutExpired:
                holder.kill()
                holder.wait()
            shutil.rmtree(temp_dir, ignore_errors=True)

    def test_joining_is_refused_by_default(self, unauthenticated):
        with pytest.raises(UnauthenticatedClusterError) as error:
            _dsgld_run(_recording_model(os.devnull), ray_address=unauthenticated)
        message = str(error.value)
        assert "RAY_AUTH_MODE=token" in message and "allow_unauthenticated_cluster" in message
        assert not ray.is_initialized()  # the session left the cluster it joined

    def test_a_prior_ray_init_is_checked_too(self, unauthenticated):
        ray.init(address=unauthenticated, log_to_driver=False)
        try:
            with pytest.raises(UnauthenticatedClusterError, match="without token auth"):
                with ray_session():
                    pass
            assert ray.is_initialized()  # not ours to shut down
            # allowed, but this driver runs in token mode: Ray's actors would die (their
            # calls back to the driver are rejected), so it says so instead
            with pytest.raises(UnauthenticatedClusterError, match="mismatch"):
                with ray_session(allow_unauthenticated_cluster=True):
                    pass
        finally:
            ray.shutdown()

    def test_the_opt_out_runs_and_is_recorded(self, unauthenticated, tmp_path):
        # fm.sample connects, finds the cluster unauthenticated, and reconnects this driver
        # without token authentication for the run (then puts RAY_AUTH_MODE back)
        result = _dsgld_run(_recording_model(str(tmp_path / "traced")),
                            ray_address=unauthenticated, allow_unauthenticated_cluster=True)
        assert result.info["ray_authentication"] == "disabled (allowed by user)"
        assert result.info["ray_instance"] == "joined"
        assert os.environ["RAY_AUTH_MODE"] == "token" and authentication_mode() == "token"
        assert not ray.is_initialized()
        assert np.isfinite(result.flat_samples()).all()
        recorded = _recorded(str(tmp_path / "traced"))
        for where in result.info["client_locations"]:
            assert {mode for mode, _ in recorded[where["pid"]]} == {"disabled"}


# --------------------------------------------------------------------- slow: more Ray starts

@pytest.mark.slow
def test_fm_sample_starts_an_authenticated_instance_and_removes_its_token(no_auth_env, tmp_path):
    if ray.is_initialized():
        ray.shutdown()
    record = str(tmp_path / "traced")
    temp_dir = _short_temp_dir()
    try:
        result = _dsgld_run(_recording_model(record),
                            ray_init_options={"num_cpus": 2, "_temp_dir": temp_dir})
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert result.info["ray_authentication"] == "token"
    assert result.info["ray_instance"] == "started"
    recorded = _recorded(record)
    token_paths = set()
    for where in result.info["client_locations"]:
        modes = recorded[where["pid"]]
        assert {mode for mode, _ in modes} == {"token"}
        token_paths |= {path for _, path in modes}
    (token_path,) = token_paths
    assert os.path.basename(os.path.dirname(token_path)).startswith("fedmcmc-ray-auth-")
    assert not os.path.exists(os.path.dirname(token_path))  # removed at shutdown
    assert not ray.is_initialized()
    assert all(name not in os.environ for name in AUTH_ENV_VARS)


@pytest.mark.slow
def test_joining_a_token_authenticated_multi_node_cluster(tmp_path):
    """The README's recipe on loopback: head + one node per client, all with
    RAY_AUTH_MODE=token and one token file; fm.sample joins it (every node is checked)."""
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    token_path = tmp_path / "cluster_token"
    token_path.write_text("5a" * 32)
    token_path.chmod(0o600)
    environment = _AuthEnvironment()
    environment.clear(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_path))
    temp_dir = _short_temp_dir()
    previous_tmpdir = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp_dir  # cluster_utils writes its address file in ./ray
    os.makedirs(os.path.join(temp_dir, "ray"))
    cluster = None
    try:
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False,
            "temp_dir": temp_dir})
        for s in range(2):
            cluster.add_node(num_cpus=1, resources={f"client_{s}": 1},
                             node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        result = _dsgld_run(_gaussian_model(), ray_address=cluster.address,
                            client_resources=[{f"client_{s}": 1} for s in range(2)])
        assert result.info["ray_authentication"] == "token"
        assert result.info["ray_instance"] == "joined"
        # a process without the token cannot join it
        out = _client(cluster.address, str(tmp_path / "marker"), _env_without_auth(**FAST_FAIL))
        assert out.returncode == 3 and "Unauthenticated" in out.stderr, out.stderr[-2000:]
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        environment.restore()
        shutil.rmtree(temp_dir, ignore_errors=True)
        if previous_tmpdir is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = previous_tmpdir


HOLD_TLS = r"""
import os, sys
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
from fedmcmc.engines.ray_security import ray_session
with ray_session(init_options={"num_cpus": 1, "_temp_dir": sys.argv[1]}) as ray:
    print(ray.get_runtime_context().gcs_address, os.environ["RAY_AUTH_TOKEN_PATH"], flush=True)
    sys.stdin.read()  # until the test closes stdin
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_instance_admits_only_clients_with_a_certificate_from_its_ca(tmp_path):
    """RAY_USE_TLS (docs/security.md): with token and TLS, a client without TLS, with another
    CA, or whose own certificate is not from the CA does not connect within 30 s and runs
    nothing; with the CA's certificate and the token it runs a task."""
    cert, key = openssl_certificate(str(tmp_path), "cluster")
    other_cert, other_key = openssl_certificate(str(tmp_path), "other")
    tls = {"RAY_USE_TLS": "1", "RAY_TLS_SERVER_CERT": cert, "RAY_TLS_SERVER_KEY": key,
           "RAY_TLS_CA_CERT": cert}
    temp_dir = _short_temp_dir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_TLS, temp_dir], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=_env_without_auth(**tls))
    try:
        address, token_path = holder.stdout.readline().split()
        token = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token_path}
        refused = {
            "no TLS": {},
            "another CA": {"RAY_USE_TLS": "1", "RAY_TLS_SERVER_CERT": other_cert,
                           "RAY_TLS_SERVER_KEY": other_key, "RAY_TLS_CA_CERT": other_cert},
            "own certificate not from the CA": {
                "RAY_USE_TLS": "1", "RAY_TLS_SERVER_CERT": other_cert,
                "RAY_TLS_SERVER_KEY": other_key, "RAY_TLS_CA_CERT": cert},
        }
        for name, extra in refused.items():
            marker = tmp_path / f"marker {name}"
            env = {k: v for k, v in _env_without_auth(**token, **FAST_FAIL).items()
                   if not k.startswith("RAY_TLS_") and k != "RAY_USE_TLS"}
            try:
                out = subprocess.run([sys.executable, "-c", CLIENT, address, str(marker)],
                                     env={**env, **extra}, capture_output=True, text=True,
                                     timeout=30)
                assert out.returncode == 3, (name, out.stdout, out.stderr[-2000:])
            except subprocess.TimeoutExpired:
                pass  # the handshake never completes: no connection (the child is killed)
            assert not marker.exists(), name
        marker = tmp_path / "marker with TLS"
        out = _client(address, str(marker), _env_without_auth(**token, **tls))
        assert out.returncode == 0 and marker.exists(), (out.stdout, out.stderr[-2000:])
    finally:
        holder.stdin.close()
        try:
            holder.wait(timeout=CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_a_started_instance_keeps_its_session_files_in_a_folder_removed_at_shutdown(no_auth_env):
    """Ray's default folder, /tmp/ray/session_*, is never cleaned up: an instance ray_session()
    starts without ``_temp_dir`` gets a temporary folder of its own, gone after the session."""
    if ray.is_initialized():
        ray.shutdown()
    with ray_session(init_options={"num_cpus": 1}):
        folder = ray._private.worker._global_node.get_temp_dir_path()
        assert os.path.isdir(folder)
        assert os.path.basename(folder).startswith("fedmcmc-ray-")
    assert not ray.is_initialized()
    assert not os.path.exists(folder)


TLS_RUN = r"""
import json, os, sys
import jax.numpy as jnp
import numpy as np
import fedmcmc as fm
from fedmcmc.engines.handoff import sample_protocol

rs = np.random.default_rng(0)
federation = fm.Federation([{"x": rs.normal(1.0, 1.0, size=(n, 2)).astype(np.float32)}
                            for n in (30, 50, 20)])
model = fm.Model(log_prior=lambda mu: -0.5 * jnp.sum(mu ** 2),
                 log_likelihood=lambda mu, ex: -0.5 * jnp.sum((ex["x"] - mu) ** 2))
protocol = fm.DSGLD(step_size=2e-3, batch_size=5, local_steps=10).handoff_protocol()
kw = dict(init=jnp.zeros(2), num_samples=20, burn_in=0, thin=5, chains=2, seed=3)
on_ray = sample_protocol(protocol, model, federation, engine="ray", visit_timeout=120.0,
                         ray_init_options={"num_cpus": 2, "_temp_dir": sys.argv[1]}, **kw)
local = sample_protocol(protocol, model, federation, engine="local", **kw)
print(json.dumps({
    "channels": on_ray.info.get("ray_direct_channels", 0),
    "actors": len(on_ray.info["ray_actors"]),
    "tls": on_ray.info.get("ray_channel_tls"),
    "failures": on_ray.info.get("ray_channel_failures", []),
    "authentication": on_ray.info.get("ray_authentication"),
    "largest_difference": float(np.max(np.abs(on_ray.flat_samples() - local.flat_samples()))),
}))
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_on_a_tls_instance_the_direct_channels_are_tls_and_give_the_same_draws(tmp_path):
    """With RAY_USE_TLS the engine's own instance speaks TLS, and the driver reaches every
    actor through a TLS direct channel made with the same files: no channel failure, and the
    draws of the in-process run of the same protocol."""
    cert, key = openssl_certificate(str(tmp_path), "cluster")
    tls = {"RAY_USE_TLS": "1", "RAY_TLS_SERVER_CERT": cert, "RAY_TLS_SERVER_KEY": key,
           "RAY_TLS_CA_CERT": cert}
    temp_dir = _short_temp_dir()
    try:
        out = subprocess.run([sys.executable, "-c", TLS_RUN, temp_dir],
                             env=_env_without_auth(**tls), capture_output=True, text=True,
                             timeout=4 * CHILD_TIMEOUT)
        assert out.returncode == 0, out.stderr[-3000:]
        figures = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    # one channel per actor (the default placement: 3 clients in 2 actors on 2 CPUs)
    assert figures["channels"] == figures["actors"] == 2 and figures["tls"] is True, figures
    assert figures["failures"] == [], figures
    assert figures["authentication"] == "token"
    assert figures["largest_difference"] <= 1e-5, figures
