"""One name must not cool another down (docs/architecture.md, "What one name can do to
another"), against the real server process.

An honest TLS peer's certificate carries only its real name. Anyone can name its address
another way (an IP literal, a second DNS name pointed at it) and make us fail TLS there:
that says nothing about the address, so lookups for the real name go on working. A download
that the deadline cuts mid-body does not cool its peer down either. And a client is told
that a server cannot be reached, never why: no address, only a private one, or one that
refuses all look the same from outside.
"""

import itertools
import os
import re
import time
import uuid
from urllib.parse import quote

import gevent
import pytest
import requests
from gevent.event import Event

from tests.peers.directory import room, serve_directory
from tests.peers.honest import multipart_media
from tests.support.federation import DENIED_IP, federation_settings
from tests.support.metrics import metric
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge

V3 = "/_matrix/client/v3"
LEGACY_MEDIA = "/_matrix/media/v3/download"
REMOTE_TIMEOUT = 3  # every deadline, the media one included, is cut to this
REAL_IP = "127.52.0.1"
REAL_NAME = "real.test"
ATTEMPTS = 20
QUERIES = itertools.count(1)


@pytest.fixture(scope="module")
def weir(test_ca, dns, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-cooldown-poisoning"))
    settings = merge(
        base_settings(os.path.join(directory, "data")),
        {"federation": federation_settings(test_ca, dns, remote_timeout=REMOTE_TIMEOUT)},
    )
    proc = WeirProcess(directory, settings).start()
    yield proc
    proc.stop()


@pytest.fixture
def real_peer(dns, start_peer):
    """An honest server whose certificate names only `real.test` (not its address), with a
    room list, an alias and a file."""
    dns.remove(REAL_NAME)
    dns.add_a(REAL_NAME, REAL_IP)
    peer = start_peer(REAL_NAME, REAL_IP, cert_names=(REAL_NAME,))
    serve_directory(
        peer, [room(f"!lobby:{REAL_NAME}", "Lobby", 5)], {f"#lobby:{REAL_NAME}": "!lobby:x"}
    )
    return peer


def cooldown_figures(weir) -> tuple[float, float]:
    return (
        metric(weir.client_url, "weir_cooldowns_started_total"),
        metric(weir.client_url, "weir_cooldown_addresses"),
    )


def public_rooms(weir, server: str, **params) -> requests.Response:
    """Anonymous: anyone may make us ask another server for its room list."""
    return requests.get(
        weir.url(f"{V3}/publicRooms"), params={"server": server, **params}, timeout=30
    )


def assert_real_name_served(weir, peer) -> None:
    """The real name's room list, alias and media, each answered by the peer itself."""
    media_id = uuid.uuid4().hex
    peer.serve_media(media_id, b"real bytes", "text/plain")
    seen = len(peer.requests)
    started = time.monotonic()
    rooms = public_rooms(weir, REAL_NAME, limit=next(QUERIES))  # never a cached answer
    assert rooms.status_code == 200, rooms.text
    assert [r["room_id"] for r in rooms.json()["chunk"]] == [f"!lobby:{REAL_NAME}"]
    alias = requests.get(
        weir.url(f"{V3}/directory/room/{quote(f'#lobby:{REAL_NAME}')}"), timeout=30
    )
    assert (alias.status_code, alias.json()["room_id"]) == (200, "!lobby:x")
    media = requests.get(weir.url(f"{LEGACY_MEDIA}/{REAL_NAME}/{media_id}"), timeout=30)
    assert (media.status_code, media.content) == (200, b"real bytes")
    assert time.monotonic() - started < REMOTE_TIMEOUT  # no deadline was waited out
    assert len(peer.requests) == seen + 3


def assert_cannot_reach(response: requests.Response, server: str) -> None:
    assert response.status_code == 502, response.text
    assert response.json() == {"errcode": "M_UNKNOWN", "error": f"Cannot reach {server}"}


def test_naming_the_address_by_ip_literal_cools_nothing(weir, real_peer):
    before = cooldown_figures(weir)
    literal = f"{REAL_IP}:8448"
    for _ in range(ATTEMPTS):
        assert_cannot_reach(public_rooms(weir, literal), literal)
    assert real_peer.hits() == 0  # TLS failed every time: no request ever reached it
    weir.wait_for_log(rf"cannot reach {literal}: TLS failure with {literal}: .*doesn't match")
    assert_real_name_served(weir, real_peer)
    assert cooldown_figures(weir) == before
    assert before[1] == 0


def test_a_second_name_pointed_at_the_address_cools_nothing(weir, dns, real_peer):
    # No port: discovery asks https://pointed.test/.well-known/... (nothing listens on 443
    # there), then port 8448, where the certificate is for real.test.
    dns.add_a("pointed.test", REAL_IP)
    before = cooldown_figures(weir)
    for _ in range(ATTEMPTS):
        response = public_rooms(weir, "pointed.test")
        assert_cannot_reach(response, "pointed.test")
        assert REAL_IP not in response.text
    assert real_peer.hits() == 0
    assert_real_name_served(weir, real_peer)
    assert cooldown_figures(weir) == before


def test_a_download_cut_by_the_deadline_mid_body_cools_nothing(weir, start_peer):
    """An honest peer streams a large file slowly: the media deadline ends the download,
    and the next file from it is fetched at once."""
    peer = start_peer("127.52.0.2:8448", "127.52.0.2")
    body, content_type = multipart_media(
        {"Content-Type": "application/octet-stream"}, os.urandom(1 << 20)
    )
    streaming = Event()

    def slowly(req):
        def chunks():
            for i in range(0, len(body), 16 * 1024):
                yield body[i : i + 16 * 1024]
                streaming.set()
                gevent.sleep(0.2)  # the peer's pace: 1 MiB takes about 13 s

        return 200, chunks(), {"Content-Type": content_type}

    peer.route("GET", "/_matrix/federation/v1/media/download/big", slowly)
    peer.serve_media("small", b"small file", "text/plain")
    before = cooldown_figures(weir)
    started = time.monotonic()
    big = requests.get(weir.url(f"{LEGACY_MEDIA}/{peer.server_name}/big"), timeout=30)
    assert (big.status_code, big.json()["errcode"]) == (504, "M_UNKNOWN")
    assert streaming.is_set()  # the head and the first bytes came back before the deadline
    assert REMOTE_TIMEOUT - 0.5 < time.monotonic() - started < REMOTE_TIMEOUT + 5
    small = requests.get(weir.url(f"{LEGACY_MEDIA}/{peer.server_name}/small"), timeout=30)
    assert (small.status_code, small.content) == (200, b"small file")
    assert cooldown_figures(weir) == before


def test_why_a_server_cannot_be_reached_is_not_told(weir, dns, denied_listeners):
    """No address, only a denied (private) one, or one that refuses: the same answer, with
    no address in it; the detail is in the log."""
    dns.add_a("private.test", DENIED_IP)
    dns.add_a("closed.test", "127.52.0.3")  # nothing listens there: refused
    for server in ("private.test:8448", "nowhere.test:8448", "closed.test:8448"):
        response = public_rooms(weir, server)
        assert_cannot_reach(response, server)
        assert "127." not in response.text
    # The refused address cools down: the client is told for how long, not which address.
    cooled = public_rooms(weir, "closed.test:8448")
    assert cooled.status_code == 502
    told = re.fullmatch(
        r"Cannot reach closed\.test:8448: cooling down, not trying again for (\d+) s",
        cooled.json()["error"],
    )
    assert told is not None and 0 < int(told[1]) <= 30, cooled.text
    weir.wait_for_log(rf"cannot reach private.test:8448: denied address {DENIED_IP}:8448")
    weir.wait_for_log(r"cannot reach nowhere.test:8448: no address")
    weir.wait_for_log(r"cannot reach closed.test:8448: cannot connect to 127.52.0.3:8448: ")
    weir.wait_for_log(r"cannot reach closed.test:8448: 127.52.0.3:8448 is cooling down")
    # The same for the keys of a user whose server resolves to the denied address.
    token = MatrixClient(weir.client_url).register("keys")["access_token"]
    keys = requests.post(
        weir.url(f"{V3}/keys/query"),
        json={"device_keys": {"@u:private.test": []}},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert keys.status_code == 200, keys.text
    assert keys.json()["failures"] == {
        "private.test": {"status": 503, "message": "Cannot reach private.test"}
    }
    assert [listener.accepted for listener in denied_listeners] == [0, 0]
