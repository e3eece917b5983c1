"""Our room directory for other servers: publicRooms and query/directory, X-Matrix signed
by a fake origin, against the real server process with a TLS federation listener."""

import json
from urllib.parse import quote

import pytest
import requests

from tests.peers.honest import HonestPeer
from tests.support.federation import tls_weir
from tests.support.server import MatrixClient
from tests.support.spec import assert_matches_spec

V3 = "/_matrix/client/v3"
PUBLIC_ROOMS = "/_matrix/federation/v1/publicRooms"
QUERY_DIRECTORY = "/_matrix/federation/v1/query/directory"


@pytest.fixture(scope="module")
def origin(test_ca, dns):
    dns.add_a("origin.test", "127.40.3.1")
    with HonestPeer("origin.test", test_ca, host="127.40.3.1", port=8448) as peer:
        yield peer


@pytest.fixture(scope="module")
def weir(test_ca, dns, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-fed-dir"))
    with tls_weir(test_ca, directory, "127.40.2.1", dns=dns) as proc:
        yield proc


@pytest.fixture(scope="module")
def rooms(weir):
    """Three public rooms (sizes 3, 2, 1) and a private one, with aliases."""
    users = [MatrixClient(weir.client_url) for _ in range(3)]
    for i, u in enumerate(users):
        u.register(f"user{i}")
    made = []
    for size, (name, topic) in zip(
        (3, 2, 1), [("Big", "dogs"), ("Mid", "cats"), ("Small", "dogs")]
    ):
        r = users[0].post(
            f"{V3}/createRoom",
            json={
                "preset": "public_chat",
                "visibility": "public",
                "name": name,
                "topic": topic,
                "room_alias_name": name.lower(),
            },
        )
        room_id = r.json()["room_id"]
        for u in users[1:size]:
            assert u.post(f"{V3}/join/{room_id}", json={}).status_code == 200
        made.append(room_id)
    users[0].post(f"{V3}/createRoom", json={"preset": "private_chat", "name": "Hidden"})
    return made


def signed(origin, weir, test_ca, method, target, content=None):
    auth = origin.sign_request("weir.test", method, target, content)
    return requests.request(
        method,
        weir.fed_url(target),
        headers={"Authorization": auth},
        data=json.dumps(content) if content is not None else None,
        verify=test_ca.ca_path,
        timeout=30,
    )


def test_public_rooms_for_a_signed_origin(weir, test_ca, origin, rooms):
    r = signed(origin, weir, test_ca, "GET", f"{PUBLIC_ROOMS}?limit=2")
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "GET", PUBLIC_ROOMS, api="server-server")
    body = r.json()
    assert [e["room_id"] for e in body["chunk"]] == rooms[:2]
    assert [e["num_joined_members"] for e in body["chunk"]] == [3, 2]
    assert body["total_room_count_estimate"] == 3
    rest = signed(
        origin, weir, test_ca, "GET", f"{PUBLIC_ROOMS}?limit=2&since={quote(body['next_batch'])}"
    )
    assert [e["room_id"] for e in rest.json()["chunk"]] == rooms[2:]

    filtered = signed(
        origin,
        weir,
        test_ca,
        "POST",
        PUBLIC_ROOMS,
        {"filter": {"generic_search_term": "dogs"}, "limit": 10},
    )
    assert filtered.status_code == 200, filtered.text
    assert_matches_spec(filtered, "POST", PUBLIC_ROOMS, api="server-server")
    assert [e["room_id"] for e in filtered.json()["chunk"]] == [rooms[0], rooms[2]]


def test_query_directory_for_a_signed_origin(weir, test_ca, origin, rooms):
    target = f"{QUERY_DIRECTORY}?room_alias={quote('#mid:weir.test')}"
    r = signed(origin, weir, test_ca, "GET", target)
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "GET", QUERY_DIRECTORY, api="server-server")
    assert r.json() == {"room_id": rooms[1], "servers": ["weir.test"]}
    for alias in ("#nope:weir.test", "#mid:elsewhere.test"):
        missing = signed(
            origin, weir, test_ca, "GET", f"{QUERY_DIRECTORY}?room_alias={quote(alias)}"
        )
        assert (missing.status_code, missing.json()["errcode"]) == (404, "M_NOT_FOUND")


def test_unsigned_requests_are_refused(weir, test_ca, rooms):
    for target in (PUBLIC_ROOMS, f"{QUERY_DIRECTORY}?room_alias={quote('#mid:weir.test')}"):
        r = requests.get(weir.fed_url(target), verify=test_ca.ca_path, timeout=30)
        assert (r.status_code, r.json()["errcode"]) == (401, "M_UNAUTHORIZED")
