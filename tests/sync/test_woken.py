"""A woken sync answers from the recent events that woke it (homeserver/sync/woken.py) only
where that answer is the one the whole computation gives, and computes it otherwise."""

import json

import gevent
import pytest
from gevent.event import Event

from homeserver.core.events import Event as Pdu
from homeserver.core.json_text import EncodedJson
from homeserver.core.requester import Requester
from homeserver.rooms.creation import CreateRoomRequest
from homeserver.storage.rooms import StoredEvent
from homeserver.sync import woken
from homeserver.sync.filters import SyncFilter
from homeserver.sync.tokens import SyncToken
from homeserver.sync.woken import RecentEvents, Seen, WokenAnswers


class Room:
    """alice and bob in one room, and a second room alice is in alone."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.alice = self._user("alice")
        self.bob = self._user("bob")
        self.room_id = runtime.room_creator.create(
            self.bob.user_id, CreateRoomRequest(preset="public_chat")
        )
        rooms = runtime.rooms
        rooms.update_membership(self.alice.user_id, self.room_id, self.alice.user_id, "join")
        self.other_room = runtime.room_creator.create(self.alice.user_id, CreateRoomRequest())
        self.txn = 0

    def _user(self, name: str) -> Requester:
        account = self.runtime.accounts.register(name, "pw")
        return Requester(account.user_id, account.device_id, False, "")

    def send(self, sender: Requester, room_id: str | None = None, body: str = "hi") -> str:
        self.txn += 1
        return self.runtime.rooms.send_message(
            sender, room_id or self.room_id, "m.room.message", {"body": body}, f"t{self.txn}"
        )

    def wakes(self) -> dict:
        counter = self.runtime.metrics.sync_wakes
        return {k: counter.labels(k)._value.get() for k in ("recent_events", "database")}

    def parked_answer(self, act, sync_filter: str | None = None) -> tuple[dict, dict, dict]:
        """(the answer of alice's sync parked before `act()`, the whole computation's answer
        for the same token, the wake-ups counted meanwhile)."""
        sync = self.runtime.sync
        since = sync.sync(self.alice, None, 0, False, sync_filter)["next_batch"]
        computed = Event()
        original = sync._respond

        def respond(request):
            result = original(request)
            computed.set()
            return result

        sync._respond = respond
        before = self.wakes()
        parked = gevent.spawn(sync.sync, self.alice, since, 30_000, False, sync_filter)
        computed.wait(10)  # the first computation found nothing: it parks next
        gevent.sleep(0)
        act()
        answer = decoded(parked.get(timeout=10))
        sync._respond = original
        after = self.wakes()
        whole = sync.sync(self.alice, since, 0, False, sync_filter)
        return answer, whole, {k: after[k] - before[k] for k in after}


def decoded(body: dict | EncodedJson) -> dict:
    """A woken sync's answer is encoded already when it comes from the recent events."""
    return json.loads(body.text) if isinstance(body, EncodedJson) else body


def without_age(body: dict) -> dict:
    for section in body["rooms"]["join"].values():
        for event in section["timeline"]["events"] + section["state"]["events"]:
            event.get("unsigned", {}).pop("age", None)
    return body


@pytest.mark.parametrize(
    "sync_filter",
    [
        None,
        json.dumps({"event_format": "federation"}),
        json.dumps({"event_fields": ["type", "content.body", "sender"]}),
        json.dumps({"event_format": "federation", "event_fields": ["type", "content.body"]}),
        json.dumps({"room": {"timeline": {"limit": 3}}}),
        # Element's: the senders' member events and the user's own, read for the answer.
        json.dumps({"room": {"state": {"lazy_load_members": True}}}),
    ],
)
def test_a_message_is_answered_from_recent_events_as_the_database_would(runtime, sync_filter):
    room = Room(runtime)
    answer, whole, wakes = room.parked_answer(lambda: room.send(room.bob), sync_filter)
    assert wakes == {"recent_events": 1, "database": 0}
    assert list(answer["rooms"]["join"]) == [room.room_id]
    assert without_age(answer) == without_age(whole)
    assert SyncToken.parse(answer["next_batch"]).events == runtime.room_store.stream_position()
    if sync_filter and "lazy_load_members" in sync_filter:
        state = answer["rooms"]["join"][room.room_id]["state"]["events"]
        assert {e["state_key"] for e in state} == {room.alice.user_id, room.bob.user_id}


def test_a_message_in_a_room_the_filter_leaves_out_keeps_the_sync_parked(runtime):
    room = Room(runtime)
    only_first = json.dumps({"room": {"rooms": [room.room_id]}})

    def act():
        before = room.wakes()["recent_events"]
        room.send(room.alice, room.other_room)  # left out by the filter: nothing to answer
        with gevent.Timeout(10):
            while room.wakes()["recent_events"] == before:  # it woke, and parked again
                gevent.sleep(0.001)
        room.send(room.bob)

    answer, whole, wakes = room.parked_answer(act, only_first)
    # alice's own message elsewhere is skipped (a room the filter leaves out), bob's answered.
    assert wakes == {"recent_events": 2, "database": 0}
    assert [
        e["content"]["body"] for e in answer["rooms"]["join"][room.room_id]["timeline"]["events"]
    ] == ["hi"]
    assert without_age(answer) == without_age(whole)


@pytest.mark.parametrize(
    "case",
    ["topic", "someone joins", "filter hides types"],
)
def test_what_recent_events_cannot_answer_is_computed_whole(runtime, case):
    room = Room(runtime)
    sync_filter = None
    act = lambda: room.send(room.bob)  # noqa: E731
    if case == "topic":
        act = lambda: runtime.rooms.set_state(  # noqa: E731
            room.bob, room.room_id, "m.room.topic", "", {"topic": "new"}
        )
    elif case == "someone joins":
        carol = room._user("carol")
        act = lambda: runtime.rooms.update_membership(  # noqa: E731
            carol.user_id, room.room_id, carol.user_id, "join"
        )
    else:
        sync_filter = json.dumps({"room": {"timeline": {"not_types": ["m.room.topic"]}}})
    answer, whole, wakes = room.parked_answer(act, sync_filter)
    assert wakes["recent_events"] == 0
    assert without_age(answer) == without_age(whole)
    assert answer["rooms"]["join"][room.room_id]["timeline"]["events"]


@pytest.mark.parametrize(
    "sync_filter", [None, json.dumps({"event_fields": ["type", "unsigned", "content.body"]})]
)
def test_the_users_own_message_is_answered_from_recent_events_with_its_transaction_id(
    runtime, sync_filter
):
    """Only the device that sent it is given its transaction ID; the user's other device
    gets the message without one."""
    room = Room(runtime)
    answer, whole, wakes = room.parked_answer(
        lambda: room.send(room.alice, body="hers"), sync_filter
    )
    assert wakes == {"recent_events": 1, "database": 0}
    assert without_age(answer) == without_age(whole)
    events = answer["rooms"]["join"][room.room_id]["timeline"]["events"]
    assert [e["unsigned"].get("transaction_id") for e in events] == [f"t{room.txn}"]
    first = room.alice
    other = runtime.accounts.login_as(first.user_id, None, None)
    room.alice = Requester(first.user_id, other.device_id, False, "")  # who syncs
    answer, whole, wakes = room.parked_answer(lambda: room.send(first, body="from the first"))
    assert wakes == {"recent_events": 1, "database": 0}
    assert without_age(answer) == without_age(whole)
    events = answer["rooms"]["join"][room.room_id]["timeline"]["events"]
    assert [e["content"]["body"] for e in events] == ["from the first"]
    assert "transaction_id" not in events[0]["unsigned"]


# --- the parts, without a server ----------------------------------------------------------


def stored(position: int, room_id="!r", sender="@b", event_type="m.room.message", **extra):
    pdu = {"type": event_type, "room_id": room_id, "sender": sender, "content": {}}
    pdu.update({"origin_server_ts": 1, **extra})
    return StoredEvent(Pdu(f"${position}", pdu), position)


def test_recent_events_give_a_gapless_run_or_nothing():
    recent = RecentEvents(capacity=4)
    recent.add([stored(1), stored(2)])
    recent.add([stored(4)])  # 3 not heard of (a remote invite, or a skipped listener)
    assert [s.stream_ordering for s in recent.after(0) or []] == [] and recent.after(0) is None
    assert [s.stream_ordering for s in recent.after(3) or []] == [4]
    assert recent.after(4) == [] and recent.after(9) == []
    recent.add([stored(5), stored(6)])  # over capacity: 1 and 2 are forgotten
    assert recent.after(2) is None and recent.after(3) is not None
    # A redaction forgets its target, whichever room version's place names it.
    recent.add([stored(7, event_type="m.room.redaction", redacts="$5")])
    recent.add([stored(8, event_type="m.room.redaction", content={"redacts": "$6"})])
    assert recent.after(3) is None and recent.after(4) is None and recent.after(6) is not None


def answer_for(run: list, joined=("!r",), limit=10, recent=None, now=1):
    recent = recent or RecentEvents()
    recent.add(run)
    seen = Seen(SyncToken(0, 0, 0, 0, "e"), 0, frozenset(joined), frozenset(joined))
    sync_filter = SyncFilter()
    if limit != 10:
        from homeserver.sync.filters import RoomEventFilter, RoomFilter

        sync_filter = SyncFilter(room=RoomFilter(timeline=RoomEventFilter(limit=limit)))
    requester = Requester("@a", "D", False, "")

    def no_lazy_members(*args):  # these filters load no members
        raise AssertionError("lazy members asked for")

    return WokenAnswers(recent, None, no_lazy_members).answer(requester, sync_filter, seen, now)


def test_soft_failed_events_and_rooms_not_joined_are_not_answered():
    hidden = StoredEvent(stored(1).event, 1, soft_failed=True)
    found = answer_for([hidden, stored(2, room_id="!elsewhere")])
    assert found is not None and found[0] is None and found[1].events == 2
    found = answer_for([hidden, stored(2)])
    assert found is not None and found[0] is not None
    events = decoded(found[0])["rooms"]["join"]["!r"]["timeline"]["events"]
    assert [e["event_id"] for e in events] == ["$2"]


def test_an_event_is_encoded_once_for_every_sync_it_wakes(monkeypatch):
    formatted = []
    original = woken.client_event_fields
    monkeypatch.setattr(woken, "client_event_fields", lambda s: formatted.append(s) or original(s))
    recent = RecentEvents()
    recent.add([stored(1, content={"body": "hi"})])
    answers = [
        decoded(answer_for([], recent=recent, now=now)[0])["rooms"]["join"]["!r"] for now in (5, 9)
    ]
    assert len(formatted) == 1
    events = [a["timeline"]["events"] for a in answers]
    # Each reader's own age, and everything else alike.
    assert [e[0]["unsigned"] for e in events] == [
        {"age": 4, "membership": "join"},
        {"age": 8, "membership": "join"},
    ]
    assert events[0][0] == {
        "event_id": "$1",
        "type": "m.room.message",
        "content": {"body": "hi"},
        "sender": "@b",
        "origin_server_ts": 1,
        "unsigned": {"age": 4, "membership": "join"},
    }
    # A redaction forgets its target's encoding with the target itself.
    recent.add([stored(2, event_type="m.room.redaction", redacts="$1")])
    assert recent.after(0) is None
    assert recent.client_json(stored(1, content={"body": "hi"}), 5) and len(formatted) == 2


def test_a_room_entry_is_encoded_once_for_every_sync_woken_by_the_same_events(monkeypatch):
    entries = []
    original = woken._entry_text
    monkeypatch.setattr(woken, "_entry_text", lambda *a: entries.append(a) or original(*a))
    recent = RecentEvents()
    recent.add([stored(1, origin_server_ts=1), stored(2, origin_server_ts=3)])
    answers = WokenAnswers(recent, None, lambda *args: [])
    seen = Seen(SyncToken(0, 0, 0, 0, "e"), 0, frozenset({"!r"}), frozenset({"!r"}))
    found = [
        answers.answer(Requester(user_id, "D", False, ""), SyncFilter(), seen, now)
        for user_id, now in (("@a", 10), ("@c", 20))
    ]
    assert len(entries) == 1
    timelines = [decoded(f[0])["rooms"]["join"]["!r"]["timeline"] for f in found if f and f[0]]
    # Each answer's own ages, in the shared text.
    assert [[e["unsigned"]["age"] for e in t["events"]] for t in timelines] == [[9, 7], [19, 17]]
    assert [[e["event_id"] for e in t["events"]] for t in timelines] == [["$1", "$2"]] * 2
    # Another run of events in the room is another entry.
    recent.add([stored(3)])
    answers.answer(Requester("@a", "D", False, ""), SyncFilter(), seen, 30)
    assert len(entries) == 2


def test_more_new_events_than_the_timeline_limit_are_computed_whole():
    assert answer_for([stored(1), stored(2)], limit=1) is None
    assert answer_for([stored(1), stored(2)], limit=2) is not None


def test_key_counts_are_read_again_only_after_a_key_write(runtime):
    room = Room(runtime)
    store = runtime.e2ee_store
    reads = []
    key_counts_of = store.key_counts_of
    store.key_counts_of = lambda devices: reads.append(devices) or key_counts_of(devices)

    answer, _, wakes = room.parked_answer(lambda: room.send(room.bob))
    assert wakes["recent_events"] == 1 and reads == []  # the parked computation's counts
    assert answer["device_one_time_keys_count"] == {"signed_curve25519": 0}

    def upload_then_send():
        # An upload wakes nobody; the woken answer must not repeat the counts from before it.
        keys = [
            ("signed_curve25519", "AAAA", {"key": "k1"}),
            ("signed_curve25519", "AAAB", {"key": "k2"}),
        ]
        store.add_one_time_keys(room.alice.user_id, room.alice.device_id, keys)
        room.send(room.bob)

    answer, whole, wakes = room.parked_answer(upload_then_send)
    assert wakes["recent_events"] == 1 and len(reads) == 1
    assert answer["device_one_time_keys_count"] == {"signed_curve25519": 2}
    assert without_age(answer) == without_age(whole)

    store.keys_written_elsewhere = True  # federation shards claim keys in other processes
    answer, _, wakes = room.parked_answer(lambda: room.send(room.bob))
    assert wakes["recent_events"] == 1 and len(reads) == 2


def test_syncs_woken_together_read_their_unread_and_key_counts_at_once(runtime):
    room = Room(runtime)
    carol = room._user("carol")
    runtime.rooms.update_membership(carol.user_id, room.room_id, carol.user_id, "join")
    sync, users = runtime.sync, [room.alice, carol]
    before = room.send(room.bob, body="before")
    # carol read it: her count starts again, alice's does not.
    runtime.receipts.send(carol, room.room_id, "m.read", before)
    since = [sync.sync(u, None, 0, False, None)["next_batch"] for u in users]
    gathered = sync.woken.unread
    # As with other instances or shards on the database: key counts read at every wake-up.
    runtime.e2ee_store.keys_written_elsewhere = True
    key_reads = sync.e2ee._woken_counts.reads
    parked = [gevent.spawn(sync.sync, u, s, 30_000, False, None) for u, s in zip(users, since)]
    with gevent.Timeout(10):
        while runtime.notifier.waiting() < 2:
            gevent.sleep(0.01)
    reads = gathered.reads.reads
    room.send(room.bob, body="after")
    answers = [decoded(g.get(timeout=10)) for g in parked]
    assert gathered.reads.reads == reads + 1
    assert sync.e2ee._woken_counts.reads == key_reads + 1
    assert [a["device_one_time_keys_count"] for a in answers] == [{"signed_curve25519": 0}] * 2
    found = [a["rooms"]["join"][room.room_id]["unread_notifications"] for a in answers]
    assert [c["notification_count"] for c in found] == [2, 1]
    for user, since_token, count in zip(users, since, found):
        whole = sync.sync(user, since_token, 0, False, None)
        assert whole["rooms"]["join"][room.room_id]["unread_notifications"] == count


def test_the_next_long_poll_parks_on_the_registration_its_answer_kept(runtime):
    """The client's next long-poll, with the answer's next_batch, parks on the registration
    that answer kept (sync/held_registrations.py) without computing, and answers the next
    message from recent events; so does one woken meanwhile, at once; one asking with
    another filter computes. Everyone one message woke has the same token: each takes
    only their own."""
    room = Room(runtime)
    sync = runtime.sync
    answer, _, _ = room.parked_answer(lambda: room.send(room.bob, body="one"))
    computed = []
    original = sync._respond
    sync._respond = lambda request: computed.append(1) or original(request)  # type: ignore

    def long_poll(since: str, sync_filter: str | None = None, who=room.alice):
        return gevent.spawn(sync.sync, who, since, 30_000, False, sync_filter)

    def until(done) -> None:
        with gevent.Timeout(10):
            while not done():
                gevent.sleep(0.001)

    def bodies(body: dict) -> list[str]:
        events = body["rooms"]["join"][room.room_id]["timeline"]["events"]
        return [e["content"]["body"] for e in events]

    taken = sync.held.taken
    bobs = long_poll(answer["next_batch"], who=room.bob)  # not his: he computes
    until(lambda: computed == [1])
    parked = long_poll(answer["next_batch"])
    until(lambda: sync.held.taken == taken + 1)
    bobs.kill()
    before = room.wakes()
    room.send(room.bob, body="two")
    second = decoded(parked.get(timeout=10))
    assert bodies(second) == ["two"] and computed == [1]
    assert room.wakes()["recent_events"] == before["recent_events"] + 1
    # A message before the next request wakes the kept registration: that request goes on
    # from the wake as a parked sync would, answered from recent events, not computed.
    before = room.wakes()
    room.send(room.bob, body="three")
    third = decoded(long_poll(second["next_batch"]).get(timeout=10))
    assert bodies(third) == ["three"] and computed == [1]
    assert room.wakes()["recent_events"] == before["recent_events"] + 1
    assert sync.held.taken == taken + 1  # counts parks with no computation only
    # Another filter than the one answered computes, and parks.
    parked = long_poll(third["next_batch"], json.dumps({"room": {"timeline": {"limit": 5}}}))
    until(lambda: len(computed) == 2)
    assert sync.held.taken == taken + 1
    parked.kill()
    sync._respond = original
