"""Stream positions: monotonically increasing counters that tokens are built on.

`advance` must run inside the write transaction that stores what the positions are for: the
row it updates stays locked until that transaction commits, so positions become visible in
order on both engines (see 0003_rooms.sql).
"""

from __future__ import annotations


def advance(tx, stream_name: str, count: int = 1) -> int:
    """Takes `count` new positions; returns the last of them."""
    row = tx.fetchone(
        "UPDATE stream_positions SET position = position + ? WHERE stream_name = ?"
        " RETURNING position",
        (count, stream_name),
    )
    if row is None:
        raise RuntimeError(f"unknown stream {stream_name!r}")
    return row[0]


def current(tx, stream_name: str) -> int:
    return tx.fetchone(
        "SELECT position FROM stream_positions WHERE stream_name = ?", (stream_name,)
    )[0]
