"""Room stats (member counts, name, topic and the like, for room lists and /sync summaries)
and the joined-count history, kept with each change of current state in the transaction
that makes it."""

from __future__ import annotations

from homeserver.core.events import Event
from homeserver.storage.streams import Position, sql

# The room_stats column each state event (with an empty state key) keeps, and how.
_STATS_COLUMNS: dict[str, tuple[str, str]] = {
    "m.room.name": ("name", "name"),
    "m.room.topic": ("topic", "topic"),
    "m.room.canonical_alias": ("canonical_alias", "alias"),
    "m.room.avatar": ("avatar_url", "url"),
    "m.room.join_rules": ("join_rule", "join_rule"),
    "m.room.history_visibility": ("history_visibility", "history_visibility"),
    "m.room.guest_access": ("guest_access", "guest_access"),
    "m.room.create": ("room_type", "type"),
}


def update_stats(tx, event: Event, previous_membership: str | None, position: int) -> None:
    joined = change_stats(tx, event, previous_membership)
    if joined is not None:
        record_joined(tx, event.room_id, position, joined)


def change_stats(tx, event: Event, previous_membership: str | None) -> int | None:
    """The room's stats after `event` became current state; returns the joined count when
    the event changed it, for `record_joined` at the event's position (taken later: the
    stream's row is held from then to the commit, storage/streams.py)."""
    room_id = event.room_id
    if event.type == "m.room.member":
        joined = (event.membership == "join") - (previous_membership == "join")
        invited = (event.membership == "invite") - (previous_membership == "invite")
        if joined or invited:
            row = tx.fetchone(
                "UPDATE room_stats SET joined_members = joined_members + ?,"
                " invited_members = invited_members + ? WHERE room_id = ?"
                " RETURNING joined_members",
                (joined, invited, room_id),
            )
            if joined and tx.fetchone("SELECT 1 FROM users WHERE user_id = ?", (event.state_key,)):
                tx.execute(
                    "UPDATE room_stats SET local_joined_members = local_joined_members + ?"
                    " WHERE room_id = ?",
                    (joined, room_id),
                )
            if joined:
                return row[0]
        return None
    column = _STATS_COLUMNS.get(event.type)
    if column is None or event.state_key != "":
        return None
    value = event.content.get(column[1])
    # The column names come from the fixed table above, never from input.
    tx.execute(
        f"UPDATE room_stats SET {column[0]} = ? WHERE room_id = ?",
        (value if isinstance(value, str) else None, room_id),
    )
    return None


def record_joined(tx, room_id: str, position: Position, joined: int) -> None:
    # A resolution may change several members at one position: the last count stands.
    at, at_params = sql(position)
    tx.execute(
        "INSERT INTO room_joined_count_history (room_id, stream_ordering, joined_members)"
        f" VALUES (?, {at}, ?) ON CONFLICT (room_id, stream_ordering)"
        " DO UPDATE SET joined_members = excluded.joined_members",
        (room_id, *at_params, joined),
    )
