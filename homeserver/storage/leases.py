"""One sender per outbound queue across instances: a lease on the queue's own row
(docs/architecture.md, "Queue leases").

A queue (a federation destination, an appservice, a pusher) is a row of its table, and two
columns of that row are its lease: `lease_owner`, the `instance_name` that sends for it,
and `lease_until_ms`. An instance sends for a queue only under a lease it has claimed; a
claim renews a lease already held, and a lease that is not renewed lapses at
`lease_until_ms`, after which any instance with work for the queue claims it. Every claim
is one conditional UPDATE, so two instances never both win one.

Times are the database's clock, so that instances on machines whose clocks differ agree on
when a lease lapses. A lease outlasts the call it was claimed for by `MARGIN` at least
(`lease_seconds`), so no instance starts a call to a queue while another's may still run.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from homeserver.storage.database import Database, in_lists

log = logging.getLogger(__name__)

# What a holder's call may overrun its deadline by: a timer the hub fires late, the
# socket's close. A lease is at least a call's deadline and twice this.
MARGIN = 1.0
_NOW = {
    "postgres": "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT",
    "sqlite": "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
}


def lease_seconds(configured: float, call_deadline: float) -> float:
    """How long a claim lasts: `cluster.queue_lease`, or longer where one call may take
    longer (a claim is renewed before a call the rest of it would not cover)."""
    return max(configured, call_deadline + 2 * MARGIN)


@dataclass(frozen=True)
class LeasedTable:
    """A table whose rows are queues: its name and the columns that key a row."""

    name: str
    keys: tuple[str, ...]

    def where(self) -> str:
        return " AND ".join(f"{column} = ?" for column in self.keys)


@dataclass(frozen=True)
class Claim:
    row: tuple | None  # the row's `returning` columns, claimed or not; None: no such row
    claimed: bool = False
    lapses_in: float = 0.0  # not claimed: seconds until the holder's lease lapses


class QueueLeases:
    """One instance's leases on the queues of one table, and what it knows of them: until
    when (monotonic, counted from before each claim) it surely holds each one."""

    def __init__(
        self,
        db: Database,
        table: LeasedTable,
        owner: str,
        seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.db = db
        self.table = table
        self.owner = owner
        self.seconds = seconds
        self._clock = clock
        self._until: dict[tuple, float] = {}

    def claim(
        self,
        key: tuple,
        returning: str = "1",
        also_set: str = "",
        before: Callable[..., None] | None = None,
        also_params: tuple = (),
    ) -> Claim:
        """Claims (or renews) the lease on `key`'s row unless another instance holds it,
        setting `also_set` too ("column = expression, ...", its `?` taking `also_params`),
        after `before(tx)` in the same write (it may make the row)."""
        started = self._clock()
        claim = self.db.write(self._claim, key, returning, also_set, before, also_params)
        if claim.claimed:
            self._until[key] = started + self.seconds
        else:
            self._until.pop(key, None)
        return claim

    def _claim(
        self, tx, key: tuple, returning: str, also_set: str, before, also_params: tuple
    ) -> Claim:
        if before is not None:
            before(tx)
        now, table = _NOW[tx.dialect], self.table
        extra = f", {also_set}" if also_set else ""
        row = tx.fetchone(
            f"UPDATE {table.name} SET lease_owner = ?, lease_until_ms = {now} + ?{extra}"
            f" WHERE {table.where()}"
            f" AND (lease_owner IS NULL OR lease_owner = ? OR lease_until_ms < {now})"
            f" RETURNING {returning}",
            (self.owner, int(self.seconds * 1000), *also_params, *key, self.owner),
        )
        if row is not None:
            return Claim(row, claimed=True)
        held = tx.fetchone(
            f"SELECT {returning}, lease_until_ms - {now} FROM {table.name} WHERE {table.where()}",
            key,
        )
        if held is None:
            return Claim(None)
        return Claim(held[:-1], lapses_in=max(0.0, held[-1] / 1000))

    def holders(self, names: list[str]) -> dict[str, str]:
        """{name: the instance holding its lease now} of those whose lease is held, for a
        table keyed by one column; lapses on the database's clock, as claims count them."""

        def read(tx) -> dict[str, str]:
            found: dict[str, str] = {}
            column, now = self.table.keys[0], _NOW[tx.dialect]
            for chunk, marks in in_lists(names):
                found.update(
                    tx.fetchall(
                        f"SELECT {column}, lease_owner FROM {self.table.name}"
                        f" WHERE {column} IN ({marks}) AND lease_owner IS NOT NULL"
                        f" AND lease_until_ms >= {now}",
                        tuple(chunk),
                    )
                )
            return found

        return self.db.read(read) if names else {}

    def covers(self, key: tuple, call_seconds: float) -> bool:
        """Whether this instance surely holds `key` through a call starting now."""
        return self._until.get(key, 0.0) - self._clock() >= call_seconds + MARGIN

    def forget(self, key: tuple) -> None:
        self._until.pop(key, None)

    def held(self) -> int:
        """Leases this instance holds now (weir_<queue>_leases)."""
        now = self._clock()
        return sum(1 for until in self._until.values() if until > now)

    def release_all(self) -> None:
        """Gives every lease up (a stop, once nothing is in flight): another instance with
        work takes the queues at its next look, not after the lease's time."""
        self._until.clear()
        try:
            self.db.write(
                lambda tx: tx.execute(
                    f"UPDATE {self.table.name} SET lease_owner = NULL, lease_until_ms = 0"
                    " WHERE lease_owner = ?",
                    (self.owner,),
                )
            )
        except Exception:  # they lapse all the same; the drain goes on
            log.exception("could not give up the leases on %s", self.table.name)


# The fence of a write only the holder may make, e.g. "... WHERE id = ?" + HELD_BY.
HELD_BY = " AND lease_owner = ?"
