"""``engine="flower"`` with TLS and SuperNode authentication (issue 46), on loopback: a
SuperLink started with a self-signed certificate and ``--enable-supernode-auth``; a site whose
public key is not registered is refused (the run finds no SuperNode), and once the key is
registered (Control API ``RegisterNode``, what ``flwr supernode register`` sends) the same
site joins and DSGLD gives the local engine's draws. Bounded in time; every process is ended.
"""

import os
import time

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("flwr", reason="engine='flower' needs flwr (pip install 'fedmcmc[flower]')")

import fedmcmc as fm  # noqa: E402
from fedmcmc.engines.flower_site import (flower_program, free_port, site_command,  # noqa: E402
                                          start_child, wait_for_port)

from certificates import openssl_certificate  # noqa: E402
from flower_processes import flower_processes  # noqa: E402
from toy_problems import GAUSSIAN_MODEL, gaussian_federation  # noqa: E402

pytestmark = pytest.mark.slow

RUN = dict(init=jnp.zeros(2), num_samples=12, burn_in=0, thin=5, chains=1, seed=7,
           progress=False)


def _site_keys(directory):
    """A site's EC (P-384) key pair in OpenSSH format, as ``ssh-keygen -t ecdsa -b 384``
    writes it; returns (private key path, public key bytes)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    path = os.path.join(directory, "site.key")
    with open(path, "wb") as handle:
        handle.write(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.OpenSSH,
                                       serialization.NoEncryption()))
    return path, key.public_key()


def _register(address, certificate, public_key):
    from flwr.proto.control_pb2 import RegisterNodeRequest
    from flwr.supercore.control.control_http_client import ControlHttpClient
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    with open(certificate, "rb") as handle:
        ca = handle.read()
    client = ControlHttpClient.from_server_address(
        address, False, ca, [RuntimeVersionHttpInterceptor(component_name="flwr CLI")])
    try:
        return client.RegisterNode(RegisterNodeRequest(public_key=public_key_to_bytes(public_key)))
    finally:
        client.close()


def test_unregistered_site_is_refused_and_a_registered_one_runs(tmp_path):
    certificate, key = openssl_certificate(str(tmp_path), "superlink")
    port = free_port()
    address = f"127.0.0.1:{port}"
    processes = []
    try:
        processes.append(start_child(
            [flower_program("flower-superlink"), "--isolation", "process", "--host",
             "127.0.0.1", "--port", str(port), "--ssl-ca-certfile", certificate,
             "--ssl-certfile", certificate, "--ssl-keyfile", key, "--enable-supernode-auth",
             "--disable-runtime-dependency-installation"], str(tmp_path / "superlink.log")))
        wait_for_port("127.0.0.1", port, 600.0, processes[0], "flower-superlink")
        private_key, public_key = _site_keys(str(tmp_path))
        site = site_command(address, "0", root_certificates=certificate,
                            private_key=private_key)
        processes.append(start_child(site, str(tmp_path / "site_refused.log")))
        federation = fm.Federation(gaussian_federation().clients[:1])
        algorithm = fm.DSGLD(step_size=2e-3, batch_size=5, local_steps=10)
        options = dict(flower_address=address, flower_root_certificates=certificate,
                       visit_timeout=300.0)
        # not registered: the SuperLink refuses the SuperNode, so the run finds none
        with pytest.raises(TimeoutError, match="0 SuperNode"):
            fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="flower",
                      flower_connect_timeout=90.0, **options, **RUN)
        deadline = time.monotonic() + 120
        while processes[1].poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        assert processes[1].poll() not in (None, 0)  # the refused site ended
        # registered: the same site (its key) joins, and the draws are the local engine's
        assert _register(address, certificate, public_key).node_id
        processes.append(start_child(site, str(tmp_path / "site.log")))
        on_flower = fm.sample(GAUSSIAN_MODEL, federation, algorithm, engine="flower",
                              flower_connect_timeout=600.0, **options, **RUN)
        local = fm.sample(GAUSSIAN_MODEL, federation, algorithm, **RUN)
        np.testing.assert_allclose(on_flower.flat_samples(), local.flat_samples(), rtol=0,
                                   atol=1e-5)
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(15)
            except Exception:  # noqa: BLE001
                process.kill()
    deadline = time.monotonic() + 30
    while flower_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert flower_processes() == []
