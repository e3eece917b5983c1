"""Push rule evaluation on the real server (SQLite and PostgreSQL): each stored event is
evaluated for every local member who could see it, and what notifies shows in
/notifications with the actions of the rule that matched. Each condition kind, intentional
mentions, display names, muted rooms, and (at the end, on SQLite like its neighbours) a
message over federation notifying a local user."""

import os
import time
from urllib.parse import quote

import pytest

from tests.peers.origins import OriginKeyServer, send_transaction
from tests.rooms.conftest import V3, create_room
from tests.support.federation import federation_settings, tls_listener_settings
from tests.support.remote_room import room_joined_by
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge
from tests.sync.test_push_rules_api import put_rule

HIGHLIGHT = {"set_tweak": "highlight"}


def tag(name: str) -> dict:
    """A tweak naming the rule that fired: the spec lets rules carry any tweak."""
    return {"set_tweak": "rule", "value": name}


def send_event(client, room_id: str, content: dict, event_type: str = "m.room.message") -> str:
    path = f"{V3}/rooms/{quote(room_id, safe='')}/send/{event_type}/t{time.monotonic_ns()}"
    r = client.put(path, json=content)
    assert r.status_code == 200, r.text
    return r.json()["event_id"]


def say(client, room_id: str, body: str, **extra) -> str:
    return send_event(client, room_id, {"msgtype": "m.text", "body": body, **extra})


def actions_for(client, event_id: str) -> list | None:
    """The actions the event notified `client`'s user with, None if it did not."""
    r = client.get(f"{V3}/notifications", params={"limit": 100})
    assert r.status_code == 200, r.text
    for n in r.json()["notifications"]:
        if n["event"]["event_id"] == event_id:
            return n["actions"]
    return None


def shared_room(owner, *others, **body) -> str:
    room_id = create_room(owner, preset="public_chat", **body)
    for other in others:
        assert other.post(f"{V3}/join/{quote(room_id, safe='')}", json={}).status_code == 200
    return room_id


def test_event_match_globs_on_dotted_keys(user):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    room = shared_room(alice, bob, carol)  # three: no one-to-one rule
    conditions = [
        {"kind": "event_match", "key": "content.m\\.flower.kind", "pattern": "t?li*"},
        {"kind": "event_match", "key": "type", "pattern": "m.room.message"},
    ]
    put_rule(
        alice, "override", "tulips", {"conditions": conditions, "actions": ["notify", tag("t")]}
    )
    hit = say(bob, room, "look", **{"m.flower": {"kind": "TULIPS"}})
    miss = say(bob, room, "look", **{"m.flower": {"kind": "a tulip"}})  # whole value only
    nested = say(bob, room, "look", m={"flower": {"kind": "tulip"}})  # the dot is a name's
    assert actions_for(alice, hit) == ["notify", tag("t")]
    assert actions_for(alice, miss) == ["notify"]  # .m.rule.message
    assert actions_for(alice, nested) == ["notify"]
    assert actions_for(bob, hit) is None  # a sender is not notified of their own event

    # content.body matches words, anywhere in the body.
    put_rule(alice, "content", "roses", {"pattern": "ros*", "actions": ["notify", tag("r")]})
    assert actions_for(alice, say(bob, room, "I like Roses a lot")) == ["notify", tag("r")]
    assert actions_for(alice, say(bob, room, "eros")) == ["notify"]


def test_event_property_is_and_contains(user):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    room = shared_room(alice, bob, carol)
    flagged = [{"kind": "event_property_is", "key": "content.urgent", "value": True}]
    put_rule(alice, "override", "urgent", {"conditions": flagged, "actions": ["notify", tag("u")]})
    listed = [{"kind": "event_property_contains", "key": "content.tags", "value": "work"}]
    put_rule(alice, "override", "work", {"conditions": listed, "actions": ["notify", tag("w")]})

    assert actions_for(alice, say(bob, room, "a", urgent=True)) == ["notify", tag("u")]
    assert actions_for(alice, say(bob, room, "b", urgent="true")) == ["notify"]  # types differ
    assert actions_for(alice, say(bob, room, "c", urgent=1)) == ["notify"]
    assert actions_for(alice, say(bob, room, "d", tags=["home", "work"])) == ["notify", tag("w")]
    assert actions_for(alice, say(bob, room, "e", tags="work")) == ["notify"]  # not a list


def test_display_name_user_name_and_intentional_mentions(user):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    room = shared_room(alice, bob, carol)
    r = alice.put(f"{V3}/profile/{alice.user_id}/displayname", json={"displayname": "Rosalind"})
    assert r.status_code == 200, r.text
    highlighted = ["notify", {"set_tweak": "sound", "value": "default"}, HIGHLIGHT]

    assert actions_for(alice, say(bob, room, "hey ROSALIND, look")) == highlighted
    assert actions_for(alice, say(bob, room, "rosalinds")) == ["notify"]
    localpart = alice.user_id[1:].split(":")[0]
    assert actions_for(alice, say(bob, room, f"ping {localpart}!")) == highlighted

    mention = {"user_ids": [alice.user_id]}
    assert actions_for(alice, say(bob, room, "you", **{"m.mentions": mention})) == highlighted
    # With m.mentions, the name in the body no longer counts: the sender said whom.
    other = {"user_ids": [carol.user_id]}
    assert actions_for(alice, say(bob, room, "Rosalind", **{"m.mentions": other})) == ["notify"]
    assert actions_for(carol, say(bob, room, "x", **{"m.mentions": other})) == highlighted

    # A new display name counts from its member event on.
    r = alice.put(f"{V3}/profile/{alice.user_id}/displayname", json={"displayname": "Ada"})
    assert r.status_code == 200, r.text
    assert actions_for(alice, say(bob, room, "hello rosalind")) == ["notify"]
    assert actions_for(alice, say(bob, room, "hello ada")) == highlighted


def test_room_mentions_need_the_senders_notification_power(user):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    room = shared_room(alice, bob, carol)
    at_room = {"m.mentions": {"room": True}}
    assert actions_for(carol, say(bob, room, "all of you", **at_room)) == ["notify"]
    assert actions_for(carol, say(bob, room, "@room hello")) == ["notify"]
    assert actions_for(carol, say(alice, room, "everyone", **at_room)) == ["notify", HIGHLIGHT]
    assert actions_for(carol, say(alice, room, "@room hello")) == ["notify", HIGHLIGHT]

    path = f"{V3}/rooms/{quote(room, safe='')}/state/m.room.power_levels"
    levels = alice.get(path).json()
    levels["notifications"] = {"room": 0}
    assert alice.put(path, json=levels).status_code == 200
    assert actions_for(carol, say(bob, room, "now me", **at_room)) == ["notify", HIGHLIGHT]


def test_room_member_count_and_invites(user):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    room = shared_room(alice, bob)
    one_to_one = ["notify", {"set_tweak": "sound", "value": "default"}]
    assert actions_for(alice, say(bob, room, "just us")) == one_to_one
    r = alice.post(f"{V3}/rooms/{quote(room, safe='')}/invite", json={"user_id": carol.user_id})
    assert r.status_code == 200, r.text
    invites = [
        n
        for n in carol.get(f"{V3}/notifications").json()["notifications"]
        if n["event"]["type"] == "m.room.member"
    ]
    assert [n["actions"] for n in invites] == [one_to_one]  # .m.rule.invite_for_me
    assert carol.post(f"{V3}/join/{quote(room, safe='')}", json={}).status_code == 200
    assert actions_for(alice, say(bob, room, "three now")) == ["notify"]
    # Member events, notices and reactions notify no one by default.
    notice = send_event(bob, room, {"msgtype": "m.notice", "body": "bot"})
    assert actions_for(alice, notice) is None


@pytest.mark.parametrize("actions", [[], ["dont_notify"]])
def test_a_muted_room_and_a_muted_sender(user, actions):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    room, other = shared_room(alice, bob, carol), shared_room(alice, bob, carol)
    put_rule(alice, "room", room, {"actions": actions})
    assert actions_for(alice, say(bob, room, "ignored")) is None
    assert actions_for(alice, say(bob, room, "alice!", **{"m.mentions": {"user_ids": []}})) is None
    assert actions_for(alice, say(bob, other, "heard")) == ["notify"]
    put_rule(alice, "sender", carol.user_id, {"actions": actions})
    assert actions_for(alice, say(carol, other, "muted")) is None
    put_rule(alice, "override", "master", {"conditions": [], "actions": ["notify", tag("m")]})
    # A user override goes before room rules: it fires in the muted room too.
    assert actions_for(alice, say(bob, room, "loud")) == ["notify", tag("m")]

    r = alice.put(f"{V3}/pushrules/global/override/.m.rule.master/enabled", json={"enabled": True})
    assert r.status_code == 200
    assert actions_for(alice, say(bob, other, "all off")) is None


# --- over federation ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def origin_keys(test_ca, dns):
    with OriginKeyServer("push-origins.test", test_ca, dns, host="127.31.163.2") as keys:
        yield keys


@pytest.fixture(scope="module")
def weir(test_ca, dns, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("push-received"))
    fed = federation_settings(test_ca, dns, remote_timeout=5)
    fed.update(tls_listener_settings(test_ca, "weir.test", "127.31.163.3", port=0))
    settings = merge(base_settings(os.path.join(directory, "data")), {"federation": fed})
    proc = WeirProcess(directory, settings).start()
    yield proc
    proc.stop()


def test_a_message_over_federation_notifies_a_local_user(weir, test_ca, origin_keys):
    alice = MatrixClient(weir.client_url)
    alice.register("alice")
    alice.user_id = "@alice:weir.test"
    origin = origin_keys.add_origin("p1")
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    (plain, mention), pdus = room.messages(origin, "bob", ["hi", "hello alice"], prev=join_id)
    r = send_transaction(weir.federation_url, origin, "weir.test", "msgs", pdus, test_ca)
    assert r.status_code == 200 and r.json()["pdus"] == {plain: {}, mention: {}}, r.text
    one_to_one = ["notify", {"set_tweak": "sound", "value": "default"}]
    assert actions_for(alice, plain) == one_to_one
    assert actions_for(alice, mention) == [*one_to_one, HIGHLIGHT]
