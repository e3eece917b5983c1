"""Rooms over HTTP against a real server: createRoom, state, send, membership, history."""

import hashlib
import json

import gevent
from signedjson.key import decode_verify_key_bytes
from signedjson.sign import verify_signed_json
from unpaddedbase64 import decode_base64, encode_base64

from tests.rooms.conftest import V3, alias_path, create_room, send, stored_pdus
from tests.support.server import MatrixClient
from tests.support.spec import assert_matches_spec


def canonical(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()


def messages(client, room_id, **params):
    r = client.get(f"{V3}/rooms/{room_id}/messages", params=params)
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "get", "/_matrix/client/v3/rooms/{roomId}/messages")
    return r.json()


def test_create_room_with_alias_then_lookup(server, user):
    alice = user("alice")
    local = f"lobby{alice.user_id[1:].split(':')[0]}"
    r = alice.post(
        f"{V3}/createRoom",
        json={
            "room_alias_name": local,
            "name": "Lobby",
            "topic": "Chat here",
            "visibility": "public",
            "preset": "public_chat",
        },
    )
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "post", "/_matrix/client/v3/createRoom")
    room_id = r.json()["room_id"]
    # Version 12 by default: the room ID is the create event's hash, naming no server.
    assert room_id.startswith("!") and ":" not in room_id

    # Anyone can resolve the alias, without logging in.
    lookup = MatrixClient(server.client_url).get(alias_path(f"#{local}:weir.test"))
    assert lookup.json() == {"room_id": room_id, "servers": ["weir.test"]}
    assert_matches_spec(lookup, "get", "/_matrix/client/v3/directory/room/{roomAlias}")

    # The initial events, in the order the spec gives.
    chunk = messages(alice, room_id, dir="f", limit=50)["chunk"]
    assert [(e["type"], e.get("state_key")) for e in chunk] == [
        ("m.room.create", ""),
        ("m.room.member", alice.user_id),
        ("m.room.power_levels", ""),
        ("m.room.canonical_alias", ""),
        ("m.room.join_rules", ""),
        ("m.room.history_visibility", ""),
        ("m.room.guest_access", ""),
        ("m.room.name", ""),
        ("m.room.topic", ""),
    ]
    by_type = {e["type"]: e["content"] for e in chunk}
    assert by_type["m.room.create"] == {"room_version": "12"}  # v11 on: the sender is creator
    assert by_type["m.room.canonical_alias"] == {"alias": f"#{local}:weir.test"}
    assert by_type["m.room.join_rules"] == {"join_rule": "public"}
    assert by_type["m.room.power_levels"]["users"] == {}  # v12: creators' power is unbounded
    assert by_type["m.room.topic"]["topic"] == "Chat here"

    state = alice.get(f"{V3}/rooms/{room_id}/state")
    assert_matches_spec(state, "get", "/_matrix/client/v3/rooms/{roomId}/state")
    assert len(state.json()) == len(chunk)


def test_create_room_topic_has_the_spec_m_topic_block(server, user):
    # m.room.topic: `m.topic` is a TopicContentBlock, an object whose `m.text` lists the
    # topic's representations; a bare list is not that shape.
    alice = user("alice")
    room_id = create_room(alice, topic="Chat here")
    r = alice.get(f"{V3}/rooms/{room_id}/state/m.room.topic/")
    assert r.status_code == 200, r.text
    assert r.json() == {
        "topic": "Chat here",
        "m.topic": {"m.text": [{"mimetype": "text/plain", "body": "Chat here"}]},
    }


def test_the_creators_join_carries_their_profile(server, user):
    alice = user("alice")
    for field, value in (("displayname", "Alice A"), ("avatar_url", "mxc://weir.test/a")):
        r = alice.put(f"{V3}/profile/{alice.user_id}/{field}", json={field: value})
        assert r.status_code == 200, r.text
    room_id = create_room(alice)
    r = alice.get(f"{V3}/rooms/{room_id}/state/m.room.member/{alice.user_id}")
    assert r.status_code == 200, r.text
    assert r.json() == {
        "membership": "join",
        "displayname": "Alice A",
        "avatar_url": "mxc://weir.test/a",
    }


def test_create_room_options_and_refusals(server, user):
    alice, bob = user("alice"), user("bob")
    room_id = create_room(
        alice,
        room_version="11",
        invite=[bob.user_id],
        is_direct=True,
        preset="trusted_private_chat",
        creation_content={"type": "m.space", "m.federate": False},
        initial_state=[
            {"type": "m.room.history_visibility", "content": {"history_visibility": "joined"}},
            {"type": "m.custom.thing", "state_key": "k", "content": {"a": 1}},
        ],
        power_level_content_override={"events_default": 10},
    )
    state = {
        (e["type"], e["state_key"]): e for e in alice.get(f"{V3}/rooms/{room_id}/state").json()
    }
    create = state[("m.room.create", "")]["content"]
    assert create == {"room_version": "11", "type": "m.space", "m.federate": False}
    assert state[("m.room.member", bob.user_id)]["content"] == {
        "membership": "invite",
        "is_direct": True,
    }
    power = state[("m.room.power_levels", "")]["content"]
    assert power["users"] == {alice.user_id: 100, bob.user_id: 100}  # trusted: invitees as admins
    assert power["events_default"] == 10 and power["invite"] == 0
    assert state[("m.room.history_visibility", "")]["content"] == {
        "history_visibility": "joined"
    }  # initial_state wins over the preset
    assert state[("m.room.join_rules", "")]["content"] == {"join_rule": "invite"}
    assert state[("m.custom.thing", "k")]["content"] == {"a": 1}

    rooms_before = alice.get(f"{V3}/joined_rooms").json()["joined_rooms"]

    def refused(body, status, errcode):
        r = alice.post(f"{V3}/createRoom", json=body)
        assert (r.status_code, r.json()["errcode"]) == (status, errcode), r.text

    refused({"room_version": "13"}, 400, "M_UNSUPPORTED_ROOM_VERSION")
    refused({"preset": "party"}, 400, "M_BAD_JSON")
    # Other servers' users are invited after creation, a few only (homeserver/rooms/creation.py).
    refused({"invite": [f"@u{n}:elsewhere.example" for n in range(11)]}, 400, "M_INVALID_PARAM")
    refused({"invite": ["@bad:server name"]}, 400, "M_INVALID_PARAM")
    refused({"invite": ["@nobody-here:weir.test"]}, 404, "M_NOT_FOUND")
    refused({"room_alias_name": "bad:alias"}, 400, "M_INVALID_PARAM")
    refused({"initial_state": [{"type": "m.room.create", "content": {}}]}, 400, "M_INVALID_PARAM")
    # A power level override that locks the creator out of the next event: nothing is stored.
    refused(
        {"name": "x", "power_level_content_override": {"users": {alice.user_id: 0}}},
        400,
        "M_INVALID_ROOM_STATE",
    )
    taken = f"taken{bob.user_id[1:].split(':')[0]}"
    create_room(alice, room_alias_name=taken)
    after_first = alice.get(f"{V3}/joined_rooms").json()["joined_rooms"]
    refused({"room_alias_name": taken}, 400, "M_ROOM_IN_USE")
    # Refused creations left no room behind.
    assert len(after_first) == len(rooms_before) + 1
    assert alice.get(f"{V3}/joined_rooms").json()["joined_rooms"] == after_first

    # Racing for one alias: one room gets it, the others are refused whole.
    raced = f"race{bob.user_id[1:].split(':')[0]}"
    jobs = [
        gevent.spawn(alice.post, f"{V3}/createRoom", json={"room_alias_name": raced})
        for _ in range(6)
    ]
    gevent.joinall(jobs, raise_error=True)
    outcomes = sorted((j.value.status_code, j.value.json().get("errcode")) for j in jobs)
    assert outcomes == [(200, None)] + [(400, "M_ROOM_IN_USE")] * 5
    winner = [j.value.json()["room_id"] for j in jobs if j.value.status_code == 200]
    assert alice.get(alias_path(f"#{raced}:weir.test")).json()["room_id"] == winner[0]
    now_joined = alice.get(f"{V3}/joined_rooms").json()["joined_rooms"]
    assert sorted(now_joined) == sorted(after_first + winner)


def test_send_is_idempotent_per_device_and_transaction(server, user):
    alice = user("alice")
    room_id = create_room(alice)
    path = f"{V3}/rooms/{room_id}/send/m.room.message/txn-1"
    first = alice.put(path, json={"body": "once"})
    assert first.status_code == 200
    assert_matches_spec(first, "put", "/_matrix/client/v3/rooms/{roomId}/send/{eventType}/{txnId}")
    again = alice.put(path, json={"body": "once"})
    assert again.json() == first.json()

    # Many retransmissions at once still make one event.
    jobs = [
        gevent.spawn(
            alice.put, f"{V3}/rooms/{room_id}/send/m.room.message/txn-2", json={"body": "burst"}
        )
        for _ in range(8)
    ]
    gevent.joinall(jobs, raise_error=True)
    assert len({j.value.json()["event_id"] for j in jobs}) == 1

    # Another device with the same txn ID, or another event type, is another transaction.
    other_device = MatrixClient(server.client_url)
    other_device.login(alice.user_id)
    other = other_device.put(path, json={"body": "once"})
    assert other.json()["event_id"] != first.json()["event_id"]
    reaction = alice.put(f"{V3}/rooms/{room_id}/send/m.reaction/txn-1", json={})
    assert reaction.json()["event_id"] != first.json()["event_id"]

    bodies = [
        e["content"].get("body")
        for e in messages(
            alice, room_id, dir="b", limit=50, filter=json.dumps({"types": ["m.room.message"]})
        )["chunk"]
    ]
    assert bodies == ["once", "burst", "once"]
    # The sending device sees its transaction ID on the event; other devices do not.
    event = alice.get(f"{V3}/rooms/{room_id}/event/{first.json()['event_id']}")
    assert event.json()["unsigned"]["transaction_id"] == "txn-1"
    assert_matches_spec(event, "get", "/_matrix/client/v3/rooms/{roomId}/event/{eventId}")
    seen_elsewhere = other_device.get(f"{V3}/rooms/{room_id}/event/{first.json()['event_id']}")
    assert "transaction_id" not in seen_elsewhere.json()["unsigned"]
    # The same on a page of /messages, which reads transaction IDs for the user's own events.
    for client, expected in ((alice, "txn-1"), (other_device, None)):
        page = messages(client, room_id, dir="b", limit=50)["chunk"]
        [found] = [e for e in page if e["event_id"] == first.json()["event_id"]]
        assert found["unsigned"].get("transaction_id") == expected


def test_state_events(server, user):
    alice, bob = user("alice"), user("bob")
    room_id = create_room(alice, preset="public_chat")
    put = alice.put(f"{V3}/rooms/{room_id}/state/m.room.name", json={"name": "First"})
    assert put.status_code == 200
    assert_matches_spec(
        put, "put", "/_matrix/client/v3/rooms/{roomId}/state/{eventType}/{stateKey}"
    )
    # The same content again changes nothing and makes no new event.
    again = alice.put(f"{V3}/rooms/{room_id}/state/m.room.name/", json={"name": "First"})
    assert again.json() == put.json()

    content = alice.get(f"{V3}/rooms/{room_id}/state/m.room.name")
    assert content.json() == {"name": "First"}
    event = alice.get(f"{V3}/rooms/{room_id}/state/m.room.name", params={"format": "event"})
    assert event.json()["event_id"] == put.json()["event_id"]
    assert event.json()["state_key"] == ""
    missing = alice.get(f"{V3}/rooms/{room_id}/state/m.room.avatar")
    assert (missing.status_code, missing.json()["errcode"]) == (404, "M_NOT_FOUND")

    # Not a member: no state. A member without power: no name change.
    outsider = bob.get(f"{V3}/rooms/{room_id}/state")
    assert (outsider.status_code, outsider.json()["errcode"]) == (403, "M_FORBIDDEN")
    assert bob.post(f"{V3}/rooms/{room_id}/join", json={}).status_code == 200
    weak = bob.put(f"{V3}/rooms/{room_id}/state/m.room.name", json={"name": "Mine"})
    assert (weak.status_code, weak.json()["errcode"]) == (403, "M_FORBIDDEN")
    # State keys naming a user belong to that user, whatever the sender's power.
    assert (
        alice.put(f"{V3}/rooms/{room_id}/state/m.custom/{bob.user_id}", json={}).status_code == 403
    )
    assert (
        alice.put(f"{V3}/rooms/{room_id}/state/m.custom/{alice.user_id}", json={}).status_code
        == 200
    )
    # A second name replaces the first, and says what it replaced.
    second = alice.put(f"{V3}/rooms/{room_id}/state/m.room.name", json={"name": "Second"})
    event = alice.get(f"{V3}/rooms/{room_id}/event/{second.json()['event_id']}").json()
    assert event["unsigned"]["prev_content"] == {"name": "First"}
    assert event["unsigned"]["replaces_state"] == put.json()["event_id"]


def test_membership_join_invite_leave_kick(server, user):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    room_id = create_room(alice, preset="private_chat")

    denied = bob.post(f"{V3}/join/{room_id}", json={})
    assert (denied.status_code, denied.json()["errcode"]) == (403, "M_FORBIDDEN")
    invite = alice.post(f"{V3}/rooms/{room_id}/invite", json={"user_id": bob.user_id})
    assert invite.status_code == 200
    assert_matches_spec(invite, "post", "/_matrix/client/v3/rooms/{roomId}/invite ")
    joined = bob.post(f"{V3}/join/{room_id}", json={"reason": "hello"})
    assert joined.json() == {"room_id": room_id}
    assert_matches_spec(joined, "post", "/_matrix/client/v3/join/{roomIdOrAlias}")
    assert room_id in bob.get(f"{V3}/joined_rooms").json()["joined_rooms"]

    members = alice.get(f"{V3}/rooms/{room_id}/members")
    assert_matches_spec(members, "get", "/_matrix/client/v3/rooms/{roomId}/members")
    assert {(e["state_key"], e["content"]["membership"]) for e in members.json()["chunk"]} == {
        (alice.user_id, "join"),
        (bob.user_id, "join"),
    }
    bob_join = [e for e in members.json()["chunk"] if e["state_key"] == bob.user_id][0]
    assert bob_join["content"] == {"membership": "join", "reason": "hello"}

    # Bob (level 0) may not kick Alice; nobody can kick someone who is not in the room.
    assert (
        bob.post(f"{V3}/rooms/{room_id}/kick", json={"user_id": alice.user_id}).status_code == 403
    )
    assert (
        alice.post(f"{V3}/rooms/{room_id}/kick", json={"user_id": carol.user_id}).status_code == 403
    )
    kicked = alice.post(
        f"{V3}/rooms/{room_id}/kick", json={"user_id": bob.user_id, "reason": "bye"}
    )
    assert kicked.status_code == 200
    assert room_id not in bob.get(f"{V3}/joined_rooms").json()["joined_rooms"]
    # Bob still sees the room as it was when he left; the private room stays closed to him.
    left_state = bob.get(f"{V3}/rooms/{room_id}/members", params={"membership": "leave"})
    assert [(e["state_key"], e["content"]) for e in left_state.json()["chunk"]] == [
        (bob.user_id, {"membership": "leave", "reason": "bye"})
    ]
    assert bob.post(f"{V3}/rooms/{room_id}/join", json={}).status_code == 403

    # Leaving is idempotent; leaving a room you were never in is refused.
    alice.post(f"{V3}/rooms/{room_id}/invite", json={"user_id": carol.user_id})
    assert carol.post(f"{V3}/rooms/{room_id}/leave", json={}).status_code == 200  # rejects
    assert carol.post(f"{V3}/rooms/{room_id}/leave", json={}).status_code == 200
    stranger = user("dave")
    assert stranger.post(f"{V3}/rooms/{room_id}/leave", json={}).status_code == 403

    assert (
        alice.post(
            f"{V3}/rooms/{room_id}/invite", json={"user_id": "@nobody-here:weir.test"}
        ).status_code
        == 404
    )
    remote = alice.post(f"{V3}/rooms/{room_id}/invite", json={"user_id": "@x:elsewhere.example"})
    # Another server's user is invited through their server, which cannot be reached here.
    assert (remote.status_code, remote.json()["errcode"]) == (502, "M_UNKNOWN"), remote.text
    third_party = alice.post(
        f"{V3}/rooms/{room_id}/invite",
        json={"medium": "email", "address": "a@b.c", "id_server": "x"},
    )
    assert third_party.status_code == 400


def test_join_errors(server, user):
    alice = user("alice")
    unknown = alice.post(f"{V3}/join/!nope:weir.test", json={})
    assert (unknown.status_code, unknown.json()["errcode"]) == (404, "M_NOT_FOUND")
    remote = alice.post(f"{V3}/join/!room:elsewhere.example", json={})
    assert (remote.status_code, remote.json()["errcode"]) == (502, "M_UNKNOWN"), remote.text
    no_alias = alice.post(f"{V3}/join/%23missing:weir.test", json={})
    assert (no_alias.status_code, no_alias.json()["errcode"]) == (404, "M_NOT_FOUND")
    garbage = alice.post(f"{V3}/join/lobby", json={})
    assert (garbage.status_code, garbage.json()["errcode"]) == (400, "M_INVALID_PARAM")
    assert alice.get(f"{V3}/rooms/!nope:weir.test/state").status_code == 404


def test_messages_paging_and_tokens(server, user):
    alice = user("alice")
    room_id = create_room(alice)
    sent = [send(alice, room_id, f"m{i}") for i in range(25)]
    only_messages = json.dumps(
        {
            "types": ["m.room.*"],
            "not_types": [
                "m.room.member",
                "m.room.create",
                "m.room.power_levels",
                "m.room.join_rules",
                "m.room.history_visibility",
                "m.room.guest_access",
            ],
        }
    )
    seen, token, pages = [], None, 0
    while True:
        params = {"dir": "b", "limit": 10, "filter": only_messages}
        if token:
            params["from"] = token
        page = messages(alice, room_id, **params)
        seen += [e["event_id"] for e in page["chunk"]]
        pages += 1
        if "end" not in page:
            break
        token = page["end"]
    assert seen == list(reversed(sent))
    assert pages == 3

    # A page that happens to end at the oldest message still gives `end`; the page after it
    # is empty and has none.
    everything = messages(alice, room_id, dir="b", limit=25, filter=only_messages)
    assert len(everything["chunk"]) == 25
    rest = messages(
        alice, room_id, dir="b", limit=25, filter=only_messages, **{"from": everything["end"]}
    )
    assert rest["chunk"] == [] and "end" not in rest

    # Forward from the start, bounded by `to`: the first ten messages only.
    forward = messages(alice, room_id, dir="f", limit=100, filter=only_messages)
    assert [e["event_id"] for e in forward["chunk"]] == sent
    middle = messages(alice, room_id, dir="b", limit=15, filter=only_messages)
    bounded = messages(alice, room_id, dir="f", to=middle["end"], limit=100, filter=only_messages)
    assert [e["event_id"] for e in bounded["chunk"]] == sent[:10]
    # A page ends exactly where the next one starts, for either direction.
    step = messages(alice, room_id, dir="f", limit=5, filter=only_messages)
    step2 = messages(
        alice, room_id, dir="f", limit=5, filter=only_messages, **{"from": step["end"]}
    )
    assert [e["event_id"] for e in step["chunk"] + step2["chunk"]] == sent[:10]

    bad = alice.get(f"{V3}/rooms/{room_id}/messages", params={"dir": "b", "from": "zzz"})
    assert (bad.status_code, bad.json()["errcode"]) == (400, "M_INVALID_PARAM")
    bad_filter = alice.get(f"{V3}/rooms/{room_id}/messages", params={"filter": "{"})
    assert bad_filter.status_code == 400


def test_messages_backwards_to_a_token_still_gives_end(server, user):
    # `end` is omitted only when no further events are available. Paging back to a `to`
    # token (filling a gap between two syncs) stops there with older history still
    # available, so `end` must be given; clients read its absence as the room's start.
    alice = user("alice")
    room_id = create_room(alice)
    sent = [send(alice, room_id, f"m{i}") for i in range(6)]
    older = messages(alice, room_id, dir="b", limit=3)
    assert [e["event_id"] for e in older["chunk"]] == sent[:2:-1]
    newest = messages(alice, room_id, dir="b", limit=100, to=older["end"])
    assert [e["event_id"] for e in newest["chunk"]] == sent[:2:-1]
    assert "end" in newest
    rest = messages(alice, room_id, dir="b", limit=3, **{"from": newest["end"]})
    assert [e["event_id"] for e in rest["chunk"]] == sent[2::-1]


def test_history_visibility(server, user):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    joined_only = create_room(
        alice,
        preset="public_chat",
        initial_state=[
            {"type": "m.room.history_visibility", "content": {"history_visibility": "joined"}}
        ],
    )
    before = send(alice, joined_only, "before bob")
    bob.post(f"{V3}/join/{joined_only}", json={})
    after = send(alice, joined_only, "after bob")
    seen = [e["event_id"] for e in messages(bob, joined_only, dir="b", limit=50)["chunk"]]
    assert after in seen and before not in seen
    assert bob.get(f"{V3}/rooms/{joined_only}/event/{before}").status_code == 404
    assert bob.get(f"{V3}/rooms/{joined_only}/event/{after}").status_code == 200

    shared = create_room(alice, preset="public_chat")
    early = send(alice, shared, "early")
    carol.post(f"{V3}/join/{shared}", json={})
    seen = [e["event_id"] for e in messages(carol, shared, dir="b", limit=50)["chunk"]]
    assert early in seen
    # After leaving, later events are out of sight.
    carol.post(f"{V3}/rooms/{shared}/leave", json={})
    late = send(alice, shared, "late")
    seen = [e["event_id"] for e in messages(carol, shared, dir="b", limit=50)["chunk"]]
    assert early in seen and late not in seen
    # A stranger sees nothing of a room that is not world readable.
    stranger = user("eve")
    assert stranger.get(f"{V3}/rooms/{shared}/messages").status_code == 403
    alice.put(
        f"{V3}/rooms/{shared}/state/m.room.history_visibility",
        json={"history_visibility": "world_readable"},
    )
    assert stranger.get(f"{V3}/rooms/{shared}/messages").status_code == 200


def test_event_content_limits(server, user):
    alice = user("alice")
    room_id = create_room(alice)
    path = f"{V3}/rooms/{room_id}/send/m.room.message/"
    too_big = alice.put(path + "big", json={"body": "x" * 65000})
    assert (too_big.status_code, too_big.json()["errcode"]) == (413, "M_TOO_LARGE")
    way_too_big = alice.put(path + "bigger", data=b'{"body":"' + b"x" * 70000 + b'"}')
    assert (way_too_big.status_code, way_too_big.json()["errcode"]) == (413, "M_TOO_LARGE")
    floats = alice.put(path + "float", data=b'{"n": 1.5}')
    assert (floats.status_code, floats.json()["errcode"]) == (400, "M_BAD_JSON")
    huge_int = alice.put(path + "int", data=b'{"n": 9007199254740993}')
    assert (huge_int.status_code, huge_int.json()["errcode"]) == (400, "M_BAD_JSON")
    not_json = alice.put(path + "nj", data=b"nope")
    assert (not_json.status_code, not_json.json()["errcode"]) == (400, "M_NOT_JSON")
    # A redaction must name its target (tests/rooms/test_redactions_api.py has the rest).
    redaction = alice.put(f"{V3}/rooms/{room_id}/send/m.room.redaction/r", json={})
    assert (redaction.status_code, redaction.json()["errcode"]) == (400, "M_BAD_JSON")


def test_stored_events_verify_independently(server, user):
    """Event IDs, content hashes and signatures of what the server stored, checked with the
    server's published key and a hash computed here."""
    alice, bob = user("alice"), user("bob")
    room_id = create_room(alice, preset="public_chat", name="Verified", room_version="11")
    bob.post(f"{V3}/join/{room_id}", json={})
    send(alice, room_id, "signed and sealed")

    key_doc = MatrixClient(server.federation_url).get("/_matrix/key/v2/server").json()
    ((key_id, key),) = key_doc["verify_keys"].items()
    verify_key = decode_verify_key_bytes(key_id, decode_base64(key["key"]))

    pdus = stored_pdus(server, room_id)
    ids = [event_id for event_id, _ in pdus]
    state: dict = {}
    for i, (event_id, pdu) in enumerate(pdus):
        assert "event_id" not in pdu
        # Content hash over everything but unsigned, signatures and hashes.
        body = {k: v for k, v in pdu.items() if k not in ("unsigned", "signatures", "hashes")}
        assert decode_base64(pdu["hashes"]["sha256"]) == hashlib.sha256(canonical(body)).digest()
        # v11 redaction, done by hand: messages lose their content, a create keeps all;
        # other state keeps its listed keys.
        kept = {
            "m.room.member": ["membership", "join_authorised_via_users_server"],
            "m.room.join_rules": ["join_rule", "allow"],
            "m.room.power_levels": [
                "ban",
                "events",
                "events_default",
                "invite",
                "kick",
                "redact",
                "state_default",
                "users",
                "users_default",
            ],
            "m.room.history_visibility": ["history_visibility"],
        }
        redacted = {
            k: v
            for k, v in pdu.items()
            if k
            in (
                "type",
                "room_id",
                "sender",
                "state_key",
                "content",
                "hashes",
                "depth",
                "prev_events",
                "auth_events",
                "origin_server_ts",
            )
        }
        if pdu["type"] != "m.room.create":
            redacted["content"] = {
                k: v for k, v in pdu["content"].items() if k in kept.get(pdu["type"], [])
            }
        reference = hashlib.sha256(canonical(redacted)).digest()
        assert event_id == "$" + encode_base64(reference, urlsafe=True)
        verify_signed_json(dict(redacted, signatures=pdu["signatures"]), "weir.test", verify_key)
        # A linear room: each event follows the one before it, one deeper.
        assert pdu["prev_events"] == ids[i - 1 : i]
        assert pdu["depth"] == i + 1
        # auth_events are exactly the selection the spec gives, from the state before.
        if pdu["type"] != "m.room.create":
            wanted = {
                ("m.room.create", ""),
                ("m.room.power_levels", ""),
                ("m.room.member", pdu["sender"]),
            }
            if pdu["type"] == "m.room.member":
                wanted |= {("m.room.member", pdu["state_key"]), ("m.room.join_rules", "")}
            assert set(pdu["auth_events"]) == {state[k] for k in wanted if k in state}
        if "state_key" in pdu:
            state[(pdu["type"], pdu["state_key"])] = event_id


def test_concurrent_sends_stay_linear(server, user):
    alice = user("alice")
    room_id = create_room(alice)
    jobs = [gevent.spawn(send, alice, room_id, f"c{i}") for i in range(20)]
    gevent.joinall(jobs, raise_error=True)
    pdus = stored_pdus(server, room_id)
    for i, (_, pdu) in enumerate(pdus):
        assert pdu["depth"] == i + 1
        assert pdu["prev_events"] == ([pdus[i - 1][0]] if i else [])
    assert {j.value for j in jobs} <= {event_id for event_id, _ in pdus}


def test_joined_rooms_spec_shape(server, user):
    alice = user("alice")
    room_id = create_room(alice)
    r = alice.get(f"{V3}/joined_rooms")
    assert_matches_spec(r, "get", "/_matrix/client/v3/joined_rooms")
    assert room_id in r.json()["joined_rooms"]
