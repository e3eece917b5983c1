"""Reporting events, rooms and users over HTTP against a real server: the spec's shapes, the
refusals, and the rows kept for the admins."""

import sqlite3

from tests.rooms.conftest import V3, create_room, send
from tests.support.spec import assert_matches_spec

EVENT_REPORT = "/_matrix/client/v3/rooms/{roomId}/report/{eventId}"


def reports_by(server, reporter: str) -> list[tuple]:
    """(kind, room_id, event_id, target_user_id, reason, score) of the reporter's reports,
    oldest first, read from the database the server writes."""
    sql = (
        "SELECT kind, room_id, event_id, target_user_id, reason, score FROM reports"
        " WHERE reporter = {} ORDER BY id"
    )
    url = server.database_url
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(f"file:{url[len('sqlite:///') :]}?mode=ro", uri=True)
        try:
            return [tuple(r) for r in conn.execute(sql.format("?"), (reporter,)).fetchall()]
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url) as conn:
        return [tuple(r) for r in conn.execute(sql.format("%s"), (reporter,)).fetchall()]


def refused(response, status: int, errcode: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["errcode"] == errcode


def test_report_an_event(server, user):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    room_id = create_room(alice, preset="public_chat")
    assert bob.post(f"{V3}/rooms/{room_id}/join", json={}).status_code == 200
    event_id = send(alice, room_id, "rude words")

    r = bob.post(f"{V3}/rooms/{room_id}/report/{event_id}", json={"reason": "rude", "score": -80})
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "post", EVENT_REPORT)
    # Both fields are optional.
    assert bob.post(f"{V3}/rooms/{room_id}/report/{event_id}", json={}).status_code == 200
    assert reports_by(server, bob.user_id) == [
        ("event", room_id, event_id, None, "rude", -80),
        ("event", room_id, event_id, None, None, None),
    ]

    # 404 for an event that does not exist, is in another room, or the reporter cannot see
    # (carol never joined; the history is "shared", for members only).
    other_room = create_room(bob)
    for client, room, event in (
        (bob, room_id, "$nosuchevent"),
        (bob, other_room, event_id),
        (carol, room_id, event_id),
        (bob, "!nowhere:weir.test", event_id),
    ):
        r = client.post(f"{V3}/rooms/{room}/report/{event}", json={"reason": "x"})
        refused(r, 404, "M_NOT_FOUND")
        assert_matches_spec(r, "post", EVENT_REPORT)
    assert reports_by(server, carol.user_id) == []

    # The body's fields are checked (a wrong type is M_BAD_JSON, as Synapse answers); a
    # reason is at most 1000 characters.
    url = f"{V3}/rooms/{room_id}/report/{event_id}"
    refused(bob.post(url, json={"score": "bad"}), 400, "M_BAD_JSON")
    refused(bob.post(url, json={"score": 5}), 400, "M_INVALID_PARAM")
    refused(bob.post(url, json={"reason": 7}), 400, "M_BAD_JSON")
    refused(bob.post(url, json={"reason": "x" * 1001}), 400, "M_BAD_JSON")
    assert bob.post(url, json={"reason": "x" * 1000}).status_code == 200


def test_report_a_room(server, user):
    alice = user("alice")
    room_id = create_room(alice)
    r = alice.post(f"{V3}/rooms/{room_id}/report", json={"reason": "scam room"})
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "post", "/_matrix/client/v3/rooms/{roomId}/report")
    assert reports_by(server, alice.user_id) == [("room", room_id, None, None, "scam room", None)]

    refused(
        alice.post(f"{V3}/rooms/!nowhere:weir.test/report", json={"reason": "x"}),
        404,
        "M_NOT_FOUND",
    )
    refused(alice.post(f"{V3}/rooms/{room_id}/report", json={}), 400, "M_MISSING_PARAM")
    refused(
        alice.post(f"{V3}/rooms/{room_id}/report", json={"reason": "x" * 1001}), 400, "M_BAD_JSON"
    )


def test_report_a_user(server, user):
    alice, bob = user("alice"), user("bob")
    r = alice.post(f"{V3}/users/{bob.user_id}/report", json={"reason": "harassment"})
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "post", "/_matrix/client/v3/users/{userId}/report")
    # Another server's user is kept for the admins; a local user who does not exist is
    # answered alike and not kept (the answer does not tell whether they exist).
    assert (
        alice.post(f"{V3}/users/@eve:elsewhere.example/report", json={"reason": ""}).status_code
        == 200
    )
    assert (
        alice.post(f"{V3}/users/@nobody:weir.test/report", json={"reason": "x"}).status_code == 200
    )
    assert reports_by(server, alice.user_id) == [
        ("user", None, None, bob.user_id, "harassment", None),
        ("user", None, None, "@eve:elsewhere.example", "", None),
    ]

    refused(
        alice.post(f"{V3}/users/not-a-user/report", json={"reason": "x"}), 400, "M_INVALID_PARAM"
    )
    refused(alice.post(f"{V3}/users/{bob.user_id}/report", json={}), 400, "M_MISSING_PARAM")
    refused(
        alice.post(f"{V3}/users/{bob.user_id}/report", json={"reason": "x" * 1001}),
        400,
        "M_BAD_JSON",
    )
