"""Remote room lists and aliases against honest (and less honest) TLS peers: paging,
filters, the POST fallback, error mapping, signing, coalescing and the 30 s cache."""

import gevent
import pytest
import requests

from tests.peers.directory import PUBLIC_ROOMS, QUERY_DIRECTORY, room, serve_directory
from tests.peers.honest import HonestPeer
from tests.peers.liar import LiarPeer
from tests.support.federation import federation_settings
from tests.support.metrics import in_flight, metric
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge

V3 = "/_matrix/client/v3"

ROOMS = [
    room(
        f"!r{i:02d}:dir.test",
        f"Room {i:02d}",
        members=100 - i,
        topic="cats" if i % 5 == 0 else "dogs",
        room_type="m.space" if i == 7 else None,
    )
    for i in range(25)
]


def as_client(i: int) -> dict:
    return {"X-Forwarded-For": f"203.0.113.{i}", "Connection": "close"}


@pytest.fixture(scope="module")
def peers(test_ca, dns):
    made = {}

    def peer(name, ip, cls=HonestPeer, **kw):
        dns.add_a(name, ip)
        made[name] = cls(name, test_ca, host=ip, port=8448, **kw).start()
        return made[name]

    serve_directory(
        peer("dir.test", "127.40.1.1"), ROOMS, aliases={"#lobby:dir.test": "!r00:dir.test"}
    )
    serve_directory(peer("nofilter.test", "127.40.1.2"), ROOMS, post_filtering=False)
    forbidding = peer("forbid.test", "127.40.1.3")
    for method, path in (("GET", PUBLIC_ROOMS), ("GET", QUERY_DIRECTORY)):
        forbidding.route(
            method, path, lambda req: (403, {"errcode": "M_FORBIDDEN", "error": "Not for you"})
        )
    peer("liar.test", "127.40.1.4", cls=LiarPeer).malformed_json(PUBLIC_ROOMS)
    serve_directory(peer("slow.test", "127.40.1.5", latency=0.5), ROOMS[:3])
    yield made
    for p in made.values():
        p.stop()


@pytest.fixture(scope="module")
def weir(test_ca, dns, peers, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-remote-dir"))
    settings = merge(
        base_settings(f"{directory}/data"),
        {
            "server": {"http": {"trusted_proxies": ["127.0.0.0/8"]}},
            "federation": federation_settings(test_ca, dns),
        },
    )
    proc = WeirProcess(directory, settings).start()
    yield proc
    proc.stop()


def get_rooms(weir, server, client=1, **params):
    return requests.get(
        weir.url(f"{V3}/publicRooms"),
        params={"server": server, **params},
        headers=as_client(client),
        timeout=30,
    )


@pytest.fixture(scope="module")
def alice(weir):
    c = MatrixClient(weir.client_url, headers={"X-Forwarded-For": "203.0.113.200"})
    c.register("alice")
    return c


def test_remote_list_pages_through_every_room(weir, peers):
    seen, since = [], None
    for _ in range(5):
        params = {"limit": 10, **({"since": since} if since else {})}
        page = get_rooms(weir, "dir.test", **params)
        assert page.status_code == 200, page.text
        body = page.json()
        seen += [r["room_id"] for r in body["chunk"]]
        assert body["total_room_count_estimate"] == 25
        since = body.get("next_batch")
        if since is None:
            break
    assert seen == [r["room_id"] for r in ROOMS]  # largest first, each exactly once
    # Signed by us, for the server name asked for (discovery found its address).
    request = peers["dir.test"].requests[-1]
    assert request.headers["Authorization"].startswith("X-Matrix ")
    assert (
        'origin="weir.test"' in request.headers["Authorization"]
        or "origin=weir.test" in request.headers["Authorization"]
    )
    assert request.host == "dir.test" and request.sni == "dir.test"


def test_remote_list_filter(weir, peers, alice):
    r = alice.post(
        f"{V3}/publicRooms",
        params={"server": "dir.test"},
        json={"filter": {"generic_search_term": "CATS"}, "limit": 50},
    )
    assert r.status_code == 200, r.text
    assert {e["room_id"] for e in r.json()["chunk"]} == {
        x["room_id"] for x in ROOMS if x["topic"] == "cats"
    }
    assert peers["dir.test"].requests[-1].method == "POST"
    spaces = alice.post(
        f"{V3}/publicRooms",
        params={"server": "dir.test"},
        json={"filter": {"room_types": ["m.space"]}},
    )
    assert [e["room_id"] for e in spaces.json()["chunk"]] == ["!r07:dir.test"]


def test_filter_falls_back_to_get_when_post_is_unsupported(weir, peers, alice):
    nofilter = peers["nofilter.test"]
    before = nofilter.hits(PUBLIC_ROOMS)
    r = alice.post(
        f"{V3}/publicRooms",
        params={"server": "nofilter.test"},
        json={"filter": {"generic_search_term": "room 1"}, "limit": 100},
    )
    assert r.status_code == 200, r.text
    assert [e["name"] for e in r.json()["chunk"]] == [f"Room {i}" for i in range(10, 20)]
    methods = [req.method for req in nofilter.requests[before:]]
    assert methods == ["POST", "GET"]


def test_remote_alias(weir, peers):
    found = requests.get(
        weir.url(f"{V3}/directory/room/%23lobby:dir.test"), headers=as_client(2), timeout=30
    )
    assert found.status_code == 200, found.text
    assert found.json() == {"room_id": "!r00:dir.test", "servers": ["dir.test"]}
    missing = requests.get(
        weir.url(f"{V3}/directory/room/%23nope:dir.test"), headers=as_client(2), timeout=30
    )
    assert (missing.status_code, missing.json()["errcode"]) == (404, "M_NOT_FOUND")


def test_remote_errors_map_per_the_table(weir, peers):
    forbidden = get_rooms(weir, "forbid.test", client=3)
    assert (forbidden.status_code, forbidden.json()["errcode"]) == (403, "M_FORBIDDEN")
    alias = requests.get(
        weir.url(f"{V3}/directory/room/%23x:forbid.test"), headers=as_client(3), timeout=30
    )
    assert (alias.status_code, alias.json()["errcode"]) == (403, "M_FORBIDDEN")
    malformed = get_rooms(weir, "liar.test", client=3)
    assert (malformed.status_code, malformed.json()["errcode"]) == (502, "M_UNKNOWN")
    unknown = get_rooms(weir, "nowhere.test", client=3)  # NXDOMAIN
    assert (unknown.status_code, unknown.json()["errcode"]) == (502, "M_UNKNOWN")
    assert in_flight(weir.client_url, "client_outbound") == 0


def test_identical_requests_share_one_call_then_the_cache(weir, peers):
    slow = peers["slow.test"]
    before = slow.hits(PUBLIC_ROOMS)
    calls = [gevent.spawn(get_rooms, weir, "slow.test", 100 + i, limit=3) for i in range(20)]
    gevent.joinall(calls, timeout=30, raise_error=True)
    assert [c.value.status_code for c in calls] == [200] * 20
    assert all(c.value.json() == calls[0].value.json() for c in calls)
    assert slow.hits(PUBLIC_ROOMS) - before == 1  # exactly one upstream fetch
    # Within 30 s the same query is answered from the cache: no peer hit, and no slot.
    again = get_rooms(weir, "slow.test", 200, limit=3)
    assert again.json() == calls[0].value.json()
    assert slow.hits(PUBLIC_ROOMS) - before == 1
    assert metric(weir.client_url, "weir_cache_hits_total", cache="remote_public_rooms") >= 1
    # A different query is a different call.
    other = get_rooms(weir, "slow.test", 201, limit=2)
    assert other.status_code == 200 and slow.hits(PUBLIC_ROOMS) - before == 2
    assert in_flight(weir.client_url, "client_outbound") == 0
