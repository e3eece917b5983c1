"""Stream positions: monotonically increasing counters that tokens are built on.

`advance` must run inside the write transaction that stores what the positions are for: the
row it updates stays locked until that transaction commits, so positions become visible in
order on both engines (see 0003_rooms.sql). It should come as late in that transaction as
it can: every statement after it is time every other writer of the stream waits
(storage/rooms.py writes all that needs no position first).

With several instances on one PostgreSQL, the same row lock orders them all: a writer of a
stream waits for the previous one to commit, so positions are committed in order
cluster-wide. `advance` then also queues a NOTIFY on `CHANNEL` with the stream and its new
position, in the `UPDATE`'s own statement, which PostgreSQL delivers only at commit, in
commit order, and never for a rolled-back write (storage/announcements.py listens;
docs/architecture.md, "Several instances").

A write that needs no position's value in Python until it has committed takes them with
`take` in a pipelined transaction (`Database.write_pipelined`): its statements read the
positions themselves (`Pending`, `sql`), so the advance, the rows and the COMMIT reach the
server together, and the row is held for the server's work alone, never for a turn of our
hub between the advance's answer and the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

# The LISTEN/NOTIFY channel of stream positions; the payload is "<instance> <stream> <position>".
CHANNEL = "weir_streams"


_TAKE = (
    "UPDATE stream_positions SET position = position + ? WHERE stream_name = ? RETURNING position"
)


@dataclass(frozen=True)
class Pending:
    """A position this transaction took (`take`) and has not read: `back` before the last
    one taken. A statement of the same transaction reads it (`sql`)."""

    stream_name: str
    back: int = 0

    def __sub__(self, n: int) -> Pending:
        return Pending(self.stream_name, self.back + n)


Position = int | Pending


def sql(position: Position) -> tuple[str, tuple]:
    """`position` as a statement's value: its SQL and the parameters of its `?`s. A
    transaction reads its own update of the stream's row, on both engines."""
    if isinstance(position, Pending):
        return (
            "(SELECT position - ? FROM stream_positions WHERE stream_name = ?)",
            (position.back, position.stream_name),
        )
    return "?", (position,)


class Taken:
    """Positions taken by `take`: the last of them is `pending` to the transaction's
    statements, and `last()` reads it (in a pipelined transaction, a wait for the server,
    or once it has committed)."""

    def __init__(self, cursor, stream_name: str):
        self._cursor = cursor
        self._last: int | None = None
        self.pending = Pending(stream_name)

    def last(self) -> int:
        if self._last is None:
            row = self._cursor.fetchone()
            if row is None:
                raise RuntimeError(f"unknown stream {self.pending.stream_name!r}")
            self._last = row[0]
        return self._last


def take(tx, stream_name: str, count: int = 1) -> Taken:
    """Takes `count` new positions, without waiting for the server's answer."""
    if tx.announce_as is None:
        return Taken(tx.execute(_TAKE, (count, stream_name)), stream_name)
    # The NOTIFY in the same statement: one round trip fewer with the row held.
    cursor = tx.execute(
        f"WITH taken AS ({_TAKE}) SELECT position, pg_notify(?, concat(?::text, position))"
        " FROM taken",
        (count, stream_name, CHANNEL, f"{tx.announce_as} {stream_name} "),
    )
    return Taken(cursor, stream_name)


def advance(tx, stream_name: str, count: int = 1) -> int:
    """Takes `count` new positions; returns the last of them."""
    return take(tx, stream_name, count).last()


def announce(tx, stream_name: str, position: int) -> None:
    """Tells the other instances, at commit, that `stream_name` reached `position`; nothing
    with one instance."""
    if tx.announce_as is not None:
        tx.execute(
            "SELECT pg_notify(?, ?)", (CHANNEL, f"{tx.announce_as} {stream_name} {position}")
        )


def current(tx, stream_name: str) -> int:
    return tx.fetchone(
        "SELECT position FROM stream_positions WHERE stream_name = ?", (stream_name,)
    )[0]
