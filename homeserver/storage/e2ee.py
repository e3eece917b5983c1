"""End-to-end encryption rows (0020_e2ee.sql): device keys, one-time and fallback keys,
cross-signing keys and signatures, the device list stream and to-device messages.

Keys are kept as the JSON their owner signed, never rebuilt: a signature covers every byte of
the canonical form. The device list and to-device streams take positions like the others
(storage/streams.py), so a sync token's parts mean the same after a restart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from homeserver.storage import streams
from homeserver.storage.database import Database, in_lists
from homeserver.storage.outbox import queue_edus

DEVICE_LISTS_STREAM = "device_lists"
TO_DEVICE_STREAM = "to_device"
# With other instances, each key write takes a position of it, with no row: the others count
# it a key write (`heard_key_writes`) when its NOTIFY arrives (sync/cluster.py).
KEY_WRITES_STREAM = "key_writes"


@dataclass(frozen=True)
class ToDeviceMessage:
    position: int
    sender: str
    type: str
    content: dict


@dataclass(frozen=True)
class DeviceSyncRead:
    """What a sync reads of one device (E2eeStore.device_sync_read)."""

    acknowledged_held: bool  # messages the token acknowledges are still stored
    to_device: list[ToDeviceMessage]
    one_time_key_counts: dict[str, int]
    unused_fallback_key_types: list[str]


@dataclass(frozen=True)
class Signature:
    target_user_id: str
    target_key_id: str
    signer_user_id: str
    signer_key_id: str
    signature: str


def _dumps(value) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def mark_changed(tx, user_ids: list[str]) -> int:
    """One device list position for these users' changes, in the caller's transaction."""
    position = streams.advance(tx, DEVICE_LISTS_STREAM)
    tx.executemany(
        "INSERT INTO device_list_changes (stream_position, user_id) VALUES (?, ?)",
        [(position, u) for u in sorted(set(user_ids))],
    )
    return position


def delete_device_rows(tx, user_id: str, device_id: str) -> bool:
    """Deletes a device's keys and pending to-device messages, in the caller's transaction
    (AccountStore.remove_device). True if it had device keys: others must hear of it."""
    had_keys = (
        tx.fetchone(
            "SELECT 1 FROM e2e_device_keys WHERE user_id = ? AND device_id = ?",
            (user_id, device_id),
        )
        is not None
    )
    for table in (
        "e2e_device_keys",
        "e2e_one_time_keys",
        "e2e_fallback_keys",
        "to_device_messages",
    ):
        tx.execute(f"DELETE FROM {table} WHERE user_id = ? AND device_id = ?", (user_id, device_id))
    tx.execute(
        "DELETE FROM e2e_signatures WHERE target_user_id = ? AND target_key_id = ?",
        (user_id, device_id),
    )
    if had_keys:
        mark_changed(tx, [user_id])
    return had_keys


class E2eeStore:
    def __init__(self, db: Database, keys_written_elsewhere: bool = False):
        self.db = db
        # One-time and fallback key writes, counted once each has ended: key counts read
        # before a count stayed are still current (sync/woken.py). Other instances' are
        # counted when heard, milliseconds after their commit: until then one answer's
        # counts may lag (docs/architecture.md, "What memory may not serve").
        # `keys_written_elsewhere`: other processes write keys unheard (federation shards
        # claim them), so no count is kept. Deleting a device is not counted: it is logged
        # out, and nothing it is told matters any more.
        self.key_writes = 0
        self.keys_written_elsewhere = keys_written_elsewhere

    def keys_unchanged_since(self, key_writes: int) -> bool:
        """Whether no key write ended since `key_writes` was read (a caller killed while
        its write commits may count it a moment early: one answer's counts then lag)."""
        return not self.keys_written_elsewhere and self.key_writes == key_writes

    def heard_key_writes(self) -> None:
        """Another instance wrote keys."""
        self.key_writes += 1

    def _write_keys(self, write):
        def announced(tx):
            written = write(tx)
            if tx.announce_as is not None:  # last: the stream's row is held until commit
                streams.take(tx, KEY_WRITES_STREAM)
            return written

        try:
            return self.db.write(announced)
        finally:
            self.key_writes += 1

    # --- devices ------------------------------------------------------------------------

    def devices(self, user_id: str) -> list[tuple[str, str | None, int | None]]:
        """(device_id, display_name, last_seen_ts) of the user's devices."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT device_id, display_name, last_seen_ts FROM devices WHERE user_id = ?"
                " ORDER BY device_id",
                (user_id,),
            )
        )
        return [tuple(r) for r in rows]

    def set_display_name(self, user_id: str, device_id: str, name: str | None) -> bool:
        def write(tx):
            cur = tx.execute(
                "UPDATE devices SET display_name = ? WHERE user_id = ? AND device_id = ?",
                (name, user_id, device_id),
            )
            if cur.rowcount != 1:
                return False
            # Other users see the name in /keys/query: a device with keys is a list change.
            if tx.fetchone(
                "SELECT 1 FROM e2e_device_keys WHERE user_id = ? AND device_id = ?",
                (user_id, device_id),
            ):
                mark_changed(tx, [user_id])
            return True

        return self.db.write(write)

    # --- device keys --------------------------------------------------------------------

    def put_device_keys(self, user_id: str, device_id: str, keys: dict) -> bool:
        """Stores the device's keys; True (and a device list change) if they are new."""
        text = _dumps(keys)

        def write(tx):
            row = tx.fetchone(
                "SELECT key_json FROM e2e_device_keys WHERE user_id = ? AND device_id = ?",
                (user_id, device_id),
            )
            if row is not None and row[0] == text:
                return False
            tx.execute(
                "INSERT INTO e2e_device_keys (user_id, device_id, key_json) VALUES (?, ?, ?)"
                " ON CONFLICT (user_id, device_id) DO UPDATE SET key_json = excluded.key_json",
                (user_id, device_id, text),
            )
            mark_changed(tx, [user_id])
            return True

        return self.db.write(write)

    def device_keys(self, user_id: str, device_id: str) -> dict | None:
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT key_json FROM e2e_device_keys WHERE user_id = ? AND device_id = ?",
                (user_id, device_id),
            )
        )
        return json.loads(row[0]) if row else None

    def query_device_keys(self, user_id: str) -> dict[str, tuple[dict, str | None]]:
        """{device_id: (keys, display name)} for the user's devices that have keys."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT k.device_id, k.key_json, d.display_name FROM e2e_device_keys k"
                " JOIN devices d ON d.user_id = k.user_id AND d.device_id = k.device_id"
                " WHERE k.user_id = ?",
                (user_id,),
            )
        )
        return {r[0]: (json.loads(r[1]), r[2]) for r in rows}

    # --- one-time and fallback keys -------------------------------------------------------

    def add_one_time_keys(
        self, user_id: str, device_id: str, keys: list[tuple[str, str, object]]
    ) -> list[str]:
        """Adds (algorithm, key_id, key) rows; returns `algorithm:key_id` of those that
        already exist with other content (nothing is stored then)."""

        def write(tx):
            conflicts, new = [], []
            for algorithm, key_id, key in keys:
                text = _dumps(key)
                row = tx.fetchone(
                    "SELECT key_json FROM e2e_one_time_keys WHERE user_id = ? AND device_id = ?"
                    " AND algorithm = ? AND key_id = ?",
                    (user_id, device_id, algorithm, key_id),
                )
                if row is None:
                    new.append((user_id, device_id, algorithm, key_id, text))
                elif row[0] != text:
                    conflicts.append(f"{algorithm}:{key_id}")
            if conflicts:
                return conflicts
            tx.executemany(
                "INSERT INTO e2e_one_time_keys (user_id, device_id, algorithm, key_id, key_json)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                new,
            )
            return []

        return self._write_keys(write)

    def one_time_key_counts(self, user_id: str, device_id: str) -> dict[str, int]:
        return self.db.read(lambda tx: _one_time_key_counts(tx, user_id, device_id))

    def set_fallback_keys(
        self, user_id: str, device_id: str, keys: list[tuple[str, str, object]]
    ) -> None:
        """Replaces the device's fallback key of each algorithm, unused again. The same key
        uploaded again keeps its used flag, as a client re-sends what it holds."""

        def write(tx):
            for algorithm, key_id, key in keys:
                tx.execute(
                    "INSERT INTO e2e_fallback_keys (user_id, device_id, algorithm, key_id,"
                    " key_json, used) VALUES (?, ?, ?, ?, ?, 0)"
                    " ON CONFLICT (user_id, device_id, algorithm) DO UPDATE"
                    " SET key_id = excluded.key_id, key_json = excluded.key_json, used = 0"
                    " WHERE e2e_fallback_keys.key_json <> excluded.key_json"
                    " OR e2e_fallback_keys.key_id <> excluded.key_id",
                    (user_id, device_id, algorithm, key_id, _dumps(key)),
                )

        self._write_keys(write)

    def unused_fallback_key_types(self, user_id: str, device_id: str) -> list[str]:
        return self.db.read(lambda tx: _unused_fallback_key_types(tx, user_id, device_id))

    def claim_key(self, user_id: str, device_id: str, algorithm: str) -> tuple[str, object] | None:
        """Takes one one-time key of the algorithm, or else the fallback key (which may be
        handed out again): (key_id, key), or None when the device has neither.

        The DELETE is what claims: of two claimants that picked the same row, one deletes
        it and the other deletes nothing (PostgreSQL waits for the first to commit, SQLite
        has one writer) and picks again, so no key is handed out twice.
        """

        def write(tx):
            while True:
                row = tx.fetchone(
                    "SELECT key_id FROM e2e_one_time_keys WHERE user_id = ? AND device_id = ?"
                    " AND algorithm = ? ORDER BY key_id LIMIT 1",
                    (user_id, device_id, algorithm),
                )
                if row is None:
                    break
                taken = tx.fetchone(
                    "DELETE FROM e2e_one_time_keys WHERE user_id = ? AND device_id = ?"
                    " AND algorithm = ? AND key_id = ? RETURNING key_json",
                    (user_id, device_id, algorithm, row[0]),
                )
                if taken is not None:
                    return row[0], json.loads(taken[0])
            fallback = tx.fetchone(
                "UPDATE e2e_fallback_keys SET used = 1 WHERE user_id = ? AND device_id = ?"
                " AND algorithm = ? RETURNING key_id, key_json",
                (user_id, device_id, algorithm),
            )
            return (fallback[0], json.loads(fallback[1])) if fallback else None

        return self._write_keys(write)

    # --- cross-signing ------------------------------------------------------------------

    def cross_signing_keys(self, user_id: str) -> dict[str, dict]:
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT key_type, key_json FROM e2e_cross_signing_keys WHERE user_id = ?",
                (user_id,),
            )
        )
        return {r[0]: json.loads(r[1]) for r in rows}

    def put_cross_signing_keys(self, user_id: str, keys: dict[str, dict]) -> None:
        def write(tx):
            for key_type, key in keys.items():
                tx.execute(
                    "INSERT INTO e2e_cross_signing_keys (user_id, key_type, key_json)"
                    " VALUES (?, ?, ?) ON CONFLICT (user_id, key_type) DO UPDATE"
                    " SET key_json = excluded.key_json",
                    (user_id, key_type, _dumps(key)),
                )
            if "master" in keys:
                # A new master key voids every signature made with or on the old one.
                tx.execute("DELETE FROM e2e_signatures WHERE target_user_id = ?", (user_id,))
            mark_changed(tx, [user_id])

        self.db.write(write)

    def put_signatures(self, signatures: list[Signature]) -> None:
        def write(tx):
            tx.executemany(
                "INSERT INTO e2e_signatures (target_user_id, target_key_id, signer_user_id,"
                " signer_key_id, signature) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (target_user_id, target_key_id, signer_user_id, signer_key_id)"
                " DO UPDATE SET signature = excluded.signature",
                [
                    (
                        s.target_user_id,
                        s.target_key_id,
                        s.signer_user_id,
                        s.signer_key_id,
                        s.signature,
                    )
                    for s in signatures
                ],
            )
            mark_changed(tx, [s.target_user_id for s in signatures])

        if signatures:
            self.db.write(write)

    def signatures_on(self, target_user_id: str) -> list[Signature]:
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT target_user_id, target_key_id, signer_user_id, signer_key_id, signature"
                " FROM e2e_signatures WHERE target_user_id = ?",
                (target_user_id,),
            )
        )
        return [Signature(*r) for r in rows]

    # --- device lists -------------------------------------------------------------------

    def changed_users(self, after: int, up_to: int, user_ids: list[str]) -> set[str]:
        """Which of `user_ids` changed their device list with `after < position <= up_to`."""
        found: set[str] = set()
        for chunk, marks in in_lists(user_ids):
            rows = self.db.read(
                lambda tx: tx.fetchall(
                    f"SELECT DISTINCT user_id FROM device_list_changes WHERE user_id IN ({marks})"
                    " AND stream_position > ? AND stream_position <= ?",
                    (*chunk, after, up_to),
                )
            )
            found.update(r[0] for r in rows)
        return found

    def users_sharing_a_room(self, user_id: str) -> set[str]:
        """Users joined to a room `user_id` is joined to, `user_id` included."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT DISTINCT b.state_key FROM current_state a JOIN current_state b"
                " ON b.room_id = a.room_id AND b.type = 'm.room.member' AND b.membership = 'join'"
                " WHERE a.state_key = ? AND a.type = 'm.room.member' AND a.membership = 'join'",
                (user_id,),
            )
        )
        return {r[0] for r in rows} | {user_id}

    def rooms_of(self, user_id: str) -> list[str]:
        """Rooms the user has any membership in."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT room_id FROM current_state WHERE state_key = ? AND type = 'm.room.member'",
                (user_id,),
            )
        )
        return [r[0] for r in rows]

    def members_ever(self, room_id: str) -> set[str]:
        """Users joined to the room now or before (one of them may just have left)."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT state_key FROM current_state WHERE room_id = ? AND type = 'm.room.member'"
                " AND membership IN ('join', 'leave', 'ban')",
                (room_id,),
            )
        )
        return {r[0] for r in rows}

    def membership_changes(
        self, room_ids: list[str], after: int, up_to: int
    ) -> list[tuple[str, str, str]]:
        """(room_id, user_id, membership) of member events in `room_ids` with
        `after < stream_ordering <= up_to`, oldest first."""
        return self.db.read(E2eeStore.member_moves, room_ids, after, up_to)

    @staticmethod
    def member_moves(tx, room_ids: list[str], after: int, up_to: int) -> list[tuple[str, str, str]]:
        """`membership_changes` inside a caller's transaction (storage/sync.py's snapshot)."""
        found: list[tuple[str, str, str]] = []
        for chunk, marks in in_lists(room_ids):
            rows = tx.fetchall(
                "SELECT room_id, state_key, membership FROM events"
                f" WHERE room_id IN ({marks}) AND type = 'm.room.member'"
                " AND stream_ordering > ? AND stream_ordering <= ? ORDER BY stream_ordering",
                (*chunk, after, up_to),
            )
            found += [tuple(r) for r in rows]
        return found

    # --- to-device messages -------------------------------------------------------------

    def send_to_device(
        self,
        sender: tuple[str, str],
        txn_id: str,
        event_type: str,
        messages: list[tuple[str, str, dict]],
        max_pending: int,
        now_ms: int,
        remote_edus: Sequence[tuple[str, str, dict]] = (),
        max_queued_edus: int = 0,
    ) -> tuple[bool, list[tuple[str, str]], list[tuple[str, str]]]:
        """Stores (user_id, device_id, content) messages from `sender` (user, device) once
        per transaction ID, and queues the `remote_edus` (destination, type, content) for
        other servers' devices in the same write. Returns (stored now, devices skipped as
        full, EDUs left out): a device that already holds `max_pending` undelivered messages
        gets no more, and a server owed `max_queued_edus` EDUs neither
        (storage/outbox.py, `queue_edus`)."""

        def write(tx):
            fresh = tx.fetchone(
                "INSERT INTO to_device_txns (user_id, device_id, txn_id, created_ts)"
                " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING txn_id",
                (*sender, txn_id, now_ms),
            )
            if fresh is None:
                return False, [], []
            rows, full = [], []
            for user_id, device_id, content in messages:
                pending = tx.fetchone(
                    "SELECT COUNT(*) FROM to_device_messages WHERE user_id = ? AND device_id = ?",
                    (user_id, device_id),
                )[0]
                if pending >= max_pending:
                    full.append((user_id, device_id))
                    continue
                rows.append((user_id, device_id, _dumps(content)))
            if rows:
                last = streams.advance(tx, TO_DEVICE_STREAM, len(rows))
                tx.executemany(
                    "INSERT INTO to_device_messages (stream_position, user_id, device_id,"
                    " sender, type, content) VALUES (?, ?, ?, ?, ?, ?)",
                    [
                        (last - len(rows) + 1 + i, u, d, sender[0], event_type, c)
                        for i, (u, d, c) in enumerate(rows)
                    ],
                )
            return True, full, queue_edus(tx, remote_edus, max_queued_edus)

        return self.db.write(write)

    def to_device_messages(
        self, user_id: str, device_id: str, after: int, up_to: int, limit: int
    ) -> list[ToDeviceMessage]:
        return self.db.read(
            lambda tx: _to_device_messages(tx, user_id, device_id, after, up_to, limit)
        )

    def delete_to_device(self, user_id: str, device_id: str, up_to: int) -> None:
        """The device acknowledged everything up to `up_to` (its next sync's `since`). Read
        first: most syncs acknowledge nothing new, and a write would queue them all behind
        SQLite's one writer."""
        if self.db.read(lambda tx: _holds_to_device(tx, user_id, device_id, up_to)):
            self.forget_to_device(user_id, device_id, up_to)

    def forget_to_device(self, user_id: str, device_id: str, up_to: int) -> None:
        self.db.write(
            lambda tx: tx.execute(
                f"DELETE FROM to_device_messages {_UP_TO}", (user_id, device_id, up_to)
            )
        )

    def device_sync_read(
        self,
        user_id: str,
        device_id: str,
        acknowledged: int | None,
        span: tuple[int, int],
        limit: int,
    ) -> DeviceSyncRead:
        """What a sync sends of one device, in one read: one hop through the database's
        thread pool instead of four, for every sync an event wakes. `acknowledged`: the
        to-device position the device's token acknowledges (None for an initial sync);
        `span`: the (after, up_to] of to-device messages to send."""
        after, up_to = span

        def read(tx) -> DeviceSyncRead:
            return DeviceSyncRead(
                acknowledged is not None and _holds_to_device(tx, user_id, device_id, acknowledged),
                _to_device_messages(tx, user_id, device_id, after, up_to, limit)
                if up_to > after
                else [],
                _one_time_key_counts(tx, user_id, device_id),
                _unused_fallback_key_types(tx, user_id, device_id),
            )

        return self.db.read(read)

    def key_counts(self, user_id: str, device_id: str) -> tuple[dict[str, int], list[str]]:
        """The device's one-time key counts and unused fallback key types, in one read."""
        return self.db.read(
            lambda tx: (
                _one_time_key_counts(tx, user_id, device_id),
                _unused_fallback_key_types(tx, user_id, device_id),
            )
        )

    def key_counts_of(
        self, devices: list[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[dict[str, int], list[str]]]:
        """`key_counts` of several (user_id, device_id) at once."""
        found: dict = {device: ({}, []) for device in devices}

        def read(tx) -> None:
            users = sorted({user_id for user_id, _ in devices})
            for chunk, marks in in_lists(users):
                for user_id, device_id, algorithm, count in tx.fetchall(
                    "SELECT user_id, device_id, algorithm, COUNT(*) FROM e2e_one_time_keys"
                    f" WHERE user_id IN ({marks}) GROUP BY user_id, device_id, algorithm",
                    chunk,
                ):
                    if (user_id, device_id) in found:
                        found[user_id, device_id][0][algorithm] = count
                for user_id, device_id, algorithm in tx.fetchall(
                    "SELECT user_id, device_id, algorithm FROM e2e_fallback_keys"
                    f" WHERE user_id IN ({marks}) AND used = 0 ORDER BY algorithm",
                    chunk,
                ):
                    if (user_id, device_id) in found:
                        found[user_id, device_id][1].append(algorithm)

        if devices:
            self.db.read(read)
        return found


_UP_TO = "WHERE user_id = ? AND device_id = ? AND stream_position <= ?"


def _holds_to_device(tx, user_id: str, device_id: str, up_to: int) -> bool:
    row = tx.fetchone(
        f"SELECT 1 FROM to_device_messages {_UP_TO} LIMIT 1", (user_id, device_id, up_to)
    )
    return row is not None


def _to_device_messages(tx, user_id: str, device_id: str, after: int, up_to: int, limit: int):
    rows = tx.fetchall(
        "SELECT stream_position, sender, type, content FROM to_device_messages"
        " WHERE user_id = ? AND device_id = ? AND stream_position > ?"
        " AND stream_position <= ? ORDER BY stream_position LIMIT ?",
        (user_id, device_id, after, up_to, limit),
    )
    return [ToDeviceMessage(r[0], r[1], r[2], json.loads(r[3])) for r in rows]


def _one_time_key_counts(tx, user_id: str, device_id: str) -> dict[str, int]:
    rows = tx.fetchall(
        "SELECT algorithm, COUNT(*) FROM e2e_one_time_keys"
        " WHERE user_id = ? AND device_id = ? GROUP BY algorithm",
        (user_id, device_id),
    )
    return {r[0]: r[1] for r in rows}


def _unused_fallback_key_types(tx, user_id: str, device_id: str) -> list[str]:
    rows = tx.fetchall(
        "SELECT algorithm FROM e2e_fallback_keys WHERE user_id = ? AND device_id = ?"
        " AND used = 0 ORDER BY algorithm",
        (user_id, device_id),
    )
    return [r[0] for r in rows]
