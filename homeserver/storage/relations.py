"""Reads of `event_relations` (written with each event, storage/event_rows.py): an event's
children a page at a time, the rows of bundled aggregations for a page of parents (one query
per kind, whatever the page's size) and a room's threads by their latest activity.

Rows are read by parent ID, and the room is checked on the relation row: a relation names
an event of its own room only, as the spec says."""

from __future__ import annotations

from dataclasses import dataclass

from homeserver.storage.database import Database, in_lists
from homeserver.storage.rooms import StoredEvent, _stored

REPLACE = "m.replace"
REFERENCE = "m.reference"
# /relations with recurse follows relations of relations this deep, as Synapse does.
MAX_RECURSION_DEPTH = 3
_EVENT = "e.stream_ordering, e.event_id, e.json, e.unsigned"


def _in_room(alias: str) -> str:
    """The room check of a read by parent. SQLite, without statistics, would rather walk the
    whole room's rows in the threads index (room_id first) than look up the parents: 10 ms
    for a page in a room of 12,000 relations. An expression is no indexed column, so both
    engines look up the parents by `event_relations_by_parent`."""
    return f"{alias}.room_id || '' = ?"


@dataclass(frozen=True)
class ChildQuery:
    """Which children of `parent_id` one page of /relations reads: `low < position <= high`,
    newest first when `backwards`."""

    room_id: str
    parent_id: str
    rel_type: str | None
    event_type: str | None
    recurse: bool
    low: int
    high: int
    backwards: bool
    limit: int


@dataclass(frozen=True)
class ThreadRow:
    """A thread as its stored rows say: its events, its latest, and whether the user sent
    one of them."""

    count: int
    latest: StoredEvent
    participated: bool


class RelationStore:
    def __init__(self, db: Database):
        self.db = db

    def children(self, q: ChildQuery) -> list[StoredEvent]:
        where = [_in_room("r"), "r.stream_ordering > ?", "r.stream_ordering <= ?"]
        params: list = [q.room_id, q.low, q.high]
        if q.rel_type is not None:
            where.append("r.rel_type = ?")
            params.append(q.rel_type)
        if q.event_type is not None:
            where.append("r.type = ?")
            params.append(q.event_type)
        order = "DESC" if q.backwards else "ASC"
        if q.recurse:
            # Children, their children and theirs: a tree, each event with one parent.
            source = (
                "WITH RECURSIVE related (event_id, depth) AS ("
                " SELECT event_id, 1 FROM event_relations p"
                f" WHERE relates_to_id = ? AND {_in_room('p')}"
                " UNION SELECT c.event_id, related.depth + 1 FROM event_relations c"
                " JOIN related ON c.relates_to_id = related.event_id"
                f" WHERE related.depth < {MAX_RECURSION_DEPTH} AND {_in_room('c')})"
                f" SELECT DISTINCT {_EVENT} FROM related"
                " JOIN event_relations r ON r.event_id = related.event_id"
            )
            params = [q.parent_id, q.room_id, q.room_id, *params]
        else:
            source = f"SELECT {_EVENT} FROM event_relations r"
            where.insert(0, "r.relates_to_id = ?")
            params.insert(0, q.parent_id)
        sql = (
            f"{source} JOIN events e ON e.event_id = r.event_id WHERE {' AND '.join(where)}"
            f" ORDER BY e.stream_ordering {order} LIMIT ?"
        )
        rows = self.db.read(lambda tx: tx.fetchall(sql, (*params, q.limit)))
        return [_stored(r) for r in rows]

    # --- bundled aggregations: each a query for a whole page of parents ----------------------

    def aggregation_rows(
        self, room_id: str, parent_ids: list[str], user_id: str
    ) -> tuple[dict[str, StoredEvent], dict[str, ThreadRow], dict[str, list[str]]]:
        """For the parents of one page: the latest edit of each by its sender with its type
        (by origin_server_ts, then event ID, as the spec says), each thread's row, and the
        IDs of the events that reference each. One read, three queries."""

        def read(tx):
            return (
                edits_of(tx, room_id, parent_ids),
                _threads_of(tx, room_id, parent_ids, user_id),
                _references_of(tx, room_id, parent_ids),
            )

        return self.db.read(read)

    def edits(self, room_id: str, parent_ids: list[str]) -> dict[str, StoredEvent]:
        return self.db.read(lambda tx: edits_of(tx, room_id, parent_ids))

    def thread_events(
        self, room_id: str, roots: list[str], per_root: int
    ) -> dict[str, list[StoredEvent]]:
        """The latest `per_root` events of each thread, newest first: where a reader who may
        not see a thread's latest event finds the latest they may."""

        def read(tx) -> dict[str, list[StoredEvent]]:
            found: dict[str, list[StoredEvent]] = {root: [] for root in roots}
            for chunk, marks in in_lists(roots):
                rows = tx.fetchall(
                    f"SELECT t.thread_root, {_EVENT} FROM (SELECT thread_root, event_id,"
                    " ROW_NUMBER() OVER (PARTITION BY thread_root ORDER BY stream_ordering DESC)"
                    " AS n FROM event_relations WHERE room_id = ?"
                    f" AND thread_root IN ({marks})) t JOIN events e ON e.event_id = t.event_id"
                    " WHERE t.n <= ? ORDER BY e.stream_ordering DESC",
                    (room_id, *chunk, per_root),
                )
                for row in rows:
                    found[row[0]].append(_stored(row[1:]))
            return found

        return self.db.read(read)

    def threads(
        self, room_id: str, below: int, limit: int, participant: str | None
    ) -> list[tuple[StoredEvent | None, int]]:
        """Up to `limit` thread roots of the room whose latest event is below `below`, latest
        activity first, each with that position (None for a root no client may be shown);
        with `participant`, only threads they started or sent an event to."""
        sql = (
            f"SELECT t.latest, {_EVENT}, e.room_id, e.soft_failed, e.outlier FROM"
            " (SELECT thread_root, MAX(stream_ordering) AS latest FROM event_relations"
            " WHERE room_id = ? AND thread_root IS NOT NULL GROUP BY thread_root) t"
            " JOIN events e ON e.event_id = t.thread_root WHERE t.latest < ?"
        )
        params: list = [room_id, below]
        if participant is not None:
            sql += (
                " AND (e.sender = ? OR EXISTS (SELECT 1 FROM event_relations p"
                " WHERE p.thread_root = t.thread_root AND p.room_id = ? AND p.sender = ?))"
            )
            params += [participant, room_id, participant]
        sql += " ORDER BY t.latest DESC LIMIT ?"
        rows = self.db.read(lambda tx: tx.fetchall(sql, (*params, limit)))
        return [
            (_stored(r[1:5]) if r[5] == room_id and not r[6] and not r[7] else None, r[0])
            for r in rows
        ]


def edits_of(tx, room_id: str, parent_ids: list[str]) -> dict[str, StoredEvent]:
    found: dict[str, StoredEvent] = {}
    for chunk, marks in in_lists(parent_ids):
        rows = tx.fetchall(
            f"SELECT t.relates_to_id, {_EVENT} FROM (SELECT r.relates_to_id, r.event_id,"
            " ROW_NUMBER() OVER (PARTITION BY r.relates_to_id"
            " ORDER BY r.origin_server_ts DESC, r.event_id DESC) AS n"
            " FROM event_relations r JOIN events p ON p.event_id = r.relates_to_id"
            f" WHERE r.relates_to_id IN ({marks}) AND r.rel_type = ? AND {_in_room('r')}"
            " AND p.sender = r.sender AND p.type = r.type) t"
            " JOIN events e ON e.event_id = t.event_id WHERE t.n = 1",
            (*chunk, REPLACE, room_id),
        )
        found.update((row[0], _stored(row[1:])) for row in rows)
    return found


def _threads_of(tx, room_id: str, parent_ids: list[str], user_id: str) -> dict[str, ThreadRow]:
    found: dict[str, ThreadRow] = {}
    for chunk, marks in in_lists(parent_ids):
        rows = tx.fetchall(
            f"SELECT t.thread_root, t.count, t.mine, {_EVENT} FROM (SELECT thread_root, event_id,"
            " COUNT(*) OVER (PARTITION BY thread_root) AS count,"
            " MAX(CASE WHEN sender = ? THEN 1 ELSE 0 END) OVER (PARTITION BY thread_root) AS mine,"
            " ROW_NUMBER() OVER (PARTITION BY thread_root ORDER BY stream_ordering DESC) AS n"
            f" FROM event_relations WHERE thread_root IN ({marks}) AND room_id = ?) t"
            " JOIN events e ON e.event_id = t.event_id WHERE t.n = 1",
            (user_id, *chunk, room_id),
        )
        found.update((r[0], ThreadRow(r[1], _stored(r[3:]), bool(r[2]))) for r in rows)
    return found


def _references_of(tx, room_id: str, parent_ids: list[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for chunk, marks in in_lists(parent_ids):
        for parent, child in tx.fetchall(
            "SELECT relates_to_id, event_id FROM event_relations r"
            f" WHERE relates_to_id IN ({marks}) AND rel_type = ? AND {_in_room('r')}"
            " ORDER BY stream_ordering",
            (*chunk, REFERENCE, room_id),
        ):
            found.setdefault(parent, []).append(child)
    return found
