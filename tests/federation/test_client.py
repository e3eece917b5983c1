"""The outbound client: signing, caps, errors, TLS, deadlines and target outcomes."""

import contextlib
import os
import socket

import gevent
import psutil
import pytest
from gevent.event import Event
from gevent.server import StreamServer
from signedjson.key import generate_signing_key, get_verify_key

from budget import DeadlineExceeded, OutboundDeadline
from homeserver.core.errors import MatrixError
from homeserver.federation import transport
from homeserver.federation.cooldown import AddressCooldown
from homeserver.federation.errors import (
    AddressCoolingDown,
    DestinationUnreachable,
    KeyResolutionRefused,
    MalformedResponse,
    RemoteError,
    ResponseTooLarge,
    to_client_error,
)
from homeserver.federation.signing import parse_x_matrix, request_object, verify_signature
from tests.peers.liar import LiarPeer
from tests.peers.slow import HangingPeer
from tests.peers.tarpit import Tarpit
from tests.support.federation import FakeClock, make_client

KEY = generate_signing_key("c1")


@pytest.fixture
def client(test_ca, dns):
    c = make_client(test_ca, dns, signing_key=KEY)
    yield c
    c.close()


@pytest.fixture
def liar(start_peer):
    return start_peer("127.24.0.1:8448", "127.24.0.1", 8448, cls=LiarPeer)


def test_every_request_is_signed_over_the_exact_target(client, liar):
    liar.route("PUT", "/_matrix/federation/v1/send/t1", lambda req: (200, {"pdus": {}}))
    content = {"pdus": [], "edus": [{"x": "é"}]}
    assert client.put_json(
        liar.server_name, "/_matrix/federation/v1/send/t1", content, {"a": "1 2", "b": ["x", "y"]}
    ) == {"pdus": {}}
    seen = liar.requests[-1]
    assert seen.target == "/_matrix/federation/v1/send/t1?a=1+2&b=x&b=y"
    auth = parse_x_matrix(seen.headers["Authorization"])
    assert (auth.origin, auth.destination, auth.key_id) == (
        "weir.test",
        liar.server_name,
        "ed25519:c1",
    )
    signed = request_object("PUT", seen.target, "weir.test", liar.server_name, seen.json())
    signed["signatures"] = {"weir.test": {auth.key_id: auth.sig}}
    verify_signature(signed, "weir.test", get_verify_key(KEY))


def test_json_cap_default_and_per_call(client, liar):
    liar.huge_json("/huge", 11 * 1024 * 1024)
    liar.huge_json("/small", 2000)
    with pytest.raises(ResponseTooLarge):
        client.get_json(liar.server_name, "/huge")
    with pytest.raises(ResponseTooLarge):
        client.get_json(liar.server_name, "/small", max_bytes=1000)
    assert client.get_json(liar.server_name, "/small", max_bytes=3000)["pad"] == "x" * 2000


def test_cap_holds_without_content_length(client, liar):
    # A chunked body has no length to check up front: reading stops at the cap.
    def chunks():
        yield b"["
        for _ in range(100):
            yield b"1," * 50
        yield b"1]"

    liar.route("GET", "/chunked", lambda req: (200, chunks()))
    with pytest.raises(ResponseTooLarge):
        client.get_json(liar.server_name, "/chunked", max_bytes=4096)


def test_malformed_json(client, liar):
    liar.malformed_json("/bad")
    with pytest.raises(MalformedResponse):
        client.get_json(liar.server_name, "/bad")


def test_json_nested_past_the_parser_depth_is_malformed(client, liar):
    # 100 kB of brackets: the parser gives up with RecursionError, which is no ValueError.
    deep = b"[" * 50_000 + b"]" * 50_000
    liar.route("GET", "/deep", lambda req: (200, deep, {"Content-Type": "application/json"}))
    with pytest.raises(MalformedResponse):
        client.get_json(liar.server_name, "/deep")
    # An error body that deep is still the remote's error, only without an errcode.
    liar.route("GET", "/deep-error", lambda req: (500, deep, {"Content-Type": "application/json"}))
    with pytest.raises(RemoteError) as e:
        client.get_json(liar.server_name, "/deep-error")
    assert (e.value.status, e.value.errcode) == (500, None)


def test_remote_errors_carry_status_and_errcode(client, liar):
    liar.route("GET", "/forbidden", lambda req: (403, {"errcode": "M_FORBIDDEN", "error": "no"}))
    with pytest.raises(RemoteError) as e:
        client.get_json(liar.server_name, "/missing")
    assert (e.value.status, e.value.errcode) == (404, "M_UNRECOGNIZED")
    with pytest.raises(RemoteError) as e:
        client.get_json(liar.server_name, "/forbidden")
    assert (e.value.status, e.value.errcode, e.value.body["error"]) == (403, "M_FORBIDDEN", "no")


def test_api_calls_never_follow_redirects(client, liar):
    liar.redirect("/moved", "/elsewhere")
    liar.route("GET", "/elsewhere", lambda req: (200, {}))
    with pytest.raises(RemoteError) as e:
        client.get_json(liar.server_name, "/moved")
    assert e.value.status == 302
    assert liar.hits("/elsewhere") == 0


def test_tls_is_verified(test_ca, dns, start_peer):
    # A certificate for another name, and (for a client without the test CA) an unknown CA.
    dns.add_a("wrongcert.test", "127.24.1.1")
    start_peer("wrongcert.test", "127.24.1.1", 8448, cert_names=("someone-else.test",))
    start_peer("127.24.1.2:8448", "127.24.1.2", 8448)
    with make_client(test_ca, dns) as trusting, make_client(test_ca, dns, ca_file="") as plain:
        with pytest.raises(DestinationUnreachable) as e:
            trusting.get_json("wrongcert.test", "/_matrix/key/v2/server")
        assert "TLS" in e.value.reason
        with pytest.raises(DestinationUnreachable) as e:
            plain.get_json("127.24.1.2:8448", "/_matrix/key/v2/server")
        assert "TLS" in e.value.reason
        assert trusting.get_json("127.24.1.2:8448", "/_matrix/key/v2/server")


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_tarpit_ends_at_the_deadline_and_leaves_nothing_behind(client):
    with Tarpit("127.24.2.1", 8448) as tarpit:
        fds = _open_fds()
        deadline = OutboundDeadline(0.5, what="tarpit")
        with pytest.raises(DeadlineExceeded) as e:
            client.get_json("127.24.2.1:8448", "/x", deadline=deadline)
        assert e.value.what == "tarpit"
        assert tarpit.wait_accepted(1, timeout=5)
        assert tarpit.wait_current(0, timeout=5)  # our side closed its socket
        assert _open_fds() <= fds


def test_discovery_and_request_share_one_deadline(client, dns):
    # DNS that never answers uses up the deadline: the request gets nothing more.
    dns.blackhole("slowdns.test")
    deadline = OutboundDeadline(1.0)
    with pytest.raises(DeadlineExceeded):
        client.get_json("slowdns.test:8448", "/x", deadline=deadline)
    assert deadline.elapsed() < 3


class RecordingHealth:
    def __init__(self, refuse=()):
        self.refuse = set(refuse)
        self.outcomes = []

    def check(self, ip, port):
        if (ip, port) in self.refuse:
            raise DestinationUnreachable(ip, "cooling down")

    def record(self, ip, port, ok, timed_out):
        self.outcomes.append((ip, port, ok, timed_out))


def test_target_health_sees_every_outcome(test_ca, dns, start_peer):
    # SRV order: first an address that refuses connections, then a working one.
    dns.add_srv("_matrix-fed._tcp.health.test", "127.24.3.1", 8448, priority=1)
    dns.add_srv("_matrix-fed._tcp.health.test", "127.24.3.2", 8448, priority=2)
    start_peer("health.test", "127.24.3.2", 8448)
    health = RecordingHealth()
    with make_client(test_ca, dns, target_health=health) as client:
        client.get_json("health.test", "/_matrix/key/v2/server")
        # A refused connection, then an answer.
        assert health.outcomes == [
            ("127.24.3.1", 8448, False, False),
            ("127.24.3.2", 8448, True, False),
        ]
        with Tarpit("127.24.3.3", 8448):
            with pytest.raises(DeadlineExceeded):
                client.get_json("127.24.3.3:8448", "/x", deadline=OutboundDeadline(0.3))
        assert health.outcomes[-1] == ("127.24.3.3", 8448, False, True)  # silent
    # check() refuses fast: the address is not even tried, and the next one is.
    health = RecordingHealth(refuse={("127.24.3.1", 8448)})
    with make_client(test_ca, dns, target_health=health) as client:
        client.get_json("health.test", "/_matrix/key/v2/server")
        assert health.outcomes == [("127.24.3.2", 8448, True, False)]
        with pytest.raises(DestinationUnreachable) as e:
            client.get_json("127.24.3.1:8448", "/_matrix/key/v2/server")
        assert e.value.reason == "cooling down"
    assert health.outcomes == [("127.24.3.2", 8448, True, False)]
    # A health object given for one call replaces the client's for that call only.
    per_call = RecordingHealth()
    with make_client(test_ca, dns, target_health=health) as client:
        client.get_json("health.test", "/_matrix/key/v2/server", target_health=per_call)
    assert per_call.outcomes == [
        ("127.24.3.1", 8448, False, False),
        ("127.24.3.2", 8448, True, False),
    ]
    assert health.outcomes == [("127.24.3.2", 8448, True, False)]


@contextlib.contextmanager
def full_backlog(ip: str, port: int = 8448):
    """A listener whose accept queue is full: the kernel drops further SYNs, so a connect
    there times out (a host that never answers)."""
    listener = socket.socket()
    listener.bind((ip, port))
    listener.listen(0)
    filler = socket.create_connection((ip, port), timeout=5)  # takes the one queue place
    try:
        yield
    finally:
        filler.close()
        listener.close()


def test_a_connect_that_times_out_is_silence(test_ca, dns):
    health = RecordingHealth()
    with full_backlog("127.24.4.1"), make_client(test_ca, dns, target_health=health) as client:
        with pytest.raises(DeadlineExceeded):
            client.get_json("127.24.4.1:8448", "/x", deadline=OutboundDeadline(0.5))
    assert health.outcomes == [("127.24.4.1", 8448, False, True)]


def test_a_tls_handshake_that_times_out_is_silence(test_ca, dns, monkeypatch):
    # A tarpit takes the TCP connection and never speaks TLS. urllib3 raises ReadTimeoutError
    # for the handshake's socket timeout (the connect timeout): here it fires well before the
    # deadline, which is left to the caller.
    monkeypatch.setattr(transport, "CONNECT_TIMEOUT_CAP", 0.3)
    monkeypatch.setattr(transport, "FAIR_WAIT_SECONDS", 0.2)
    health = RecordingHealth()
    with Tarpit("127.24.4.2", 8448), make_client(test_ca, dns, target_health=health) as client:
        deadline = OutboundDeadline(10)
        with pytest.raises(DestinationUnreachable) as e:
            client.get_json("127.24.4.2:8448", "/x", deadline=deadline)
        assert deadline.elapsed() < 5
    assert e.value.reason == "127.24.4.2:8448 did not answer"
    assert health.outcomes == [("127.24.4.2", 8448, False, True)]


def test_no_response_head_before_the_deadline_is_silence(test_ca, dns):
    health = RecordingHealth()
    with (
        HangingPeer(test_ca, ("hang.test",), "127.24.4.3", 8448) as hang,
        make_client(test_ca, dns, target_health=health) as client,
    ):
        with pytest.raises(DeadlineExceeded):
            client.get_json("127.24.4.3:8448", "/x", deadline=OutboundDeadline(0.5))
        assert hang.requests == 1  # the request went out; no head came back
    assert health.outcomes == [("127.24.4.3", 8448, False, True)]


def test_an_address_that_answered_badly_is_not_recorded(test_ca, dns, start_peer):
    """A certificate for another name, a connection closed once accepted: the address
    answered, so nothing is recorded (neither a cool-down nor its end)."""
    dns.add_a("pointed.test", "127.24.5.1")
    start_peer("real.test", "127.24.5.1", cert_names=("real.test",))
    closed = StreamServer(("127.24.5.2", 8448), lambda sock, address: sock.close())
    closed.start()
    health = RecordingHealth()
    try:
        with make_client(test_ca, dns, target_health=health) as client:
            for name in ("127.24.5.1:8448", "pointed.test:8448"):
                with pytest.raises(DestinationUnreachable) as e:
                    client.get_json(name, "/_matrix/key/v2/server")
                assert e.value.reason.startswith("TLS failure with 127.24.5.1:8448")
            with pytest.raises(DestinationUnreachable):
                client.get_json("127.24.5.2:8448", "/_matrix/key/v2/server")
    finally:
        closed.stop()
    assert health.outcomes == []


def test_an_http_error_or_a_bad_body_is_an_answer(test_ca, dns, liar):
    liar.route("GET", "/fail", lambda req: (500, {"errcode": "M_UNKNOWN"}))
    liar.malformed_json("/bad")
    stalled = Event()

    def stall():
        yield b"["
        stalled.set()
        gevent.sleep(60)  # silent mid-body: the deadline ends the read
        yield b"]"

    liar.route("GET", "/stall", lambda req: (200, stall()))
    health = RecordingHealth()
    with make_client(test_ca, dns, target_health=health) as client:
        with pytest.raises(RemoteError):
            client.get_json(liar.server_name, "/fail")
        with pytest.raises(MalformedResponse):
            client.get_json(liar.server_name, "/bad")
        with pytest.raises(DeadlineExceeded):
            client.get_json(liar.server_name, "/stall", deadline=OutboundDeadline(1.0))
        assert stalled.is_set()
    assert health.outcomes == [(liar.host, liar.port, True, False)] * 3


def test_a_deadline_spent_elsewhere_does_not_make_an_address_silent(test_ca, dns, monkeypatch):
    # The first SRV target takes 1.2 s to time out its connect; the second, which would
    # answer no faster than the first, has 0.8 s of the 2 s deadline left: less than its
    # fair chance (half the deadline), so its silence is not held against it.
    monkeypatch.setattr(transport, "CONNECT_TIMEOUT_CAP", 1.2)
    dns.add_srv("_matrix-fed._tcp.spent.test", "127.24.6.1", 8448, priority=1)
    dns.add_srv("_matrix-fed._tcp.spent.test", "127.24.6.2", 8448, priority=2)
    health = RecordingHealth()
    with (
        full_backlog("127.24.6.1"),
        HangingPeer(test_ca, ("spent.test",), "127.24.6.2", 8448) as hang,
        make_client(test_ca, dns, target_health=health) as client,
    ):
        with pytest.raises(DeadlineExceeded):
            client.get_json("spent.test", "/x", deadline=OutboundDeadline(2.0))
        assert hang.wait_until(lambda: hang.requests == 1, timeout=5)
    assert health.outcomes == [("127.24.6.1", 8448, False, True)]


def test_a_response_ends_a_cool_down(test_ca, dns, start_peer):
    clock = FakeClock()
    cooldown = AddressCooldown(clock=clock)
    with make_client(test_ca, dns, target_health=cooldown) as client:
        with pytest.raises(DestinationUnreachable):  # nothing listens: refused
            client.get_json("127.24.7.1:8448", "/_matrix/key/v2/server")
        cooling = cooldown.cooling("127.24.7.1", 8448)
        assert cooling is not None and cooling.seconds_left == 30
        peer = start_peer("127.24.7.1:8448", "127.24.7.1")
        with pytest.raises(AddressCoolingDown):  # refused without a connection
            client.get_json("127.24.7.1:8448", "/_matrix/key/v2/server")
        assert peer.hits() == 0
        clock.advance(31)  # cooled down: the next call is the probe, and it is answered
        assert client.get_json("127.24.7.1:8448", "/_matrix/key/v2/server")
        assert cooldown.cooling_count() == 0
        peer.stop()
        with pytest.raises(DestinationUnreachable):
            client.get_json("127.24.7.1:8448", "/_matrix/key/v2/server")
    # Its failures were forgotten: the next cool-down is the first one's 30 s, not 60.
    assert cooldown.cooling("127.24.7.1", 8448).seconds_left == 30
    assert cooldown.cooldowns_started == 2


def test_open_stream_reads_within_cap(client, liar):
    body = bytes(range(256)) * 1000
    liar.route(
        "GET",
        "/_matrix/federation/v1/media/download/abc",
        lambda req: (200, body, {"Content-Type": "application/octet-stream"}),
    )
    with client.open_stream(
        liar.server_name, "/_matrix/federation/v1/media/download/abc", max_bytes=len(body)
    ) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "application/octet-stream"
        assert b"".join(response.stream(4096)) == body
    assert parse_x_matrix(liar.requests[-1].headers["Authorization"]).origin == "weir.test"
    with pytest.raises(ResponseTooLarge):
        with client.open_stream(
            liar.server_name, "/_matrix/federation/v1/media/download/abc", max_bytes=len(body) - 1
        ) as response:
            response.read()
    with pytest.raises(RemoteError):
        client.open_stream(liar.server_name, "/nothing", max_bytes=10)


def test_stream_that_stalls_mid_body_ends_at_the_deadline(client, liar):
    stalled = Event()

    def drip():
        yield b"first chunk"
        stalled.set()
        gevent.sleep(60)  # the peer goes silent mid-body
        yield b"never"

    liar.route("GET", "/drip", lambda req: (200, drip()))
    deadline = OutboundDeadline(1.0, what="drip")
    response = client.open_stream(liar.server_name, "/drip", deadline=deadline, max_bytes=1000)
    with pytest.raises(DeadlineExceeded):
        with response:
            assert response.read(100) == b"first chunk"
            assert stalled.wait(5)
            response.read(100)
    assert deadline.elapsed() < 3
    assert response.read(100) == b""  # closed: nothing more, no error
    # Our end of the connection is closed (the peer's end, in this process, still sleeps).
    assert _connections_to(liar.host, liar.port) == []


def _connections_to(ip, port):
    return [
        c
        for c in psutil.Process().net_connections("tcp")
        if c.raddr and (c.raddr.ip, c.raddr.port) == (ip, port)
    ]


def test_an_endless_answer_streamed_is_refused_at_its_item_cap(client, liar):
    """put_json_streamed (a send_join answer): the items are counted as they come, so an
    answer that never ends is refused at the cap, long before the byte cap, and the
    connection is closed; a whole answer is what put_json would give."""
    item = b'{"type": "m.room.member", "content": {"membership": "join"}}'
    sent = []

    def endless():
        yield b'{"origin": "x", "state": ['
        while True:
            sent.append(1)
            yield item + b","

    liar.route("PUT", "/endless", lambda req: (200, endless()))
    call = {"arrays": ("state", "auth_chain"), "max_items": 1000, "max_bytes": 1 << 30}
    deadline = OutboundDeadline(30, what="endless")
    with pytest.raises(MalformedResponse, match="more than 1000|too many"):
        client.put_json_streamed(liar.server_name, "/endless", {}, deadline=deadline, **call)
    # What the peer wrote before we hung up, the sockets' buffers included: far from 1 GiB.
    assert len(sent) * len(item) < 16 << 20
    assert _connections_to(liar.host, liar.port) == []

    whole = {"origin": "x", "state": [{"a": i} for i in range(500)], "auth_chain": [[]]}
    liar.route("PUT", "/whole", lambda req: (200, whole))
    deadline = OutboundDeadline(30, what="whole")
    assert client.put_json_streamed(liar.server_name, "/whole", {}, deadline=deadline, **call) == (
        client.put_json(liar.server_name, "/whole", {})
    )


def test_open_url_is_unsigned_and_follows_checked_redirects(client, liar):
    liar.redirect("/go", "/file")
    liar.route("GET", "/file", lambda req: (200, b"content"))
    with client.open_url(f"{liar.url}/go", max_bytes=100) as response:
        assert response.read(100) == b"content"
    assert "Authorization" not in liar.requests[-1].headers
    with pytest.raises(MalformedResponse):
        client.open_url(f"http://{liar.host}:{liar.port}/file", max_bytes=100)


@pytest.mark.parametrize(
    "exc, status, errcode",
    [
        (DeadlineExceeded(10, 10.1, "x"), 504, "M_UNKNOWN"),
        (DestinationUnreachable("r.test", "denied address"), 502, "M_UNKNOWN"),
        (RemoteError("r.test", 404, None), 404, "M_NOT_FOUND"),
        (RemoteError("r.test", 400, "M_NOT_FOUND"), 404, "M_NOT_FOUND"),
        (RemoteError("r.test", 403, "M_FORBIDDEN"), 403, "M_FORBIDDEN"),
        (RemoteError("r.test", 500, "M_UNKNOWN"), 502, "M_UNKNOWN"),
        (RemoteError("r.test", 302), 502, "M_UNKNOWN"),
        (MalformedResponse("r.test", "bad"), 502, "M_UNKNOWN"),
        (ResponseTooLarge("r.test", 10), 502, "M_UNKNOWN"),
        (KeyResolutionRefused("r.test", 1500, "busy"), 429, "M_LIMIT_EXCEEDED"),
    ],
)
def test_client_error_mapping(exc, status, errcode):
    error = to_client_error(exc, "r.test")
    assert isinstance(error, MatrixError)
    assert (error.status, error.errcode) == (status, errcode)
    if status == 504:
        assert "r.test" in error.error


@pytest.mark.parametrize(
    "reason",
    [
        "no address",
        "denied address 10.1.2.3:8448",
        "cannot connect to 10.1.2.3:8448: [Errno 111] Connection refused",
        "TLS failure with 10.1.2.3:8448: hostname 'r.test' doesn't match 'x.test'",
        "DNS failure: NoNameservers",
    ],
)
def test_an_unreachable_server_is_only_named(reason, caplog):
    # Whether a name has no address, only private ones, or ones that fail is not for the
    # client (it would tell anyone what a name resolves to): one log line keeps the detail.
    caplog.set_level("INFO", logger="homeserver.federation.errors")
    error = to_client_error(DestinationUnreachable("r.test", reason), "other.test")
    assert (error.status, error.errcode, error.error) == (502, "M_UNKNOWN", "Cannot reach r.test")
    logged = [r for r in caplog.records if r.name == "homeserver.federation.errors"]
    assert [(r.levelname, r.getMessage(), r.exc_info) for r in logged] == [
        ("INFO", f"cannot reach r.test: {reason}", None)
    ]


def test_a_cool_down_is_told_without_its_address():
    for timed_out, status in ((True, 504), (False, 502)):
        error = to_client_error(AddressCoolingDown("r.test", "10.1.2.3:8448", 29.2, timed_out))
        assert (error.status, error.errcode, error.error) == (
            status,
            "M_UNKNOWN",
            "Cannot reach r.test: cooling down, not trying again for 30 s",
        )
