"""Reads of `event_search`, the full-text index of room events written with each event
(storage/event_rows.py): a page of the events matching a user's words in some rooms, best
match or newest first, and how many match in all.

A search term is user input: only its words reach the engine. On SQLite each word is an FTS5
string (quoted, so `OR`, `*` or `"` are words, never syntax); on PostgreSQL the words go
through plainto_tsquery, which takes any text."""

from __future__ import annotations

import re
from dataclasses import dataclass

from homeserver.storage.database import Database
from homeserver.storage.rooms import StoredEvent, _stored

_WORD = re.compile(r"\w+")
# The most words of a term used; the rest are ignored, so a term cannot make a huge query.
MAX_WORDS = 20


def search_words(term: str) -> list[str]:
    """The words of a search term, as the index splits text (letters and digits)."""
    return _WORD.findall(term)[:MAX_WORDS]


@dataclass(frozen=True)
class SearchQuery:
    room_ids: list[str]
    words: list[str]
    keys: list[str]
    recent: bool  # newest first; else best match first
    offset: int
    limit: int


@dataclass(frozen=True)
class Hit:
    stored: StoredEvent
    rank: float


class SearchStore:
    def __init__(self, db: Database):
        self.db = db

    def _where(self, q: SearchQuery) -> tuple[str, list]:
        rooms = ", ".join("?" for _ in q.room_ids)
        keys = ", ".join("?" for _ in q.keys)
        if self.db.dialect == "postgres":
            match = "s.vector @@ plainto_tsquery('english', ?)"
            text = " ".join(q.words)
        else:
            match = "event_search MATCH ?"
            text = " ".join(f'"{w}"' for w in q.words)
        where = f"{match} AND s.room_id IN ({rooms}) AND s.key IN ({keys})"
        return where, [text, *q.room_ids, *q.keys]

    def search(self, q: SearchQuery) -> tuple[list[Hit], int]:
        """A page of matching events from `offset`, and the count of all matches."""
        if not (q.words and q.room_ids and q.keys):
            return [], 0
        where, params = self._where(q)
        if self.db.dialect == "postgres":
            position = "s.stream_ordering"
            rank = "ts_rank(s.vector, plainto_tsquery('english', ?))"
            rank_params = [" ".join(q.words)]
        else:
            position = "s.rowid"
            rank, rank_params = "-bm25(event_search)", []  # bm25: lower is better
        order = "pos DESC" if q.recent else "score DESC, pos DESC"
        outer = "h.pos DESC" if q.recent else "h.score DESC, h.pos DESC"
        source = f"event_search s JOIN events e ON e.stream_ordering = {position}"
        # The page is ranked and cut on the index alone, then joined to its events: sorting
        # every match with its event's JSON took 40 ms for a word in 5,000 messages.
        sql = (
            "SELECT e.stream_ordering, h.score, e.event_id, e.json, e.unsigned FROM"
            f" (SELECT {position} AS pos, {rank} AS score FROM event_search s WHERE {where}"
            f" ORDER BY {order} LIMIT ? OFFSET ?) h"
            f" JOIN events e ON e.stream_ordering = h.pos ORDER BY {outer}"
        )
        count_sql = f"SELECT COUNT(*) FROM {source} WHERE {where}"

        def read(tx) -> tuple[list[Hit], int]:
            rows = tx.fetchall(sql, (*rank_params, *params, q.limit, q.offset))
            hits = [Hit(_stored((r[0], r[2], r[3], r[4])), float(r[1])) for r in rows]
            return hits, tx.fetchone(count_sql, params)[0]

        return self.db.read(read)
