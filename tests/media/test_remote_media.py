"""Remote media against the real server process in pool mode (ADR-0121): the media pool
handoff, the per-client budget, one fetch per remote file, the cache, and bad peers.

Peers are real TLS servers on loopback, named by IP literal (found without DNS). One server
process is shared by the module; tests that need other settings start their own. After every
fault, the budgets' in-flight counts are checked back at zero through /metrics.
"""

import io
import os
import time
import uuid

import gevent
import pytest
from gevent.event import Event
from gevent.server import StreamServer
from PIL import Image

from tests.media.images import solid
from tests.peers.honest import multipart_media
from tests.peers.liar import MALFORMED_MEDIA, LiarPeer
from tests.peers.tarpit import Tarpit
from tests.support.browser import Connection, burst
from tests.support.federation import DENIED_IP, federation_settings
from tests.support.metrics import in_flight, metric, wait_for_metric
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge

CLIENT = "/_matrix/client/v1/media"
LEGACY = "/_matrix/media/v3"
REMOTE_TIMEOUT = 5  # the media deadline is min(30 s, remote_timeout): faults end sooner
MAX_UPLOAD = 1_000_000
BLOCKED = "127.44.3.1:8448"


def weir_settings(test_ca, directory: str, **extra) -> dict:
    settings = merge(
        base_settings(os.path.join(directory, "data")),
        {
            "federation": federation_settings(test_ca, remote_timeout=REMOTE_TIMEOUT),
            "media": {"max_upload_size": MAX_UPLOAD},
            "security": {"media": {"blocked_servers": [BLOCKED]}},
        },
    )
    return merge(settings, extra)


@pytest.fixture(scope="module")
def weir(test_ca, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-remote-media"))
    proc = WeirProcess(directory, weir_settings(test_ca, directory)).start()
    proc.media_root = os.path.join(directory, "data", "media")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def token(weir) -> str:
    return MatrixClient(weir.client_url).register("viewer")["access_token"]


@pytest.fixture
def alice(weir, token) -> MatrixClient:
    return MatrixClient(weir.client_url, token)


def auth(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def new_id() -> str:
    return uuid.uuid4().hex


def error(response) -> tuple[int, str]:
    return response.status_code, response.json()["errcode"]


def assert_budgets_back_to_zero(weir) -> None:
    for budget in ("media_fetch", "client_outbound"):
        wait_for_metric(weir.client_url, "weir_budget_in_flight", 0, budget=budget)
    wait_for_metric(weir.client_url, "weir_media_handed_off", 0)
    wait_for_metric(weir.client_url, "weir_budget_queued", 0, budget="media_fetch")
    wait_for_metric(weir.client_url, "weir_pool_greenlets", 0, pool="media")


def cached_files(weir) -> list[str]:
    """Every file under the media store's remote cache and its temp folder."""
    return sorted(
        os.path.join(d, f)
        for sub in ("remote", "tmp")
        for d, _, names in os.walk(os.path.join(weir.media_root, sub))
        for f in names
    )


# --- Element's first view ---------------------------------------------------------------------


def test_element_first_view(weir, token, start_peer):
    """Ten images and their thumbnails, as a browser asks for them: six keep-alive connections
    from one address, each image next to its thumbnail, from a peer 300 ms away."""
    peer = start_peer("127.44.1.1:8448", "127.44.1.1", latency=0.3)
    images = {new_id(): solid(400 + 10 * i, 300, "PNG", color=(20 * i, 80, 160)) for i in range(10)}
    for media_id, data in images.items():
        peer.serve_media(media_id, data, "image/png", f"{media_id}.png")
    paths = []
    for media_id in images:
        paths += [
            f"{CLIENT}/download/{peer.server_name}/{media_id}",
            f"{CLIENT}/thumbnail/{peer.server_name}/{media_id}?width=96&height=96&method=crop",
        ]

    started = time.monotonic()
    results = burst(weir.client_url, paths, connections=6, headers=auth(token))
    wall = time.monotonic() - started
    print(
        f"\nElement first view: {len(paths)} requests over 6 connections, peer latency "
        f"300 ms: {wall:.2f} s wall time"
    )

    assert [r.status for r in results] == [200] * len(paths), [r.body[:200] for r in results]
    for media_id, download, thumbnail in zip(images, results[0::2], results[1::2]):
        assert download.body == images[media_id]
        assert download.headers["content-type"] == "image/png"
        assert Image.open(io.BytesIO(thumbnail.body)).size == (96, 96)
    # One fetch per file, whatever asked for it.
    assert peer.media_fetches() == 10
    assert all(peer.media_fetches(media_id) == 1 for media_id in images)

    # The same view again is served from the cache: the peer sees nothing.
    seen = len(peer.requests)
    started = time.monotonic()
    again = burst(weir.client_url, paths, connections=6, headers=auth(token))
    print(f"Element first view, repeated: {time.monotonic() - started:.2f} s wall time")
    assert [r.body for r in again] == [r.body for r in results]
    assert len(peer.requests) == seen
    assert_budgets_back_to_zero(weir)


# --- refusals ---------------------------------------------------------------------------------


def test_allow_remote_false_and_a_blocked_origin_are_refused(weir, alice, start_peer):
    peer = start_peer("127.44.3.2:8448", "127.44.3.2")
    blocked = start_peer(BLOCKED, "127.44.3.1")
    media_id = new_id()
    for p in (peer, blocked):
        p.serve_media(media_id, b"x", "text/plain")
    anonymous = MatrixClient(weir.client_url)
    for path in (
        f"{LEGACY}/download/{peer.server_name}/{media_id}?allow_remote=false",
        f"{LEGACY}/thumbnail/{peer.server_name}/{media_id}?width=8&height=8&allow_remote=false",
    ):
        assert error(anonymous.get(path)) == (404, "M_NOT_FOUND")
    for path in (
        f"{CLIENT}/download/{BLOCKED}/{media_id}",
        f"{CLIENT}/thumbnail/{BLOCKED}/{media_id}?width=8&height=8",
    ):
        assert error(alice.get(path)) == (404, "M_NOT_FOUND")
    assert (peer.hits(), blocked.hits()) == (0, 0)
    # Fetched once, allow_remote=false still refuses it: the check comes before the cache.
    assert anonymous.get(f"{LEGACY}/download/{peer.server_name}/{media_id}").content == b"x"
    assert error(
        anonymous.get(f"{LEGACY}/download/{peer.server_name}/{media_id}?allow_remote=false")
    ) == (404, "M_NOT_FOUND")
    assert peer.media_fetches() == 1


def test_switching_remote_media_off_or_blocking_covers_cached_copies(test_ca, tmp_path, start_peer):
    peer = start_peer("127.44.3.3:8448", "127.44.3.3")
    other = start_peer("127.44.3.4:8448", "127.44.3.4")
    cached, fresh = new_id(), new_id()
    for p in (peer, other):
        p.serve_media(cached, b"cached", "text/plain")
        p.serve_media(fresh, b"fresh", "text/plain")
    directory = str(tmp_path)

    def run(extra: dict):
        return WeirProcess(directory, weir_settings(test_ca, directory, **extra))

    with run({}) as weir:
        client = MatrixClient(weir.client_url)
        client.register("carol")
        for p in (peer, other):
            assert client.get(f"{CLIENT}/download/{p.server_name}/{cached}").content == b"cached"
    assert (peer.media_fetches(), other.media_fetches()) == (1, 1)

    with run({"security": {"media": {"remote_fetch_enabled": False}}}) as weir:
        client = MatrixClient(weir.client_url)
        client.login("carol")
        for media_id in (cached, fresh):
            for path in (
                f"{CLIENT}/download/{peer.server_name}/{media_id}",
                f"{CLIENT}/thumbnail/{peer.server_name}/{media_id}?width=8&height=8",
            ):
                assert error(client.get(path)) == (404, "M_NOT_FOUND")

    # A port-less entry blocks the host on every port, its cached copies included.
    with run({"security": {"media": {"blocked_servers": ["127.44.3.3"]}}}) as weir:
        client = MatrixClient(weir.client_url)
        client.login("carol")
        for media_id in (cached, fresh):
            assert error(client.get(f"{CLIENT}/download/{peer.server_name}/{media_id}")) == (
                404,
                "M_NOT_FOUND",
            )
        assert client.get(f"{CLIENT}/download/{other.server_name}/{cached}").content == b"cached"
    assert (peer.media_fetches(), other.media_fetches()) == (1, 1)


# --- the cache: authenticated copies, failures ------------------------------------------------


def test_copies_fetched_for_client_v1_are_not_served_by_the_legacy_api(weir, alice, start_peer):
    peer = start_peer("127.44.7.1:8448", "127.44.7.1")
    frozen, open_copy = new_id(), new_id()
    peer.serve_media(frozen, solid(64, 64), "image/png")
    peer.serve_media(open_copy, solid(64, 64), "image/png")
    anonymous = MatrixClient(weir.client_url)

    assert alice.get(f"{CLIENT}/download/{peer.server_name}/{frozen}").status_code == 200
    for path in (
        f"{LEGACY}/download/{peer.server_name}/{frozen}",
        f"{LEGACY}/thumbnail/{peer.server_name}/{frozen}?width=32&height=32",
    ):
        assert error(anonymous.get(path)) == (404, "M_NOT_FOUND")

    # Fetched through the legacy API, a copy is served by both.
    assert anonymous.get(f"{LEGACY}/download/{peer.server_name}/{open_copy}").status_code == 200
    assert (
        anonymous.get(
            f"{LEGACY}/thumbnail/{peer.server_name}/{open_copy}?width=32&height=32"
        ).status_code
        == 200
    )
    assert alice.get(f"{CLIENT}/download/{peer.server_name}/{open_copy}").status_code == 200
    assert peer.media_fetches() == 2


def test_a_failed_fetch_is_shared_by_its_waiters_and_not_cached(weir, alice, start_peer):
    peer = start_peer("127.44.7.2:8448", "127.44.7.2", cls=LiarPeer)
    media_id = new_id()
    path = f"/_matrix/federation/v1/media/download/{media_id}"
    release = Event()

    def fails_once(req):
        if peer.hits(path) > 1:
            body, content_type = multipart_media({"Content-Type": "text/plain"}, b"better now")
            return 200, body, {"Content-Type": content_type}
        release.wait()
        return 500, {"errcode": "M_UNKNOWN", "error": "disk on fire"}

    peer.route("GET", path, fails_once)
    waiting = [
        gevent.spawn(alice.get, f"{CLIENT}/{kind}/{peer.server_name}/{media_id}?width=8&height=8")
        for kind in ("download", "thumbnail") * 2
    ]
    assert peer.wait_hits(path, 1)
    wait_for_metric(weir.client_url, "weir_media_handed_off", 4)
    release.set()
    gevent.joinall(waiting, raise_error=True)
    assert [error(g.value) for g in waiting] == [(502, "M_UNKNOWN")] * 4
    assert peer.hits(path) == 1

    r = alice.get(f"{CLIENT}/download/{peer.server_name}/{media_id}")
    assert (r.status_code, r.content) == (200, b"better now")
    assert peer.hits(path) == 2
    assert_budgets_back_to_zero(weir)


@pytest.mark.parametrize(
    "status, errcode, expected",
    [
        (404, "M_NOT_FOUND", (404, "M_NOT_FOUND")),
        (403, "M_FORBIDDEN", (403, "M_FORBIDDEN")),
        (500, "M_UNKNOWN", (502, "M_UNKNOWN")),
        (400, "M_UNRECOGNIZED", (502, "M_UNKNOWN")),
    ],
)
def test_remote_errors_are_mapped(weir, alice, start_peer, status, errcode, expected):
    peer = start_peer("127.44.7.3:8448", "127.44.7.3", cls=LiarPeer)
    media_id = new_id()
    peer.route(
        "GET",
        f"/_matrix/federation/v1/media/download/{media_id}",
        lambda req: (status, {"errcode": errcode, "error": "no"}),
    )
    assert error(alice.get(f"{CLIENT}/download/{peer.server_name}/{media_id}")) == expected
    assert peer.media_fetches() == 1  # no fallback: only 404/405 M_UNRECOGNIZED mean that
    assert_budgets_back_to_zero(weir)


def test_an_unreachable_origin_is_502(weir, alice):
    # Nothing listens there: the connection is refused.
    assert error(alice.get(f"{CLIENT}/download/127.44.7.4:8448/{new_id()}")) == (502, "M_UNKNOWN")
    assert_budgets_back_to_zero(weir)


def test_an_origin_that_just_failed_is_refused_at_once(weir, alice):
    """A remote media fetch is a client-triggered call: an address that refused the
    connection cools down, and the next request for that origin is refused before anything
    is spent on it, without naming the address."""
    refusals = metric(weir.client_url, "weir_cooldown_refusals_total")
    # Nothing listens there yet: the connection is refused.
    assert error(alice.get(f"{CLIENT}/download/127.44.7.6:8448/{new_id()}")) == (502, "M_UNKNOWN")
    accepted = []

    def hang_up(sock, address):
        accepted.append(address)
        sock.close()

    listener = StreamServer(("127.44.7.6", 8448), hang_up)
    listener.start()
    try:
        r = alice.get(f"{CLIENT}/download/127.44.7.6:8448/{new_id()}")
        assert error(r) == (502, "M_UNKNOWN")
        assert r.json()["error"].startswith("Cannot reach 127.44.7.6:8448: cooling down")
        assert accepted == []  # not even a connection
        assert metric(weir.client_url, "weir_cooldown_refusals_total") == refusals + 1
    finally:
        listener.stop()
    assert_budgets_back_to_zero(weir)


# --- fetching: Location, fallback -------------------------------------------------------------


def test_a_location_part_is_followed(weir, alice, start_peer):
    peer = start_peer("127.44.6.1:8448", "127.44.6.1", cls=LiarPeer)
    store = start_peer("cdn.test", "127.44.6.2", 443)  # a Location target, not a Matrix server
    media_id, data = new_id(), os.urandom(50_000)
    store.route(
        "GET",
        "/blobs/1",
        lambda req: (
            200,
            data,
            {
                "Content-Type": "application/pdf",
                "Content-Disposition": "attachment; filename=report.pdf",
            },
        ),
    )
    peer.media_location(media_id, f"{store.url}/blobs/1")
    r = alice.get(f"{CLIENT}/download/{peer.server_name}/{media_id}")
    assert (r.status_code, r.content) == (200, data)
    assert r.headers["Content-Type"] == "application/pdf"
    assert r.headers["Content-Disposition"] == "attachment; filename=report.pdf"
    assert "Authorization" not in store.requests[-1].headers  # not signed: not a Matrix server
    # Cached: neither is asked again.
    assert alice.get(f"{CLIENT}/download/{peer.server_name}/{media_id}").content == data
    assert (peer.media_fetches(), store.hits("/blobs/1")) == (1, 1)


def test_servers_without_the_federation_endpoint_get_the_legacy_download(weir, alice, start_peer):
    old = start_peer("127.44.5.1:8448", "127.44.5.1")
    old.federation_media = False
    media_id, data = new_id(), solid(300, 200, "JPEG")
    old.serve_media(media_id, data, "image/jpeg", "photo.jpg")
    r = alice.get(f"{CLIENT}/download/{old.server_name}/{media_id}")
    assert (r.status_code, r.content) == (200, data)
    assert r.headers["Content-Disposition"] == "inline; filename=photo.jpg"
    first, legacy = old.requests[-2:]
    assert first.path == f"/_matrix/federation/v1/media/download/{media_id}"
    assert legacy.path == f"/_matrix/media/v3/download/{old.server_name}/{media_id}"
    assert "allow_remote=false" in legacy.query and "allow_redirect=true" in legacy.query
    t = alice.get(f"{CLIENT}/thumbnail/{old.server_name}/{media_id}?width=32&height=32")
    assert Image.open(io.BytesIO(t.content)).size == (32, 21)  # scale keeps 3:2
    assert len(old.requests) == 2


def test_a_legacy_redirect_is_followed_with_the_same_checks(
    weir, alice, start_peer, denied_listeners
):
    old = start_peer("127.44.5.2:8448", "127.44.5.2", cls=LiarPeer)
    old.federation_media = False
    store = start_peer("127.44.5.3:443", "127.44.5.3", 443)
    good, bad = new_id(), new_id()
    store.route(
        "GET", "/good", lambda req: (200, b"redirected bytes", {"Content-Type": "text/plain"})
    )
    old.redirect(
        f"/_matrix/media/v3/download/{old.server_name}/{good}", f"{store.url}/good", status=307
    )
    old.redirect(
        f"/_matrix/media/v3/download/{old.server_name}/{bad}",
        f"https://{DENIED_IP}/bad",
        status=307,
    )
    r = alice.get(f"{CLIENT}/download/{old.server_name}/{good}")
    assert (r.status_code, r.content) == (200, b"redirected bytes")
    assert error(alice.get(f"{CLIENT}/download/{old.server_name}/{bad}")) == (502, "M_UNKNOWN")
    assert [listener.accepted for listener in denied_listeners] == [0, 0]
    assert_budgets_back_to_zero(weir)


# --- bad peers --------------------------------------------------------------------------------


@pytest.mark.parametrize("declared", [False, True], ids=["streamed", "declared"])
def test_oversized_media_is_502_too_large_with_nothing_kept(weir, alice, start_peer, declared):
    liar = start_peer("127.44.4.1:8448", "127.44.4.1", cls=LiarPeer)
    media_id, size = new_id(), 8 * MAX_UPLOAD
    liar.oversized_media(media_id, size, declared=declared)
    before = cached_files(weir)
    r = alice.get(f"{CLIENT}/download/{liar.server_name}/{media_id}")
    assert error(r) == (502, "M_TOO_LARGE")
    assert liar.media_bytes_sent < size  # the stream was cut off, not read to its end
    assert cached_files(weir) == before  # no partial file, no temp file
    assert_budgets_back_to_zero(weir)
    # Not cached: asked again, it is fetched again (and refused again).
    assert error(alice.get(f"{CLIENT}/download/{liar.server_name}/{media_id}")) == (
        502,
        "M_TOO_LARGE",
    )
    assert liar.media_fetches() == 2


@pytest.mark.parametrize("kind", sorted(MALFORMED_MEDIA))
def test_malformed_multipart_is_502(weir, alice, start_peer, kind):
    liar = start_peer("127.44.4.2:8448", "127.44.4.2", cls=LiarPeer)
    media_id = new_id()
    liar.malformed_media(media_id, kind)
    before = cached_files(weir)
    for path in (
        f"{CLIENT}/download/{liar.server_name}/{media_id}",
        f"{CLIENT}/thumbnail/{liar.server_name}/{media_id}?width=8&height=8",
    ):
        assert error(alice.get(path)) == (502, "M_UNKNOWN")
    assert cached_files(weir) == before
    assert liar.media_fetches() == 2  # a failure is not cached
    assert_budgets_back_to_zero(weir)


def test_a_location_to_a_denied_address_makes_no_connection_there(
    weir, alice, start_peer, denied_listeners
):
    liar = start_peer("127.44.4.3:8448", "127.44.4.3", cls=LiarPeer)
    media_id = new_id()
    liar.media_location(media_id, f"https://{DENIED_IP}/steal")
    liar.media_location(media_id + "b", f"https://{DENIED_IP}:8448/steal")
    for mid in (media_id, media_id + "b"):
        assert error(alice.get(f"{CLIENT}/download/{liar.server_name}/{mid}")) == (502, "M_UNKNOWN")
    assert [listener.accepted for listener in denied_listeners] == [0, 0]
    assert_budgets_back_to_zero(weir)


# --- the main pool stays free -----------------------------------------------------------------


def test_the_main_pool_stays_free(test_ca, start_weir):
    """main_pool_size = 8: sixteen requests parked on a tarpit origin have left the main
    pool, so eight further connections making local requests are all served at once."""
    weir = start_weir(
        {
            "server": {"http": {"main_pool_size": 8, "media_fetch_max_per_client": 16}},
            # Parking the sixteen and serving the eight take well under a second.
            "federation": federation_settings(test_ca, remote_timeout=2),
        }
    )
    client = MatrixClient(weir.client_url)
    client.register("dora")
    client.session.close()  # its keep-alive connection would hold a main-pool place
    headers = auth(client.token)
    with Tarpit("127.44.8.1", 8448) as tarpit:
        parked_connections = [Connection(weir.client_url) for _ in range(16)]
        parked = [
            gevent.spawn(c.get, f"{CLIENT}/download/127.44.8.1:8448/{new_id()}", headers)
            for c in parked_connections
        ]
        assert tarpit.wait_accepted(16, timeout=10)
        assert in_flight(weir.client_url, "media_fetch") == 16
        # Eight connections open at once, each served while all are open: the whole main pool
        # is free (a ninth would wait for a place).
        local = [Connection(weir.client_url, timeout=10) for _ in range(8)]
        try:
            results = gevent.joinall(
                [gevent.spawn(c.get, "/_matrix/client/versions") for c in local], raise_error=True
            )
            assert [g.value.status for g in results] == [200] * 8
            assert all(not g.ready() for g in parked)  # still parked on the tarpit
        finally:
            for c in local:
                c.close()
        gevent.joinall(parked, raise_error=True)
        for c in parked_connections:
            c.close()
    assert {(g.value.status, g.value.json()["errcode"]) for g in parked} == {(504, "M_UNKNOWN")}
    assert_budgets_back_to_zero(weir)


# --- rate limiting ----------------------------------------------------------------------------


def test_the_rate_limiter_counts_each_request_once(test_ca, start_weir, start_peer):
    """Three requests for one file (a leader and two coalesced waiters) spend three tokens,
    not more, even when the leader's client hangs up and a waiter leads the fetch again."""
    weir = start_weir(
        {
            "federation": federation_settings(test_ca, remote_timeout=REMOTE_TIMEOUT),
            "ratelimiting": {"remote_media": {"max_requests": 3, "per_seconds": 3600}},
        }
    )
    client = MatrixClient(weir.client_url)
    client.register("erin")
    peer = start_peer("127.44.9.1:8448", "127.44.9.1", cls=LiarPeer)
    media_id = new_id()
    path = f"/_matrix/federation/v1/media/download/{media_id}"
    release = Event()

    def slow_then_fine(req):
        if peer.hits(path) == 1:
            release.wait()  # the first attempt hangs until its client has gone
        body, content_type = multipart_media({"Content-Type": "text/plain"}, b"worth the wait")
        return 200, body, {"Content-Type": content_type}

    peer.route("GET", path, slow_then_fine)
    leader = Connection(weir.client_url)
    leader_request = gevent.spawn(
        leader.get, f"{CLIENT}/download/{peer.server_name}/{media_id}", auth(client.token)
    )
    assert peer.wait_hits(path, 1)
    waiters = [
        gevent.spawn(client.get, f"{CLIENT}/download/{peer.server_name}/{media_id}")
        for _ in range(2)
    ]
    wait_for_metric(weir.client_url, "weir_media_handed_off", 3)
    leader_request.kill()
    leader.close()  # the leader's client hangs up: a waiter leads a second attempt
    assert peer.wait_hits(path, 2)
    gevent.joinall(waiters, raise_error=True)
    release.set()
    assert [(g.value.status_code, g.value.content) for g in waiters] == [
        (200, b"worth the wait")
    ] * 2
    # Three tokens spent: a fourth miss is refused by the limiter, a cache hit is not.
    r = client.get(f"{CLIENT}/download/{peer.server_name}/{new_id()}")
    assert error(r) == (429, "M_LIMIT_EXCEEDED")
    assert client.get(f"{CLIENT}/download/{peer.server_name}/{media_id}").status_code == 200
    assert_budgets_back_to_zero(weir)


def test_a_refusal_by_the_budget_spends_no_rate_limit_token(test_ca, start_weir, start_peer):
    """One running fetch and no queue per client, two tokens: three requests refused by the
    budget while a fetch runs leave both tokens, for the next two misses."""
    weir = start_weir(
        {
            "server": {
                "http": {"media_fetch_max_per_client": 1, "media_fetch_max_queued_per_client": 0}
            },
            "federation": federation_settings(test_ca, remote_timeout=REMOTE_TIMEOUT),
            "ratelimiting": {"remote_media": {"max_requests": 2, "per_seconds": 3600}},
        }
    )
    client = MatrixClient(weir.client_url)
    client.register("fay")
    peer = start_peer("127.44.9.2:8448", "127.44.9.2")
    first, second, third = new_id(), new_id(), new_id()
    for media_id in (first, second, third):
        peer.serve_media(media_id, media_id.encode(), "text/plain")
    release = peer.media_gate = Event()
    running = gevent.spawn(client.get, f"{CLIENT}/download/{peer.server_name}/{first}")
    assert peer.wait_hits(f"/_matrix/federation/v1/media/download/{first}", 1)
    for _ in range(3):
        r = client.get(f"{CLIENT}/download/{peer.server_name}/{second}")
        assert error(r) == (429, "M_LIMIT_EXCEEDED")
        assert "in flight" in r.json()["error"]  # the budget's refusal, not the limiter's
    release.set()
    assert running.get().status_code == 200
    r = client.get(f"{CLIENT}/download/{peer.server_name}/{second}")
    assert (r.status_code, r.content) == (200, second.encode())
    r = client.get(f"{CLIENT}/download/{peer.server_name}/{third}")
    assert error(r) == (429, "M_LIMIT_EXCEEDED")
    assert r.json()["error"] == "Too many remote media requests"
    assert peer.media_fetches() == 2
    assert_budgets_back_to_zero(weir)
