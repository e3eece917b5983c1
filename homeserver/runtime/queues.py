"""Other instances' events wake this instance's outbound queues (docs/architecture.md,
"Queue leases").

An event stored through another instance queues work for the federation destinations it
goes to, the appservices, and the pushers of the users it notifies. When that instance's
NOTIFY arrives (storage/announcements.py), the rows in the range say which queues; each
sender then claims the queue's lease before it sends, so a queue another instance holds is
left to that one, and one whose holder died is taken over when its lease lapses.
"""

from __future__ import annotations

from typing import Protocol

from homeserver.storage.appservice import HANDOVER


class _Queues(Protocol):
    def stored_elsewhere(self, after: int, upto: int) -> None: ...


class QueueWakes:
    def __init__(self, *senders: _Queues, handed_to: _Queues | None = None):
        """`handed_to`: the appservices, woken when another instance hands them ephemeral
        data (storage/appservice.py, `hand_over`)."""
        self._senders = senders
        self._handed_to = handed_to
        self._last: int | None = None  # the events stream's position last applied
        self.wakes = 0  # ranges read (weir_cluster_queue_wakes_total)

    def on_positions(self, positions: dict[str, int]) -> None:
        """The newest positions other instances announced."""
        if HANDOVER in positions and self._handed_to is not None:
            self._handed_to.stored_elsewhere(0, positions[HANDOVER])
        upto = positions.get("events")
        if upto is None or (self._last is not None and upto <= self._last):
            return
        if self._last is not None:  # else where this instance started: its senders resume
            for sender in self._senders:
                sender.stored_elsewhere(self._last, upto)
            self.wakes += 1
        # Only once applied: a failed read is tried again with the next batch.
        self._last = upto
