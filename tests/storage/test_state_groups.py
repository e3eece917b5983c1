"""State groups as deltas (storage/event_state.py), and the migration of groups stored as
whole maps, on SQLite and on a real PostgreSQL cluster."""

import json

from homeserver.config import parse_config
from homeserver.core.events import Event
from homeserver.rooms.creation import CreateRoomRequest
from homeserver.runtime import HomeserverRuntime
from homeserver.storage import event_state
from homeserver.storage.database import open_database
from homeserver.storage.migrations import migrate

ROOM = "!room:weir.test"


def member(n: int) -> tuple[str, str]:
    return ("m.room.member", f"@u{n}:weir.test")


def rows(tx, table: str) -> int:
    return tx.fetchone(f"SELECT COUNT(*) FROM {table}")[0]


def test_a_group_is_a_delta_and_a_chain_is_bounded(db):
    def write(tx):
        group = event_state.new_group(tx, ROOM, None, {("m.room.create", ""): "$c"})
        groups = [group]
        for n in range(2 * event_state.MAX_CHAIN + 10):
            group = event_state.new_group(tx, ROOM, group, {member(n): f"$j{n}"})
            groups.append(group)
        entries = rows(tx, "state_group_entries")
        longest = tx.fetchone("SELECT MAX(chain_length) FROM state_groups")[0]
        return groups, entries, longest

    groups, entries, longest = db.write(write)
    assert longest == event_state.MAX_CHAIN
    # one key per delta; three whole groups: the first, and where each chain ended
    whole = [1, event_state.MAX_CHAIN + 2, 2 * event_state.MAX_CHAIN + 3]
    assert entries == (len(groups) - len(whole)) + sum(whole)
    last = db.read(event_state.read_group, groups[-1])
    assert len(last) == 2 * event_state.MAX_CHAIN + 11
    assert last[member(0)] == "$j0" and last[("m.room.create", "")] == "$c"
    keys = [member(5), member(150), ("m.room.name", "")]
    assert db.read(event_state.read_group, groups[-1], keys) == {
        member(5): "$j5",
        member(150): "$j150",
    }
    assert db.read(event_state.read_group, groups[3]) == {
        ("m.room.create", ""): "$c",
        **{member(n): f"$j{n}" for n in range(3)},
    }


def test_a_removed_key_is_gone_from_later_groups(db):
    def write(tx):
        first = event_state.new_group(tx, ROOM, None, {member(1): "$a", member(2): "$b"})
        second = event_state.new_group(tx, ROOM, first, {member(1): None, member(3): "$c"})
        return first, second

    first, second = db.write(write)
    assert db.read(event_state.read_group, second) == {member(2): "$b", member(3): "$c"}
    assert db.read(event_state.read_group, second, [member(1)]) == {}
    assert db.read(event_state.read_group, first)[member(1)] == "$a"


def event(event_id: str, prevs: list[str], state_key: str | None = None) -> Event:
    pdu = {
        "room_id": ROOM,
        "type": "m.room.member" if state_key is not None else "m.room.message",
        "sender": "@u:weir.test",
        "prev_events": prevs,
        "auth_events": [],
        "depth": 1,
        "content": {"membership": "join"} if state_key is not None else {"body": "hi"},
    }
    if state_key is not None:
        pdu["state_key"] = state_key
    return Event(event_id, pdu)


def test_a_message_writes_no_state_and_a_state_event_one_key(db):
    def write(tx):
        base = event_state.new_group(tx, ROOM, None, {member(n): f"$j{n}" for n in range(50)})
        tx.execute(
            "INSERT INTO event_state_groups (event_id, room_id, state_group) VALUES (?, ?, ?)",
            ("$prev", ROOM, base),
        )
        before = event_state.read_group(tx, base)
        entries = rows(tx, "state_group_entries")
        event_state.record_state(tx, event("$msg", ["$prev"]), before, local=False)
        message_cost = rows(tx, "state_group_entries") - entries
        event_state.record_state(tx, event("$join", ["$msg"], "@new:weir.test"), None, local=True)
        join_cost = rows(tx, "state_group_entries") - entries
        return base, message_cost, join_cost

    base, message_cost, join_cost = db.write(write)
    assert message_cost == 0 and join_cost == 1
    assert db.read(event_state.group_of, "$msg") == base
    after_join = db.read(event_state.state_of, "$join")
    assert len(after_join) == 51 and after_join[("m.room.member", "@new:weir.test")] == "$join"


def test_groups_stored_whole_before_deltas_migrate_and_read_the_same(empty_database_url):
    db = open_database(empty_database_url)
    migrate(db, until=25)
    states = [
        {("m.room.create", ""): "$c", **{member(k): f"$j{k}" for k in range(n)}} for n in range(130)
    ]
    states.append({("m.room.create", ""): "$c", member(7): "$left"})  # keys gone, one changed

    def legacy(tx):
        groups = []
        for state in states:
            text = json.dumps({f"{t}\u0000{k}": v for (t, k), v in sorted(state.items())})
            groups.append(
                tx.fetchone(
                    "INSERT INTO state_groups (room_id, state) VALUES (?, ?) RETURNING state_group",
                    (ROOM, text),
                )[0]
            )
        tx.execute(
            "INSERT INTO event_state_groups (event_id, room_id, state_group) VALUES (?, ?, ?)",
            ("$last", ROOM, groups[-1]),
        )
        return groups

    groups = db.write(legacy)
    migrate(db)
    try:
        for group, state in zip(groups, states):
            assert db.read(event_state.read_group, group) == state
        assert db.read(event_state.state_of, "$last", [member(7), member(8)]) == {
            member(7): "$left"
        }
        longest = db.read(lambda tx: tx.fetchone("SELECT MAX(chain_length) FROM state_groups"))
        assert longest[0] == event_state.MAX_CHAIN
        # deltas, not 130 whole maps: about 8,500 keys whole, a few hundred as deltas
        assert db.read(rows, "state_group_entries") < 600
    finally:
        db.close()


def test_a_local_join_shares_one_group_with_the_current_state(database_url, tmp_path):
    """The current state after a local state event is the state after it: one group, one
    key, for both (they were written twice, and drifted apart for good at a whole group)."""
    settings = {"server_name": "weir.test", "data_dir": str(tmp_path)}
    rt = HomeserverRuntime(parse_config({**settings, "database": {"url": database_url}}))
    try:
        owner = rt.accounts.register("owner", "pw").user_id
        room = rt.room_creator.create(owner, CreateRoomRequest(preset="public_chat"))
        counts = lambda tx: (rows(tx, "state_groups"), rows(tx, "state_group_entries"))  # noqa: E731
        for n in range(event_state.MAX_CHAIN + 5):  # past a whole group
            # No password: the joins are the point, not 105 scrypt hashes.
            user = rt.accounts.register(f"u{n}", None).user_id
            before = rt.db.read(counts)
            join = rt.rooms.update_membership(user, room, user, "join")
            after = rt.db.read(counts)
            if n < event_state.MAX_CHAIN - 10:
                assert after == (before[0] + 1, before[1] + 1), n
            shared = rt.db.read(event_state.current_group, room)
            assert shared == rt.db.read(event_state.group_of, join), n
        current = rt.db.read(event_state.current_ids, room)
        assert rt.db.read(event_state.read_group, shared) == current
    finally:
        rt.close()


def test_a_batch_that_sets_a_key_twice_stores_what_one_event_at_a_time_would(db):
    # storage/rooms.py writes a batch's state before its positions: the second event must
    # still see the first as the state it replaces, and each its own current state.
    from homeserver.storage.rooms import NewRoom, RoomStore

    store = RoomStore(db)
    joined, again = event("$a", [], "@u:weir.test"), event("$b", ["$a"], "@u:weir.test")
    again.pdu["content"] = {"membership": "join", "displayname": "U"}
    joined.pdu["origin_server_ts"] = again.pdu["origin_server_ts"] = 0
    first, second = store.persist_events(
        [joined, again], new_room=NewRoom(ROOM, "10", "@u:weir.test", 0)
    )
    assert first.unsigned == {}
    assert second.unsigned == {
        "replaces_state": "$a",
        "prev_content": {"membership": "join"},
        "prev_sender": "@u:weir.test",
    }
    assert store.get_event("$b").unsigned == second.unsigned
    key = ("m.room.member", "@u:weir.test")
    assert store.state_at(ROOM, first.stream_ordering)[key].event.event_id == "$a"
    assert store.state_at(ROOM, second.stream_ordering)[key].event.event_id == "$b"
    assert store.current_state(ROOM)[key].event.event_id == "$b"
    counts = db.read(
        lambda tx: tx.fetchall(
            "SELECT r.stream_ordering, r.joined_members, s.joined_members FROM room_stats s"
            " JOIN room_joined_count_history r ON r.room_id = s.room_id"
        )
    )
    assert counts == [(first.stream_ordering, 1, 1)]
