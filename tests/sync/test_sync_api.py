"""/sync against a real server: waking, tokens, limited timelines, filters and sections."""

import json
import time

import gevent
import pytest

from tests.rooms.conftest import V3, create_room, send
from tests.support.spec import assert_matches_spec
from tests.sync.conftest import event_ids, metric, sync, timeline


def wait_until(predicate, timeout: float = 10.0) -> None:
    """Checks a condition the server exposes until it holds (no fixed sleep)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        gevent.sleep(0.02)


def pair(user, **room):
    """alice's room with bob joined, and bob's token after the join."""
    alice, bob = user("alice"), user("bob")
    room_id = create_room(alice, invite=[bob.user_id], **room)
    assert bob.post(f"{V3}/rooms/{room_id}/join", json={}).status_code == 200
    return alice, bob, room_id, sync(bob)["next_batch"]


def test_a_waiting_sync_wakes_when_the_other_member_sends(server, user):
    alice, bob, room_id, since = pair(user)
    waiting = gevent.spawn(sync, bob, since, timeout=60_000)
    wait_until(lambda: metric(server, "weir_sync_waiters") >= 1)
    event_id = send(alice, room_id, "are you there?")
    body = waiting.get(timeout=30)
    events = timeline(body, room_id)
    assert event_ids(events) == [event_id]
    assert events[0]["content"]["body"] == "are you there?"
    assert events[0]["sender"] == alice.user_id and "room_id" not in events[0]
    assert body["next_batch"] != since
    # Nothing new after it: the next sync with timeout 0 is empty and keeps the token.
    again = sync(bob, body["next_batch"])
    assert again["rooms"]["join"] == {} and again["next_batch"] == body["next_batch"]


def test_a_token_that_is_behind_returns_at_once(server, user):
    alice, bob, room_id, since = pair(user)
    sent = [send(alice, room_id, f"m{i}") for i in range(3)]
    r = bob.get(f"{V3}/sync", params={"since": since, "timeout": 600_000}, timeout=20)
    assert r.status_code == 200
    assert event_ids(timeline(r.json(), room_id)) == sent


def test_the_sender_sees_its_transaction_id_and_the_others_do_not(server, user):
    alice, bob, room_id, since = pair(user)
    alice_since = sync(alice)["next_batch"]
    send(alice, room_id, "mine", txn="txn-42")
    own = timeline(sync(alice, alice_since), room_id)[0]
    other = timeline(sync(bob, since), room_id)[0]
    assert own["unsigned"]["transaction_id"] == "txn-42"
    assert "transaction_id" not in other["unsigned"]
    assert other["unsigned"]["membership"] == "join"


def test_limited_timeline_and_prev_batch_lead_to_the_gap_through_messages(server, user):
    alice, bob, room_id, since = pair(user)
    sent = [send(alice, room_id, f"m{i}") for i in range(12)]
    body = sync(bob, since, sync_filter={"room": {"timeline": {"limit": 5}}})
    room = body["rooms"]["join"][room_id]
    assert room["timeline"]["limited"] is True
    assert event_ids(room["timeline"]["events"]) == sent[-5:]

    gap = bob.get(
        f"{V3}/rooms/{room_id}/messages",
        params={"dir": "b", "from": room["timeline"]["prev_batch"], "to": since, "limit": 50},
    )
    assert gap.status_code == 200, gap.text
    assert_matches_spec(gap, "get", "/_matrix/client/v3/rooms/{roomId}/messages")
    assert event_ids(gap.json()["chunk"]) == sent[:-5][::-1]

    # The spec lets /messages start from a sync's next_batch too.
    latest = bob.get(
        f"{V3}/rooms/{room_id}/messages",
        params={"dir": "b", "from": body["next_batch"], "limit": 2},
    )
    assert event_ids(latest.json()["chunk"]) == sent[-1:-3:-1]

    # An unlimited timeline says so: every new event is in it.
    more = send(alice, room_id, "one more")
    quiet = sync(bob, body["next_batch"], sync_filter={"room": {"timeline": {"limit": 5}}})
    assert quiet["rooms"]["join"][room_id]["timeline"]["limited"] is False
    assert event_ids(timeline(quiet, room_id)) == [more]


def test_initial_sync_gives_state_and_the_latest_events(server, user):
    alice, bob, room_id, _ = pair(user, name="Lounge", topic="chat")
    sent = [send(alice, room_id, f"m{i}") for i in range(4)]
    body = sync(bob, sync_filter={"room": {"timeline": {"limit": 3}}})
    room = body["rooms"]["join"][room_id]
    assert event_ids(room["timeline"]["events"]) == sent[-3:]
    assert room["timeline"]["limited"] is True
    state = {(e["type"], e["state_key"]): e for e in room["state"]["events"]}
    assert state[("m.room.name", "")]["content"] == {"name": "Lounge"}
    assert state[("m.room.member", bob.user_id)]["content"]["membership"] == "join"
    assert ("m.room.create", "") in state
    # The state is as at the start of the timeline: nothing in both.
    assert not set(event_ids(room["state"]["events"])) & set(sent)
    assert room["summary"] == {"m.joined_member_count": 2, "m.invited_member_count": 0}
    assert body["account_data"]["events"][0]["type"] == "m.push_rules"


def test_full_state_returns_all_state_at_once(server, user):
    alice, bob, room_id, since = pair(user, name="Full")
    r = bob.get(
        f"{V3}/sync", params={"since": since, "full_state": "true", "timeout": 600_000}, timeout=20
    )
    room = r.json()["rooms"]["join"][room_id]
    assert {e["type"] for e in room["state"]["events"]} >= {
        "m.room.create",
        "m.room.name",
        "m.room.member",
        "m.room.power_levels",
    }
    assert room["timeline"]["events"] == []


def test_full_state_gives_a_left_room_all_its_state_too(server, user):
    # Spec, GET /sync full_state: "all state events will be returned, even if since is
    # non-empty" - for the rooms in `leave` as much as for those in `join`.
    alice, bob, room_id, since = pair(user, name="Gone")
    said = send(alice, room_id, "bye")
    assert bob.post(f"{V3}/rooms/{room_id}/leave", json={}).status_code == 200
    room = sync(bob, since, full_state="true")["rooms"]["leave"][room_id]
    assert event_ids(room["timeline"]["events"])[0] == said
    state = {(e["type"], e["state_key"]) for e in room["state"]["events"]}
    assert {
        ("m.room.create", ""),
        ("m.room.name", ""),
        ("m.room.power_levels", ""),
        ("m.room.member", alice.user_id),
        ("m.room.member", bob.user_id),
    } <= state
    # Without it, only what changed since the token, which the timeline already carries.
    assert sync(bob, since)["rooms"]["leave"][room_id]["state"]["events"] == []


def test_a_stored_filter_limits_the_timeline(server, user):
    alice, bob, room_id, since = pair(user)
    sent = [send(alice, room_id, f"m{i}") for i in range(4)]
    definition = {
        "room": {"timeline": {"limit": 2}},
        "event_fields": ["type", "content.body", "event_id"],
    }
    r = bob.post(f"{V3}/user/{bob.user_id}/filter", json=definition)
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "post", "/_matrix/client/v3/user/{userId}/filter")
    filter_id = r.json()["filter_id"]
    # The same filter again is the same ID; it reads back as it was stored.
    assert (
        bob.post(f"{V3}/user/{bob.user_id}/filter", json=definition).json()["filter_id"]
        == filter_id
    )
    stored = bob.get(f"{V3}/user/{bob.user_id}/filter/{filter_id}")
    assert stored.json() == definition

    room = sync(bob, since, sync_filter=filter_id, check_spec=False)["rooms"]["join"][room_id]
    assert room["timeline"]["events"] == [
        {"type": "m.room.message", "content": {"body": f"m{i}"}, "event_id": sent[i]}
        for i in (2, 3)
    ]
    assert room["timeline"]["limited"] is True

    # Filters are private to their owner, and an unknown one is refused.
    assert alice.get(f"{V3}/user/{bob.user_id}/filter/{filter_id}").status_code == 403
    missing = bob.get(f"{V3}/user/{bob.user_id}/filter/999999")
    assert (missing.status_code, missing.json()["errcode"]) == (404, "M_NOT_FOUND")
    unknown = bob.get(f"{V3}/sync", params={"filter": "999999"})
    assert (unknown.status_code, unknown.json()["errcode"]) == (400, "M_INVALID_PARAM")
    for bad in ({"room": {"timeline": {"limit": 0}}}, {"room": {"rooms": "!notalist"}}):
        refused = bob.post(f"{V3}/user/{bob.user_id}/filter", json=bad)
        assert (refused.status_code, refused.json()["errcode"]) == (400, "M_BAD_JSON")
    inline = bob.get(f"{V3}/sync", params={"filter": "{not json"})
    assert (inline.status_code, inline.json()["errcode"]) == (400, "M_BAD_JSON")


def test_an_inline_filter_nested_too_deep_is_bad_json(server, user):
    # 1,000 levels fit in a request line, and are past what the JSON parser recurses into.
    deep = '{"room": ' + "[" * 1000 + "]" * 1000 + "}"
    r = user("deepfilter").get(f"{V3}/sync", params={"filter": deep})
    assert (r.status_code, r.json()["errcode"]) == (400, "M_BAD_JSON")


def test_filters_pick_rooms_types_and_lazy_members(server, user):
    alice, bob, room_id, since = pair(user, preset="public_chat")
    carol = user("carol")
    assert carol.post(f"{V3}/rooms/{room_id}/join", json={}).status_code == 200
    other_room = create_room(bob, name="Elsewhere")
    send(alice, room_id, "message")
    send(bob, other_room, "elsewhere")
    requests_topic = alice.put(
        f"{V3}/rooms/{room_id}/state/m.room.topic/", json={"topic": "filtered out of the timeline"}
    )
    assert requests_topic.status_code == 200

    only_one = sync(bob, since, sync_filter={"room": {"rooms": [room_id]}})
    assert list(only_one["rooms"]["join"]) == [room_id]
    not_one = sync(bob, since, sync_filter={"room": {"not_rooms": [room_id]}})
    assert list(not_one["rooms"]["join"]) == [other_room]

    messages_only = sync(
        bob, since, sync_filter={"room": {"timeline": {"types": ["m.room.mess*"]}}}
    )
    room = messages_only["rooms"]["join"][room_id]
    assert [e["type"] for e in room["timeline"]["events"]] == ["m.room.message"]
    # Carol's join and the topic, kept out of the timeline by the filter, reach the state.
    assert [(e["type"], e["state_key"]) for e in room["state"]["events"]] == [
        ("m.room.member", carol.user_id),
        ("m.room.topic", ""),
    ]

    # Lazy members: only the timeline's senders' member events, and one's own.
    lazy = sync(
        bob, sync_filter={"room": {"state": {"lazy_load_members": True}, "timeline": {"limit": 1}}}
    )
    state = lazy["rooms"]["join"][room_id]["state"]["events"]
    assert {e["state_key"] for e in state if e["type"] == "m.room.member"} == {
        bob.user_id,
        alice.user_id,
    }
    eager = sync(bob, sync_filter={"room": {"timeline": {"limit": 1}}})
    assert carol.user_id in {
        e["state_key"]
        for e in eager["rooms"]["join"][room_id]["state"]["events"]
        if e["type"] == "m.room.member"
    }


def test_lazy_members_of_a_left_room_are_as_they_were_when_the_user_left(server, user):
    # History visibility: a user who left sees nothing of the room after they left. The
    # member events lazy-loading adds for the timeline's senders must be those of then,
    # not the room's current state.
    alice, bob, room_id, since = pair(user)
    said = send(alice, room_id, "see you")
    assert bob.post(f"{V3}/rooms/{room_id}/leave", json={}).status_code == 200
    renamed = alice.put(
        f"{V3}/profile/{alice.user_id}/displayname", json={"displayname": "after bob left"}
    )
    assert renamed.status_code == 200, renamed.text
    left = sync(bob, since, sync_filter={"room": {"state": {"lazy_load_members": True}}})
    room = left["rooms"]["leave"][room_id]
    assert event_ids(room["timeline"]["events"])[0] == said
    members = {e["state_key"]: e for e in room["state"]["events"] if e["type"] == "m.room.member"}
    assert members[alice.user_id]["content"].get("displayname") != "after bob left"
    assert (
        members[alice.user_id]["origin_server_ts"]
        <= room["timeline"]["events"][0]["origin_server_ts"]
    )


def test_invite_join_and_leave_appear_in_their_sections(server, user):
    alice, carol = user("alice"), user("carol")
    room_id = create_room(alice, name="Sections")
    since = sync(carol)["next_batch"]

    waiting = gevent.spawn(sync, carol, since, timeout=60_000)
    wait_until(lambda: metric(server, "weir_sync_waiters") >= 1)
    assert (
        alice.post(f"{V3}/rooms/{room_id}/invite", json={"user_id": carol.user_id}).status_code
        == 200
    )
    invited = waiting.get(timeout=30)
    stripped = invited["rooms"]["invite"][room_id]["invite_state"]["events"]
    assert {
        "type": "m.room.name",
        "state_key": "",
        "content": {"name": "Sections"},
        "sender": alice.user_id,
    } in stripped
    assert (
        stripped[-1]["type"] == "m.room.member"
        and stripped[-1]["content"]["membership"] == "invite"
    )
    assert invited["rooms"]["join"] == {}

    assert carol.post(f"{V3}/rooms/{room_id}/join", json={}).status_code == 200
    joined = sync(carol, invited["next_batch"])
    assert room_id in joined["rooms"]["join"] and room_id not in joined["rooms"]["invite"]
    state_types = {e["type"] for e in joined["rooms"]["join"][room_id]["state"]["events"]} | {
        e["type"] for e in timeline(joined, room_id)
    }
    assert {"m.room.create", "m.room.name", "m.room.power_levels"} <= state_types

    said = send(alice, room_id, "before you go")
    assert carol.post(f"{V3}/rooms/{room_id}/leave", json={}).status_code == 200
    send(alice, room_id, "after you left")
    left = sync(carol, joined["next_batch"])
    assert room_id not in left["rooms"]["join"]
    events = timeline(left, room_id, "leave")
    assert event_ids(events)[0] == said
    assert events[-1]["type"] == "m.room.member" and events[-1]["content"] == {
        "membership": "leave"
    }
    # Left before the token: not sent again; on an initial sync only with include_leave.
    assert room_id not in sync(carol, left["next_batch"])["rooms"]["leave"]
    assert room_id not in sync(carol)["rooms"]["leave"]
    assert room_id in sync(carol, sync_filter={"room": {"include_leave": True}})["rooms"]["leave"]


def test_account_data_global_and_per_room(server, user):
    alice, bob, room_id, since = pair(user)
    path = f"{V3}/user/{bob.user_id}/account_data/org.example.settings"
    assert bob.get(path).json()["errcode"] == "M_NOT_FOUND"
    assert bob.put(path, json={"theme": "dark"}).status_code == 200
    assert bob.get(path).json() == {"theme": "dark"}
    room_path = f"{V3}/user/{bob.user_id}/rooms/{room_id}/account_data/m.tag"
    assert bob.put(room_path, json={"tags": {"u.work": {}}}).status_code == 200
    assert bob.get(room_path).json() == {"tags": {"u.work": {}}}

    body = sync(bob, since)
    assert body["account_data"]["events"] == [
        {"type": "org.example.settings", "content": {"theme": "dark"}}
    ]
    assert body["rooms"]["join"][room_id]["account_data"]["events"] == [
        {"type": "m.tag", "content": {"tags": {"u.work": {}}}}
    ]
    assert sync(bob, body["next_batch"])["account_data"]["events"] == []

    # Someone else's, server-controlled types, a bad room ID: refused.
    assert alice.get(path).status_code == 403 and alice.put(path, json={}).status_code == 403
    push = bob.put(f"{V3}/user/{bob.user_id}/account_data/m.push_rules", json={})
    assert (push.status_code, push.json()["errcode"]) == (405, "M_BAD_JSON")
    read = bob.put(
        f"{V3}/user/{bob.user_id}/rooms/{room_id}/account_data/m.fully_read",
        json={"event_id": "$x"},
    )
    assert (read.status_code, read.json()["errcode"]) == (405, "M_BAD_JSON")
    bad_room = bob.put(f"{V3}/user/{bob.user_id}/rooms/nonsense/account_data/m.tag", json={})
    assert (bad_room.status_code, bad_room.json()["errcode"]) == (400, "M_INVALID_PARAM")


def test_receipts_and_typing_reach_the_room_through_sync(server, user):
    alice, bob, room_id, bob_since = pair(user)
    message = send(alice, room_id, "read me")
    alice_since = sync(alice)["next_batch"]

    waiting = gevent.spawn(sync, alice, alice_since, timeout=60_000)
    wait_until(lambda: metric(server, "weir_sync_waiters") >= 1)
    r = bob.post(f"{V3}/rooms/{room_id}/receipt/m.read/{message}", json={})
    assert r.status_code == 200, r.text
    woken = waiting.get(timeout=30)
    receipt = woken["rooms"]["join"][room_id]["ephemeral"]["events"]
    assert receipt[0]["type"] == "m.receipt"
    assert set(receipt[0]["content"][message]["m.read"]) == {bob.user_id}

    # Private receipts and the fully-read marker go to their owner only.
    assert (
        bob.post(f"{V3}/rooms/{room_id}/receipt/m.read.private/{message}", json={}).status_code
        == 200
    )
    assert (
        bob.post(f"{V3}/rooms/{room_id}/read_markers", json={"m.fully_read": message}).status_code
        == 200
    )
    assert sync(alice, woken["next_batch"])["rooms"]["join"] == {}
    own = sync(bob, bob_since)["rooms"]["join"][room_id]
    receipts = [e for e in own["ephemeral"]["events"] if e["type"] == "m.receipt"]
    assert set(receipts[0]["content"][message]) == {"m.read", "m.read.private"}
    assert own["account_data"]["events"] == [
        {"type": "m.fully_read", "content": {"event_id": message}}
    ]

    before_typing = sync(bob)["next_batch"]
    typing = alice.put(
        f"{V3}/rooms/{room_id}/typing/{alice.user_id}", json={"typing": True, "timeout": 30_000}
    )
    assert typing.status_code == 200, typing.text
    body = sync(bob, before_typing)
    assert body["rooms"]["join"][room_id]["ephemeral"]["events"] == [
        {"type": "m.typing", "content": {"user_ids": [alice.user_id]}}
    ]
    alice.put(f"{V3}/rooms/{room_id}/typing/{alice.user_id}", json={"typing": False})
    stopped = sync(bob, body["next_batch"])
    assert stopped["rooms"]["join"][room_id]["ephemeral"]["events"] == [
        {"type": "m.typing", "content": {"user_ids": []}}
    ]

    # Only for oneself, only in a joined room, only for events one can see.
    assert (
        bob.put(f"{V3}/rooms/{room_id}/typing/{alice.user_id}", json={"typing": True}).status_code
        == 403
    )
    stranger = user("stranger")
    assert (
        stranger.put(
            f"{V3}/rooms/{room_id}/typing/{stranger.user_id}", json={"typing": True}
        ).status_code
        == 403
    )
    assert (
        stranger.post(f"{V3}/rooms/{room_id}/receipt/m.read/{message}", json={}).status_code == 404
    )
    bad_type = bob.post(f"{V3}/rooms/{room_id}/receipt/m.unknown/{message}", json={})
    assert (bad_type.status_code, bad_type.json()["errcode"]) == (400, "M_INVALID_PARAM")


def test_profile_changes_reach_every_joined_room(server, user):
    alice, bob, room_id, since = pair(user)
    second = create_room(alice, name="Second")
    path = f"{V3}/profile/{alice.user_id}/displayname"
    r = alice.put(path, json={"displayname": "Alice A."})
    assert r.status_code == 200, r.text
    assert alice.get(path).json() == {"displayname": "Alice A."}
    avatar = alice.put(
        f"{V3}/profile/{alice.user_id}/avatar_url", json={"avatar_url": "mxc://weir.test/abc"}
    )
    assert avatar.status_code == 200
    whole = alice.get(f"{V3}/profile/{alice.user_id}", auth=False)
    assert_matches_spec(whole, "get", "/_matrix/client/v3/profile/{userId}")
    assert whole.json() == {"displayname": "Alice A.", "avatar_url": "mxc://weir.test/abc"}

    for rid in (room_id, second):
        member = alice.get(f"{V3}/rooms/{rid}/state/m.room.member/{alice.user_id}").json()
        assert member == {
            "membership": "join",
            "displayname": "Alice A.",
            "avatar_url": "mxc://weir.test/abc",
        }
    updates = [e for e in timeline(sync(bob, since), room_id) if e["type"] == "m.room.member"]
    assert updates[-1]["content"]["displayname"] == "Alice A."

    # A new join carries the profile from the start.
    third = create_room(bob, invite=[alice.user_id])
    assert alice.post(f"{V3}/rooms/{third}/join", json={}).status_code == 200
    joined = alice.get(f"{V3}/rooms/{third}/state/m.room.member/{alice.user_id}").json()
    assert joined["displayname"] == "Alice A."

    assert alice.delete(f"{V3}/profile/{alice.user_id}/avatar_url").status_code == 200
    assert alice.get(f"{V3}/profile/{alice.user_id}/avatar_url").status_code == 404
    member = alice.get(f"{V3}/rooms/{room_id}/state/m.room.member/{alice.user_id}").json()
    assert "avatar_url" not in member

    custom = alice.put(
        f"{V3}/profile/{alice.user_id}/org.example.pronouns", json={"org.example.pronouns": ["she"]}
    )
    assert custom.status_code == 200
    assert alice.get(f"{V3}/profile/{alice.user_id}/org.example.pronouns").json() == {
        "org.example.pronouns": ["she"]
    }

    assert (
        alice.put(
            f"{V3}/profile/{alice.user_id}/org.example.half",
            json={"org.example.half": "x" * 40_000},
        ).status_code
        == 200
    )
    refusals = [
        (bob.put(path, json={"displayname": "not yours"}), 403, "M_FORBIDDEN"),
        (alice.put(path, json={"name": "x"}), 400, "M_MISSING_PARAM"),
        (alice.put(path, json={"displayname": 5}), 400, "M_BAD_JSON"),
        (
            alice.put(f"{V3}/profile/{alice.user_id}/avatar_url", json={"avatar_url": "https://x"}),
            400,
            "M_BAD_JSON",
        ),
        (alice.put(f"{V3}/profile/{alice.user_id}/Bad", json={"Bad": 1}), 400, "M_INVALID_PARAM"),
        # A final newline is not part of a key or an mxc URI.
        (
            alice.put(
                f"{V3}/profile/{alice.user_id}/org.example.x%0A", json={"org.example.x\n": 1}
            ),
            400,
            "M_INVALID_PARAM",
        ),
        (
            alice.put(
                f"{V3}/profile/{alice.user_id}/avatar_url",
                json={"avatar_url": "mxc://weir.test/abc\n"},
            ),
            400,
            "M_BAD_JSON",
        ),
        (
            alice.put(
                f"{V3}/profile/{alice.user_id}/org.example.big",
                json={"org.example.big": "x" * 40_000},
            ),
            400,
            "M_PROFILE_TOO_LARGE",
        ),
        (alice.get(f"{V3}/profile/@nobody:weir.test"), 404, "M_NOT_FOUND"),
    ]
    for response, status, errcode in refusals:
        assert (response.status_code, response.json()["errcode"]) == (status, errcode)


def test_capabilities_and_default_push_rules(server, user):
    alice = user("alice")
    caps = alice.get(f"{V3}/capabilities")
    assert_matches_spec(caps, "get", "/_matrix/client/v3/capabilities")
    versions = caps.json()["capabilities"]["m.room_versions"]
    assert versions == {
        "default": "12",
        "available": {
            **{v: "unstable" for v in ("1", "2", "3", "4", "5")},
            **{str(v): "stable" for v in range(6, 13)},
        },
    }
    assert caps.json()["capabilities"]["m.change_password"] == {"enabled": True}

    rules = alice.get(f"{V3}/pushrules/")
    assert_matches_spec(rules, "get", "/_matrix/client/v3/pushrules/")
    ruleset = rules.json()["global"]
    assert [r["rule_id"] for r in ruleset["override"]][:4] == [
        ".m.rule.master",
        ".m.rule.suppress_notices",
        ".m.rule.invite_for_me",
        ".m.rule.member_event",
    ]
    assert ruleset["override"][0]["enabled"] is False
    invite = ruleset["override"][2]
    assert {"kind": "event_match", "key": "state_key", "pattern": alice.user_id} in invite[
        "conditions"
    ]
    assert ruleset["content"][0]["pattern"] == alice.user_id[1:].split(":")[0]
    assert [r["rule_id"] for r in ruleset["underride"]] == [
        ".m.rule.call",
        ".m.rule.encrypted_room_one_to_one",
        ".m.rule.room_one_to_one",
        ".m.rule.message",
        ".m.rule.encrypted",
    ]
    assert alice.get(f"{V3}/pushrules/global/").json() == ruleset
    one = alice.get(f"{V3}/pushrules/global/override/.m.rule.master")
    assert one.json()["rule_id"] == ".m.rule.master"
    assert alice.get(f"{V3}/pushrules/global/override/.m.rule.master/enabled").json() == {
        "enabled": False
    }
    assert alice.get(f"{V3}/pushrules/global/underride/.m.rule.message/actions").json() == {
        "actions": ["notify"]
    }
    assert alice.get(f"{V3}/pushrules/global/override/.m.rule.nothing").status_code == 404


@pytest.mark.parametrize(
    "params, errcode",
    [
        ({"since": "garbage"}, "M_INVALID_PARAM"),
        ({"timeout": "-1"}, "M_INVALID_PARAM"),
        ({"timeout": "soon"}, "M_INVALID_PARAM"),
        ({"set_presence": "busy"}, "M_INVALID_PARAM"),
        ({"full_state": "maybe"}, "M_INVALID_PARAM"),
    ],
)
def test_bad_sync_parameters_are_refused(server, user, params, errcode):
    r = user("alice").get(f"{V3}/sync", params=params)
    assert (r.status_code, r.json()["errcode"]) == (400, errcode)


def test_sync_needs_a_token(server):
    from tests.support.server import MatrixClient

    r = MatrixClient(server.client_url).get(f"{V3}/sync")
    assert (r.status_code, r.json()["errcode"]) == (401, "M_MISSING_TOKEN")


def test_set_presence_is_accepted(server, user):
    r = user("alice").get(f"{V3}/sync", params={"set_presence": "offline"})
    assert r.status_code == 200 and json.loads(r.text)["next_batch"]
