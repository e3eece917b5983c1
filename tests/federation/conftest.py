"""Shared fixtures for federation tests: a loopback DNS server and test peers."""

import pytest

from tests.peers.dns import DnsServer
from tests.peers.honest import HonestPeer
from tests.peers.tarpit import Tarpit
from tests.support.federation import DENIED_IP


@pytest.fixture(scope="module")
def dns():
    """One DNS server per module; tests use names of their own."""
    with DnsServer("127.0.0.1") as server:
        yield server


@pytest.fixture
def start_peer(test_ca):
    """start_peer(server_name, ip, port=8448, cls=HonestPeer, **kw): a running TLS peer,
    stopped after the test."""
    started = []

    def start(server_name, ip, port=8448, cls=HonestPeer, **kw):
        peer = cls(server_name, test_ca, host=ip, port=port, **kw).start()
        started.append(peer)
        return peer

    yield start
    for peer in started:
        peer.stop()


@pytest.fixture
def denied_listeners():
    """Listeners on the denied address, on the ports discovery would use (443, 8448): they
    count accepts, and SSRF tests assert there are none."""
    listeners = [Tarpit(DENIED_IP, port).start() for port in (443, 8448)]
    yield listeners
    for listener in listeners:
        listener.stop()
