"""A space with rooms on other servers, walked for a client on the real server: a child on
a fake peer over real TLS is asked for with a signed `GET /_matrix/federation/v1/hierarchy`,
its own child comes from the same answer, and a child on a tarpit that never answers costs
the request's one slot and deadline: the answer still comes, in time, with every room that
could be reached, and the client-outbound budget is back to zero in flight."""

import time
from urllib.parse import quote

import pytest

from tests.peers.honest import HonestPeer
from tests.peers.tarpit import Tarpit
from tests.rooms.conftest import V3, create_room
from tests.support.federation import tls_weir
from tests.support.metrics import in_flight, metric
from tests.support.server import MatrixClient

WEIR_IP = "127.40.31.11"
PEER_IP = "127.40.31.12"
TARPIT_IP = "127.40.31.13"
PEER = f"{PEER_IP}:8448"
FAR = f"!far:{PEER}"
FARTHER = f"!farther:{PEER}"
STUCK = f"!stuck:{TARPIT_IP}:8448"
HIERARCHY = "/_matrix/federation/v1/hierarchy/"
DEADLINE = 3  # remote_timeout caps the walk's 10 s deadline


def summary(room_id: str, name: str, children: list[str] = ()) -> dict:
    links = [
        {
            "type": "m.space.child",
            "state_key": child,
            "sender": f"@creator:{PEER}",
            "content": {"via": [PEER]},
            "origin_server_ts": 1,
        }
        for child in children
    ]
    return {
        "room_id": room_id,
        "name": name,
        "num_joined_members": 3,
        "world_readable": False,
        "guest_can_join": False,
        "join_rule": "public",
        "children_state": links,
    }


@pytest.fixture(scope="module")
def peer(test_ca):
    peer = HonestPeer(PEER, test_ca, host=PEER_IP, port=8448)

    def hierarchy(req):
        if req.path != HIERARCHY + FAR:
            return 404, {"errcode": "M_NOT_FOUND", "error": "unknown room"}
        body = {
            "room": summary(FAR, "Far", [FARTHER]),
            "children": [summary(FARTHER, "Farther")],
            "inaccessible_children": [],
        }
        return 200, body

    peer.route("GET", HIERARCHY, hierarchy, prefix=True)
    peer.start()
    yield peer
    peer.stop()


@pytest.fixture(scope="module")
def weir(test_ca, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-spaces"))
    proc = tls_weir(
        test_ca, directory, WEIR_IP, f"{WEIR_IP}:8448", federation={"remote_timeout": DEADLINE}
    )
    with proc:
        yield proc


def link(client, parent: str, child: str, via: str, order: str) -> None:
    content = {"via": [via], "order": order}
    r = client.put(
        f"{V3}/rooms/{quote(parent, safe='')}/state/m.space.child/{quote(child, safe='')}",
        json=content,
    )
    assert r.status_code == 200, r.text


def test_remote_children_are_asked_for_and_a_tarpit_costs_only_the_deadline(weir, peer):
    alice = MatrixClient(weir.client_url)
    alice.register("spacealice")
    root = create_room(
        alice, name="Root", preset="public_chat", creation_content={"type": "m.space"}
    )
    local = create_room(alice, name="Local", preset="public_chat")
    # The tarpit comes first: its siblings are asked beside it, not after its deadline.
    link(alice, root, STUCK, f"{TARPIT_IP}:8448", "a")
    link(alice, root, FAR, PEER, "b")
    link(alice, root, local, f"{WEIR_IP}:8448", "c")
    with Tarpit(host=TARPIT_IP, port=8448) as tarpit:
        started = time.monotonic()
        r = alice.get(f"/_matrix/client/v1/rooms/{quote(root, safe='')}/hierarchy", timeout=30)
        elapsed = time.monotonic() - started
        assert r.status_code == 200, r.text
        assert tarpit.accepted >= 1
    assert elapsed < DEADLINE + 3
    rooms = r.json()["rooms"]
    assert [room["room_id"] for room in rooms] == [root, FAR, local, FARTHER]
    assert rooms[1]["name"] == "Far" and rooms[3]["name"] == "Farther"
    assert [c["state_key"] for c in rooms[1]["children_state"]] == [FARTHER]
    # One signed question to the peer: the farther room came in the same answer.
    asked = [req for req in peer.requests if req.path.startswith(HIERARCHY)]
    assert [req.path for req in asked] == [HIERARCHY + FAR]
    assert asked[0].headers.get("Authorization", "").startswith("X-Matrix")
    assert f'origin="{WEIR_IP}:8448"' in asked[0].headers["Authorization"]
    assert asked[0].query == "suggested_only=false"
    assert in_flight(weir.client_url, "client_outbound") == 0
    outcomes = {
        outcome: metric(
            weir.client_url, "weir_outbound_calls_total", call="hierarchy", outcome=outcome
        )
        for outcome in ("ok", "deadline")
    }
    assert outcomes == {"ok": 1, "deadline": 1}
    # Paging walks the space again: the peer's answer is reused, not asked for again.
    url = f"/_matrix/client/v1/rooms/{quote(root, safe='')}/hierarchy"
    first = alice.get(url, params={"limit": 2}, timeout=30).json()
    second = alice.get(url, params={"limit": 2, "from": first["next_batch"]}, timeout=30).json()
    assert [room["room_id"] for room in first["rooms"] + second["rooms"]] == [
        root,
        FAR,
        local,
        FARTHER,
    ]
    assert len([req for req in peer.requests if req.path.startswith(HIERARCHY)]) == 1
    assert in_flight(weir.client_url, "client_outbound") == 0
