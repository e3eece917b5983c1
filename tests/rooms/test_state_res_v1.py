"""State resolution v1 (rooms/state_res_v1.py), from the room version 1 spec's algorithm and
Synapse's reading of it. Each scenario builds a small room in memory with room version 1's
event shape (IDs `$name:a` carried in the PDU, prev and auth events as [id, hashes] pairs),
forks it, and resolves the states at the fork tips; every expected answer is worked out by
hand in a comment. Where v2 answers differently, its answer is asserted too (under room
version 2, whose auth rules are the same), so these tests fail against the v2 code."""

from __future__ import annotations

import hashlib

from homeserver.core.events import Event
from homeserver.rooms.auth import select_auth_events
from homeserver.rooms.state_res import auth_chain_from_lookup, resolve_state
from homeserver.rooms.state_res_v1 import ordered, resolve_state_v1, split_conflicted_v1
from homeserver.rooms.versions import ROOM_V1, ROOM_V2

ALICE, BOB, EVELYN = "@alice:a", "@bob:b", "@evelyn:e"
PL, JR, MEMBER, TOPIC = "m.room.power_levels", "m.room.join_rules", "m.room.member", "m.room.topic"
ROOM = "!room:a"
HASHES = {"sha256": "aGFzaA"}

# (name, sender, type, state_key, content): the trunk every room starts with, linear. Alice
# alone has power (100); Bob is in the room with the default 0; Evelyn is not in it.
INITIAL = [
    ("CREATE", ALICE, "m.room.create", "", {"creator": ALICE}),
    ("IMA", ALICE, MEMBER, ALICE, {"membership": "join"}),
    ("IPOWER", ALICE, PL, "", {"users": {ALICE: 100}}),
    ("IJR", ALICE, JR, "", {"join_rule": "public"}),
    ("IMB", BOB, MEMBER, BOB, {"membership": "join"}),
    ("START", BOB, "m.room.message", None, {"body": "start"}),
]


def eid(name: str) -> str:
    return f"${name}:a"


def sha1(name: str) -> str:
    return hashlib.sha1(eid(name).encode()).hexdigest()


class Room:
    """Room version 1 events, built one after another: each follows one event (so the state
    before it is that event's state after, unresolved), with origin_server_ts in build
    order and its auth events selected from that state."""

    def __init__(self) -> None:
        self.events: dict[str, Event] = {}
        self.state_after: dict[str, dict] = {}
        self.rejected: set[str] = set()
        self.chain(None, *INITIAL)

    def get(self, event_id: str) -> Event | None:
        return self.events.get(event_id)

    def chain(self, after: str | None, *specs: tuple) -> str:
        """Builds `specs` one after another following `after`; the last one's name."""
        for name, sender, event_type, state_key, content in specs:
            self._build(name, sender, event_type, state_key, content, after)
            after = name
        assert after is not None
        return after

    def _build(self, name, sender, event_type, state_key, content, after) -> None:
        before = self.state_after[eid(after)] if after else {}
        state = {k: self.events[v] for k, v in before.items()}
        auth = select_auth_events(ROOM_V1, event_type, sender, state_key, content, state)
        pdu: dict = {
            "event_id": eid(name),
            "room_id": ROOM,
            "type": event_type,
            "sender": sender,
            "content": content,
            "prev_events": [[eid(after), HASHES]] if after else [],
            "auth_events": [[a.event_id, HASHES] for a in auth],
            "origin_server_ts": len(self.events),
            "depth": self.events[eid(after)].depth + 1 if after else 1,
        }
        if state_key is not None:
            pdu["state_key"] = state_key
        self.events[eid(name)] = Event(eid(name), pdu)
        after_state = dict(before)
        if state_key is not None:
            after_state[(event_type, state_key)] = eid(name)
        self.state_after[eid(name)] = after_state

    def v1(self, *tips: str) -> dict:
        """The v1 resolution of the states after `tips`, directly and through
        `resolve_state`'s dispatch (which must agree)."""
        sets = [self.state_after[eid(t)] for t in tips]
        rejected = self.rejected.__contains__
        resolved = resolve_state_v1(ROOM_V1, sets, self.get, rejected)
        chain = auth_chain_from_lookup(self.get)
        assert resolve_state(ROOM_V1, sets, self.get, chain, rejected) == resolved
        return resolved

    def v2(self, *tips: str) -> dict:
        sets = [self.state_after[eid(t)] for t in tips]
        return resolve_state(ROOM_V2, sets, self.get, auth_chain_from_lookup(self.get))

    def expect(self, *names: str, without: tuple = ()) -> dict:
        """The state after START with the named events' keys set to them."""
        expected = dict(self.state_after[eid("START")])
        for name in names:
            event = self.events[eid(name)]
            expected[(event.type, event.state_key)] = event.event_id
        for key in without:
            expected.pop(key, None)
        return expected


def levels(name, users, **extra):
    return (name, ALICE, PL, "", {"users": users, **extra})


def topic(name, sender):
    return (name, sender, TOPIC, "", {"topic": name})


def message(name, sender=ALICE):
    return (name, sender, "m.room.message", None, {"body": name})


# --- the event shape and the split --------------------------------------------------------


def test_v1_events_name_their_prev_and_auth_events_by_id():
    room = Room()
    event = room.events[eid("IMB")]
    assert event.pdu["prev_events"] == [[eid("IJR"), HASHES]]
    assert event.prev_event_ids == [eid("IJR")]
    assert sorted(event.auth_event_ids) == sorted(
        [eid("CREATE"), eid("IPOWER"), eid("IJR")]
    )  # Bob's own member event is not there yet


def test_unconflicted_keys_are_kept_unchecked():
    """A key every set gives one event, or that only some sets have, is not a conflict: it
    is R's start, kept as it is, even when the lookup knows none of its events."""
    a, b, c = ("a", ""), ("b", ""), ("c", "")
    sets = [{a: "$x:s", b: "$y:s"}, {a: "$x:s", c: "$z:s"}, {a: "$x:s"}]
    assert split_conflicted_v1(sets) == ({a: "$x:s", b: "$y:s", c: "$z:s"}, {})
    assert resolve_state_v1(ROOM_V1, sets, lambda e: None) == {a: "$x:s", b: "$y:s", c: "$z:s"}
    # Three values of one key: all three conflict.
    sets = [{a: "$x:s"}, {a: "$y:s"}, {a: "$z:s"}]
    assert split_conflicted_v1(sets) == ({}, {a: {"$x:s", "$y:s", "$z:s"}})
    assert resolve_state_v1(ROOM_V1, [], lambda e: None) == {}


def test_a_topic_only_one_fork_has_survives_its_senders_demotion():
    """Bob (50) sets the topic on one fork while Alice demotes him to 0 on the other. v1:
    the topic key is in one set only, so it is unconflicted and kept unchecked; the power
    levels conflict walks P50 (depth 7) then PA (8), which Alice may send, so PA stands.
    v2 counts the key's absence as a conflict, checks Bob's topic against PA, and drops it."""
    room = Room()
    room.chain("START", levels("P50", {ALICE: 100, BOB: 50}))
    room.chain("P50", topic("TB", BOB))
    room.chain("P50", levels("PA", {ALICE: 100}))
    assert room.v1("TB", "PA") == room.expect("PA", "TB")
    assert room.v2("TB", "PA") == room.expect("PA")


# --- power levels ---------------------------------------------------------------------------


def test_power_levels_of_a_user_whose_power_the_other_fork_removed_lose():
    """Alice demotes Bob (PA, depth 8) while Bob, a moderator, gives Charlie 50 (PB, depth
    9, after a message). Walked oldest first: PA is taken unchecked, then PB is checked with
    PA in R, where Bob has 0 < 50 (state_default) for power levels: refused, so PA stands."""
    room = Room()
    room.chain("START", levels("P50", {ALICE: 100, BOB: 50}))
    room.chain("P50", levels("PA", {ALICE: 100}))
    room.chain("P50", message("M1", BOB), ("PB", BOB, PL, "", {"users": {
        ALICE: 100, BOB: 50, "@charlie:c": 50}}))  # fmt: skip
    assert room.v1("PA", "PB") == room.expect("PA")


def test_power_levels_of_a_user_who_kept_his_power_win_by_depth():
    """As above, but Alice's PA2 leaves Bob at 50 (it gives Zara 10): PB, checked with PA2
    in R, passes, so the walk ends on it, the deeper (newest) event."""
    room = Room()
    room.chain("START", levels("P50", {ALICE: 100, BOB: 50}))
    room.chain("P50", levels("PA2", {ALICE: 100, BOB: 50, "@zara:z": 10}))
    room.chain("P50", message("M1", BOB), ("PB", BOB, PL, "", {"users": {
        ALICE: 100, BOB: 50, "@charlie:c": 50}}))  # fmt: skip
    assert room.v1("PA2", "PB") == room.expect("PB")


def test_the_walk_stops_at_the_first_refused_event():
    """Three forks: Alice demotes Bob (PA, depth 8); Bob changes the levels (PB, 9); Alice
    gives Zara 10 (PC, 10, after two messages). Walked oldest first: PA unchecked, then PB
    refused (Bob has 0 in PA): the walk stops there, though PC would have passed: PA.
    v2 replays Alice's events first (more power), PA then PC, and refuses PB: PC."""
    room = Room()
    room.chain("START", levels("P50", {ALICE: 100, BOB: 50}))
    room.chain("P50", levels("PA", {ALICE: 100}))
    room.chain("P50", message("M1", BOB), ("PB", BOB, PL, "", {"users": {
        ALICE: 100, BOB: 50, "@charlie:c": 50}}))  # fmt: skip
    room.chain("P50", message("M2"), message("M3"), levels("PC", {ALICE: 100, "@zara:z": 10}))
    assert room.v1("PA", "PB", "PC") == room.expect("PA")
    assert room.v2("PA", "PB", "PC") == room.expect("PC")


# --- other state: depth, then SHA-1 ---------------------------------------------------------


def test_a_conflicted_topic_goes_to_the_lowest_sha1_at_equal_depth():
    """Alice sets T3 on one fork and then T1 on the other, both at depth 7; both pass, so
    the first in order wins: equal depth, then the lowest SHA-1 of the event ID, T3's.
    v2 orders by origin_server_ts instead and applies T1, sent later, last: T1."""
    assert sha1("T3") < sha1("T1")  # 04c3... < c879...
    room = Room()
    room.chain("START", topic("T3", ALICE))
    room.chain("START", topic("T1", ALICE))
    assert room.v1("T1", "T3") == room.expect("T3")
    assert room.v2("T1", "T3") == room.expect("T1")


def test_a_conflicted_topic_goes_to_the_deepest_before_sha1():
    """As above but T1 follows a message, at depth 8: depth comes first, so T1 wins despite
    its higher SHA-1."""
    room = Room()
    room.chain("START", topic("T3", ALICE))
    room.chain("START", message("M1"), topic("T1", ALICE))
    assert room.v1("T1", "T3") == room.expect("T1")


def test_when_no_topic_passes_the_last_in_order_wins():
    """Bob (50) sets T3 on one fork and T1 on the other, both at depth 8; the second fork
    then demotes him (PA, depth 9), which wins the power levels walk (P50 then PA). Neither
    topic passes with Bob at 0 < 50 in R, so the last in order wins: at equal depth the one
    with the higher SHA-1, T1. v2 applies neither and leaves the room with no topic."""
    room = Room()
    room.chain("START", levels("P50", {ALICE: 100, BOB: 50}))
    room.chain("P50", topic("T3", BOB))
    room.chain("P50", topic("T1", BOB), levels("PA", {ALICE: 100}))
    assert [e.event_id for e in ordered([room.events[eid("T1")], room.events[eid("T3")]])] == [
        eid("T3"),
        eid("T1"),
    ]
    assert room.v1("T3", "PA") == room.expect("PA", "T1")
    assert room.v2("T3", "PA") == room.expect("PA", without=((TOPIC, ""),))


# --- memberships and join rules ---------------------------------------------------------


def ban_and_join(raise_ban_level: bool) -> Room:
    """Alice makes Bob a moderator (PA, depth 7) and Bob bans Evelyn (BAN, 8) on one fork;
    Evelyn joins the public room (JOIN, 7) on the other, where Alice may then raise the
    ban level to 75 (PX, 8)."""
    room = Room()
    room.chain("START", levels("PA", {ALICE: 100, BOB: 50}), (
        "BAN", BOB, MEMBER, EVELYN, {"membership": "ban"}))  # fmt: skip
    joined = room.chain("START", ("JOIN", EVELYN, MEMBER, EVELYN, {"membership": "join"}))
    if raise_ban_level:
        room.chain(joined, levels("PX", {ALICE: 100}, ban=75))
    return room


def test_a_ban_beats_a_join_by_the_resolved_power_levels():
    """Power levels first: IPOWER (depth 3) then PA (7), which Alice may send: PA. Then
    Evelyn's membership: JOIN (7) is taken unchecked, then BAN (8) is checked with PA in R:
    Bob has 50 >= ban 50 and Evelyn 0 < 50, so BAN passes and stands. With IPOWER in R,
    Bob would have had 0 and the join would have stood."""
    room = ban_and_join(raise_ban_level=False)
    assert room.v1("BAN", "JOIN") == room.expect("PA", "BAN")
    assert room.v2("BAN", "JOIN") == room.expect("PA", "BAN")


def test_a_ban_loses_to_a_join_when_the_resolved_power_levels_refuse_it():
    """Power levels: PA (7) then PX (8), which Alice may send: PX, where banning needs 75.
    Evelyn's membership: JOIN (7) unchecked, then BAN: Bob's 50 < 75, refused. JOIN stands."""
    room = ban_and_join(raise_ban_level=True)
    assert room.v1("BAN", "PX") == room.expect("PX", "JOIN")


def test_a_join_evades_a_concurrent_invite_only_join_rule():
    """Alice makes the room invite-only on one fork while Evelyn joins on the other. v1:
    the join rules walk IJR (depth 4) then JRI (7), which Alice may send: invite only. But
    Evelyn's member key is in one set only, unconflicted, so her join is kept unchecked
    (the reason v2 exists). v2 checks the join against the invite-only rule: refused."""
    room = Room()
    room.chain("START", ("JRI", ALICE, JR, "", {"join_rule": "invite"}))
    room.chain("START", ("JOIN", EVELYN, MEMBER, EVELYN, {"membership": "join"}))
    assert room.v1("JRI", "JOIN") == room.expect("JRI", "JOIN")
    assert room.v2("JRI", "JOIN") == room.expect("JRI")


# --- unknown and rejected events ----------------------------------------------------------


def test_unknown_and_rejected_conflicted_events_are_left_out():
    """As the no-topic-passes room: with T3 rejected, T1 is the one known event of its key
    and stands unchecked (though Bob may not set it); with T1 unknown too, the key is left
    out."""
    room = Room()
    room.chain("START", levels("P50", {ALICE: 100, BOB: 50}))
    room.chain("P50", topic("T3", BOB))
    room.chain("P50", topic("T1", BOB), levels("PA", {ALICE: 100}))
    room.rejected.add(eid("T3"))
    assert room.v1("T3", "PA") == room.expect("PA", "T1")
    del room.events[eid("T1")]
    assert room.v1("T3", "PA") == room.expect("PA", without=((TOPIC, ""),))


def test_a_conflicted_create_event_is_always_allowed():
    """Two create events naming room version 1 (which `auth.py`'s create rule does not
    know): a create event has no rule that depends on the state, so both are allowed, and
    the normal rule takes the first in order, equal depth, the lowest SHA-1: CREATE3's."""
    assert sha1("CREATE3") < sha1("CREATE2")  # 1256... < bab0...
    room = Room()
    for name in ("CREATE2", "CREATE3"):
        content = {"creator": ALICE, "room_version": "1"}
        room.chain(None, (name, ALICE, "m.room.create", "", content))
    key = ("m.room.create", "")
    sets = [{key: eid("CREATE3")}, {key: eid("CREATE2")}]
    assert resolve_state_v1(ROOM_V1, sets, room.get) == {key: eid("CREATE3")}
