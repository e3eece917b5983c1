"""What /sync reads besides room events: stream positions, stored filters, account data and
read receipts.

Account data and receipts each have a stream (0008_sync.sql). A write takes the next position
of its stream in the same transaction (storage/streams.py), so positions commit in order and
"changed after position N" is a range query on `stream_position`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from homeserver.core.events import Event
from homeserver.storage import streams
from homeserver.storage.database import Database, in_lists
from homeserver.storage.e2ee import DEVICE_LISTS_STREAM, TO_DEVICE_STREAM, E2eeStore
from homeserver.storage.presence import PRESENCE_STREAM
from homeserver.storage.remote_invites import RemoteInviteStore
from homeserver.storage.rooms import EVENTS_STREAM, RoomStore

ACCOUNT_DATA_STREAM = "account_data"
# A room's tags are its `m.tag` account data (client-server spec, "Room Tagging").
TAG_TYPE = "m.tag"
RECEIPTS_STREAM = "receipts"
_STREAMS = (
    EVENTS_STREAM,
    ACCOUNT_DATA_STREAM,
    RECEIPTS_STREAM,
    TO_DEVICE_STREAM,
    DEVICE_LISTS_STREAM,
    PRESENCE_STREAM,
)


@dataclass(frozen=True)
class StreamPositions:
    """The persisted streams' positions, read together in one transaction."""

    events: int
    account_data: int
    receipts: int
    to_device: int
    device_lists: int
    presence: int


def read_positions(tx) -> StreamPositions:
    rows = dict(tx.fetchall("SELECT stream_name, position FROM stream_positions"))
    return StreamPositions(*(rows[name] for name in _STREAMS))


@dataclass(frozen=True)
class AccountData:
    room_id: str  # "" for global account data
    type: str
    content: dict


@dataclass(frozen=True)
class Receipt:
    room_id: str
    receipt_type: str
    user_id: str
    thread_id: str  # "" for an unthreaded receipt
    event_id: str
    ts: int


@dataclass(frozen=True)
class SyncSnapshot:
    """Where a sync reads up to, and the user's rooms there."""

    positions: StreamPositions
    # (room_id, membership, position of the member event) for every room the user has a
    # membership in; a position past `positions.events` was written after they were read.
    memberships: list[tuple[str, str, int]]
    # Of the rooms joined at `positions.events` and kept by the filter, those with events
    # after the token's position; None for an initial sync.
    rooms_with_events: set[str] | None
    # Invites to, knocks on, and their ends (a rejection, a rescinded knock) in rooms this
    # server is not in (they are among `memberships`), by room: for an invite or a knock
    # the stripped state to show, the user's own event last; for a leave, the event.
    out_of_room: dict[str, list[dict] | Event] = field(default_factory=dict)
    # Member events after the token's position in the rooms the user has a membership in,
    # (room_id, user_id, membership) oldest first: what device list changes are made of
    # (e2ee/sync_part.py). None for an initial sync.
    member_moves: list[tuple[str, str, str]] | None = None
    # For each room of `rooms_with_events`, the `RoomStore.history_keys` state changes: the
    # history view a woken sync needs to look into the room, without a hop of its own.
    history: dict[str, dict] = field(default_factory=dict)


def _stripped(pdu: dict) -> dict:
    return {k: pdu[k] for k in ("type", "state_key", "sender", "content") if k in pdu}


class SyncStore:
    def __init__(self, db: Database):
        self.db = db

    def snapshot(self, user_id: str, events_after: int | None, keeps_room) -> SyncSnapshot:
        """Everything a sync needs before it looks into rooms, in one read transaction: the
        waking of a thousand syncs at once is bounded by database round trips."""

        def read(tx):
            positions = read_positions(tx)
            every = memberships_in(tx, user_id)
            # A forgotten room is out of the sync; its member moves still count for device
            # lists (the user's leave is one).
            memberships = [(r, m, at) for r, m, at, forgotten in every if not forgotten]
            with_events = moves = None
            history: dict[str, dict] = {}
            if events_after is not None:
                # Read here rather than by the e2ee part, to save each woken sync a hop.
                moves = E2eeStore.member_moves(
                    tx, [r[0] for r in every], events_after, positions.events
                )
                joined = [
                    room_id
                    for room_id, membership, at in memberships
                    if membership == "join" and at <= positions.events and keeps_room(room_id)
                ]
                with_events = rooms_with_events_in(tx, joined, events_after, positions.events)
                keys = RoomStore.history_keys(user_id)
                history = {r: RoomStore.state_changes_in(tx, r, keys) for r in with_events}
            remote = _remote_memberships(tx, user_id, positions.events)
            memberships += [(r.room_id, r.membership, r.stream_ordering) for r in remote]
            out_of_room = {
                r.room_id: (
                    r.event
                    if r.membership == "leave"
                    else [*r.invite_room_state, _stripped(r.event.pdu)]
                )
                for r in remote
            }
            return SyncSnapshot(positions, memberships, with_events, out_of_room, moves, history)

        return self.db.read(read)

    # --- filters ------------------------------------------------------------------------

    def add_filter(self, user_id: str, filter_json: str, now_ms: int) -> str:
        """Stores a filter (canonical JSON) and returns its ID; the same filter uploaded
        again by the same user gets the same ID."""
        digest = hashlib.sha256(filter_json.encode("utf-8")).hexdigest()

        def write(tx):
            tx.execute(
                "INSERT INTO user_filters (user_id, filter_hash, filter_json, created_ts)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (user_id, filter_hash) DO NOTHING",
                (user_id, digest, filter_json, now_ms),
            )
            return tx.fetchone(
                "SELECT filter_id FROM user_filters WHERE user_id = ? AND filter_hash = ?",
                (user_id, digest),
            )[0]

        return str(self.db.write(write))

    def get_filter(self, user_id: str, filter_id: int) -> str | None:
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT filter_json FROM user_filters WHERE filter_id = ? AND user_id = ?",
                (filter_id, user_id),
            )
        )
        return row[0] if row else None

    # --- account data -------------------------------------------------------------------

    def put_account_data(self, user_id: str, room_id: str, data_type: str, content: dict) -> int:
        """Sets one account data type (room_id "" for global); returns its stream position."""
        text = json.dumps(content, separators=(",", ":"))

        def write(tx):
            position = streams.advance(tx, ACCOUNT_DATA_STREAM)
            tx.execute(
                "INSERT INTO account_data (user_id, room_id, type, content, stream_position)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (user_id, room_id, type) DO UPDATE"
                " SET content = excluded.content, stream_position = excluded.stream_position",
                (user_id, room_id, data_type, text, position),
            )
            return position

        return self.db.write(write)

    def get_account_data(self, user_id: str, room_id: str, data_type: str) -> dict | None:
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT content FROM account_data WHERE user_id = ? AND room_id = ? AND type = ?",
                (user_id, room_id, data_type),
            )
        )
        return json.loads(row[0]) if row else None

    def account_data_changes(self, user_id: str, after: int, up_to: int) -> list[AccountData]:
        """The user's account data set with `after < position <= up_to`, global and per
        room, in the order it was set."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT room_id, type, content FROM account_data WHERE user_id = ?"
                " AND stream_position > ? AND stream_position <= ? ORDER BY stream_position",
                (user_id, after, up_to),
            )
        )
        return [AccountData(r[0], r[1], json.loads(r[2])) for r in rows]

    def update_room_tag(self, user_id: str, room_id: str, tag: str, content: dict | None) -> bool:
        """Sets (`content`) or removes (None) one tag of the room's `m.tag` account data, in
        one write; returns whether anything changed. Concurrent updates for one user must be
        serialised by the caller: on PostgreSQL two writes could each miss the other's tag."""

        def write(tx) -> bool:
            row = tx.fetchone(
                "SELECT content FROM account_data WHERE user_id = ? AND room_id = ? AND type = ?",
                (user_id, room_id, TAG_TYPE),
            )
            # Written whole through the account data API, it may hold anything.
            found = json.loads(row[0]).get("tags") if row else None
            tags = dict(found) if isinstance(found, dict) else {}
            if tags.get(tag) == content:
                return False
            if content is None:
                del tags[tag]
            else:
                tags[tag] = content
            text = json.dumps({"tags": tags}, separators=(",", ":"))
            tx.execute(
                "INSERT INTO account_data (user_id, room_id, type, content, stream_position)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (user_id, room_id, type) DO UPDATE"
                " SET content = excluded.content, stream_position = excluded.stream_position",
                (user_id, room_id, TAG_TYPE, text, streams.advance(tx, ACCOUNT_DATA_STREAM)),
            )
            return True

        return self.db.write(write)

    def membership_of(self, user_id: str, room_id: str) -> str | None:
        """The user's latest membership in the room (`latest_membership`), if any."""
        found = self.db.read(lambda tx: latest_membership(tx, user_id, room_id))
        return found[0] if found else None

    # --- forgotten rooms ----------------------------------------------------------------

    def forget_room(self, user_id: str, room_id: str, now_ms: int) -> str | None:
        """Forgets the room for the user at their latest member event, unless it says they
        are in the room (join), invited or knocking; returns that membership (None when
        they have never had one: nothing to forget)."""

        def write(tx) -> str | None:
            latest = latest_membership(tx, user_id, room_id)
            if latest is None or latest[0] in ("join", "invite", "knock"):
                return latest[0] if latest else None
            tx.execute(
                "INSERT INTO forgotten_rooms (user_id, room_id, event_id, forgotten_ts)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (user_id, room_id) DO UPDATE"
                " SET event_id = excluded.event_id, forgotten_ts = excluded.forgotten_ts",
                (user_id, room_id, latest[1], now_ms),
            )
            return latest[0]

        return self.db.write(write)

    # --- receipts -----------------------------------------------------------------------

    def put_receipt(self, receipt: Receipt) -> int | None:
        """Moves the user's receipt forward to `receipt.event_id`; returns the new stream
        position, or None when the receipt already points at that event or a later one, or
        the event is not one of the room's shown events."""
        return self.db.write(lambda tx: self._put_receipt_in(tx, receipt))

    def put_receipts(self, receipts: list[Receipt]) -> list[Receipt]:
        """`put_receipt` for each, in one write transaction (a remote server's batch);
        returns those that moved."""
        return self.db.write(
            lambda tx: [r for r in receipts if self._put_receipt_in(tx, r) is not None]
        )

    @staticmethod
    def _put_receipt_in(tx, receipt: Receipt) -> int | None:
        # Soft-failed events and outliers are hidden from clients: a receipt would point at nothing.
        row = tx.fetchone(
            "SELECT stream_ordering FROM events"
            " WHERE event_id = ? AND room_id = ? AND soft_failed = 0 AND outlier = 0",
            (receipt.event_id, receipt.room_id),
        )
        if row is None:
            return None
        ordering = row[0]
        current = tx.fetchone(
            "SELECT event_stream_ordering FROM receipts WHERE room_id = ?"
            " AND receipt_type = ? AND user_id = ? AND thread_id = ?",
            (receipt.room_id, receipt.receipt_type, receipt.user_id, receipt.thread_id),
        )
        if current is not None and current[0] >= ordering:
            return None
        position = streams.advance(tx, RECEIPTS_STREAM)
        # Checked again as it is written: on PostgreSQL another write may have committed
        # a later receipt since `current` was read (then this position stays unused).
        moved = tx.fetchone(
            "INSERT INTO receipts (room_id, receipt_type, user_id, thread_id, event_id,"
            " event_stream_ordering, ts, stream_position) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (room_id, receipt_type, user_id, thread_id) DO UPDATE"
            " SET event_id = excluded.event_id,"
            " event_stream_ordering = excluded.event_stream_ordering,"
            " ts = excluded.ts, stream_position = excluded.stream_position"
            " WHERE receipts.event_stream_ordering < excluded.event_stream_ordering"
            " RETURNING stream_position",
            (
                receipt.room_id,
                receipt.receipt_type,
                receipt.user_id,
                receipt.thread_id,
                receipt.event_id,
                ordering,
                receipt.ts,
                position,
            ),
        )
        return position if moved else None

    def receipt_changes(self, room_ids: list[str], after: int, up_to: int) -> list[Receipt]:
        """Receipts in `room_ids` set with `after < position <= up_to`."""
        found: list[Receipt] = []
        for chunk, marks in in_lists(room_ids):
            rows = self.db.read(
                lambda tx: tx.fetchall(
                    "SELECT room_id, receipt_type, user_id, thread_id, event_id, ts FROM receipts"
                    f" WHERE room_id IN ({marks}) AND stream_position > ? AND stream_position <= ?"
                    " ORDER BY stream_position",
                    (*chunk, after, up_to),
                )
            )
            found += [Receipt(*r) for r in rows]
        return found


def memberships_in(tx, user_id: str) -> list[tuple[str, str, int, bool]]:
    """(room_id, membership, stream position of that member event, whether the user forgot
    the room at that event) for every room the user has a member event in, whatever it
    says now."""
    return [
        (r[0], r[1], r[2], bool(r[3]))
        for r in tx.fetchall(
            "SELECT c.room_id, c.membership, e.stream_ordering, EXISTS (SELECT 1"
            " FROM forgotten_rooms f WHERE f.user_id = c.state_key AND f.room_id = c.room_id"
            " AND f.event_id = c.event_id) FROM current_state c"
            " JOIN events e ON e.event_id = c.event_id"
            " WHERE c.state_key = ? AND c.type = 'm.room.member' ORDER BY c.room_id",
            (user_id,),
        )
    ]


def _remote_memberships(tx, user_id: str, up_to: int) -> list:
    """The user's remote invites and knocks, and their ends, at or before `up_to`, but for
    an end the user has forgotten."""
    remote = [r for r in RemoteInviteStore.invites_in(tx, user_id) if r.stream_ordering <= up_to]
    if not any(r.membership == "leave" for r in remote):
        return remote
    forgotten = {
        row[0]
        for row in tx.fetchall("SELECT event_id FROM forgotten_rooms WHERE user_id = ?", (user_id,))
    }
    return [r for r in remote if r.event.event_id not in forgotten]


def latest_membership(tx, user_id: str, room_id: str) -> tuple[str, str] | None:
    """(membership, event_id) of the user's latest member event in the room: their event in
    its state, or a remote invite's or knock's (or its end's) when that is newer."""
    found = tx.fetchall(
        "SELECT c.membership, c.event_id, e.stream_ordering FROM current_state c"
        " JOIN events e ON e.event_id = c.event_id"
        " WHERE c.room_id = ? AND c.type = 'm.room.member' AND c.state_key = ?"
        " UNION ALL SELECT membership, event_id, stream_ordering FROM remote_invites"
        " WHERE room_id = ? AND user_id = ?",
        (room_id, user_id, room_id, user_id),
    )
    if not found:
        return None
    membership, event_id, _ = max(found, key=lambda r: r[2])
    return membership, event_id


def rooms_with_events_in(tx, room_ids: list[str], after: int, up_to: int) -> set[str]:
    """Which of `room_ids` have events with `after < stream_ordering <= up_to`: one index
    probe per room, however long the range."""
    found: set[str] = set()
    for chunk, marks in in_lists(room_ids):
        found.update(
            r[0]
            for r in tx.fetchall(
                f"SELECT DISTINCT room_id FROM events WHERE room_id IN ({marks})"
                " AND stream_ordering > ? AND stream_ordering <= ? AND soft_failed = 0",
                (*chunk, after, up_to),
            )
        )
    return found
