"""Presence (homeserver/sync/presence.py): through the client API of a real server on both
engines (PUT/GET, /sync's presence section and set_presence, who may see whom), and the
service on a real SQLite file with a clock the test moves (going offline, other servers'
EDUs). Crossing to Synapse is in tests/sync/test_presence_synapse.py."""

import pytest

from homeserver.storage.database import open_database
from homeserver.storage.migrations import migrate
from homeserver.storage.presence import PresenceStore
from homeserver.sync.presence import SYNC_ONLINE_TIMEOUT_MS, PresenceService
from tests.rooms.conftest import create_room
from tests.support.server import MatrixClient
from tests.sync.conftest import V3, sync


def presence_of(body: dict, user_id: str) -> list[dict]:
    events = body.get("presence", {}).get("events", [])
    return [e["content"] for e in events if e["sender"] == user_id]


@pytest.mark.parametrize("server", ["sqlite", "postgres"], indirect=True)
def test_presence_is_set_read_and_synced_to_those_who_share_a_room(server, user):
    alice, bob, stranger = user("alice"), user("bob"), user("stranger")
    room = create_room(alice, preset="public_chat")
    assert bob.post(f"{V3}/rooms/{room}/join", json={}).status_code == 200
    since = sync(bob, set_presence="offline")["next_batch"]

    r = alice.put(
        f"{V3}/presence/{alice.user_id}/status",
        json={"presence": "unavailable", "status_msg": "out to lunch"},
    )
    assert r.status_code == 200, r.text
    body = sync(bob, since=since, timeout=10_000, set_presence="offline")
    [seen] = presence_of(body, alice.user_id)
    assert seen["presence"] == "unavailable" and seen["status_msg"] == "out to lunch"
    assert seen["currently_active"] is False and seen["last_active_ago"] >= 0

    r = bob.get(f"{V3}/presence/{alice.user_id}/status")
    assert r.status_code == 200 and r.json()["presence"] == "unavailable", r.text
    # Someone who shares no room with alice sees nothing of her, here or in /sync.
    r = stranger.get(f"{V3}/presence/{alice.user_id}/status")
    assert (r.status_code, r.json()["errcode"]) == (404, "M_NOT_FOUND")
    assert presence_of(sync(stranger, set_presence="offline"), alice.user_id) == []
    # Only one's own presence may be set, and only to a state the spec has.
    r = bob.put(f"{V3}/presence/{alice.user_id}/status", json={"presence": "online"})
    assert (r.status_code, r.json()["errcode"]) == (403, "M_FORBIDDEN")
    r = alice.put(f"{V3}/presence/{alice.user_id}/status", json={"presence": "busy"})
    assert (r.status_code, r.json()["errcode"]) == (400, "M_INVALID_PARAM")

    # A sync with set_presence=online puts alice online; bob's next sync says so, once.
    since = sync(bob, set_presence="offline")["next_batch"]
    sync(alice, set_presence="online")
    body = sync(bob, since=since, timeout=10_000, set_presence="offline")
    [seen] = presence_of(body, alice.user_id)
    assert seen["presence"] == "online" and seen["currently_active"] is True
    assert seen["status_msg"] == "out to lunch"  # a sync keeps the message
    again = sync(bob, since=body["next_batch"], set_presence="offline")
    assert presence_of(again, alice.user_id) == []
    # A user's first sync brings them online, and shows them their own presence.
    dave = user("dave")
    assert presence_of(sync(dave), dave.user_id)[0]["presence"] == "online"


def test_presence_can_be_turned_off(start_weir):
    weir = start_weir({"presence": {"enabled": False}})
    alice = MatrixClient(weir.client_url)
    user_id = alice.register("alice")["user_id"]
    r = alice.put(f"{V3}/presence/{user_id}/status", json={"presence": "online"})
    assert (r.status_code, r.json()["errcode"]) == (403, "M_FORBIDDEN")
    assert "presence" not in sync(alice)  # enabled, a first sync has the user's own


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def service(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/presence.db")
    migrate(db)
    woken, sent, clock = [], [], Clock()
    rooms = {"@alice:here": {"@alice:here", "@bob:far"}, "@bob:far": {"@alice:here", "@bob:far"}}
    svc = PresenceService(
        PresenceStore(db),
        "here",
        True,
        lambda user_id: rooms.get(user_id, {user_id}),
        woken.append,
        lambda servers, edu_type, content: sent.append((list(servers), edu_type, content)),
        clock=clock,
    )
    svc.woken, svc.sent, svc.clock = woken, sent, clock
    yield svc
    db.close()


def test_a_user_whose_syncs_stopped_goes_offline_and_other_servers_are_told(service):
    service.syncing("@alice:here", None, 30_000)  # offline until now: a sync brings her online
    assert service.store.get("@alice:here").state == "online"
    [(servers, edu_type, content)] = service.sent
    assert (servers, edu_type) == (["far"], "m.presence")
    assert content["push"][0]["user_id"] == "@alice:here"
    assert content["push"][0]["presence"] == "online"
    # Still within its long-poll and the grace after it: nothing changes, nothing is sent.
    service.clock.now += 30 + SYNC_ONLINE_TIMEOUT_MS / 1000 - 1
    service.syncing("@alice:here", None, 0)
    assert service.sweep() == 0 and len(service.sent) == 1
    service.clock.now += SYNC_ONLINE_TIMEOUT_MS / 1000
    assert service.sweep() == 1
    assert service.store.get("@alice:here").state == "offline"
    assert service.sent[-1][2]["push"][0]["presence"] == "offline"
    assert service.woken[-1] == {"@alice:here", "@bob:far"}


def test_other_servers_presence_is_applied_only_for_their_users_who_share_a_room(service):
    def edu(*items):
        return [{"edu_type": "m.presence", "content": {"push": list(items)}}]

    good = {"user_id": "@bob:far", "presence": "online", "last_active_ago": 5000}
    assert service.receive_remote("far", edu(good)) == (1, 0)
    stored = service.store.get("@bob:far")
    assert stored.state == "online" and stored.currently_active is False
    # The same again changes nothing a client sees: not stored again.
    position = stored.position
    assert service.receive_remote("far", edu(good)) == (1, 0)
    assert service.store.get("@bob:far").position == position
    refused = [
        {"user_id": "@mallory:evil", "presence": "online"},  # not the origin's user
        {"user_id": "@carol:far", "presence": "online"},  # shares no room with ours
        {"user_id": "@bob:far", "presence": "dancing"},
        {"user_id": "@bob:far", "presence": "online", "status_msg": "x" * 2000},
        "not an object",
    ]
    assert service.receive_remote("far", edu(*refused)) == (0, len(refused))
    assert service.store.get("@carol:far") is None
    # Unheard of for half an hour, a remote user is shown offline.
    service.clock.now += 30 * 60
    assert service.sweep() == 1 and service.store.get("@bob:far").state == "offline"
    assert [s for s in service.sent if s[0] == ["far"]] == []  # theirs is not ours to send


def test_a_plain_sync_keeps_a_chosen_unavailable_and_an_explicit_one_changes_it(service):
    service.set_status("@alice:here", "@alice:here", {"presence": "unavailable"})
    service.syncing("@alice:here", None, 30_000)
    assert service.store.get("@alice:here").state == "unavailable"
    service.syncing("@alice:here", "offline", 30_000)
    assert service.store.get("@alice:here").state == "unavailable"
    service.syncing("@alice:here", "online", 30_000)
    assert service.store.get("@alice:here").state == "online"
    assert [c["push"][0]["presence"] for _, _, c in service.sent] == ["unavailable", "online"]


class WallClock:
    def __init__(self):
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


def test_a_user_syncing_through_two_instances_is_kept_online_by_either(pg_cluster):
    """Several instances (`shared`): the online time is stored, so the instance a user left
    does not take them offline while they sync through another, and once they stop, one
    instance takes them offline and tells other servers once."""
    url = pg_cluster.new_database()
    first = open_database(url)
    migrate(first)
    first.close()
    wall, sent = WallClock(), {"a": [], "b": []}
    rooms = {"@alice:here": {"@alice:here", "@bob:far"}}
    instances = {
        name: PresenceService(
            PresenceStore(open_database(url, announce_as=name)),
            "here",
            True,
            lambda user_id: rooms.get(user_id, {user_id}),
            lambda users: None,
            lambda servers, edu_type, content, name=name: sent[name].append(content),
            shared=True,
            wall_ms=wall,
        )
        for name in ("a", "b")
    }
    a, b = instances["a"], instances["b"]
    a.syncing("@alice:here", None, 30_000)  # online until 30 s after the long-poll
    wall.now_ms += 60_000
    b.syncing("@alice:here", None, 30_000)  # she moved to b
    wall.now_ms += 60_000  # a's own times have run out; b's have not
    assert a.sweep() == 0 and b.sweep() == 0
    assert a.store.get("@alice:here").state == "online"
    # A sync within what b stored costs no write.
    stored = stored_until(a.store, "@alice:here")
    b.syncing("@alice:here", None, 0)
    assert stored_until(a.store, "@alice:here") == stored
    wall.now_ms += 60_000 + 30_000 + 1  # past b's long-poll, its grace and the margin
    assert a.sweep() == 1 and b.sweep() == 0  # one instance takes her offline
    assert a.store.get("@alice:here").state == "offline"
    assert [c["push"][0]["presence"] for c in sent["a"]] == ["online", "offline"]
    assert sent["b"] == []
    for service in (a, b):
        service.store.db.close()


def stored_until(store: PresenceStore, user_id: str) -> int:
    return store.db.read(
        lambda tx: tx.fetchone("SELECT online_until_ms FROM presence WHERE user_id = ?", (user_id,))
    )[0]
