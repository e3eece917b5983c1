"""Redactions over the client-server API on the real server (SQLite and PostgreSQL): who may
redact what, where `redacts` goes in room versions 10 and 11, and that a redacted event is
served redacted by /event, /messages, /sync and /state, with `unsigned.redacted_because`."""

from urllib.parse import quote

import pytest

from homeserver.rooms.events import event_id_for
from homeserver.rooms.versions import KNOWN_ROOM_VERSIONS
from tests.rooms.conftest import V3, create_room, send, stored_pdus
from tests.support.spec import assert_matches_spec
from tests.sync.conftest import sync, timeline

REDACT = "/_matrix/client/v3/rooms/{roomId}/redact/{eventId}/{txnId}"


def redact(client, room_id: str, event_id: str, txn: str, **body):
    return client.put(
        f"{V3}/rooms/{quote(room_id, safe='')}/redact/{quote(event_id, safe='')}/{txn}",
        json=body,
    )


def get_event(client, room_id: str, event_id: str) -> dict:
    r = client.get(f"{V3}/rooms/{quote(room_id, safe='')}/event/{quote(event_id, safe='')}")
    assert r.status_code == 200, r.text
    return r.json()


def messages(client, room_id: str) -> dict[str, dict]:
    r = client.get(f"{V3}/rooms/{quote(room_id, safe='')}/messages", params={"dir": "b"})
    assert r.status_code == 200, r.text
    return {e["event_id"]: e for e in r.json()["chunk"]}


def assert_redacted(event: dict, redaction_id: str, reason: str | None = None) -> None:
    assert event["content"] == {}
    because = event["unsigned"]["redacted_because"]
    assert because["event_id"] == redaction_id
    assert because["type"] == "m.room.redaction"
    assert because["redacts"] == because["content"]["redacts"] == event["event_id"]
    if reason is not None:
        assert because["content"]["reason"] == reason


@pytest.mark.parametrize("version", ["10", "11", "12"])
def test_own_message_redacted_and_served_redacted_everywhere(server, user, version):
    alice = user("alice")
    room_id = create_room(alice, room_version=version)
    target = send(alice, room_id, "regrettable")
    r = redact(alice, room_id, target, "r1", reason="typo")
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "PUT", REDACT)
    redaction_id = r.json()["event_id"]
    # The same transaction: the same redaction, not another.
    again = redact(alice, room_id, target, "r1", reason="typo")
    assert again.json() == {"event_id": redaction_id}

    assert_redacted(get_event(alice, room_id, target), redaction_id, "typo")
    chunk = messages(alice, room_id)
    assert_redacted(chunk[target], redaction_id, "typo")
    assert chunk[redaction_id]["redacts"] == target
    assert chunk[redaction_id]["content"] == {"redacts": target, "reason": "typo"}
    assert list(chunk).count(redaction_id) == 1
    events = {e["event_id"]: e for e in timeline(sync(alice), room_id)}
    assert_redacted(events[target], redaction_id, "typo")
    assert events[redaction_id]["unsigned"]["transaction_id"] == "r1"

    # Stored: the redaction names its target where the version says; the target is kept in
    # its redacted form, with its hashes and signatures, under the same event ID.
    pdus = dict(stored_pdus(server, room_id))
    if version == "10":
        assert pdus[redaction_id]["redacts"] == target
        assert pdus[redaction_id]["content"] == {"reason": "typo"}
    else:
        assert "redacts" not in pdus[redaction_id]
        assert pdus[redaction_id]["content"] == {"redacts": target, "reason": "typo"}
    stored = pdus[target]
    assert stored["content"] == {} and "unsigned" not in stored
    assert stored["hashes"]["sha256"] and stored["signatures"]
    assert event_id_for(KNOWN_ROOM_VERSIONS[version], stored) == target


def test_who_may_redact_what(server, user):
    alice, bob, eve = user("alice"), user("bob"), user("eve")
    room_id = create_room(alice, preset="public_chat")
    assert bob.post(f"{V3}/join/{room_id}", json={}).status_code == 200
    by_alice, by_bob = send(alice, room_id, "alice's"), send(bob, room_id, "bob's")

    # Without the redact level, only one's own events.
    r = redact(bob, room_id, by_alice, "b1")
    assert (r.status_code, r.json()["errcode"]) == (403, "M_FORBIDDEN")
    assert get_event(bob, room_id, by_alice)["content"]["body"] == "alice's"
    r = redact(bob, room_id, "$unknown", "b2")
    assert (r.status_code, r.json()["errcode"]) == (404, "M_NOT_FOUND")
    # Not in the room: refused before anything else is said.
    r = redact(eve, room_id, by_alice, "e1")
    assert (r.status_code, r.json()["errcode"]) == (403, "M_FORBIDDEN")
    r = redact(eve, room_id, "$unknown", "e2")
    assert (r.status_code, r.json()["errcode"]) == (403, "M_FORBIDDEN")
    # The create event and server ACLs are not redactable (as Synapse refuses them).
    state = alice.get(f"{V3}/rooms/{room_id}/state").json()
    create_id = next(e["event_id"] for e in state if e["type"] == "m.room.create")
    r = redact(alice, room_id, create_id, "a0")
    assert (r.status_code, r.json()["errcode"]) == (403, "M_FORBIDDEN")

    # The creator (100 >= redact 50) redacts bob's event, and may name one not seen here.
    r = redact(alice, room_id, by_bob, "a1")
    assert r.status_code == 200, r.text
    assert_redacted(get_event(bob, room_id, by_bob), r.json()["event_id"])
    r = redact(alice, room_id, "$not-here-yet", "a2")
    assert r.status_code == 200, r.text

    # bob's own, through /send with content.redacts (v12, Synapse's default, keeps it there).
    own = send(bob, room_id, "mine")
    r = bob.put(f"{V3}/rooms/{room_id}/send/m.room.redaction/s1", json={"redacts": own})
    assert r.status_code == 200, r.text
    assert_redacted(get_event(alice, room_id, own), r.json()["event_id"])

    # The m.room.redaction event level is the auth rules' own: at 50, bob may redact nothing.
    levels = alice.get(f"{V3}/rooms/{room_id}/state/m.room.power_levels").json()
    levels["events"]["m.room.redaction"] = 50
    r = alice.put(f"{V3}/rooms/{room_id}/state/m.room.power_levels", json=levels)
    assert r.status_code == 200, r.text
    another = send(bob, room_id, "another")
    r = redact(bob, room_id, another, "b3")
    assert (r.status_code, r.json()["errcode"]) == (403, "M_FORBIDDEN")
    assert get_event(bob, room_id, another)["content"]["body"] == "another"


def test_a_redacted_state_event_stays_state_with_redacted_content(server, user):
    alice = user("alice")
    room_id = create_room(alice, name="Secret plans", topic="do not read")
    state = {
        (e["type"], e["state_key"]): e for e in alice.get(f"{V3}/rooms/{room_id}/state").json()
    }
    name_id = state[("m.room.name", "")]["event_id"]
    r = redact(alice, room_id, name_id, "n1", reason="leak")
    assert r.status_code == 200, r.text
    after = {
        (e["type"], e["state_key"]): e for e in alice.get(f"{V3}/rooms/{room_id}/state").json()
    }
    assert after[("m.room.name", "")]["event_id"] == name_id
    assert_redacted(after[("m.room.name", "")], r.json()["event_id"], "leak")
    assert alice.get(f"{V3}/rooms/{room_id}/state/m.room.name").json() == {}
    assert after[("m.room.topic", "")]["content"]["topic"] == "do not read"
    # A later name shows the redacted one as what it replaced.
    r = alice.put(f"{V3}/rooms/{room_id}/state/m.room.name", json={"name": "Open plans"})
    newer = get_event(alice, room_id, r.json()["event_id"])
    assert newer["unsigned"]["replaces_state"] == name_id
    assert newer["unsigned"]["prev_content"] == {}
    # Power levels keep what the algorithm keeps: redacting them changes no one's power.
    pl_id = state[("m.room.power_levels", "")]["event_id"]
    assert redact(alice, room_id, pl_id, "p1").status_code == 200
    levels = alice.get(f"{V3}/rooms/{room_id}/state/m.room.power_levels").json()
    # From version 12 the creator's power is the create event's, not a users entry.
    assert levels["users"] == {} and levels["redact"] == 50 and levels["users_default"] == 0
    r = alice.put(f"{V3}/rooms/{room_id}/state/m.room.topic", json={"topic": "still mine"})
    assert r.status_code == 200, r.text
