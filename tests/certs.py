"""A throwaway self-signed TLS certificate for 127.0.0.1, for tests.

Made with the ``cryptography`` package when it is importable, else with the
``openssl`` command; :class:`NoCertificateTool` when neither is there.
"""

from __future__ import annotations

import datetime
import shutil
import subprocess
from pathlib import Path

__all__ = ["NoCertificateTool", "self_signed_certificate"]


class NoCertificateTool(RuntimeError):
    """Neither ``cryptography`` nor the ``openssl`` command is available."""


def self_signed_certificate(directory: Path, host: str = "127.0.0.1") -> tuple[Path, Path]:
    """Write ``cert.pem`` and ``key.pem`` (EC P-256, one day, IP SAN ``host``) into ``directory``.

    The certificate is its own CA: a client trusts it with
    ``ssl.create_default_context(cafile=cert)``.

    Returns:
        ``(certfile, keyfile)``.

    Raises:
        NoCertificateTool: no way to make one here.
    """
    certfile, keyfile = directory / "cert.pem", directory / "key.pem"
    try:
        _with_cryptography(certfile, keyfile, host)
    except ImportError:
        _with_openssl(certfile, keyfile, host)
    return certfile, keyfile


def _with_cryptography(certfile: Path, keyfile: Path, host: str) -> None:
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.timezone.utc)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def _with_openssl(certfile: Path, keyfile: Path, host: str) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise NoCertificateTool("neither the cryptography package nor the openssl command is available")
    command = [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    command += ["-keyout", str(keyfile), "-out", str(certfile), "-days", "1", "-subj", f"/CN={host}"]
    command += ["-addext", f"subjectAltName=IP:{host}", "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0"]
    command += ["-addext", "keyUsage=critical,digitalSignature,keyCertSign", "-addext", "extendedKeyUsage=serverAuth"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise NoCertificateTool(f"openssl req failed: {done.stderr.strip()}")
