"""Events decoded from their stored JSON, kept in memory: a busy room's auth and state
events are read again for every event that arrives, and decoding them was most of it.

An entry is used only while the stored text is the same: a redaction rewrites the text, so
a redacted event is decoded afresh even if nobody dropped it (another process may have
redacted it). The cache holds at most `MAX_TEXT` characters of JSON, oldest use first out.
Callers treat the PDU as read-only (core/events.py), as they always had to.
"""

from __future__ import annotations

import json
from collections import OrderedDict

from homeserver.core.events import Event

MAX_TEXT = 16 * 1024 * 1024


class ParsedEvents:
    def __init__(self, max_text: int = MAX_TEXT):
        self.max_text = max_text
        self._entries: OrderedDict[str, tuple[str, Event]] = OrderedDict()
        self._text = 0
        self.hits = self.misses = 0

    def event(self, event_id: str, text: str) -> Event:
        entry = self._entries.get(event_id)
        if entry is not None and entry[0] == text:
            self._entries.move_to_end(event_id)
            self.hits += 1
            return entry[1]
        self.misses += 1
        event = Event(event_id, json.loads(text))
        self.drop(event_id)
        if len(text) <= self.max_text // 16:  # one huge event does not empty the cache
            self._entries[event_id] = (text, event)
            self._text += len(text)
            while self._text > self.max_text:
                _, (old, _) = self._entries.popitem(last=False)
                self._text -= len(old)
        return event

    def drop(self, event_id: str) -> None:
        entry = self._entries.pop(event_id, None)
        if entry is not None:
            self._text -= len(entry[0])

    def __len__(self) -> int:
        return len(self._entries)


# One per process: entries are checked against the text read, so any database may share it.
PARSED = ParsedEvents()
