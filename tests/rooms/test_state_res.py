"""State resolution v2 and v2.1 (rooms/state_res.py), from the spec's definitions and the
classic fork scenarios: each scenario is a small room graph whose forks merge, built event by
event with each event's auth events selected from the state before it (itself resolved where
prev_events meet), and the state before its last event is checked. Every scenario runs
under room versions 10, 11 and 12 (state resolution v2.1)."""

from __future__ import annotations

import tempfile
from typing import Iterable

import pytest

from homeserver.core.events import Event
from homeserver.rooms.auth import select_auth_events
from homeserver.rooms.state_res import (
    auth_chain_from_lookup,
    auth_difference,
    conflicted_subgraph,
    iterative_auth_checks,
    mainline,
    mainline_order,
    resolve_state,
    reverse_topological_power_order,
    split_conflicted,
)
from homeserver.rooms.versions import ROOM_V10, ROOM_V11, ROOM_V12, RoomVersion
from homeserver.storage import auth_chains
from homeserver.storage.database import Database, open_database
from homeserver.storage.migrations import migrate

ALICE, BOB, CHARLIE, EVELYN, ZARA = "@alice:a", "@bob:b", "@charlie:c", "@evelyn:e", "@zara:z"
PL, JR, MEMBER, TOPIC, MSG = (
    "m.room.power_levels",
    "m.room.join_rules",
    "m.room.member",
    "m.room.topic",
    "m.room.message",
)
VERSIONS = [ROOM_V10, ROOM_V11, ROOM_V12]
ids = pytest.mark.parametrize("version", VERSIONS, ids=lambda v: f"v{v.identifier}")

# (name, sender, type, state_key, content): the room every scenario starts from, linear.
INITIAL = [
    ("CREATE", ALICE, "m.room.create", "", {}),
    ("IMA", ALICE, MEMBER, ALICE, {"membership": "join"}),
    ("IPOWER", ALICE, PL, "", {"users": {ALICE: 100}}),
    ("IJR", ALICE, JR, "", {"join_rule": "public"}),
    ("IMB", BOB, MEMBER, BOB, {"membership": "join"}),
    ("IMC", CHARLIE, MEMBER, CHARLIE, {"membership": "join"}),
    ("IMZ", ZARA, MEMBER, ZARA, {"membership": "join"}),
    ("START", ZARA, MSG, None, {"body": "start"}),
]


def eid(name: str) -> str:
    return "$" + name


class Graph:
    """Builds a room graph: events in the order given (which is also their
    origin_server_ts order), prev_events from `edges` (chains, newest first, as the
    scenarios are drawn), auth events from the (resolved) state before each event."""

    def __init__(
        self,
        version: RoomVersion,
        events: list,
        edges: list[list[str]],
        index: Database | None = None,
    ):
        self.version = version
        # With `index`, each event is put on the auth chain index of that database as it
        # is built, and resolutions take their auth difference from it.
        self.index = index
        self.events: dict[str, Event] = {}
        self.state_after: dict[str, dict] = {}
        self.room_id = "!CREATE" if version.room_id_is_create_event_id else "!room:a"
        prevs: dict[str, list[str]] = {}
        for (a, *_), (b, *_) in zip(INITIAL[1:], INITIAL):
            prevs[a] = [b]
        for chain in edges:
            for newer, older in zip(chain, chain[1:]):
                prevs.setdefault(newer, [])
                if older not in prevs[newer]:
                    prevs[newer].append(older)
        specs = {spec[0]: spec for spec in [*INITIAL, *events]}
        specs.setdefault("END", ("END", ZARA, MSG, None, {"body": "end"}))
        self.ts = {name: i for i, name in enumerate(specs)}
        for name in specs:
            self._build(name, specs, prevs)

    def get(self, event_id: str) -> Event | None:
        return self.events.get(event_id)

    def resolve(self, state_sets: list[dict]) -> dict:
        chain = auth_chain_from_lookup(self.get)
        difference = None
        if self.index is not None:
            difference = self.index.read(auth_chains.auth_difference, state_sets)
            assert difference == auth_difference(state_sets, chain) & self.events.keys()
        return resolve_state(self.version, state_sets, self.get, chain, difference=difference)

    def state_before(self, name: str) -> dict:
        event = self.events[eid(name)]
        sets = [self.state_after[p] for p in event.prev_event_ids]
        return sets[0] if len(sets) == 1 else self.resolve(sets)

    def _build(self, name: str, specs: dict, prevs: dict) -> None:
        if eid(name) in self.events:
            return
        for prev in prevs.get(name, []):
            self._build(prev, specs, prevs)
        _, sender, event_type, state_key, content = specs[name]
        content = self._content(event_type, content)
        sets = [self.state_after[eid(p)] for p in prevs.get(name, [])]
        before = sets[0] if len(sets) == 1 else (self.resolve(sets) if sets else {})
        state = {k: self.events[v] for k, v in before.items()}
        auth = select_auth_events(self.version, event_type, sender, state_key, content, state)
        pdu: dict = {
            "room_id": self.room_id,
            "type": event_type,
            "sender": sender,
            "content": content,
            "prev_events": [eid(p) for p in prevs.get(name, [])],
            "auth_events": [a.event_id for a in auth],
            "origin_server_ts": self.ts[name],
            "depth": 1 + max((self.events[eid(p)].depth for p in prevs.get(name, [])), default=0),
        }
        if state_key is not None:
            pdu["state_key"] = state_key
        if event_type == "m.room.create":
            pdu["content"] = {"room_version": self.version.identifier, "creator": ALICE}
            if self.version.room_id_is_create_event_id:
                del pdu["room_id"]
        self.events[eid(name)] = event = Event(eid(name), pdu)
        if self.index is not None:
            self.index.write(auth_chains.index_events, [event])
        after = dict(before)
        if state_key is not None:
            after[(event_type, state_key)] = event.event_id
        self.state_after[event.event_id] = after

    def _content(self, event_type: str, content: dict) -> dict:
        # v12 creators are above every level and may not be listed in `users`.
        if event_type == PL and self.version.creators_have_infinite_power:
            users = {u: v for u, v in content.get("users", {}).items() if u != ALICE}
            return {**content, "users": users}
        return content

    def expect(self, names: Iterable[str]) -> dict:
        """The state after START with the named events' keys set to them."""
        expected = dict(self.state_after[eid("START")])
        for name in names:
            event = self.events[eid(name)]
            expected[(event.type, event.state_key)] = event.event_id
        return expected


def ev(name, sender, event_type, state_key, content):
    return (name, sender, event_type, state_key, content)


def topic(name, sender):
    return ev(name, sender, TOPIC, "", {"topic": name})


def levels(name, sender, users, **extra):
    return ev(name, sender, PL, "", {"users": users, **extra})


def check(version, events, edges, expected_names):
    """Resolved walking the auth chains, and again with the auth chain index (a SQLite
    file of its own, storage/auth_chains.py): the same state both ways."""
    graph = Graph(version, events, edges)
    assert graph.state_before("END") == graph.expect(expected_names)
    with tempfile.TemporaryDirectory() as directory:
        database = open_database(f"sqlite:///{directory}/index.db")
        try:
            migrate(database)
            indexed = Graph(version, events, edges, index=database)
            assert indexed.state_before("END") == indexed.expect(expected_names)
        finally:
            database.close()


# --- the classic scenarios --------------------------------------------------------------


@ids
def test_ban_beats_a_concurrent_power_levels_change(version):
    """Alice bans Bob while Bob changes the power levels on another fork: the ban is
    replayed first (Alice has more power), so Bob's change no longer passes."""
    events = [
        levels("PA", ALICE, {ALICE: 100, BOB: 50}),
        ev("MA", ALICE, MEMBER, ALICE, {"membership": "join"}),
        ev("MB", ALICE, MEMBER, BOB, {"membership": "ban"}),
        levels("PB", BOB, {ALICE: 100, BOB: 50}),
    ]
    edges = [["END", "MB", "MA", "PA", "START"], ["END", "PB", "PA"]]
    check(version, events, edges, ["PA", "MA", "MB"])


@ids
def test_topic_is_not_reset_by_a_banned_users_fork(version):
    """Bob sets the topic after being made a moderator, and is banned on one fork; the
    topic from before his promotion stands, not his."""
    events = [
        topic("T1", ALICE),
        levels("PA", ALICE, {ALICE: 100, BOB: 50}),
        topic("T2", BOB),
        ev("MB", ALICE, MEMBER, BOB, {"membership": "ban"}),
    ]
    edges = [["END", "MB", "T2", "PA", "T1", "START"], ["END", "T1"]]
    check(version, events, edges, ["T1", "MB", "PA"])


@ids
def test_join_rule_evasion(version):
    """Alice makes the room private while Evelyn joins on another fork: the join rules are
    a power event and go first, so Evelyn's join is refused."""
    events = [
        ev("JR", ALICE, JR, "", {"join_rule": "private"}),
        ev("ME", EVELYN, MEMBER, EVELYN, {"membership": "join"}),
    ]
    edges = [["END", "JR", "START"], ["END", "ME", "START"]]
    check(version, events, edges, ["JR"])


@ids
def test_offtopic_power_levels(version):
    """Three power levels changes in a row on one fork, the first alone on the other: the
    newest wins, each passing against the one before it."""
    events = [
        levels("PA", ALICE, {ALICE: 100, BOB: 50}),
        levels("PB", BOB, {ALICE: 100, BOB: 50, CHARLIE: 50}),
        levels("PC", CHARLIE, {ALICE: 100, BOB: 50, CHARLIE: 0}),
    ]
    edges = [["END", "PC", "PB", "PA", "START"], ["END", "PA"]]
    check(version, events, edges, ["PC"])


@ids
def test_topic_basic(version):
    """Alice demotes Bob on one fork while Bob sets the topic on the other: the demotion
    comes before Bob's topic in mainline order, so Bob's topic fails and Alice's stands."""
    events = [
        topic("T1", ALICE),
        levels("PA1", ALICE, {ALICE: 100, BOB: 50}),
        topic("T2", ALICE),
        levels("PA2", ALICE, {ALICE: 100, BOB: 0}),
        levels("PB", BOB, {ALICE: 100, BOB: 50}),
        topic("T3", BOB),
    ]
    edges = [["END", "PA2", "T2", "PA1", "T1", "START"], ["END", "T3", "PB", "PA1"]]
    check(version, events, edges, ["PA2", "T2"])


@ids
def test_topic_after_a_merge(version):
    """As topic_basic, but the forks merged (at a message) and Alice set the topic again
    after the merge: her newer topic wins."""
    events = [
        topic("T1", ALICE),
        levels("PA1", ALICE, {ALICE: 100, BOB: 50}),
        topic("T2", ALICE),
        levels("PA2", ALICE, {ALICE: 100, BOB: 0}),
        levels("PB", BOB, {ALICE: 100, BOB: 50}),
        topic("T3", BOB),
        ev("MZ1", ZARA, MSG, None, {"body": "merge"}),
        topic("T4", ALICE),
    ]
    edges = [
        ["END", "T4", "MZ1", "PA2", "T2", "PA1", "T1", "START"],
        ["END", "MZ1", "T3", "PB", "PA1"],
    ]
    check(version, events, edges, ["T4", "PA2"])


@ids
def test_mainline_sort(version):
    """Two topics, each on a fork based on a different power levels event: the one whose
    power levels event is further along the mainline is applied last, and wins."""
    events = [
        topic("T1", ALICE),
        levels("PA1", ALICE, {ALICE: 100, BOB: 50}),
        topic("T2", ALICE),
        levels("PA2", ALICE, {ALICE: 100, BOB: 50}, events={PL: 100}),
        levels("PB", BOB, {ALICE: 100, BOB: 50}),
        topic("T3", BOB),
        topic("T4", ALICE),
    ]
    edges = [
        ["END", "T3", "PA2", "T2", "PA1", "T1", "START"],
        ["END", "T4", "PB", "PA1"],
    ]
    check(version, events, edges, ["T3", "PA2"])


# --- the pieces, on their definitions ---------------------------------------------------


def test_split_conflicted():
    """A key with one value in every set is unconflicted; a key missing from one set, or
    with differing values, puts all its values in the conflicted set."""
    a = {("t", ""): "$1", ("u", ""): "$2", ("v", ""): "$4"}
    b = {("t", ""): "$1", ("u", ""): "$3"}
    assert split_conflicted([a, b]) == ({("t", ""): "$1"}, {"$2", "$3", "$4"})


def test_auth_difference_is_union_minus_intersection():
    graph = Graph(ROOM_V10, [levels("PA", ALICE, {ALICE: 100, BOB: 50})], [["END", "PA", "START"]])
    chain = auth_chain_from_lookup(graph.get)
    before, after = graph.state_after["$START"], graph.state_after["$PA"]
    # PA is only in the second set; IPOWER (which PA's auth chain holds) is in both.
    assert auth_difference([before, after], chain) == {"$PA"}
    assert auth_difference([before, before], chain) == set()


def test_auth_chain_walks_auth_events_not_the_event_itself():
    graph = Graph(ROOM_V10, [], [])
    assert auth_chain_from_lookup(graph.get)(["$IMB"]) == {"$CREATE", "$IPOWER", "$IJR", "$IMA"}


def test_reverse_topological_power_order():
    """Auth ancestors come first; among events free to go, the more powerful sender's,
    then the older one."""
    events = [
        levels("PA", ALICE, {ALICE: 100, BOB: 50}),
        topic("TB", BOB),
        topic("TA", ALICE),
        levels("PB", BOB, {ALICE: 100, BOB: 50}),
    ]
    graph = Graph(ROOM_V10, events, [["END", "PB", "TA", "TB", "PA", "START"]])
    chain = auth_chain_from_lookup(graph.get)
    order = reverse_topological_power_order(
        ROOM_V10, {"$PA", "$TB", "$TA", "$PB", "$IPOWER"}, graph.get, chain
    )
    # IPOWER is in PA's auth chain, PA in the others'; Alice (100) before Bob (50), and
    # between Bob's two, the older.
    assert order == ["$IPOWER", "$PA", "$TA", "$TB", "$PB"]


def test_mainline_and_its_order():
    events = [
        levels("PA1", ALICE, {ALICE: 100, BOB: 50}),
        topic("T1", BOB),
        levels("PA2", ALICE, {ALICE: 100, BOB: 50, CHARLIE: 10}),
        topic("T2", BOB),
        ev("X", ZARA, "m.custom", "", {}),
    ]
    graph = Graph(ROOM_V10, events, [["END", "X", "T2", "PA2", "T1", "PA1", "START"]])
    assert mainline("$PA2", graph.get) == ["$PA2", "$PA1", "$IPOWER"]
    # T2 cites PA2 (position 0), T1 cites PA1 (1): T1 first. An event citing no power
    # levels on the mainline (position infinity) would go before both.
    assert mainline_order(["$T2", "$T1"], "$PA2", graph.get) == ["$T1", "$T2"]
    assert mainline_order(["$T2", "$IMA"], "$PA2", graph.get) == ["$IMA", "$T2"]


def test_iterative_auth_checks_skip_what_fails_and_ignore_rejected_auth_events():
    graph = Graph(ROOM_V10, [topic("T1", BOB)], [["END", "T1", "START"]])
    start = graph.state_after["$START"]
    # Bob has 0 and topics need 50: T1 is ignored.
    assert iterative_auth_checks(ROOM_V10, ["$T1"], start, graph.get) == start
    # A topic by Alice passes from a state that lacks her membership, through her own
    # auth event, unless that auth event was rejected.
    graph = Graph(ROOM_V10, [topic("T2", ALICE)], [["END", "T2", "START"]])
    bare = {k: v for k, v in graph.state_after["$START"].items() if k != (MEMBER, ALICE)}
    passed = iterative_auth_checks(ROOM_V10, ["$T2"], bare, graph.get)
    assert passed[(TOPIC, "")] == "$T2"
    refused = iterative_auth_checks(ROOM_V10, ["$T2"], bare, graph.get, lambda e: e == "$IMA")
    assert (TOPIC, "") not in refused


def test_one_state_set_or_identical_sets_resolve_to_themselves():
    graph = Graph(ROOM_V10, [], [])
    state = graph.state_after["$START"]
    assert graph.resolve([state]) == state
    assert graph.resolve([state, dict(state)]) == state
    assert graph.resolve([]) == {}


# --- v2.1 (room version 12) -------------------------------------------------------------


def _left_after_power_change(version: RoomVersion) -> tuple[Graph, dict, dict]:
    """Bob (50) changes the power levels on one fork, then leaves on both: his leave is
    unconflicted, his power levels change is not."""
    events = [
        levels("PA", ALICE, {ALICE: 100, BOB: 50}),
        levels("PB", BOB, {ALICE: 100, BOB: 50}, events={TOPIC: 50}),
        ev("LB", BOB, MEMBER, BOB, {"membership": "leave"}),
    ]
    graph = Graph(version, events, [["END", "PB", "PA", "START"], ["END", "LB", "PA"]])
    with_pb = dict(graph.state_after["$PB"])
    without = dict(graph.state_after["$PA"])
    leave = graph.state_after["$LB"][(MEMBER, BOB)]
    with_pb[(MEMBER, BOB)] = without[(MEMBER, BOB)] = leave
    return graph, with_pb, without


def test_v2_checks_conflicted_power_events_against_the_unconflicted_state():
    """v2 starts the iterative auth checks from the unconflicted state map, where Bob has
    already left: his power levels change, made while he was in, is dropped."""
    graph, with_pb, without = _left_after_power_change(ROOM_V11)
    assert graph.resolve([with_pb, without])[(PL, "")] == "$PA"


def test_v2_1_starts_from_an_empty_state():
    """v2.1 (room version 12) starts from an empty state map: Bob's change is checked
    against its own history, where he was in the room with 50, and stands."""
    graph, with_pb, without = _left_after_power_change(ROOM_V12)
    resolved = graph.resolve([with_pb, without])
    assert resolved[(PL, "")] == "$PB"
    assert resolved[(MEMBER, BOB)] == without[(MEMBER, BOB)]  # unconflicted still wins


def test_conflicted_state_subgraph():
    """The events on auth_events paths between conflicted events: Bob's join sits between
    Alice's power levels (which authorised it) and Bob's (which it authorised)."""
    events = [
        levels("PA", ALICE, {ALICE: 100, BOB: 50}),
        ev("MB2", BOB, MEMBER, BOB, {"membership": "join", "displayname": "b"}),
        levels("PB", BOB, {ALICE: 100, BOB: 50}, events={TOPIC: 50}),
    ]
    graph = Graph(ROOM_V12, events, [["END", "PB", "MB2", "PA", "START"]])
    assert conflicted_subgraph({"$PA", "$PB"}, graph.get) == {"$PA", "$MB2", "$PB"}
    # Nothing lies between two events that do not lead to one another.
    assert conflicted_subgraph({"$PA", "$IMZ"}, graph.get) == set()


def test_v12_creator_outranks_everyone_in_power_order():
    """In v12 the creator is infinitely powerful (not listed in `users`): their event goes
    first among events free to go, whatever the timestamps."""
    events = [levels("PA", ALICE, {BOB: 100}), topic("TB", BOB), topic("TA", ALICE)]
    graph = Graph(ROOM_V12, events, [["END", "TA", "TB", "PA", "START"]])
    chain = auth_chain_from_lookup(graph.get)
    order = reverse_topological_power_order(ROOM_V12, {"$TB", "$TA"}, graph.get, chain)
    assert order == ["$TA", "$TB"]
