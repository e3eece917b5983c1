"""Unread counts in /sync and GET /notifications on the real server (SQLite and
PostgreSQL): counted from the user's read receipt on, a receipt clearing them and waking
the sync, per thread when the filter asks, and the notifications paged newest first."""

import json
from urllib.parse import quote

import gevent

from tests.rooms.conftest import V3
from tests.support.spec import assert_matches_spec
from tests.sync.conftest import metric, sync
from tests.sync.test_push_evaluation import say, send_event, shared_room

NOTIFICATIONS = f"{V3}/notifications"
THREADED = {"room": {"timeline": {"unread_thread_notifications": True}}}


def counts(body: dict, room_id: str) -> dict:
    return body["rooms"]["join"][room_id]["unread_notifications"]


def receipt(client, room_id: str, event_id: str, kind: str = "m.read", **body) -> None:
    path = f"{V3}/rooms/{quote(room_id, safe='')}/receipt/{kind}/{quote(event_id, safe='')}"
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text


def test_messages_count_a_mention_highlights_and_a_receipt_clears(user):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    room = shared_room(alice, bob, carol)
    since = sync(alice)["next_batch"]
    say(bob, room, "one")
    second = say(bob, room, "two")
    body = sync(alice, since=since)
    assert counts(body, room) == {"notification_count": 2, "highlight_count": 0}

    mention = say(bob, room, "alice?", **{"m.mentions": {"user_ids": [alice.user_id]}})
    body = sync(alice, since=body["next_batch"])
    assert counts(body, room) == {"notification_count": 3, "highlight_count": 1}

    receipt(alice, room, second)  # what came after it is still unread
    body = sync(alice, since=body["next_batch"])
    assert counts(body, room) == {"notification_count": 1, "highlight_count": 1}
    receipt(alice, room, mention, "m.read.private")
    body = sync(alice, since=body["next_batch"])
    assert counts(body, room) == {"notification_count": 0, "highlight_count": 0}
    # The sender counts nothing of their own; a first sync has every joined room's counts.
    assert counts(sync(bob), room) == {"notification_count": 0, "highlight_count": 0}


def parked(server, client, since: str) -> gevent.Greenlet:
    """A /sync, once the server has it waiting."""
    waiting = metric(server, "weir_sync_waiters")
    greenlet = gevent.spawn(sync, client, since=since, timeout=20_000)
    with gevent.Timeout(10):
        while metric(server, "weir_sync_waiters") == waiting:
            gevent.sleep(0.01)
    return greenlet


def test_a_parked_sync_is_woken_with_the_new_counts(server, user):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    room = shared_room(alice, bob, carol)
    say(bob, room, "one")
    since = sync(alice)["next_batch"]
    waiting = parked(server, alice, since)
    second = say(bob, room, "two")  # answered from the event that woke it (woken.py)
    body = waiting.get(timeout=30)
    assert counts(body, room) == {"notification_count": 2, "highlight_count": 0}
    waiting = parked(server, alice, body["next_batch"])
    receipt(alice, room, second)
    body = waiting.get(timeout=30)
    assert counts(body, room) == {"notification_count": 0, "highlight_count": 0}


def test_thread_counts_and_threaded_receipts(user):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    room = shared_room(alice, bob, carol)
    root = say(bob, room, "root")
    in_thread = {"m.relates_to": {"rel_type": "m.thread", "event_id": root}}
    reply = say(bob, room, "reply", **in_thread)
    say(bob, room, "another reply", **in_thread)
    body = sync(alice, sync_filter=THREADED)
    entry = body["rooms"]["join"][room]
    assert entry["unread_notifications"] == {"notification_count": 1, "highlight_count": 0}
    assert entry["unread_thread_notifications"] == {
        root: {"notification_count": 2, "highlight_count": 0}
    }
    # Without the filter's ask, one count for the whole room.
    assert counts(sync(alice), room) == {"notification_count": 3, "highlight_count": 0}

    receipt(alice, room, reply, thread_id=root)  # the thread's own receipt
    entry = sync(alice, sync_filter=THREADED)["rooms"]["join"][room]
    assert entry["unread_notifications"]["notification_count"] == 1
    assert entry["unread_thread_notifications"][root]["notification_count"] == 1
    receipt(alice, room, root, thread_id="main")  # the main timeline only
    entry = sync(alice, sync_filter=THREADED)["rooms"]["join"][room]
    assert entry["unread_notifications"]["notification_count"] == 0
    assert entry["unread_thread_notifications"][root]["notification_count"] == 1


def test_notifications_page_newest_first_and_only_highlights(user):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    room = shared_room(alice, bob, carol)
    mentioned = {"m.mentions": {"user_ids": [alice.user_id]}}
    sent = [
        say(bob, room, "a"),
        say(bob, room, "b", **mentioned),
        say(bob, room, "c"),
        say(bob, room, "d", **mentioned),
        say(bob, room, "e"),
    ]
    send_event(bob, room, {"msgtype": "m.notice", "body": "not notified"})
    receipt(alice, room, sent[1])

    seen, token = [], None
    while True:
        r = alice.get(NOTIFICATIONS, params={"limit": 2, **({"from": token} if token else {})})
        assert r.status_code == 200, r.text
        assert_matches_spec(r, "get", NOTIFICATIONS)
        page = r.json()
        assert len(page["notifications"]) <= 2
        seen += page["notifications"]
        token = page.get("next_token")
        if token is None:
            break
    assert [n["event"]["event_id"] for n in seen] == list(reversed(sent))
    assert [n["read"] for n in seen] == [False, False, False, True, True]
    assert {n["room_id"] for n in seen} == {room}
    assert all(isinstance(n["ts"], int) for n in seen)
    assert seen[1]["actions"][-1] == {"set_tweak": "highlight"}

    r = alice.get(NOTIFICATIONS, params={"only": "highlight"})
    assert [n["event"]["event_id"] for n in r.json()["notifications"]] == [sent[3], sent[1]]
    assert "next_token" not in r.json()

    r = alice.get(NOTIFICATIONS, params={"from": "yesterday"})
    assert (r.status_code, r.json()["errcode"]) == (400, "M_INVALID_PARAM")
    r = alice.get(NOTIFICATIONS, params={"limit": "many"})
    assert (r.status_code, r.json()["errcode"]) == (400, "M_INVALID_PARAM")
    assert carol.get(NOTIFICATIONS).json()["notifications"][0]["event"]["event_id"] == sent[-1]
    assert json.dumps(bob.get(NOTIFICATIONS).json()) == '{"notifications": []}'
