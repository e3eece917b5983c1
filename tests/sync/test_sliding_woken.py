"""A sliding sync connection woken by a message: its answer is a whole computation's, and
its next long-poll with the same request parks on the registration held since that answer
(sync/held_registrations.py) without computing; if something came meanwhile, it computes
once from that wake."""

import threading

import gevent

from homeserver.core.json_text import encode
from homeserver.rooms.pagination import stream_token
from homeserver.sync import sliding
from homeserver.sync.sliding import _body
from homeserver.sync.sliding_extensions import ExtensionsPart
from homeserver.sync.sliding_request import Extensions, SlidingRequest, parse_request
from homeserver.sync.sliding_rooms import LiveTimeline, SlidingRooms, live_text
from homeserver.sync.woken import RecentEvents
from tests.e2ee.conftest import device  # noqa: F401 - fixture
from tests.rooms.conftest import V3, create_room, send
from tests.sync.conftest import metric
from tests.sync.test_sliding_sync import join, lists_made, room_list, slide, without_ages
from tests.sync.test_waiting import wait_until
from tests.sync.test_woken import Room, decoded, stored


class _LongPoll:
    """One long-poll on its own thread; `body` once answered."""

    def __init__(self, client, request: dict, pos: str):
        self.body: dict = {}
        self._thread = threading.Thread(
            target=lambda: self.body.update(slide(client, request, pos=pos, timeout=20_000))
        )
        self._thread.start()

    def answered(self) -> dict:
        self._thread.join(20)
        assert not self._thread.is_alive()
        return self.body


def _timeline(body: dict, room_id: str) -> list[str]:
    return [e["event_id"] for e in body["rooms"][room_id]["timeline"]]


def test_a_woken_connection_parks_again_on_its_held_registration(server, user):
    alice, bob = user("alice"), user("bob")
    room = create_room(bob, preset="public_chat", name="shared")
    join(alice, room)
    request = {"lists": {"all": room_list([[0, 9]])}, "conn_id": "held"}
    first = slide(alice, request)
    poll = _LongPoll(alice, request, first["pos"])
    wait_until(lambda: metric(server, "weir_sync_waiters") == 1)
    send(bob, room, "one")
    woken = poll.answered()
    assert [e["content"]["body"] for e in woken["rooms"][room]["timeline"]] == ["one"]
    made = lists_made(server)
    assert metric(server, "weir_sync_waiters") == 0  # held, but no request waits on it
    poll = _LongPoll(alice, request, woken["pos"])
    wait_until(lambda: metric(server, "weir_sync_waiters") == 1)
    assert lists_made(server) == made  # parked with no computation
    second = send(bob, room, "two")
    again = poll.answered()
    assert _timeline(again, room) == [second]
    assert lists_made(server)["kept"] == made["kept"] + 1  # woken: one computation
    # A message between an answer and the next request: that request answers at once.
    third = send(bob, room, "three")
    at_once = slide(alice, request, pos=again["pos"], timeout=20_000)
    assert _timeline(at_once, room) == [third]
    # Another request with a held pos computes: here, a longer timeline sends it whole.
    poll = _LongPoll(alice, request, at_once["pos"])
    wait_until(lambda: metric(server, "weir_sync_waiters") == 1)
    send(bob, room, "four")
    longer = {"lists": {"all": room_list([[0, 9]], timeline_limit=3)}, "conn_id": "held"}
    whole = slide(alice, longer, pos=poll.answered()["pos"])
    assert whole["rooms"][room]["initial"] is True and len(whole["rooms"][room]["timeline"]) == 3


def test_a_connection_with_to_device_and_e2ee_parks_again_on_its_held_registration(
    server,
    device,  # noqa: F811 - the fixture
):
    """As Element X asks: the next long-poll, its to-device `since` the woken answer's
    `next_batch`, parks with no computation; a to-device message then wakes it, and the one
    after it, acknowledging that message, never gets it again."""
    alice, bob = device("alice"), device("bob")
    room = create_room(bob.client, preset="public_chat", name="e2ee held")
    join(alice.client, room)
    request = {
        "lists": {"all": room_list([[0, 9]])},
        "conn_id": "element-x",
        "extensions": {"to_device": {"enabled": True}, "e2ee": {"enabled": True}},
    }

    def next_poll(body: dict) -> _LongPoll:
        request["extensions"]["to_device"]["since"] = body["extensions"]["to_device"]["next_batch"]
        poll = _LongPoll(alice.client, request, body["pos"])
        wait_until(lambda: metric(server, "weir_sync_waiters") == 1)
        return poll

    poll = next_poll(slide(alice.client, request))
    send(bob.client, room, "one")
    woken = poll.answered()
    assert [e["content"]["body"] for e in woken["rooms"][room]["timeline"]] == ["one"]
    made = lists_made(server)
    poll = next_poll(woken)
    assert lists_made(server) == made  # parked with no computation
    r = bob.client.put(
        f"{V3}/sendToDevice/m.room_key_request/held1",
        json={"messages": {alice.user_id: {alice.device_id: {"hello": "alice"}}}},
    )
    assert r.status_code == 200, r.text
    sent = poll.answered()["extensions"]["to_device"]
    assert [e["content"] for e in sent["events"]] == [{"hello": "alice"}]
    poll = next_poll(poll.body)  # acknowledges it, and parks on the held registration
    assert lists_made(server)["kept"] == made["kept"] + 1  # the to-device wake alone
    send(bob.client, room, "two")
    again = poll.answered()
    assert again["extensions"]["to_device"]["events"] == []
    assert [e["content"]["body"] for e in again["rooms"][room]["timeline"]] == ["two"]


def test_to_device_messages_left_past_an_answer_hold_no_registration():
    """More to-device messages than one answer takes: the next request has the rest at
    once, so no registration is kept for it."""
    request = SlidingRequest("c", extensions=Extensions(to_device=True, to_device_since=3))
    whole = ExtensionsPart({}, False, 9, to_device_whole=True)
    assert sliding._next_request(request, whole) == SlidingRequest(
        "c", extensions=Extensions(to_device=True, to_device_since=9)
    )
    assert sliding._next_request(request, ExtensionsPart({}, True, 7, False)) is None
    plain = SlidingRequest("c")
    assert sliding._next_request(plain, ExtensionsPart({}, False, 0)) is plain


def test_a_woken_answer_without_extensions_is_a_whole_computations(server, user):
    """Asked for no extension, a woken answer reads no side stream; it is, room for room and
    token for token, what a request computing it whole answers."""
    alice, bob = user("alice"), user("bob")
    room = create_room(bob, preset="public_chat", name="plain")
    join(alice, room)
    request = {"lists": {"all": room_list([[0, 9]], timeline_limit=2)}}
    woken_conn, whole_conn = {**request, "conn_id": "woken"}, {**request, "conn_id": "whole"}
    start = slide(alice, woken_conn)
    whole_start = slide(alice, whole_conn)
    poll = _LongPoll(alice, woken_conn, start["pos"])
    wait_until(lambda: metric(server, "weir_sync_waiters") == 1)
    send(bob, room, "news")
    woken = poll.answered()
    whole = slide(alice, whole_conn, pos=whole_start["pos"])
    assert woken["extensions"] == whole["extensions"] == {}
    assert woken["pos"].split(".")[2] == whole["pos"].split(".")[2]  # the sync token
    assert without_ages(woken["rooms"]) == without_ages(whole["rooms"])


def _live(rooms: SlidingRooms, run: list, **rest) -> dict:
    return {
        "timeline": LiveTimeline(rooms._live_entry("!r", run), run),
        "required_state": [],
        "prev_batch": stream_token(run[0].stream_ordering - 1),
        "limited": False,
        "num_live": len(run),
        "membership": "join",
        "notification_count": 1,
        "highlight_count": 0,
        **rest,
    }


def test_a_live_result_is_encoded_once_and_as_its_whole_encoding_would_be():
    """Its start is shared by every connection the events wake; the text, its own ages and
    counts in it, is what encoding the result with its events formatted gives."""
    recent = RecentEvents()
    events = [stored(1, content={"body": "é \u2028"}, origin_server_ts=3), stored(2)]
    recent.add(events)
    rooms = SlidingRooms(None, None, None, None, recent)
    for run, rest in ((events[:1], {}), (events, {"bump_stamp": 2, "lists": ["all"]})):
        result = _live(rooms, run, **rest)
        assert live_text(result, 10) == encode(
            {**result, "timeline": result["timeline"].decoded(10)}
        )
    assert rooms._live_entry("!r", events) is rooms._live_entry("!r", events)
    # A whole answer of live results, encoded; with ages of 0 (sent in the future) to compare.
    future = [stored(3, origin_server_ts=10**15)]
    recent.add(future)
    result = _live(rooms, future, lists=["all"])
    answer = _body("1.2.s3", {"all": 1}, {"!r": result}, {})
    expected = {
        "pos": "1.2.s3",
        "lists": {"all": {"count": 1}},
        "rooms": {"!r": {**result, "timeline": result["timeline"].decoded(0)}},
        "extensions": {},
    }
    assert not isinstance(answer, dict) and answer.text == encode(expected)
    # Beside a result read whole, a live one is sent decoded, in the answer as a dict.
    mixed = _body("1.2.s3", {}, {"!r": _live(rooms, future), "!s": {"timeline": []}}, {})
    assert isinstance(mixed, dict) and mixed["rooms"]["!r"]["timeline"][0]["event_id"] == "$3"


def test_connections_woken_together_read_their_unread_counts_at_once(runtime):
    """As woken /syncs do (GatheredUnread): one read for the counts of all, each its own."""
    room = Room(runtime)
    carol = room._user("carol")
    runtime.rooms.update_membership(carol.user_id, room.room_id, carol.user_id, "join")
    before = room.send(room.bob, body="before")
    runtime.receipts.send(carol, room.room_id, "m.read", before)  # carol's count restarts
    sliding, users = runtime.sliding_sync, [room.alice, carol]
    request = parse_request({"lists": {"all": {"ranges": [[0, 9]], "timeline_limit": 1}}})
    positions = [sliding.begin(u, request, None, 0)["pos"] for u in users]
    waiting = [sliding.begin(u, request, p, 30_000) for u, p in zip(users, positions)]
    parked = [gevent.spawn(w.answer) for w in waiting]
    gathered = runtime.sync.woken.unread
    with gevent.Timeout(10):
        while runtime.notifier.parked() < 2:
            gevent.sleep(0.01)
    reads = gathered.reads.reads
    room.send(room.bob, body="after")
    answers = [decoded(g.get(timeout=10)) for g in parked]
    assert gathered.reads.reads == reads + 1
    counts = [a["rooms"][room.room_id]["notification_count"] for a in answers]
    assert counts == [2, 1]
    for user, pos, count in zip(users, positions, counts):
        whole = sliding.begin(user, request, pos, 0)  # from the same pos, read whole
        assert decoded(whole)["rooms"][room.room_id]["notification_count"] == count
