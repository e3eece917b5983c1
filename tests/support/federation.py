"""Settings and builders for federation tests on loopback.

Addressing: every peer gets its own 127.x.y.z address, inside ``ALLOWED_RANGE`` (the test
allowlist, which wins over the default denylist that covers 127/8). ``DENIED_IP`` lies outside
it: nothing may ever connect there.
"""

from __future__ import annotations

import os

from signedjson.key import generate_signing_key

from homeserver.config import parse_config
from homeserver.federation.client import FederationClient
from tests.support.server import WeirProcess, base_settings, merge

ALLOWED_RANGE = "127.0.0.0/9"
DENIED_IP = "127.200.0.1"


def federation_settings(test_ca, dns=None, **extra) -> dict:
    """The `[federation]` table for talking to test peers: our CA, our DNS, loopback allowed."""
    fed = {"ca_file": test_ca.ca_path, "ip_range_allowlist": [ALLOWED_RANGE]}
    if dns is not None:
        fed["dns_nameservers"] = [dns.nameserver]
    fed.update(extra)
    return fed


def tls_listener_settings(test_ca, server_name: str, ip: str, port: int = 8448) -> dict:
    """A Weir federation listener on ``ip:port`` with a test-CA certificate for its name."""
    host = server_name.rsplit(":", 1)[0] if not server_name.startswith("[") else server_name
    cert = test_ca.issue(host.strip("[]"), ip)
    return {
        "bind_address": ip,
        "port": port,
        "tls_certificate": cert.cert_path,
        "tls_private_key": cert.key_path,
    }


def tls_weir(
    test_ca, directory: str, ip: str, server_name: str = "weir.test", dns=None, **overrides
) -> WeirProcess:
    """A Weir process (not started) in ``directory`` that talks to test peers and serves
    federation over TLS on ``ip:8448`` as ``server_name``; ``overrides`` are merged over its
    settings."""
    fed = federation_settings(test_ca, dns)
    fed.update(tls_listener_settings(test_ca, server_name, ip))
    settings = merge(
        base_settings(os.path.join(directory, "data")),
        {"server_name": server_name, "federation": fed},
    )
    return WeirProcess(directory, merge(settings, overrides))


def make_client(
    test_ca,
    dns=None,
    server_name: str = "weir.test",
    signing_key=None,
    *,
    clock=None,
    target_health=None,
    **federation,
) -> FederationClient:
    """An in-process FederationClient built the way the runtime builds it."""
    config = parse_config(
        {"server_name": server_name, "federation": federation_settings(test_ca, dns, **federation)}
    )
    extra = {"clock": clock} if clock is not None else {}
    return FederationClient.from_config(
        config, signing_key or generate_signing_key("t"), target_health=target_health, **extra
    )


class FakeClock:
    """A monotonic clock that moves only when told to: crosses cache TTLs without waiting."""

    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
