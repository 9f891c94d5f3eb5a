"""Throwaway TLS certificates and SuperNode keys for the loopback deployment test.

    python throwaway_keys.py FOLDER NODES

writes into FOLDER: ``ca.crt`` and ``server.crt``/``server.key`` (a CA and the SuperLink's
certificate for 127.0.0.1 and localhost, valid one day), and ``node<k>`` / ``node<k>.pub``
(each SuperNode's ECDSA key pair, the public key in OpenSSH format as ``flwr supernode
register`` reads it). For a test on one machine only: a real deployment makes its
certificates as docs/engines.md shows and keeps each node's private key on its site.
"""

from __future__ import annotations

import datetime
import ipaddress
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

PEM = serialization.Encoding.PEM
NO_PASSWORD = serialization.NoEncryption()


def _certificate(subject: str, key, issuer: str, signer, ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(signer, hashes.SHA256())


def _private(key) -> bytes:
    return key.private_bytes(PEM, serialization.PrivateFormat.PKCS8, NO_PASSWORD)


def main(folder: Path, nodes: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = _certificate("fedkit-test-ca", ca_key, "fedkit-test-ca", ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP384R1())
    server = _certificate("localhost", server_key, "fedkit-test-ca", ca_key, ca=False)
    (folder / "ca.crt").write_bytes(ca.public_bytes(PEM))
    (folder / "server.crt").write_bytes(server.public_bytes(PEM))
    (folder / "server.key").write_bytes(_private(server_key))
    for k in range(nodes):
        key = ec.generate_private_key(ec.SECP384R1())
        (folder / f"node{k}").write_bytes(
            key.private_bytes(PEM, serialization.PrivateFormat.OpenSSH, NO_PASSWORD)
        )
        public = key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        (folder / f"node{k}.pub").write_bytes(public + b"\n")
    for path in folder.iterdir():
        path.chmod(0o600)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
