"""What a sync sends of the streams beside room events, once read (room_entries.py's
`SyncBatch`): each room's ephemeral events (typing, read receipts) and account data, and the global
account data, as the filter keeps them."""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

from homeserver.rooms.pagination import EventFilter
from homeserver.sync.filters import RoomEventFilter

PUSH_RULES = "m.push_rules"


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
    data_filter: EventFilter, changed: Mapping, ruleset: Callable[[], dict], initial: bool
) -> list:
    """`ruleset()`: the user's push rules, read only when sent: in the first sync, and
    whenever they changed (their stored account data is a copy, set with each change)."""
    changes = changed.get("", ())
    others = [item for item in changes if item.type != PUSH_RULES]
    events = _account_data_events(others, data_filter)
    if (initial or len(others) < len(changes)) and data_filter.keeps_type(PUSH_RULES):
        events.append({"type": PUSH_RULES, "content": {"global": ruleset()}})
    return events


def _account_data_events(items: Iterable, data_filter: EventFilter) -> list[dict]:
    events = [
        {"type": item.type, "content": item.content}
        for item in items
        if data_filter.keeps_type(item.type)
    ]
    return events[: data_filter.limit] if data_filter.limit else events
