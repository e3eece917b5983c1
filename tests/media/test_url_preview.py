"""Link previews on the real server (SQLite and PostgreSQL), fetching from a web site on
loopback over real HTTP (tests/peers/web.py): a page's Open Graph object with its image
stored as our media; a plain `<title>` page; an image URL itself; a tarpit page costing one
client-outbound slot and one deadline; twenty clients asking for one URL making one fetch;
a redirect and a DNS name leading to a denied address, never connected to; a 1 GiB page cut
at the cap, its connection closed; the blacklist; previews off by default."""

import time

import gevent
import pytest

from tests.media.images import solid
from tests.peers.tarpit import Tarpit
from tests.peers.web import EndlessPage, WebSite
from tests.support.metrics import in_flight, metric, wait_for_metric
from tests.support.server import MatrixClient, WeirProcess, base_settings
from tests.support.spec import assert_matches_spec

WEB_IP = "127.40.62.1"  # allowed by the server's url_preview.ip_range_allowlist
DENIED_IP = "127.40.62.2"  # loopback, denied by the default denylist
PREVIEW = "/_matrix/client/v1/media/preview_url"
DEADLINE = 3
MAX_SPIDER = 2 * 1024 * 1024
GIB = 1024 * 1024 * 1024
IMAGE = solid(37, 23)

OG_PAGE = b"""<!doctype html><html><head>
<meta property="og:title" content="A page with a card">
<meta property="og:description" content="What the card says">
<meta property="og:image" content="/card.png">
<title>Not this title</title></head><body><p>Hello</p></body></html>"""

TITLE_PAGE = b"""<html><head><title>  A plain
 page </title><meta name="description" content="Only a description"></head>
<body><svg><title>a drawing</title></svg><p>text</p></body></html>"""


@pytest.fixture(scope="module")
def site(server):
    """A site per server: what it saw is that server's fetches alone."""
    with WebSite(WEB_IP) as site:
        site.page("/og", OG_PAGE)
        site.page("/card.png", IMAGE, content_type="image/png")
        site.page("/title", TITLE_PAGE)
        yield site


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(request, tmp_path_factory, dns, test_ca):
    directory = tmp_path_factory.mktemp("weir-preview")
    settings = base_settings(str(directory / "data"))
    if request.param == "postgres":
        settings["database"] = {"url": request.getfixturevalue("pg_cluster").new_database()}
    # X-Forwarded-For from loopback names the client: twenty clients, twenty client keys.
    settings["server"]["http"]["trusted_proxies"] = ["127.0.0.0/8"]
    settings["federation"]["dns_nameservers"] = [dns.nameserver]
    settings["federation"]["ca_file"] = test_ca.ca_path  # trusted for https pages too
    settings["url_preview"] = {
        "enabled": True,
        "url_blacklist": ["*.blocked.test", f"http://{WEB_IP}:*/secret*"],
        "max_spider_size": MAX_SPIDER,
        "deadline": DEADLINE,
        "ip_range_allowlist": [f"{WEB_IP}/32"],
    }
    proc = WeirProcess(str(directory), settings).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def alice(server):
    client = MatrixClient(server.client_url)
    client.register("previewer")
    return client


def preview(client, url: str, status: int = 200, **params) -> dict:
    r = client.get(PREVIEW, params={"url": url, **params}, timeout=30)
    assert r.status_code == status, r.text
    if status == 200:
        assert_matches_spec(r, "GET", PREVIEW)
    return r.json()


def downloaded(client, mxc: str) -> bytes:
    r = client.get(f"/_matrix/client/v1/media/download/{mxc[len('mxc://') :]}")
    assert r.status_code == 200, r.text
    return r.content


def test_a_page_gives_its_open_graph_and_its_image_becomes_our_media(alice, site):
    og = preview(alice, site.url("/og"))
    assert og["og:title"] == "A page with a card"
    assert og["og:description"] == "What the card says"
    assert og["og:image"].startswith("mxc://weir.test/")
    assert (og["og:image:width"], og["og:image:height"]) == (37, 23)
    assert og["og:image:type"] == "image/png"
    assert og["matrix:image:size"] == len(IMAGE)
    assert downloaded(alice, og["og:image"]) == IMAGE
    assert site.count("/og") == 1 and site.count("/card.png") == 1
    assert ("/og", f"{WEB_IP}:{site.port}") in site.requests  # the URL's Host header
    # The legacy paths answer the same preview, kept: the site is not asked again.
    for legacy in ("/_matrix/media/v3/preview_url", "/_matrix/media/r0/preview_url"):
        r = alice.get(legacy, params={"url": site.url("/og")})
        assert r.status_code == 200 and r.json() == og
    # As of a time before the first fetch, the current preview is the one there is.
    assert preview(alice, site.url("/og"), ts=1) == og
    assert site.count("/og") == 1


def test_a_plain_page_gives_its_title_and_description(alice, site):
    og = preview(alice, site.url("/title"))
    assert og == {"og:title": "A plain page", "og:description": "Only a description"}


def test_an_image_url_is_described_as_the_stored_image(alice, site):
    image = solid(5, 8, "JPEG")
    site.page("/photo", image, content_type="image/jpeg")
    og = preview(alice, site.url("/photo"))
    assert (og["og:image:width"], og["og:image:height"]) == (5, 8)
    assert og["og:image:type"] == "image/jpeg" and og["matrix:image:size"] == len(image)
    assert downloaded(alice, og["og:image"]) == image


def test_https_pages_are_fetched_with_their_certificate_verified(alice, dns, test_ca):
    dns.add_a("secure.preview.test", WEB_IP)
    dns.add_a("impostor.preview.test", WEB_IP)
    context = test_ca.server_context("secure.preview.test")
    with WebSite(WEB_IP, ssl_context=context) as secure:
        secure.page("/", b"<title>Over TLS</title>")
        url = f"https://secure.preview.test:{secure.port}/"
        assert preview(alice, url) == {"og:title": "Over TLS"}
        assert secure.requests == [("/", f"secure.preview.test:{secure.port}")]
        # The same server under a name its certificate does not carry: no request is sent.
        for wrong in (f"https://impostor.preview.test:{secure.port}/", secure.url("/")):
            r = alice.get(PREVIEW, params={"url": wrong.replace("http://", "https://")})
            assert r.status_code == 502 and r.json()["errcode"] == "M_UNKNOWN", r.text
        assert len(secure.requests) == 1


def test_a_tarpit_costs_one_slot_and_one_deadline(server, alice):
    """One slot (a second preview of the client's is 429 meanwhile), one deadline, then
    nothing held: the connection closed, the slot back, the failure kept."""
    with Tarpit(WEB_IP) as tarpit:
        started = time.monotonic()
        asking = gevent.spawn(alice.get, PREVIEW, params={"url": tarpit.url + "/"}, timeout=30)
        assert tarpit.wait_accepted(1, timeout=10)
        assert in_flight(server.client_url, "client_outbound") == 1
        # The client's one slot is taken: another preview it asks for is refused at once.
        r = alice.get(PREVIEW, params={"url": f"http://{WEB_IP}:9/elsewhere"})
        assert r.status_code == 429 and r.json()["errcode"] == "M_LIMIT_EXCEEDED", r.text
        r = asking.get(timeout=30)
        elapsed = time.monotonic() - started
        assert r.status_code == 504, r.text
        assert r.json()["errcode"] == "M_UNKNOWN"
        assert DEADLINE - 0.5 < elapsed < DEADLINE + 3
        assert tarpit.wait_current(0, timeout=10)  # our connection was closed
        # Asked again, the failure is answered at once, with no slot and no connection.
        started = time.monotonic()
        again = alice.get(PREVIEW, params={"url": tarpit.url + "/"}, timeout=30)
        assert again.status_code == 504 and time.monotonic() - started < 1
        assert tarpit.accepted == 1
    assert in_flight(server.client_url, "client_outbound") == 0
    labels = {"call": "url_preview", "outcome": "deadline"}
    assert metric(server.client_url, "weir_outbound_calls_total", **labels) == 1


def test_an_og_image_that_never_comes_is_left_out_within_the_one_deadline(alice, site):
    with Tarpit(WEB_IP) as tarpit:
        page = b'<meta property="og:title" content="Slow image">'
        page += b'<meta property="og:image" content="%s/card.png">' % tarpit.url.encode()
        site.page("/slow-image", page)
        started = time.monotonic()
        og = preview(alice, site.url("/slow-image"))
        assert time.monotonic() - started < DEADLINE + 2
        assert og == {"og:title": "Slow image"}
        assert tarpit.accepted == 1


def test_twenty_clients_asking_for_one_url_make_one_fetch(server, alice, site):
    gate = site.gated("/busy", b"<title>Worth the wait</title>")
    clients = [
        MatrixClient(server.client_url, alice.token, {"X-Forwarded-For": f"198.51.100.{n}"})
        for n in range(20)
    ]
    asking = [gevent.spawn(c.get, PREVIEW, params={"url": site.url("/busy")}) for c in clients]
    try:
        assert site.wait_count("/busy", 1, timeout=10)
        # Every client is in: one leads the fetch, nineteen wait for it, each with its slot.
        wait_for_metric(server.client_url, "weir_budget_in_flight", 20, budget="client_outbound")
        assert site.count("/busy") == 1
    finally:
        gate.set()
    answers = [g.get(timeout=30) for g in asking]
    assert [r.status_code for r in answers] == [200] * 20
    assert {r.json()["og:title"] for r in answers} == {"Worth the wait"}
    assert site.count("/busy") == 1
    assert in_flight(server.client_url, "client_outbound") == 0


def test_a_redirect_or_a_name_leading_to_a_denied_address_is_never_followed(alice, site, dns):
    with Tarpit(DENIED_IP) as denied:
        site.redirect("/away", f"http://{DENIED_IP}:{denied.port}/inside")
        r = alice.get(PREVIEW, params={"url": site.url("/away")})
        assert r.status_code == 502 and r.json()["errcode"] == "M_UNKNOWN", r.text
        assert str(denied.port) not in r.text and DENIED_IP not in r.text
        dns.add_a("inside.preview.test", DENIED_IP)
        r = alice.get(PREVIEW, params={"url": f"http://inside.preview.test:{denied.port}/"})
        assert r.status_code == 502, r.text
        r = alice.get(PREVIEW, params={"url": f"http://{DENIED_IP}:{denied.port}/"})
        assert r.status_code == 502, r.text
        assert denied.accepted == 0
    assert site.count("/away") == 1


def test_a_gigabyte_page_is_cut_at_the_cap_and_its_connection_closed(alice, site):
    page = EndlessPage(GIB)
    site.handle("/endless", page)
    og = preview(alice, site.url("/endless"))
    assert og == {"og:title": "Endless"}  # what was read, parsed
    assert page.hung_up.wait(10)
    # The cap, and what the sockets' buffers took before we closed: far from a gigabyte.
    assert MAX_SPIDER <= page.sent < MAX_SPIDER + 16 * 1024 * 1024


def test_blacklisted_urls_and_bad_requests_are_refused(server, alice, site):
    for url in ("http://www.blocked.test/", site.url("/secret/page")):
        r = alice.get(PREVIEW, params={"url": url})
        assert r.status_code == 403 and r.json()["errcode"] == "M_UNKNOWN", r.text
    assert site.count("/secret/page") == 0
    assert alice.get(PREVIEW).json()["errcode"] == "M_MISSING_PARAM"
    for url in ("ftp://example.org/", "/relative", "http://:80/"):
        r = alice.get(PREVIEW, params={"url": url})
        assert r.status_code == 400 and r.json()["errcode"] == "M_INVALID_PARAM", r.text
    r = alice.get(PREVIEW, params={"url": site.url("/og"), "ts": "yesterday"})
    assert r.status_code == 400 and r.json()["errcode"] == "M_INVALID_PARAM"
    r = MatrixClient(server.client_url).get(PREVIEW, params={"url": site.url("/og")})
    assert r.status_code == 401
    site.page("/doc", b"%PDF-1.4", content_type="application/pdf")
    for path in ("/doc", "/missing"):  # a type we do not read, an error status: as Synapse
        r = alice.get(PREVIEW, params={"url": site.url(path)})
        assert r.status_code == 502 and r.json()["errcode"] == "M_UNKNOWN", r.text


def test_previews_are_off_by_default_as_in_synapse(start_weir):
    weir = start_weir()
    client = MatrixClient(weir.client_url)
    client.register("nopreview")
    for path in (PREVIEW, "/_matrix/media/v3/preview_url"):
        for who in (client, MatrixClient(weir.client_url)):
            r = who.get(path, params={"url": "http://example.org/"})
            assert r.status_code == 404 and r.json()["errcode"] == "M_UNRECOGNIZED", r.text
