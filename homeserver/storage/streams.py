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
"""

from __future__ import annotations

# The LISTEN/NOTIFY channel of stream positions; the payload is "<instance> <stream> <position>".
CHANNEL = "weir_streams"


_TAKE = (
    "UPDATE stream_positions SET position = position + ? WHERE stream_name = ? RETURNING position"
)


def advance(tx, stream_name: str, count: int = 1) -> int:
    """Takes `count` new positions; returns the last of them."""
    if tx.announce_as is None:
        row = tx.fetchone(_TAKE, (count, stream_name))
    else:  # the NOTIFY in the same statement: one round trip fewer with the row held
        row = tx.fetchone(
            f"WITH taken AS ({_TAKE}) SELECT position, pg_notify(?, concat(?::text, position))"
            " FROM taken",
            (count, stream_name, CHANNEL, f"{tx.announce_as} {stream_name} "),
        )
    if row is None:
        raise RuntimeError(f"unknown stream {stream_name!r}")
    return row[0]


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
