"""Server discovery, every step of the spec v1.16 algorithm, against real peers on loopback
with a real DNS server. Each test asserts the Host header and the SNI the peer saw."""

import pytest

from budget import DeadlineExceeded, OutboundDeadline
from homeserver.federation.discovery import split_server_name
from homeserver.federation.errors import DestinationUnreachable
from tests.peers.liar import LiarPeer
from tests.peers.tarpit import Tarpit
from tests.support.federation import FakeClock, make_client

KEYS = "/_matrix/key/v2/server"
WELL_KNOWN = "/.well-known/matrix/server"


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def client(test_ca, dns, clock):
    c = make_client(test_ca, dns, clock=clock)
    yield c
    c.close()


def fetch_keys(client, server_name, seconds=10):
    return client.get_json(server_name, KEYS, deadline=OutboundDeadline(seconds))


def seen(peer, path=KEYS):
    request = [r for r in peer.requests if r.path == path][-1]
    return request.host, request.sni


def test_step1_ip_literal_with_port(client, start_peer):
    peer = start_peer("127.20.1.1:8449", "127.20.1.1", 8449)
    assert fetch_keys(client, "127.20.1.1:8449")["server_name"] == "127.20.1.1:8449"
    # Host is the server name with its port; no SNI is sent for an IP (the cert names the IP).
    assert seen(peer) == ("127.20.1.1:8449", None)


def test_step1_ip_literal_defaults_to_8448(client, start_peer, dns):
    peer = start_peer("127.20.1.2", "127.20.1.2", 8448)
    queries = dns.total_queries
    fetch_keys(client, "127.20.1.2")
    assert seen(peer) == ("127.20.1.2", None)
    assert dns.total_queries == queries  # no lookup is needed for a literal
    assert client.discovery.cached("127.20.1.2").targets == (("127.20.1.2", 8448),)


def test_step2_hostname_with_explicit_port(client, start_peer, dns):
    dns.add_a("explicit.test", "127.20.2.1")
    peer = start_peer("explicit.test:8450", "127.20.2.1", 8450)
    fetch_keys(client, "explicit.test:8450")
    assert seen(peer) == ("explicit.test:8450", "explicit.test")
    # An explicit port skips well-known and SRV altogether.
    assert dns.count("_matrix-fed._tcp.explicit.test") == 0


def test_step3_1_well_known_delegates_to_ip_literal(client, start_peer, dns):
    dns.add_a("wk31.test", "127.20.3.1")
    wk = start_peer("wk31.test", "127.20.3.1", 443)
    wk.serve_well_known("127.20.3.2:8451")
    target = start_peer("127.20.3.2:8451", "127.20.3.2", 8451)
    fetch_keys(client, "wk31.test")
    assert seen(wk, WELL_KNOWN) == ("wk31.test", "wk31.test")
    assert seen(target) == ("127.20.3.2:8451", None)


def test_step3_2_well_known_delegates_to_name_and_port(client, start_peer, dns):
    dns.add_a("wk32.test", "127.20.4.1")
    dns.add_a("delegated32.test", "127.20.4.2")
    start_peer("wk32.test", "127.20.4.1", 443).serve_well_known("delegated32.test:8452")
    target = start_peer("wk32.test", "127.20.4.2", 8452, cert_names=("delegated32.test",))
    fetch_keys(client, "wk32.test")
    assert seen(target) == ("delegated32.test:8452", "delegated32.test")
    assert dns.count("_matrix-fed._tcp.delegated32.test") == 0


def test_step3_3_well_known_then_srv(client, start_peer, dns):
    dns.add_a("wk33.test", "127.20.5.1")
    dns.add_srv("_matrix-fed._tcp.delegated33.test", "srv33.test", 8453)
    dns.add_a("srv33.test", "127.20.5.2")
    start_peer("wk33.test", "127.20.5.1", 443).serve_well_known("delegated33.test")
    # The certificate must be for the delegated name, not for the SRV target.
    target = start_peer("wk33.test", "127.20.5.2", 8453, cert_names=("delegated33.test",))
    fetch_keys(client, "wk33.test")
    assert seen(target) == ("delegated33.test", "delegated33.test")
    assert dns.count("_matrix._tcp.delegated33.test") == 0


def test_step3_4_well_known_then_deprecated_srv(client, start_peer, dns):
    dns.add_a("wk34.test", "127.20.6.1")
    dns.add_srv("_matrix._tcp.delegated34.test", "srv34.test", 8454)
    dns.add_a("srv34.test", "127.20.6.2")
    start_peer("wk34.test", "127.20.6.1", 443).serve_well_known("delegated34.test")
    target = start_peer("wk34.test", "127.20.6.2", 8454, cert_names=("delegated34.test",))
    fetch_keys(client, "wk34.test")
    assert seen(target) == ("delegated34.test", "delegated34.test")
    assert dns.count("_matrix-fed._tcp.delegated34.test", "SRV") == 1


def test_step3_5_well_known_then_port_8448(client, start_peer, dns):
    dns.add_a("wk35.test", "127.20.7.1")
    dns.add_a("delegated35.test", "127.20.7.2")
    start_peer("wk35.test", "127.20.7.1", 443).serve_well_known("delegated35.test")
    target = start_peer("wk35.test", "127.20.7.2", 8448, cert_names=("delegated35.test",))
    fetch_keys(client, "wk35.test")
    assert seen(target) == ("delegated35.test", "delegated35.test")
    assert dns.count("_matrix._tcp.delegated35.test", "SRV") == 1


def test_step4_no_well_known_then_srv(client, start_peer, dns):
    dns.add_a("srv4.test", "127.20.8.1")  # nothing listens on its 443
    dns.add_srv("_matrix-fed._tcp.srv4.test", "target4.test", 8455)
    dns.add_a("target4.test", "127.20.8.2")
    target = start_peer("srv4.test", "127.20.8.2", 8455)
    fetch_keys(client, "srv4.test")
    assert seen(target) == ("srv4.test", "srv4.test")


def test_step5_deprecated_srv(client, start_peer, dns):
    dns.add_srv("_matrix._tcp.srv5.test", "target5.test", 8456)
    dns.add_a("target5.test", "127.20.9.2")
    target = start_peer("srv5.test", "127.20.9.2", 8456)
    fetch_keys(client, "srv5.test")
    assert seen(target) == ("srv5.test", "srv5.test")


def test_step6_fallback_to_8448(client, start_peer, dns):
    dns.add_a("plain6.test", "127.20.10.1")
    peer = start_peer("plain6.test", "127.20.10.1", 8448)
    fetch_keys(client, "plain6.test")
    assert seen(peer) == ("plain6.test", "plain6.test")
    assert dns.count("_matrix-fed._tcp.plain6.test") == dns.count("_matrix._tcp.plain6.test") == 1


def test_srv_priority_order_and_next_target_on_refusal(client, start_peer, dns):
    # The preferred target refuses connections: the next one in SRV order is used.
    dns.add_srv("_matrix-fed._tcp.multi.test", "first.test", 8457, priority=1)
    dns.add_srv("_matrix-fed._tcp.multi.test", "second.test", 8457, priority=2)
    dns.add_a("first.test", "127.20.11.1")
    dns.add_a("second.test", "127.20.11.2")
    peer = start_peer("multi.test", "127.20.11.2", 8457)
    fetch_keys(client, "multi.test")
    assert client.discovery.cached("multi.test").targets == (
        ("127.20.11.1", 8457),
        ("127.20.11.2", 8457),
    )
    assert peer.hits(KEYS) == 1


# -- well-known caching -----------------------------------------------------------------------


def _well_known_setup(start_peer, dns, name, ip, headers=None, cls=LiarPeer):
    dns.add_a(name, ip)
    wk = start_peer(name, ip, 443, cls=cls)
    target_ip = ip.rsplit(".", 1)[0] + ".2"
    dns.add_a(f"fed.{name}", target_ip)
    wk.serve_well_known(f"fed.{name}:8448", headers)
    target = start_peer(name, target_ip, 8448, cert_names=(f"fed.{name}",))
    return wk, target


def _rediscover(client, name):
    client.discovery.forget(name)  # drop the resolved server; the well-known cache stays
    return client.discovery.resolve(name, OutboundDeadline(10))


@pytest.mark.parametrize(
    "cache_control, lifetime",
    [
        ("max-age=3600", 3600),
        (None, 24 * 3600),  # no header: 24 h
        ("max-age=10", 5 * 60),  # below the floor: 5 min
        ("public, max-age=999999", 48 * 3600),  # above the ceiling: 48 h
    ],
)
def test_well_known_is_cached_per_cache_control(
    client, clock, start_peer, dns, cache_control, lifetime
):
    name = f"cache{lifetime}.test"
    ip = {3600: "127.21.1.1", 86400: "127.21.2.1", 300: "127.21.3.1", 172800: "127.21.4.1"}[
        lifetime
    ]
    wk, _ = _well_known_setup(
        start_peer, dns, name, ip, {"Cache-Control": cache_control} if cache_control else None
    )
    assert _rediscover(client, name).host_header == f"fed.{name}:8448"
    clock.advance(lifetime - 1)
    _rediscover(client, name)
    assert wk.hits(WELL_KNOWN) == 1
    clock.advance(2)
    _rediscover(client, name)
    assert wk.hits(WELL_KNOWN) == 2


def test_well_known_errors_are_cached_for_an_hour(client, clock, start_peer, dns):
    dns.add_a("wkerr.test", "127.21.5.1")
    wk = start_peer("wkerr.test", "127.21.5.1", 443)  # no well-known route: 404
    start_peer("wkerr.test", "127.21.5.1", 8448)
    assert _rediscover(client, "wkerr.test").targets == (("127.21.5.1", 8448),)
    clock.advance(3599)
    _rediscover(client, "wkerr.test")
    assert wk.hits(WELL_KNOWN) == 1
    clock.advance(2)
    _rediscover(client, "wkerr.test")
    assert wk.hits(WELL_KNOWN) == 2


def test_a_well_known_nested_past_the_parser_is_an_error_like_any_other(client, start_peer, dns):
    dns.add_a("wkdeep.test", "127.21.9.1")
    wk = start_peer("wkdeep.test", "127.21.9.1", 443)
    deep = b'{"m.server": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    wk.route("GET", WELL_KNOWN, lambda req: (200, deep, {"Content-Type": "application/json"}))
    start_peer("wkdeep.test", "127.21.9.1", 8448)
    assert _rediscover(client, "wkdeep.test").targets == (("127.21.9.1", 8448),)
    assert wk.hits(WELL_KNOWN) == 1


def test_silent_well_known_gets_half_the_deadline_then_fallback(client, clock, start_peer, dns):
    dns.add_a("wksilent.test", "127.21.7.1")
    peer = start_peer("wksilent.test", "127.21.7.1", 8448)
    with Tarpit("127.21.7.1", 443) as tarpit:
        deadline = OutboundDeadline(8.4)
        with deadline:
            resolved = client.discovery.resolve("wksilent.test", deadline)
        assert resolved.targets == (("127.21.7.1", 8448),)
        assert 4.0 <= deadline.elapsed() < 8.4  # the well-known step had half, no more
        assert tarpit.wait_accepted(1, timeout=5)
        fetch_keys(client, "wksilent.test")
        assert peer.hits(KEYS) == 1
        # The timeout is remembered (briefly): the next discovery does not wait again.
        _rediscover(client, "wksilent.test")
        assert tarpit.accepted == 1
        # Two minutes later it is tried again, with a short deadline: half of it, less than
        # its fair chance, so that timeout is not remembered and the next lookup asks again.
        clock.advance(121)
        for accepted in (2, 3):
            client.discovery.forget("wksilent.test")
            deadline = OutboundDeadline(1.0)
            with deadline:
                assert client.discovery.resolve("wksilent.test", deadline).targets == (
                    ("127.21.7.1", 8448),
                )
            assert tarpit.wait_accepted(accepted, timeout=5)


def test_resolved_server_cached_with_dns_ttl(client, clock, start_peer, dns):
    dns.add_a("ttl.test", "127.21.6.1", ttl=30)
    start_peer("ttl.test", "127.21.6.1", 8448)
    assert client.discovery.cached("ttl.test") is None
    fetch_keys(client, "ttl.test")
    fetch_keys(client, "ttl.test")
    assert dns.count("ttl.test", "A") == 1
    assert client.discovery.cached("ttl.test").targets == (("127.21.6.1", 8448),)
    clock.advance(31)
    assert client.discovery.cached("ttl.test") is None  # answers from memory only
    fetch_keys(client, "ttl.test")
    assert dns.count("ttl.test", "A") == 2


# -- redirects and the size cap -----------------------------------------------------------------


def test_well_known_redirects_are_followed(client, start_peer, dns):
    wk, target = _well_known_setup(start_peer, dns, "redir.test", "127.22.1.1")
    wk.redirect(WELL_KNOWN, f"{wk.url}/hop1")
    wk.redirect("/hop1", "/hop2", status=301)  # relative Location
    wk.redirect("/hop2", "/hop3", status=307)
    wk.redirect("/hop3", "/hop4", status=308)
    wk.redirect("/hop4", "/final")
    wk.route("GET", "/final", lambda req: (200, {"m.server": "fed.redir.test:8448"}))
    fetch_keys(client, "redir.test")
    assert seen(target) == ("fed.redir.test:8448", "fed.redir.test")
    assert wk.hits("/final") == 1  # five redirects followed, no more needed


def test_well_known_more_than_five_redirects_is_an_error(client, start_peer, dns):
    wk, target = _well_known_setup(start_peer, dns, "redir6.test", "127.22.2.1")
    for i in range(6):
        wk.redirect(WELL_KNOWN if i == 0 else f"/hop{i}", f"/hop{i + 1}")
    wk.route("GET", "/hop6", lambda req: (200, {"m.server": "fed.redir6.test:8448"}))
    with pytest.raises(DestinationUnreachable):  # falls back to redir6.test:8448: nothing there
        fetch_keys(client, "redir6.test")
    assert wk.hits("/hop6") == 0 and wk.hits("/hop5") == 1
    assert target.hits() == 0


def test_well_known_redirect_loop_is_an_error(client, start_peer, dns):
    wk, target = _well_known_setup(start_peer, dns, "loop.test", "127.22.3.1")
    wk.redirect_loop(WELL_KNOWN)
    with pytest.raises(DestinationUnreachable):
        fetch_keys(client, "loop.test")
    # by name, then /a by IP, then back by IP, then /a again: a URL seen before ends it.
    assert wk.hits(WELL_KNOWN) == 2 and wk.hits(WELL_KNOWN + "/a") == 1
    assert target.hits() == 0


@pytest.mark.parametrize("size, delegated", [(49 * 1024, True), (51 * 1024, False)])
def test_well_known_body_cap_50_kib(client, start_peer, dns, size, delegated):
    name = f"big{size}.test"
    ip = "127.22.4.1" if delegated else "127.22.5.1"
    wk, target = _well_known_setup(start_peer, dns, name, ip)
    wk.oversized_well_known(size, f"fed.{name}:8448")
    resolved = client.discovery.resolve(name, OutboundDeadline(10))
    # Under the cap the delegation is used; over it the body is refused and discovery
    # falls back to the server name itself.
    if delegated:
        assert resolved.host_header == f"fed.{name}:8448"
    else:
        assert (resolved.host_header, resolved.targets) == (name, ((ip, 8448),))


# -- names and deadlines ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, expected",
    [
        ("example.org", ("example.org", None)),
        ("example.org:8448", ("example.org", 8448)),
        ("1.2.3.4:80", ("1.2.3.4", 80)),
        ("[2001:db8::1]:8448", ("2001:db8::1", 8448)),
        ("[::1]", ("::1", None)),
    ],
)
def test_split_server_name(name, expected):
    assert split_server_name(name) == expected


@pytest.mark.parametrize(
    "name", ["", "a b", "host:", "host:port", "host:99999", "[::1", "[not-ip]:1", "host:1:2"]
)
def test_invalid_server_names_are_refused(client, name):
    with pytest.raises(DestinationUnreachable):
        client.discovery.resolve(name, OutboundDeadline(1))


def test_dns_that_never_answers_is_bounded_by_the_deadline(client, dns):
    dns.blackhole("silent.test")
    deadline = OutboundDeadline(1.0)
    with pytest.raises(DeadlineExceeded):
        with deadline:
            client.discovery.resolve("silent.test:8448", deadline)
    assert deadline.elapsed() < 3
