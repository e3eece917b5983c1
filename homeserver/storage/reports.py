"""Content reports (0041_reports.sql): what local users reported to the server's admins,
an event, a room or a user, kept for the admins to read."""

from __future__ import annotations

from dataclasses import dataclass

from homeserver.storage.database import Database


@dataclass(frozen=True)
class Report:
    id: int
    reporter: str
    kind: str  # "event", "room" or "user"
    room_id: str | None
    event_id: str | None
    target_user_id: str | None
    reason: str | None
    score: int | None
    received_ts: int


_COLUMNS = "id, reporter, kind, room_id, event_id, target_user_id, reason, score, received_ts"


class ReportStore:
    def __init__(self, db: Database):
        self.db = db

    def add(
        self,
        reporter: str,
        kind: str,
        received_ts: int,
        *,
        room_id: str | None = None,
        event_id: str | None = None,
        target_user_id: str | None = None,
        reason: str | None = None,
        score: int | None = None,
    ) -> None:
        self.db.write(
            lambda tx: tx.execute(
                "INSERT INTO reports (reporter, kind, room_id, event_id, target_user_id,"
                " reason, score, received_ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (reporter, kind, room_id, event_id, target_user_id, reason, score, received_ts),
            )
        )

    def list(self, limit: int = 100, before_id: int | None = None) -> list[Report]:
        """The latest reports first, at most `limit`, those with an id below `before_id`
        when given (the next page of an admin's list)."""
        sql = f"SELECT {_COLUMNS} FROM reports"
        params: tuple = ()
        if before_id is not None:
            sql += " WHERE id < ?"
            params = (before_id,)
        rows = self.db.read(
            lambda tx: tx.fetchall(sql + " ORDER BY id DESC LIMIT ?", (*params, limit))
        )
        return [Report(*r) for r in rows]
