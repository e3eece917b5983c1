"""`POST /user_directory/search` on the real server (SQLite and PostgreSQL): users found by
the start of any word of their display name or user ID, as far as the searcher may see them
(a shared room, a public or world-readable room; every local user with
`user_directory.search_all_users`), re-indexed when a profile or membership changes, other
servers' users from the joins their servers send; `limited`, bad bodies, the rate limit."""

import itertools
import os
from urllib.parse import quote

import pytest

from tests.peers.origins import OriginKeyServer, send_transaction
from tests.peers.resident import ResidentPeer
from tests.rooms.conftest import create_room
from tests.support.federation import federation_settings, tls_listener_settings
from tests.support.remote_room import RemoteRoom
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge
from tests.support.spec import assert_matches_spec

V3 = "/_matrix/client/v3"
SEARCH = f"{V3}/user_directory/search"
WEIR = "weir.test"
_names = itertools.count()


def _start(request, tmp_path_factory, dns, test_ca, ip: str, **overrides) -> WeirProcess:
    directory = str(tmp_path_factory.mktemp("userdir"))
    fed = federation_settings(test_ca, dns, remote_timeout=5)
    fed.update(tls_listener_settings(test_ca, WEIR, ip, port=0))
    settings = merge(base_settings(os.path.join(directory, "data")), {"federation": fed})
    if request.param == "postgres":
        settings["database"] = {"url": request.getfixturevalue("pg_cluster").new_database()}
    return WeirProcess(directory, merge(settings, overrides)).start()


@pytest.fixture(scope="module")
def keys(test_ca, dns):
    with OriginKeyServer("userdir.test", test_ca, dns, host="127.36.0.2") as server:
        yield server


@pytest.fixture(scope="module")
def resident(test_ca):
    """A room on another server, public, whose creator's join (before the join rule in its
    state) carries a display name."""
    peer = ResidentPeer(test_ca, host="127.36.0.4", creator_name="Resident Marzipan").start()
    yield peer
    peer.stop()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def weir(request, tmp_path_factory, dns, test_ca):
    proc = _start(request, tmp_path_factory, dns, test_ca, "127.36.0.1")
    yield proc
    proc.stop()


@pytest.fixture
def user(weir):
    def make(prefix: str = "user", displayname: str | None = None) -> MatrixClient:
        client = MatrixClient(weir.client_url)
        client.user_id = client.register(f"{prefix}{next(_names)}")["user_id"]
        if displayname is not None:
            set_profile(client, "displayname", displayname)
        return client

    return make


def set_profile(client: MatrixClient, key: str, value: str) -> None:
    path = f"{V3}/profile/{quote(client.user_id, safe='')}/{key}"
    r = client.put(path, json={key: value})
    assert r.status_code == 200, r.text


def search(client: MatrixClient, term: str, status: int = 200, **body) -> dict:
    r = client.post(SEARCH, json={"search_term": term, **body})
    assert r.status_code == status, r.text
    if status == 200:
        assert_matches_spec(r, "POST", SEARCH)
    return r.json()


def found(client: MatrixClient, term: str) -> list[str]:
    return [u["user_id"] for u in search(client, term)["results"]]


def join(client: MatrixClient, room_id: str) -> None:
    r = client.post(f"{V3}/join/{quote(room_id, safe='')}", json={})
    assert r.status_code == 200, r.text


def leave(client: MatrixClient, room_id: str) -> None:
    r = client.post(f"{V3}/rooms/{quote(room_id, safe='')}/leave", json={})
    assert r.status_code == 200, r.text


def put_state(client: MatrixClient, room_id: str, event_type: str, content: dict) -> None:
    r = client.put(f"{V3}/rooms/{quote(room_id, safe='')}/state/{event_type}", json=content)
    assert r.status_code == 200, r.text


def test_found_by_the_start_of_a_word_of_the_display_name_or_user_id(user):
    alice = user("alice")
    bob = user("tangbob", "Bobby Tangerine-Smith")
    room = create_room(alice, preset="private_chat", invite=[bob.user_id])
    assert found(alice, "tangerine") == []  # invited is not sharing the room
    join(bob, room)

    answer = search(alice, "tange")
    assert answer == {
        "results": [{"user_id": bob.user_id, "display_name": "Bobby Tangerine-Smith"}],
        "limited": False,
    }
    for term in ("TANGERINE", "smi", "bobby smith", "Smith BOBBY", bob.user_id, "tangbob"):
        assert found(alice, term) == [bob.user_id], term
    for term in ("angerine", "bobby zebra", "", "  ", "!!"):
        assert found(alice, term) == [], term  # a word's middle; a word no one has; no word

    leave(bob, room)
    assert found(alice, "tangerine") == []


def test_a_user_sharing_no_room_is_found_once_in_a_public_or_world_readable_room(user):
    alice = user("alice")
    carol = user("carol", "Carol Ultramarine")
    assert found(alice, "ultramarine") == []

    public = create_room(carol, preset="public_chat")
    assert found(alice, "ultramarine") == [carol.user_id]
    # Who may be seen is read at search time: the room made invite-only hides her again.
    put_state(carol, public, "m.room.join_rules", {"join_rule": "invite"})
    assert found(alice, "ultramarine") == []
    put_state(carol, public, "m.room.history_visibility", {"history_visibility": "world_readable"})
    assert found(alice, "ultramarine") == [carol.user_id]


def test_a_profile_change_is_indexed(user):
    alice = user("alice")
    dora = user("dora", "Dora Vermilion")
    create_room(dora, preset="public_chat")
    assert found(alice, "vermil") == [dora.user_id]

    set_profile(dora, "displayname", "Dora Cerulean")
    set_profile(dora, "avatar_url", "mxc://weir.test/dora")
    assert found(alice, "vermilion") == []
    assert search(alice, "cerul")["results"] == [
        {
            "user_id": dora.user_id,
            "display_name": "Dora Cerulean",
            "avatar_url": "mxc://weir.test/dora",
        }
    ]
    r = dora.delete(f"{V3}/profile/{quote(dora.user_id, safe='')}/displayname")
    assert r.status_code == 200, r.text
    assert found(alice, "cerulean") == []
    assert search(alice, dora.user_id)["results"] == [
        {"user_id": dora.user_id, "avatar_url": "mxc://weir.test/dora"}
    ]


def test_a_remote_user_is_found_from_the_join_their_server_sent(weir, user, keys, test_ca):
    alice, erin = user("alice"), user("erin")
    origin = keys.add_origin(f"remote{next(_names)}")
    room = RemoteRoom.create(alice)
    profile = {"displayname": "Zed Xylophone", "avatar_url": f"mxc://{origin.name}/zed"}
    join_id, pdu = room.join_pdu(origin, "zed", profile=profile)
    r = send_transaction(weir.federation_url, origin, WEIR, f"t{next(_names)}", [pdu], test_ca)
    assert (r.status_code, r.json()) == (200, {"pdus": {join_id: {}}}), r.text

    zed = origin.user("zed")
    expected = {
        "user_id": zed,
        "display_name": "Zed Xylophone",
        "avatar_url": profile["avatar_url"],
    }
    assert search(alice, "xylo")["results"] == [expected]  # shares the room
    assert search(erin, "zed xyl")["results"] == [expected]  # the room is public
    assert found(erin, zed) == [zed]

    # A later join of theirs (a profile change) names them anew.
    rename_id, rename = room.join_pdu(
        origin, "zed", prev=join_id, profile={"displayname": "Zed Quince"}
    )
    r = send_transaction(weir.federation_url, origin, WEIR, f"t{next(_names)}", [rename], test_ca)
    assert (r.status_code, r.json()) == (200, {"pdus": {rename_id: {}}}), r.text
    assert found(erin, "xylophone") == []
    assert search(erin, "quince")["results"] == [{"user_id": zed, "display_name": "Zed Quince"}]

    # Once none of ours is in the room, its state no longer follows it: zed is not found.
    leave(alice, room.room_id)
    assert found(erin, "quince") == []


def test_the_members_of_a_remote_room_we_join_are_found(user, resident):
    """The join's answer brings the room's state at once, its members before its join rule;
    their names still count, the room being public."""
    alice, erin = user("alice"), user("erin")
    join(alice, resident.room_id)
    creator = {"user_id": resident.creator, "display_name": "Resident Marzipan"}
    assert search(erin, "marzip")["results"] == [creator]
    leave(alice, resident.room_id)
    assert found(erin, "marzipan") == []


def test_limited_when_more_match_than_the_limit(user):
    alice = user("alice")
    walruses = [user("walrus", f"Walrus Number {i}") for i in range(3)]
    room = create_room(walruses[0], preset="public_chat")
    for w in walruses[1:]:
        join(w, room)
    two = search(alice, "walrus numb", limit=2)
    assert (len(two["results"]), two["limited"]) == (2, True)
    three = search(alice, "walrus numb", limit=3)
    assert (len(three["results"]), three["limited"]) == (3, False)
    assert {u["user_id"] for u in three["results"]} == {w.user_id for w in walruses}
    assert search(alice, "walrus")["limited"] is False  # the default limit, 10
    assert search(alice, "walrus", limit=0) == {"results": [], "limited": True}


@pytest.mark.parametrize(
    "body, errcode",
    [
        ({}, "M_MISSING_PARAM"),
        ({"limit": 5}, "M_MISSING_PARAM"),
        ({"search_term": 5}, "M_BAD_JSON"),
        ({"search_term": None}, "M_BAD_JSON"),
        ({"search_term": "a", "limit": "ten"}, "M_BAD_JSON"),
        ({"search_term": "a", "limit": 1.5}, "M_BAD_JSON"),
    ],
)
def test_a_bad_body_is_400(user, body, errcode):
    r = user("alice").post(SEARCH, json=body)
    assert (r.status_code, r.json()["errcode"]) == (400, errcode), r.text


def test_a_search_needs_a_user(weir):
    r = MatrixClient(weir.client_url).post(SEARCH, json={"search_term": "a"}, auth=False)
    assert (r.status_code, r.json()["errcode"]) == (401, "M_MISSING_TOKEN"), r.text


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def all_users_weir(request, tmp_path_factory, dns, test_ca):
    rate = {"max_requests": 3, "per_seconds": 600}
    proc = _start(
        request,
        tmp_path_factory,
        dns,
        test_ca,
        "127.36.0.3",
        user_directory={"search_all_users": True},
        ratelimiting={"user_directory": rate},
    )
    yield proc
    proc.stop()


def test_search_all_users_finds_local_users_in_no_room_and_limits_each_user(all_users_weir):
    def make(name: str) -> MatrixClient:
        client = MatrixClient(all_users_weir.client_url)
        client.user_id = client.register(f"{name}{next(_names)}")["user_id"]
        return client

    alice, frank = make("alice"), make("frank")
    set_profile(frank, "displayname", "Frank Saffron")
    assert found(alice, "saffron") == [frank.user_id]  # in no room at all
    assert found(alice, frank.user_id) == [frank.user_id]
    assert found(alice, "frank") == [frank.user_id]  # the third of three
    r = alice.post(SEARCH, json={"search_term": "saffron"})
    assert (r.status_code, r.json()["errcode"]) == (429, "M_LIMIT_EXCEEDED"), r.text
    assert r.json()["retry_after_ms"] > 0
    assert found(frank, "saffron") == [frank.user_id]  # per user: frank has his own
