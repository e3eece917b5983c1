"""The notifier, tokens, typing and filters in-process."""

import contextlib
import gc

import gevent
import pytest
from gevent.event import Event

from homeserver.core.collector import CollectorHold
from homeserver.core.errors import MatrixError
from homeserver.core.requester import Requester
from homeserver.rooms.creation import CreateRoomRequest
from homeserver.sync.filters import parse_filter, project
from homeserver.sync.notifier import BURST_WAKES, Notifier
from homeserver.sync.tokens import SyncToken


class Members:
    """joined_users for the notifier, counting its reads."""

    def __init__(self, rooms: dict):
        self.rooms = rooms
        self.reads = 0

    def __call__(self, room_id):
        self.reads += 1
        return self.rooms.get(room_id, [])


def test_only_the_users_an_event_concerns_are_woken():
    members = Members({"!r": ["@a", "@b"]})
    notifier = Notifier(members)
    with (
        notifier.registered("@a") as a,
        notifier.registered("@a") as a2,
        notifier.registered("@c") as c,
    ):
        assert notifier.waiting() == 3
        notifier.notify_room("!r", also=["@x"])
        assert a.woken.is_set() and a2.woken.is_set() and not c.woken.is_set()
        notifier.notify_users(["@c"])
        assert c.woken.is_set()
    assert notifier.waiting() == 0
    # Nobody waiting: a room notification reads nothing.
    reads = members.reads
    notifier.notify_room("!r")
    assert members.reads == reads


def test_a_presence_change_wakes_only_the_syncs_that_carry_presence():
    """A sliding sync carries no presence: a room's presence changes leave it parked."""
    notifier = Notifier(Members({}))
    with (
        notifier.registered("@a") as sync,
        notifier.registered("@a", presence=False) as sliding,
    ):
        notifier.notify_presence(["@a"])
        assert sync.woken.is_set() and sync.recompute and not sliding.woken.is_set()
        notifier.notify_users(["@a"])  # anything else wakes it
        assert sliding.woken.is_set() and sliding.recompute


def test_registration_is_removed_when_the_waiting_greenlet_is_killed():
    notifier = Notifier(Members({}))
    parked = Event()

    def waiter():
        with notifier.registered("@a") as registration:
            parked.set()
            registration.woken.wait()

    greenlet = gevent.spawn(waiter)
    parked.wait()
    assert notifier.waiting() == 1
    greenlet.kill(gevent.GreenletExit)
    assert notifier.waiting() == 0 and notifier._waiting == {}


def test_close_wakes_everyone_and_later_registrations_at_once():
    notifier = Notifier(Members({}))
    with notifier.registered("@a") as a:
        notifier.close()
        assert a.woken.is_set() and a.recompute
    with notifier.registered("@b") as b:
        assert b.woken.is_set() and b.recompute


def test_only_new_room_events_leave_a_woken_sync_free_to_answer_from_them():
    notifier = Notifier(Members({"!r": ["@a"]}))
    with notifier.registered("@a") as a:
        notifier.notify_room("!r", recompute=False)  # what the persist listener does
        assert a.woken.is_set() and not a.recompute
        notifier.notify_room("!r")  # a receipt or typing
        assert a.recompute
        a.clear()
        assert not a.woken.is_set() and not a.recompute
        notifier.notify_users(["@a"])
        assert a.woken.is_set() and a.recompute


def test_a_burst_of_wake_ups_holds_the_collector_until_each_is_taken():
    members = [f"@u{i}" for i in range(BURST_WAKES)]
    collector = CollectorHold()
    notifier = Notifier(Members({"!big": members, "!small": members[:3]}), collector)
    with contextlib.ExitStack() as stack:
        waiters = [stack.enter_context(notifier.registered(user)) for user in members]
        notifier.notify_room("!small")  # three woken: no hold
        assert gc.isenabled() and not collector.held()
        for waiter in waiters[:3]:
            waiter.clear()
        notifier.notify_room("!big")
        assert not gc.isenabled() and notifier.bursts == 1
        for waiter in waiters[:-1]:
            waiter.clear()  # each woken sync, as it computes
        assert not gc.isenabled()
    # The last one gave up its registration instead (a hang-up): the burst is over.
    assert gc.isenabled() and not collector.held()


def test_a_burst_that_is_never_taken_ends_at_its_time():
    collector = CollectorHold(max_seconds=0.05)
    burst = collector.begin(5)
    assert not gc.isenabled()
    with gevent.Timeout(5):
        while collector.held():
            gevent.sleep(0.01)
    assert gc.isenabled()
    burst.done()  # late: harmless
    assert gc.isenabled()


def test_a_collector_turned_off_before_a_burst_stays_off():
    collector = CollectorHold()
    gc.disable()
    try:
        burst = collector.begin(1)
        burst.done()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_sync_tokens_round_trip_and_refuse_garbage():
    token = SyncToken(12, 3, 4, 5, "0a1b2c3d", 6, 7, 8)
    assert str(token) == "s12_3_4_5_0a1b2c3d_6_7_8"
    assert SyncToken.parse(str(token)) == token
    # A token from before the to-device, device-list and presence parts reads them as 0.
    assert SyncToken.parse("s12_3_4_5_0a1b2c3d") == SyncToken(12, 3, 4, 5, "0a1b2c3d", 0, 0)
    assert SyncToken.parse("s12_3_4_5_0a1b2c3d_6_7") == SyncToken(12, 3, 4, 5, "0a1b2c3d", 6, 7, 0)
    assert token.typing_since("0a1b2c3d") == 5 and token.typing_since("ffffffff") == 0
    for bad in ("", "s12", "s1_2_3_4", "s1_2_3_4_XYZ", "x1_2_3_4_0a1b2c3d", "s1_2_3_4_0a1b2c3d_5"):
        with pytest.raises(MatrixError):
            SyncToken.parse(bad)


def test_filters_parse_and_match_types_with_wildcards():
    sync_filter = parse_filter(
        {
            "room": {
                "timeline": {"limit": 500, "types": ["m.room.*"], "not_types": ["m.room.name"]},
                "state": {"lazy_load_members": True},
                "not_rooms": ["!x"],
            },
            "account_data": {"not_types": ["*.secret"]},
        }
    )
    timeline = sync_filter.room.timeline
    assert sync_filter.room.timeline_limit == 250  # capped
    assert timeline.keeps_type("m.room.message") and not timeline.keeps_type("m.room.name")
    assert not timeline.keeps_type("org.example")
    assert sync_filter.room.state.lazy_load_members
    assert not sync_filter.room.keeps_room("!x") and sync_filter.room.keeps_room("!y")
    assert not sync_filter.account_data.keeps_type("my.secret")
    # `*` is the only special character.
    assert parse_filter({"room": {"timeline": {"types": ["a.b"]}}}).room.timeline.keeps_type("a.b")
    assert not parse_filter({"room": {"timeline": {"types": ["a.b"]}}}).room.timeline.keeps_type(
        "aXb"
    )


def test_event_fields_keep_only_the_named_paths():
    event = {"type": "t", "content": {"body": "b", "m.x": {"y": 1}, "other": 2}, "sender": "@s"}
    assert project(event, ("type", "content.body", "content.m\\.x.y", "missing.path")) == {
        "type": "t",
        "content": {"body": "b", "m.x": {"y": 1}},
    }


def test_an_event_stored_while_a_sync_computes_still_wakes_it(runtime):
    """The lost wake-up race: the sync registers before it reads anything, so an event
    stored between its (empty) computation and its parking sets its Event."""
    alice = runtime.accounts.register("alice", "pw")
    requester = Requester(alice.user_id, alice.device_id, False, "")
    room_id = runtime.room_creator.create(alice.user_id, CreateRoomRequest())
    since = runtime.sync.sync(requester, None, 0, False, None)["next_batch"]

    computing = Event()
    original = runtime.sync._respond

    def respond_then_send(request):
        result = original(request)
        if not computing.is_set():
            computing.set()  # the first, empty computation is done; parking comes next
            runtime.rooms.send_message(requester, room_id, "m.room.message", {"body": "x"}, "race")
        return result

    runtime.sync._respond = respond_then_send
    body = gevent.spawn(runtime.sync.sync, requester, since, 30_000, False, None).get(timeout=10)
    assert [e["content"] for e in body["rooms"]["join"][room_id]["timeline"]["events"]] == [
        {"body": "x"}
    ]


def test_typing_expires_and_wakes_the_room(runtime):
    alice = runtime.accounts.register("alice", "pw")
    requester = Requester(alice.user_id, alice.device_id, False, "")
    room_id = runtime.room_creator.create(alice.user_id, CreateRoomRequest())
    typing = runtime.typing
    typing.set_typing(requester, room_id, alice.user_id, True, 50)
    assert typing.changes([room_id], 0) == {room_id: [alice.user_id]}
    after_start = typing.position
    with runtime.notifier.registered(alice.user_id) as waiter:
        assert (
            waiter.woken.wait(10) and waiter.recompute
        )  # the expiry after 50 ms changed the room's list
    assert typing.changes([room_id], after_start) == {room_id: []}
    # Refreshing while typing is not a change; stopping twice is one change.
    typing.set_typing(requester, room_id, alice.user_id, True, 30_000)
    position = typing.position
    typing.set_typing(requester, room_id, alice.user_id, True, 30_000)
    assert typing.changes([room_id], position) == {}
    typing.set_typing(requester, room_id, alice.user_id, False, None)
    assert typing.changes([room_id], position) == {room_id: []}
    position = typing.position
    typing.set_typing(requester, room_id, alice.user_id, False, None)
    assert typing.changes([room_id], position) == {}
