"""SSRF: nothing ever connects to a denied address, however it is reached.

Listeners on the denied address (ports 443 and 8448) count accepts; every test ends with zero.
"""

import pytest

from budget import DeadlineExceeded, OutboundDeadline
from homeserver.federation.errors import DestinationUnreachable, FederationError
from tests.peers.liar import LiarPeer
from tests.support.federation import ALLOWED_RANGE, DENIED_IP, make_client


@pytest.fixture
def client(test_ca, dns):
    c = make_client(test_ca, dns)
    yield c
    c.close()


def no_accepts(listeners):
    return [listener.accepted for listener in listeners] == [0, 0]


def test_ip_literal(client, denied_listeners):
    with pytest.raises(DestinationUnreachable) as e:
        client.get_json(f"{DENIED_IP}:8448", "/_matrix/key/v2/server")
    assert e.value.reason.startswith("denied address")
    with pytest.raises(DestinationUnreachable):
        client.get_json(DENIED_IP, "/_matrix/key/v2/server")
    assert no_accepts(denied_listeners)


def test_ipv4_mapped_ipv6_literal(client, denied_listeners):
    with pytest.raises(DestinationUnreachable):
        client.get_json(f"[::ffff:{DENIED_IP}]:8448", "/_matrix/key/v2/server")
    assert no_accepts(denied_listeners)


def test_by_dns(client, dns, denied_listeners):
    dns.add_a("rebind.test", DENIED_IP)
    for name in ("rebind.test", "rebind.test:8448"):
        with pytest.raises(DestinationUnreachable) as e:
            client.get_json(name, "/_matrix/key/v2/server")
        assert e.value.reason.startswith("denied address")
    assert no_accepts(denied_listeners)


def test_by_srv_target(client, dns, denied_listeners):
    dns.add_srv("_matrix-fed._tcp.srvlie.test", "denied-target.test", 8448)
    dns.add_a("denied-target.test", DENIED_IP)
    dns.add_srv("_matrix-fed._tcp.srvlit.test", DENIED_IP, 443)
    for name in ("srvlie.test", "srvlit.test"):
        with pytest.raises(DestinationUnreachable) as e:
            client.get_json(name, "/_matrix/key/v2/server")
        assert e.value.reason.startswith("denied address")
    assert no_accepts(denied_listeners)


def test_by_well_known_delegation(client, dns, start_peer, denied_listeners):
    dns.add_a("wkdeny.test", "127.23.1.1")
    dns.add_a("wkdeny-name.test", DENIED_IP)
    wk = start_peer("wkdeny.test", "127.23.1.1", 443)
    for delegated in (f"{DENIED_IP}:8448", "wkdeny-name.test", "wkdeny-name.test:443"):
        wk.serve_well_known(delegated)
        client.discovery.forget()
        with pytest.raises(DestinationUnreachable):
            client.get_json("wkdeny.test", "/_matrix/key/v2/server")
    assert wk.hits("/.well-known/matrix/server") == 3
    assert no_accepts(denied_listeners)


def test_by_redirect(client, dns, start_peer, denied_listeners):
    dns.add_a("wkredir.test", "127.23.2.1")
    dns.add_a("denied-redirect.test", DENIED_IP)
    wk = start_peer("wkredir.test", "127.23.2.1", 443, cls=LiarPeer)
    for location in (
        f"https://{DENIED_IP}/.well-known/matrix/server",
        "https://denied-redirect.test/.well-known/matrix/server",
    ):
        wk.redirect("/.well-known/matrix/server", location)
        client.discovery.forget()
        with pytest.raises(DestinationUnreachable):  # the fallback wkredir.test:8448 is closed
            client.get_json("wkredir.test", "/_matrix/key/v2/server")
    # A media Location (open_url) gets the same treatment, directly and after a redirect.
    wk.redirect("/media", f"https://{DENIED_IP}:8448/file")
    for url in (
        f"https://{DENIED_IP}/file",
        "https://denied-redirect.test:8448/file",
        f"{wk.url}/media",
    ):
        with pytest.raises(DestinationUnreachable):
            client.open_url(url, max_bytes=1024)
    assert wk.hits("/media") == 1
    assert no_accepts(denied_listeners)


def test_mixed_answers_connect_only_to_allowed(client, dns, start_peer, denied_listeners):
    dns.add_a("mixed.test", DENIED_IP)
    dns.add_a("mixed.test", "127.23.3.1")
    peer = start_peer("mixed.test", "127.23.3.1", 8448)
    client.get_json("mixed.test", "/_matrix/key/v2/server")
    assert client.discovery.cached("mixed.test").targets == (("127.23.3.1", 8448),)
    assert peer.hits() == 1
    assert no_accepts(denied_listeners)


def test_allowlist_wins_for_ip_literals(test_ca, dns, denied_listeners):
    # With the denied address allowlisted, the literal is connected to (here: a tarpit, so
    # the call ends at its deadline). Synapse does not apply its allowlist to literals.
    client = make_client(test_ca, dns, ip_range_allowlist=[ALLOWED_RANGE, f"{DENIED_IP}/32"])
    try:
        with pytest.raises(DeadlineExceeded):
            client.get_json(
                f"{DENIED_IP}:8448", "/_matrix/key/v2/server", deadline=OutboundDeadline(0.5)
            )
    finally:
        client.close()
    assert denied_listeners[1].wait_accepted(1, timeout=5)
    assert denied_listeners[1].wait_current(0, timeout=5)  # and the socket was closed


def test_default_denylist_blocks_loopback_without_allowlist(test_ca, dns, start_peer):
    peer = start_peer("127.23.4.1:8448", "127.23.4.1", 8448)
    client = make_client(test_ca, dns, ip_range_allowlist=[])
    try:
        with pytest.raises(FederationError):
            client.get_json("127.23.4.1:8448", "/_matrix/key/v2/server")
    finally:
        client.close()
    assert peer.hits() == 0
