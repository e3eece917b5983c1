"""Reading a room's events a page at a time: the event filter that /messages and /sync
apply, the stream-position tokens /messages takes and gives, and what a read returns."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from homeserver.core.errors import invalid_param
from homeserver.storage.rooms import StoredEvent

# `s<position>`, or a /sync token, which starts with the same event stream position: the spec
# lets /messages start from a sync's next_batch.
# History behind the timeline has negative positions (storage/history.py).
_TOKEN = re.compile(r"^s(-?\d{1,19})(?:_[0-9a-z_]{1,100})?$")


@dataclass(frozen=True)
class EventFilter:
    """The spec's EventFilter, plus RoomEventFilter's contains_url: what /messages and /sync
    apply to events (`*` is a wildcard in types). The store applies types and senders in SQL;
    the `keeps_*` methods apply the same rules to events already in memory."""

    types: tuple | None = None
    not_types: tuple = ()
    senders: tuple | None = None
    not_senders: tuple = ()
    limit: int | None = None
    contains_url: bool | None = None  # only events with (True) or without (False) content.url

    def keeps_type(self, event_type: str) -> bool:
        if self.types is not None and not any(_glob(t).fullmatch(event_type) for t in self.types):
            return False
        return not any(_glob(t).fullmatch(event_type) for t in self.not_types)

    def keeps_sender(self, sender: str) -> bool:
        if self.senders is not None and sender not in self.senders:
            return False
        return sender not in self.not_senders

    def keeps_content(self, content: dict) -> bool:
        return self.contains_url is None or ("url" in content) == self.contains_url

    @property
    def may_hide_events(self) -> bool:
        """Whether it may keep some of a room's events out (its limit aside)."""
        return (
            self.types is not None
            or bool(self.not_types)
            or self.senders is not None
            or bool(self.not_senders)
            or self.contains_url is not None
        )

    def keeps(self, stored: StoredEvent) -> bool:
        event = stored.event
        return (
            self.keeps_type(event.type)
            and self.keeps_sender(event.sender)
            and self.keeps_content(event.content)
        )


@functools.lru_cache(maxsize=1024)
def _glob(pattern: str) -> re.Pattern:
    """A filter's type pattern: `*` matches any run of characters, nothing else is special."""
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")), re.DOTALL)


@dataclass(frozen=True)
class MessagesPage:
    chunk: list[dict]
    start: str
    end: str | None


@dataclass(frozen=True)
class EventScan:
    """What `RoomService.visible_events` found: the events, where the scan stopped (the next
    position to read from, in the scan's direction) and whether it reached the end of its
    range."""

    events: list[StoredEvent]
    position: int
    exhausted: bool


def stream_token(position: int) -> str:
    """A /messages token: a stream position, stable across restarts."""
    return f"s{position}"


def parse_stream_token(token: str, name: str) -> int:
    match = _TOKEN.match(token)
    if match is None:
        raise invalid_param(f"{name} is not a valid pagination token")
    return int(match.group(1))
