"""PlannedEvent: an event a service means to send, before it is built and signed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlannedEvent:
    """An event to send, before it has prev_events, auth or signatures."""

    sender: str
    event_type: str
    content: dict
    state_key: str | None = None
    redacts: str | None = None  # a redaction's top-level target (before v11)
