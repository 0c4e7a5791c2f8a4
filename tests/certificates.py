"""Self-signed TLS certificates for the tests of Ray's TLS and of the TLS direct channels."""

from __future__ import annotations

import os
import subprocess


def openssl_certificate(directory: str, name: str) -> tuple:
    """A self-signed certificate (its own CA) and key for 127.0.0.1 and localhost, made with
    the openssl command; returns their paths ``(certificate, key)``."""
    cert, key = os.path.join(directory, f"{name}.crt"), os.path.join(directory, f"{name}.key")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-sha256", "-days", "1", "-nodes",
         "-keyout", key, "-out", cert, "-subj", f"/CN={name}",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=60)
    return cert, key
