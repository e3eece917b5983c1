"""What a sync sends of the streams beside room events, once read (room_entries.py's
`SyncBatch`): each room's ephemeral events (typing, read receipts) and account data, and the global
account data, as the filter keeps them."""

from __future__ import annotations

from typing import Iterable, Mapping

from homeserver.rooms.pagination import EventFilter
from homeserver.sync.filters import RoomEventFilter
from homeserver.sync.push_rules import default_ruleset


def ephemeral_events(
    ephemeral_filter: RoomEventFilter, typing: Mapping, receipts: Mapping, room_id: str
) -> list:
    """`typing`: {room_id: user IDs typing}; `receipts`: {room_id: [Receipt]}, changed."""
    if not ephemeral_filter.keeps_room(room_id):
        return []
    events = []
    if room_id in typing and ephemeral_filter.keeps_type("m.typing"):
        events.append({"type": "m.typing", "content": {"user_ids": typing[room_id]}})
    changed = receipts.get(room_id)
    if changed and ephemeral_filter.keeps_type("m.receipt"):
        content: dict = {}
        for r in changed:
            data = {"ts": r.ts, **({"thread_id": r.thread_id} if r.thread_id else {})}
            content.setdefault(r.event_id, {}).setdefault(r.receipt_type, {})[r.user_id] = data
        events.append({"type": "m.receipt", "content": content})
    return events[: ephemeral_filter.limit] if ephemeral_filter.limit else events


def room_account_data(data_filter: RoomEventFilter, changed: Mapping, room_id: str) -> list:
    """`changed`: {room_id ("" for global): [AccountData]}."""
    if not data_filter.keeps_room(room_id):
        return []
    return _account_data_events(changed.get(room_id, ()), data_filter)


def global_account_data(
    data_filter: EventFilter, changed: Mapping, user_id: str, initial: bool
) -> list:
    events = _account_data_events(changed.get("", ()), data_filter)
    if initial and data_filter.keeps_type("m.push_rules"):
        # Push rules are the server defaults, which clients read from the first sync.
        events.append({"type": "m.push_rules", "content": {"global": default_ruleset(user_id)}})
    return events


def _account_data_events(items: Iterable, data_filter: EventFilter) -> list[dict]:
    events = [
        {"type": item.type, "content": item.content}
        for item in items
        if data_filter.keeps_type(item.type)
    ]
    return events[: data_filter.limit] if data_filter.limit else events
