"""A test certificate authority (trustme), for real TLS on loopback.

ca = TestCA(directory)                 # the session fixture `test_ca` makes one
cert = ca.issue("peer.test", "127.10.0.1")
cert.cert_path, cert.key_path          # PEM files, e.g. for federation.tls_certificate
ca.ca_path                             # the CA's PEM, for federation.ca_file
ca.server_context("peer.test")         # an ssl.SSLContext for a test server
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass

import trustme


@dataclass(frozen=True)
class CertFiles:
    cert_path: str  # the leaf certificate followed by the chain
    key_path: str


class TestCA:
    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self.ca = trustme.CA(organization_name="Weir test CA")
        self.ca_path = os.path.join(directory, "ca.pem")
        self.ca.cert_pem.write_to_path(self.ca_path)
        self._issued = 0

    def issue(self, *names: str) -> CertFiles:
        """A certificate for DNS names and/or IP addresses, written to files."""
        cert = self.ca.issue_cert(*names)
        self._issued += 1
        base = os.path.join(self.directory, f"cert{self._issued}")
        with open(base + ".pem", "wb") as f:
            for blob in cert.cert_chain_pems:
                f.write(blob.bytes())
        cert.private_key_pem.write_to_path(base + ".key")
        return CertFiles(base + ".pem", base + ".key")

    def server_context(self, *names: str) -> ssl.SSLContext:
        files = self.issue(*names)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(files.cert_path, files.key_path)
        return ctx

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_path)
        return ctx
