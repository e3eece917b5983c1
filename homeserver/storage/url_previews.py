"""Link previews as fetched (0062_url_previews.sql): the Open Graph object of a URL at each
time it was fetched, and the one to answer for a time."""

from __future__ import annotations

import json
from dataclasses import dataclass

from homeserver.storage.database import Database


@dataclass(frozen=True)
class StoredPreview:
    fetched_ts: int
    expires_ts: int
    og: dict


class UrlPreviewStore:
    def __init__(self, db: Database):
        self.db = db

    def add(self, url: str, fetched_ts: int, expires_ts: int, og: dict) -> None:
        self.db.write(
            lambda tx: tx.execute(
                "INSERT INTO url_previews (url, fetched_ts, expires_ts, og) VALUES (?, ?, ?, ?)",
                (url, fetched_ts, expires_ts, json.dumps(og)),
            )
        )

    def valid_at(self, url: str, ts: int) -> StoredPreview | None:
        """The newest preview of `url` fetched at or before `ts` and still fresh then."""
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT fetched_ts, expires_ts, og FROM url_previews"
                " WHERE url = ? AND fetched_ts <= ? AND expires_ts > ?"
                " ORDER BY fetched_ts DESC LIMIT 1",
                (url, ts, ts),
            )
        )
        if row is None:
            return None
        return StoredPreview(int(row[0]), int(row[1]), json.loads(row[2]))
