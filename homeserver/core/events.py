"""Event: a PDU and its ID, as a plain value that storage, rooms and sync all pass around.

How events are built, hashed, signed and redacted is room logic (homeserver/rooms/events.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from homeserver.core.identifiers import room_id_for_create_event


@dataclass(frozen=True)
class Event:
    """An event: its ID and its PDU. Treat `pdu` as read-only."""

    event_id: str
    pdu: dict = field(repr=False)

    @property
    def room_id(self) -> str:
        room_id = self.pdu.get("room_id")
        if room_id is None and self.pdu.get("type") == "m.room.create":
            # Room version 12: the create event has no room_id; its ID names the room.
            return room_id_for_create_event(self.event_id)
        return self.pdu["room_id"]

    @property
    def type(self) -> str:
        return self.pdu["type"]

    @property
    def state_key(self) -> str | None:
        return self.pdu.get("state_key")

    @property
    def is_state(self) -> bool:
        return "state_key" in self.pdu

    @property
    def sender(self) -> str:
        return self.pdu["sender"]

    @property
    def content(self) -> dict:
        return self.pdu["content"]

    @property
    def depth(self) -> int:
        return self.pdu["depth"]

    @property
    def origin_server_ts(self) -> int:
        return self.pdu["origin_server_ts"]

    @property
    def prev_event_ids(self) -> list[str]:
        # Room versions 1 and 2 name events as [event_id, {"sha256": ...}] pairs.
        return [p[0] if isinstance(p, list) else p for p in self.pdu["prev_events"]]

    @property
    def auth_event_ids(self) -> list[str]:
        return [p[0] if isinstance(p, list) else p for p in self.pdu["auth_events"]]

    @property
    def membership(self) -> str | None:
        if self.type == "m.room.member":
            value = self.content.get("membership")
            return value if isinstance(value, str) else None
        return None
