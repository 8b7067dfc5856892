"""`strata gateway --tls-cert/--tls-key`: HTTPS only, checked with the certificate as the
trust root; bad TLS files fail before the server starts. No broker is needed: /healthz
answers without one."""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from procs import free_port
from tests.support.gateway import REPO, stop_child
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A throw-away certificate for 127.0.0.1 and localhost, and its key (PEM files)."""
    cert, key = directory / "gateway.crt", directory / "gateway.key"
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
             "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out",
             str(cert)], check=True, capture_output=True, timeout=30)
        return cert, key
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(private.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(private, hashes.SHA256())
    )
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return cert, key


def gateway_args(port: int, *extra: str) -> list[str]:
    # Nothing listens on the bootstrap port: /healthz does not need a broker.
    return [sys.executable, "-m", "strata_tools.cli", "gateway", "--bootstrap",
            f"127.0.0.1:{free_port()}", "--port", str(port), "--no-auth",
            "--shutdown-grace-s", "2", "--log-level", "warning", *extra]


def test_tls_serves_https_only(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    port = free_port()
    process = subprocess.Popen(gateway_args(port, "--tls-cert", str(cert), "--tls-key", str(key)),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=str(REPO)),
                               start_new_session=True)
    trust = ssl.create_default_context(cafile=str(cert))
    try:
        def probe() -> int:
            if process.poll() is not None:
                raise AssertionError(f"gateway exited: {process.communicate()[1]}")
            try:
                return httpx.get(f"https://127.0.0.1:{port}/healthz", verify=trust,
                                 timeout=2).status_code
            except httpx.TransportError:
                return -1

        assert wait_for("HTTPS gateway up", probe, lambda s: s == 200, timeout=30) == 200
        with httpx.Client(verify=trust, timeout=5) as client:
            assert client.get(f"https://localhost:{port}/healthz").json() == {"status": "ok"}
        # Without the certificate as trust root the handshake fails ...
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"https://127.0.0.1:{port}/healthz", timeout=5)
        # ... and plain HTTP gets no HTTP answer (uvicorn drops the non-TLS bytes).
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
    finally:
        stop_child(process)


def test_bad_tls_files_fail_before_start(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    port = free_port()

    def fails(*extra: str) -> str:
        result = subprocess.run(gateway_args(port, *extra), capture_output=True, text=True,
                                env=env, timeout=30, stdin=subprocess.DEVNULL)
        assert result.returncode == 1, (result.stdout, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr
        return result.stderr

    missing = fails("--tls-cert", str(tmp_path / "nope.crt"), "--tls-key", str(key))
    assert "nope.crt" in missing and "cannot be read" in missing
    unreadable = tmp_path / "locked.key"
    unreadable.write_bytes(key.read_bytes())
    unreadable.chmod(0)
    if not os.access(unreadable, os.R_OK):  # root reads anything
        assert "cannot be read" in fails("--tls-cert", str(cert), "--tls-key", str(unreadable))
    garbage = tmp_path / "garbage.crt"
    garbage.write_text("not a certificate\n")
    assert "do not load" in fails("--tls-cert", str(garbage), "--tls-key", str(key))
    assert "--tls-key" in fails("--tls-cert", str(cert))
