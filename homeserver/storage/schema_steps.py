"""Migration steps SQL alone cannot write, by schema number: each runs after its numbered
file in `schema/`, in the same transaction (storage/migrations.py). Like the SQL files, a
step is never edited after it has landed, so it imports nothing from the live storage code.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Callable

# 0026: the chain length the live code keeps (event_state.MAX_CHAIN when this was written).
_MAX_CHAIN_0026 = 100


def _state_groups_to_deltas(tx) -> None:
    """Rewrites each state group stored as a whole JSON map as a delta on the room's group
    before it (by number), starting a new whole group every 100; then drops the maps."""
    rooms = [r[0] for r in tx.fetchall("SELECT DISTINCT room_id FROM state_groups")]
    for room_id in rooms:
        groups = [
            r[0]
            for r in tx.fetchall(
                "SELECT state_group FROM state_groups WHERE room_id = ? ORDER BY state_group",
                (room_id,),
            )
        ]
        previous: tuple[int, dict] | None = None
        length = 0
        for group in groups:  # one map in memory at a time: old rooms hold many large ones
            text = tx.fetchone("SELECT state FROM state_groups WHERE state_group = ?", (group,))[0]
            state = {}
            for key, event_id in json.loads(text).items():
                event_type, _, state_key = key.partition("\u0000")
                state[(event_type, state_key)] = event_id
            if previous is not None and length < _MAX_CHAIN_0026:
                base, base_state = previous
                length += 1
                delta: dict = {k: v for k, v in state.items() if base_state.get(k) != v}
                delta.update({k: None for k in base_state.keys() - state.keys()})
            else:
                base, length, delta = None, 0, state
            tx.execute(
                "UPDATE state_groups SET prev_state_group = ?, chain_length = ?"
                " WHERE state_group = ?",
                (base, length, group),
            )
            tx.executemany(
                "INSERT INTO state_group_entries (state_group, type, state_key, event_id)"
                " VALUES (?, ?, ?, ?)",
                [(group, t, k, e) for (t, k), e in delta.items()],
            )
            previous = (group, state)
    tx.execute("ALTER TABLE state_groups DROP COLUMN state")


def _index_auth_chains(tx) -> None:
    """Places every stored state event on the auth chain index (0028_auth_chain_index.sql),
    room by room."""
    chains = 0
    for (room_id,) in tx.fetchall("SELECT DISTINCT room_id FROM events"):
        chains = _index_room_auth_chains(tx, room_id, chains)
    tx.execute(
        "UPDATE stream_positions SET position = ? WHERE stream_name = 'auth_chains'", (chains,)
    )


def _index_room_auth_chains(tx, room_id: str, chains: int) -> int:
    """One room's state events, each after its auth events (Kahn's order); chain IDs from
    `chains` + 1. Returns the last chain ID taken."""
    auth_of: dict[str, list[str]] = {}
    for event_id, text in tx.fetchall(
        "SELECT event_id, json FROM events WHERE room_id = ? AND state_key IS NOT NULL",
        (room_id,),
    ):
        auth_of[event_id] = list(json.loads(text).get("auth_events", []))
    waiting = {e: sum(1 for a in auths if a in auth_of) for e, auths in auth_of.items()}
    dependants: dict[str, list[str]] = {}
    for event_id, auths in auth_of.items():
        for auth_id in (a for a in auths if a in auth_of):
            dependants.setdefault(auth_id, []).append(event_id)
    ready = [e for e, n in waiting.items() if n == 0]
    placed: dict[str, tuple[int, int]] = {}
    heads: dict[int, int] = {}
    while ready:
        event_id = ready.pop()
        auth = [placed[a] for a in auth_of[event_id] if a in placed]
        extend = [(c, s + 1) for c, s in auth if heads[c] == s]
        if not extend:
            chains += 1
        chain, seq = extend[0] if extend else (chains, 1)
        placed[event_id], heads[chain] = (chain, seq), seq
        tx.execute(
            "INSERT INTO event_auth_positions (event_id, chain_id, seq) VALUES (?, ?, ?)",
            (event_id, chain, seq),
        )
        best: dict[int, int] = {}
        for c, s in auth:
            if c != chain:
                best[c] = max(best.get(c, 0), s)
        tx.executemany(
            "INSERT INTO auth_chain_links (origin_chain, origin_seq, target_chain,"
            " target_seq) VALUES (?, ?, ?, ?)",
            [(chain, seq, c, s) for c, s in best.items()],
        )
        for dependant in dependants.get(event_id, []):
            waiting[dependant] -= 1
            if waiting[dependant] == 0:
                ready.append(dependant)
    return chains


def _index_relations(tx) -> None:
    """0050: a relation row for every stored event shown to clients whose content has an
    `m.relates_to` with a string rel_type and event_id (as storage/event_rows.py writes them
    from then on), read 1,000 events at a time in stream order. Redacted events have lost
    theirs and get none."""
    after = -(2**63)
    while True:
        rows = tx.fetchall(
            "SELECT stream_ordering, event_id, json, room_id, type, sender FROM events"
            " WHERE stream_ordering > ? AND soft_failed = 0 AND outlier = 0"
            " ORDER BY stream_ordering LIMIT 1000",
            (after,),
        )
        if not rows:
            return
        after = rows[-1][0]
        for position, event_id, text, room_id, event_type, sender in rows:
            if '"m.relates_to"' not in text:
                continue
            pdu = json.loads(text)
            relates_to = (pdu.get("content") or {}).get("m.relates_to")
            if not isinstance(relates_to, dict):
                continue
            rel_type, parent = relates_to.get("rel_type"), relates_to.get("event_id")
            if not (isinstance(rel_type, str) and isinstance(parent, str)):
                continue
            tx.execute(
                "INSERT INTO event_relations (event_id, relates_to_id, rel_type, type, sender,"
                " room_id, stream_ordering, origin_server_ts, thread_root)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (event_id) DO NOTHING",
                (
                    event_id,
                    parent,
                    rel_type,
                    event_type,
                    sender,
                    room_id,
                    position,
                    pdu.get("origin_server_ts", 0),
                    parent if rel_type == "m.thread" else None,
                ),
            )


# 0051: the searched content key of each event type (storage/event_rows.py when written).
_SEARCHED_0051 = {"m.room.message": "body", "m.room.name": "name", "m.room.topic": "topic"}


def _index_search(tx) -> None:
    """0051: a search row for every stored event shown to clients with a searchable string,
    as storage/event_rows.py writes them from then on, 1,000 events at a time. Redacted
    events have lost their text and get none."""
    if tx.dialect == "postgres":
        insert = (
            "INSERT INTO event_search (stream_ordering, event_id, room_id, key, vector)"
            " VALUES (?, ?, ?, ?, to_tsvector('english', ?))"
        )
    else:
        insert = (
            "INSERT INTO event_search (rowid, event_id, room_id, key, value) VALUES (?, ?, ?, ?, ?)"
        )
    after = -(2**63)
    while True:
        rows = tx.fetchall(
            "SELECT stream_ordering, event_id, json, room_id, type FROM events"
            " WHERE stream_ordering > ? AND soft_failed = 0 AND outlier = 0"
            " AND type IN ('m.room.message', 'm.room.name', 'm.room.topic')"
            " ORDER BY stream_ordering LIMIT 1000",
            (after,),
        )
        if not rows:
            return
        after = rows[-1][0]
        for position, event_id, text, room_id, event_type in rows:
            name = _SEARCHED_0051[event_type]
            value = (json.loads(text).get("content") or {}).get(name)
            if isinstance(value, str) and value:
                tx.execute(insert, (position, event_id, room_id, f"content.{name}", value))


# 0060: how storage/user_directory.py wrote a row when this was written.
_WORD_0060 = re.compile(r"\w+")


def _words_0060(text: str) -> list[str]:
    bare = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    return _WORD_0060.findall(bare.casefold())


def _directory_row_0060(user_id: str, name, avatar) -> tuple:
    name = name if isinstance(name, str) and 0 < len(name) <= 256 else None
    ok = isinstance(avatar, str) and avatar.startswith("mxc://") and len(avatar) <= 1024
    words = dict.fromkeys(_words_0060(name or "") + _words_0060(user_id))
    return user_id, name, avatar if ok else None, "".join(f" {w}" for w in words)


def _fill_user_directory(tx) -> None:
    """0060: a directory row for every local user, from their profile, and for every other
    server's user joined to a room: named by the newest of their joins to a public or
    world-readable room in current state, else without a name."""
    insert = (
        "INSERT INTO user_directory (user_id, display_name, avatar_url, search_text)"
        " VALUES (?, ?, ?, ?) ON CONFLICT (user_id) DO "
    )
    upsert = insert + (
        "UPDATE SET display_name = excluded.display_name, avatar_url = excluded.avatar_url,"
        " search_text = excluded.search_text"
    )
    profiles: dict[str, dict] = {u: {} for (u,) in tx.fetchall("SELECT user_id FROM users")}
    for user_id, field, value in tx.fetchall(
        "SELECT user_id, field, value FROM profile_fields"
        " WHERE field IN ('displayname', 'avatar_url')"
    ):
        profiles.setdefault(user_id, {})[field] = json.loads(value)
    for user_id, profile in profiles.items():
        row = _directory_row_0060(user_id, profile.get("displayname"), profile.get("avatar_url"))
        tx.execute(upsert, row)
    public = "(r.join_rule = 'public' OR r.history_visibility = 'world_readable')"
    after = -(2**63)
    while True:  # oldest join first, so each user's newest is written last
        rows = tx.fetchall(
            f"SELECT e.stream_ordering, c.state_key, e.json, {public} FROM current_state c"
            " JOIN events e ON e.event_id = c.event_id"
            " LEFT JOIN room_stats r ON r.room_id = c.room_id"
            " WHERE c.type = 'm.room.member' AND c.membership = 'join' AND e.stream_ordering > ?"
            " AND NOT EXISTS (SELECT 1 FROM users u WHERE u.user_id = c.state_key)"
            " ORDER BY e.stream_ordering LIMIT 1000",
            (after,),
        )
        if not rows:
            return
        after = rows[-1][0]
        for _, user_id, text, in_public in rows:
            if not in_public:  # a name meant for that room only: none, and no other replaced
                row = _directory_row_0060(user_id, None, None)
                tx.execute(insert + "NOTHING", row)
                continue
            content = json.loads(text).get("content") or {}
            name, avatar = content.get("displayname"), content.get("avatar_url")
            tx.execute(upsert, _directory_row_0060(user_id, name, avatar))


STEPS: dict[int, Callable] = {
    26: _state_groups_to_deltas,
    28: _index_auth_chains,
    50: _index_relations,
    51: _index_search,
    60: _fill_user_directory,
}
