"""Hears other instances' stream positions: LISTEN on storage/streams.py's CHANNEL; and
their requests that this instance send to a destination whose lease it holds
(storage/outbox.py's OUTBOX_CHANNEL, `hand_over`).

One connection of its own, outside the pool, waits in a greenlet: psycopg 3 waits on its
socket through gevent once the standard library is patched. Notifications that arrive
together are coalesced to the newest position per stream, and `deliver` gets them in one
call. Each instance ignores its own: its writes woke its syncs already.

The positions current when listening starts (LISTEN first, then the read, so nothing falls
between) are delivered first, and again after a lost connection is replaced: the consumer
reads everything from the last position it knew, so a reconnect loses no wake-up. A
request to send lost that way waits for its instance's next look (a lease time at most).
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable

import gevent

from homeserver.storage.outbox import OUTBOX_CHANNEL
from homeserver.storage.streams import CHANNEL

log = logging.getLogger(__name__)

# How long one wait for a notification lasts before the loop looks at `stop` again.
WAIT_SECONDS = 1.0
# Polls for more after the first before handing a batch on, so a busy cluster still wakes.
DRAIN_ROUNDS = 50
# After a lost connection, before connecting again.
RECONNECT_SECONDS = 1.0


def parse(payload: str) -> tuple[str, str, int] | None:
    """(instance, stream, position) from a payload, or None for one that is not ours."""
    parts = payload.split(" ")
    if len(parts) != 3 or not parts[2].isdigit():
        return None
    return parts[0], parts[1], int(parts[2])


class StreamAnnouncements:
    def __init__(
        self,
        url: str,
        own_name: str,
        deliver: Callable[[dict[str, int]], None],
        send_to: Callable[[list[str]], None] = lambda destinations: None,
    ):
        """`deliver(positions)`: the newest position heard per stream; `send_to(names)`:
        the destinations other instances asked this one to send to. Both are called in
        the listening greenlet, one batch at a time."""
        self._conninfo = re.sub(r"^postgres(ql)?://", "postgresql://", url)
        self._own = own_name
        self._deliver = deliver
        self._send_to = send_to
        self._destinations: set[str] = set()
        self._greenlet: gevent.Greenlet | None = None
        self._conn: Any = None  # a psycopg connection, imported late
        self._pending: dict[str, int] = {}
        self.reconnects = 0

    def start(self) -> None:
        """Listens before returning, so every write committed after it is heard."""
        self._listen()
        self._greenlet = gevent.spawn(self._run)

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill()
            self._greenlet = None
        self._close()

    def _listen(self) -> None:
        import psycopg  # after gevent's patching, as storage/database.py does

        # Named, so that an operator sees it in pg_stat_activity.
        self._conn = psycopg.connect(
            self._conninfo, autocommit=True, application_name=f"weir-listen-{self._own}"
        )
        self._conn.execute(f"LISTEN {CHANNEL}")
        self._conn.execute(f"LISTEN {OUTBOX_CHANNEL}")
        rows = self._conn.execute("SELECT stream_name, position FROM stream_positions")
        self._pending = dict(rows.fetchall())

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _run(self) -> None:
        while True:
            try:
                self._hand_on()
                self._wait()
            except gevent.GreenletExit:
                raise
            except Exception:
                log.exception("lost the stream announcements; listening again")
                self._close()
                gevent.sleep(RECONNECT_SECONDS)
                try:
                    self._listen()
                    self.reconnects += 1
                except Exception:
                    log.exception("could not listen for stream announcements")
                    self._close()

    def _wait(self) -> None:
        """Waits for a notification, then takes every one already arrived."""
        if self._conn is None:
            raise ConnectionError("not connected")
        heard = 0
        for note in self._conn.notifies(timeout=WAIT_SECONDS, stop_after=1):
            heard += 1
            self._note(note.channel, note.payload)
        rounds = DRAIN_ROUNDS
        while heard and rounds:  # drain what came meanwhile, without waiting
            heard, rounds = 0, rounds - 1
            for note in self._conn.notifies(timeout=0):
                heard += 1
                self._note(note.channel, note.payload)

    def _note(self, channel: str, payload: str) -> None:
        if channel == OUTBOX_CHANNEL:
            holder, _, destination = payload.partition(" ")
            if holder == self._own and destination:
                self._destinations.add(destination)
            return
        parsed = parse(payload)
        if parsed is None or parsed[0] == self._own:
            return
        _, stream, position = parsed
        if position > self._pending.get(stream, 0):
            self._pending[stream] = position

    def _hand_on(self) -> None:
        if self._destinations:
            destinations, self._destinations = sorted(self._destinations), set()
            try:
                self._send_to(destinations)
            except Exception:  # asked again at their instances' next look
                log.exception("could not send to %s for other instances", destinations)
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        try:
            self._deliver(pending)
        except Exception:
            # Tried again after the next wait (1 s at most): the consumer reads from the
            # last position it applied, so nothing is woken or forgotten twice or never.
            log.exception("could not wake syncs for other instances' writes")
            for stream, position in pending.items():
                self._pending[stream] = max(position, self._pending.get(stream, 0))
