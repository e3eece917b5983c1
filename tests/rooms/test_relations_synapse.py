"""Relationships across Weir and a real Synapse 1.163, TLS both ways, in one room both are in:
a thread reply, an edit and a reaction made on one server reach the other, which bundles them
with the root (`unsigned.m.relations` of /event and /messages) and lists them in /relations
and /threads. Neither server bundles reactions (the spec leaves annotations unbundled since
v1.7), so a reaction shows in /relations only."""

import os
from urllib.parse import quote

import gevent
import pytest

from tests.rooms.test_relations_api import edit, react, reply_in_thread, send_event
from tests.support.federation import tls_weir
from tests.support.server import MatrixClient

pytestmark = pytest.mark.synapse

_BASE = os.environ.get("WEIR_TEST_SYNAPSE_IP", "127.31.100.1").rsplit(".", 1)[0]
WEIR_IP = f"{_BASE}.233"
WEIR_NAME = f"{WEIR_IP}:8448"
V1, V3 = "/_matrix/client/v1", "/_matrix/client/v3"
# A timeline long enough that no event of a test is left out of an incremental sync.
_SYNC_FILTER = '{"room": {"timeline": {"limit": 100}}}'


@pytest.fixture(scope="module")
def weir(test_ca, synapse, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-relations"))
    with tls_weir(test_ca, directory, WEIR_IP, WEIR_NAME) as proc:
        yield proc


@pytest.fixture(scope="module")
def alice(weir):
    client = MatrixClient(weir.client_url)
    client.register("relalice")
    return client


@pytest.fixture(scope="module")
def bob(synapse):
    return MatrixClient(synapse.client_url, synapse.register("relbob")["access_token"])


@pytest.fixture(scope="module")
def room(synapse, alice, bob):
    """A Synapse room alice (of Weir) has joined."""
    r = bob.post(f"{V3}/createRoom", json={"preset": "public_chat"})
    assert r.status_code == 200, r.text
    room_id = r.json()["room_id"]
    r = alice.post(f"{V3}/join/{quote(room_id)}", params={"server_name": synapse.server_name})
    assert r.status_code == 200, r.text
    return room_id


def wait_for(client: MatrixClient, room_id: str, event_ids: set[str], timeout: float = 60) -> None:
    """Long-polls `client`'s /sync until every one of `event_ids` was in the room's timeline."""
    missing, since = set(event_ids), None
    with gevent.Timeout(timeout, AssertionError(f"never reached /sync: {missing}")):
        while missing:
            params = {
                "timeout": "5000",
                "filter": _SYNC_FILTER,
                **({"since": since} if since else {}),
            }
            r = client.get(f"{V3}/sync", params=params, timeout=30)
            assert r.status_code == 200, r.text
            since = r.json()["next_batch"]
            joined = r.json().get("rooms", {}).get("join", {}).get(room_id, {})
            missing -= {e["event_id"] for e in joined.get("timeline", {}).get("events", [])}


def act(client: MatrixClient, room_id: str, word: str) -> dict[str, str]:
    """A root, a reply in its thread, an edit of the root and a reaction to it: their IDs."""
    root = send_event(client, room_id, {"msgtype": "m.text", "body": f"{word} root"})
    return {
        "root": root,
        "reply": reply_in_thread(client, room_id, root, f"{word} reply"),
        "edit": edit(client, room_id, root, f"{word} root, edited"),
        "reaction": react(client, room_id, root, "👍"),
    }


def assert_bundled(root: dict, ids: dict[str, str], reader_participated: bool) -> None:
    relations = root["unsigned"]["m.relations"]
    assert set(relations) == {"m.thread", "m.replace"}, relations  # no reaction: unbundled
    thread = relations["m.thread"]
    assert thread["count"] == 1
    assert thread["latest_event"]["event_id"] == ids["reply"]
    assert thread["current_user_participated"] is reader_participated
    assert relations["m.replace"]["event_id"] == ids["edit"]
    assert relations["m.replace"]["content"]["m.new_content"]["body"].endswith("edited")


def assert_listed(client: MatrixClient, room_id: str, ids: dict[str, str]) -> None:
    """/relations of the root lists its three children, newest first, and /threads the root."""
    path = f"{V1}/rooms/{quote(room_id, safe='')}/relations/{quote(ids['root'], safe='')}"
    r = client.get(path)
    assert r.status_code == 200, r.text
    assert [e["event_id"] for e in r.json()["chunk"]] == [
        ids["reaction"],
        ids["edit"],
        ids["reply"],
    ]
    r = client.get(f"{path}/m.thread")
    assert [e["event_id"] for e in r.json()["chunk"]] == [ids["reply"]], r.text
    r = client.get(f"{path}/m.annotation/m.reaction")
    assert [e["content"]["m.relates_to"]["key"] for e in r.json()["chunk"]] == ["👍"], r.text
    r = client.get(f"{V1}/rooms/{quote(room_id, safe='')}/threads")
    assert r.status_code == 200, r.text
    roots = [e for e in r.json()["chunk"] if e["event_id"] == ids["root"]]
    assert len(roots) == 1, r.text
    assert roots[0]["unsigned"]["m.relations"]["m.thread"]["count"] == 1


def read_root(client: MatrixClient, room_id: str, root_id: str) -> tuple[dict, dict]:
    """The root as /event gives it, and as /messages does."""
    r = client.get(f"{V3}/rooms/{quote(room_id, safe='')}/event/{quote(root_id, safe='')}")
    assert r.status_code == 200, r.text
    by_event = r.json()
    r = client.get(f"{V3}/rooms/{quote(room_id, safe='')}/messages", params={"dir": "b"})
    assert r.status_code == 200, r.text
    by_messages = [e for e in r.json()["chunk"] if e["event_id"] == root_id]
    assert len(by_messages) == 1, r.text
    return by_event, by_messages[0]


def test_synapse_users_relations_are_bundled_and_listed_on_weir(alice, bob, room):
    ids = act(bob, room, "synapse")
    wait_for(alice, room, set(ids.values()))
    for root in read_root(alice, room, ids["root"]):
        assert_bundled(root, ids, reader_participated=False)
    assert_listed(alice, room, ids)
    # Alice answers in bob's thread: ours now says she took part. Synapse is not asked:
    # 1.163 caches that answer per (root, reader) and drops it per root only
    # (storage/databases/main/cache.py), so a reader asked before replying is still told False.
    answer = reply_in_thread(alice, room, ids["root"], "alice was here")
    wait_for(bob, room, {answer})
    for client in (alice, bob):
        root, _ = read_root(client, room, ids["root"])
        thread = root["unsigned"]["m.relations"]["m.thread"]
        assert (thread["count"], thread["latest_event"]["event_id"]) == (2, answer)
        assert client is bob or thread["current_user_participated"] is True


def test_weir_users_relations_are_bundled_and_listed_on_synapse(alice, bob, room):
    ids = act(alice, room, "weir")
    wait_for(bob, room, set(ids.values()))
    for root in read_root(bob, room, ids["root"]):
        assert_bundled(root, ids, reader_participated=False)
    assert_listed(bob, room, ids)
    # Bob answers in alice's thread: both servers then count two replies.
    answer = reply_in_thread(bob, room, ids["root"], "bob was here")
    wait_for(alice, room, {answer})
    for client in (alice, bob):
        root, _ = read_root(client, room, ids["root"])
        thread = root["unsigned"]["m.relations"]["m.thread"]
        assert (thread["count"], thread["latest_event"]["event_id"]) == (2, answer)
