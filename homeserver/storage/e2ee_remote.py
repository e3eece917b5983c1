"""End-to-end encryption over federation (0023_e2ee_federation.sql): other servers' users'
device lists as we cache them, and the stream IDs of our users' device list updates as we
send them.

A cached list is the JSON its server sent (device keys are signed objects, kept byte for
byte): ``{"devices": {device_id: keys}, "master_key": ..., "self_signing_key": ...}``.
Every change to a cached list also takes a device list position (storage/e2ee.py), so our
users' /sync ``device_lists.changed`` names the remote user.
"""

from __future__ import annotations

import json

from homeserver.storage.database import Database
from homeserver.storage.e2ee import mark_changed
from homeserver.storage.outbox import queue_edus


def _dumps(value) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


class RemoteDeviceStore:
    def __init__(self, db: Database):
        self.db = db

    # --- our users, as other servers see them ------------------------------------------

    def latest_position(self, user_id: str) -> int:
        """The user's newest device list position: /user/devices' `stream_id`."""
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT MAX(stream_position) FROM device_list_changes WHERE user_id = ?",
                (user_id,),
            )
        )
        return int(row[0]) if row and row[0] is not None else 0

    def next_outbound(self, user_id: str) -> tuple[int, list[int]]:
        """(stream_id, prev_id) for the m.device_list_update EDUs of the user's newest
        change. Several changes read at once share the newest position and its prev_id."""
        return self.db.write(lambda tx: _next_outbound(tx, user_id))

    def queue_device_updates(
        self, user_id: str, servers: list[str], updates: list[dict], max_queued_edus: int
    ) -> tuple[list[tuple[str, str, dict]], list[tuple[str, str]]]:
        """`next_outbound`, and in the same write an m.device_list_update EDU per update
        (its device_id, and keys or deleted) to each server, in the federation sender's
        outbox: the chain of prev_ids never names an update that was not queued. Returns
        the EDUs, and those left out (storage/outbox.py, `queue_edus`)."""

        def write(tx):
            stream_id, prev = _next_outbound(tx, user_id)
            edus = [
                (
                    server,
                    "m.device_list_update",
                    {"user_id": user_id, **update, "stream_id": stream_id, "prev_id": prev},
                )
                for update in updates
                for server in servers
            ]
            return edus, queue_edus(tx, edus, max_queued_edus)

        return self.db.write(write)

    # --- other servers' users -----------------------------------------------------------

    def cached(self, user_id: str) -> tuple[int, dict] | None:
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT stream_id, devices FROM e2e_remote_device_lists WHERE user_id = ?",
                (user_id,),
            )
        )
        return (int(row[0]), json.loads(row[1])) if row else None

    def put(self, user_id: str, stream_id: int, devices: dict) -> None:
        """Caches the user's list (replacing any), and marks the user changed."""

        def write(tx):
            tx.execute(
                "INSERT INTO e2e_remote_device_lists (user_id, stream_id, devices)"
                " VALUES (?, ?, ?) ON CONFLICT (user_id) DO UPDATE"
                " SET stream_id = excluded.stream_id, devices = excluded.devices",
                (user_id, stream_id, _dumps(devices)),
            )
            mark_changed(tx, [user_id])

        self.db.write(write)

    def forget(self, user_id: str, changed: bool = True) -> None:
        """Drops the user's cached list (it is stale); `changed` marks the user changed."""

        def write(tx):
            tx.execute("DELETE FROM e2e_remote_device_lists WHERE user_id = ?", (user_id,))
            if changed:
                mark_changed(tx, [user_id])

        self.db.write(write)

    def is_joined_anywhere(self, user_id: str) -> bool:
        """The user is joined to a room we hold: their server sends us their updates."""
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT 1 FROM current_state WHERE state_key = ? AND type = 'm.room.member'"
                " AND membership = 'join' LIMIT 1",
                (user_id,),
            )
        )
        return row is not None

    def mark_changed(self, user_ids: list[str]) -> None:
        """The users' keys changed and we cache nothing of them: clients ask again."""
        if user_ids:
            self.db.write(lambda tx: mark_changed(tx, user_ids))


def _next_outbound(tx, user_id: str) -> tuple[int, list[int]]:
    row = tx.fetchone(
        "SELECT MAX(stream_position) FROM device_list_changes WHERE user_id = ?",
        (user_id,),
    )
    latest = int(row[0]) if row and row[0] is not None else 0
    sent = tx.fetchone(
        "SELECT stream_id, prev_id FROM e2e_device_list_outbound WHERE user_id = ?",
        (user_id,),
    )
    if sent is not None and int(sent[0]) >= latest:
        return int(sent[0]), json.loads(sent[1])
    prev = [int(sent[0])] if sent is not None else []
    tx.execute(
        "INSERT INTO e2e_device_list_outbound (user_id, stream_id, prev_id)"
        " VALUES (?, ?, ?) ON CONFLICT (user_id) DO UPDATE"
        " SET stream_id = excluded.stream_id, prev_id = excluded.prev_id",
        (user_id, latest, _dumps(prev)),
    )
    return latest, prev
