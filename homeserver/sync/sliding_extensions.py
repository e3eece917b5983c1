"""A sliding sync's extensions: `to_device`, `e2ee`, `account_data`, `receipts` and `typing`
(MSC3885, MSC3884, MSC3959, MSC3960, MSC3961 as Synapse and the SDKs speak them), each
made by /sync's own parts: the side streams a batch reads (service.py `read_side_streams`,
side_streams.py) and end-to-end encryption's (e2ee/sync_part.py).

Account data goes for every room it changed in; receipts and typing for the joined rooms of
the response's lists and subscriptions.
"""

from __future__ import annotations

from dataclasses import dataclass

from homeserver.e2ee.sync_part import E2eeSyncPart, Range
from homeserver.sync.filters import NO_FILTER
from homeserver.sync.room_entries import SyncBatch, SyncRequest
from homeserver.sync.service import SyncService
from homeserver.sync.side_streams import ephemeral_events, global_account_data
from homeserver.sync.sliding_request import Extensions
from homeserver.sync.tokens import SyncToken


@dataclass
class ExtensionsPart:
    body: dict
    has_updates: bool
    to_device_position: int
    # Every to-device message up to the batch sent: none waits for the client's next since.
    to_device_whole: bool = True


class SlidingExtensions:
    def __init__(self, sync: SyncService):
        self.sync = sync

    def part(
        self,
        request: SyncRequest,
        asked: Extensions,
        batch: SyncBatch,
        window: list[str],
    ) -> ExtensionsPart:
        """`request.since`: the pos' token (None on a new connection); `window`: the joined
        rooms the response's rules matched. Reads the batch's side streams, those asked for:
        a connection that asks for none (a room list's) reads none, its typing position
        aside, which its token carries as any other's."""
        ephemeral_asked = asked.receipts or asked.typing
        window = window if ephemeral_asked else []
        self.sync.read_side_streams(request, batch, window, asked.account_data)
        if not asked.any:
            return ExtensionsPart({}, False, 0)
        body: dict = {}
        updates = False
        if asked.account_data:
            body["account_data"] = self._account_data(request, batch)
            rooms = body["account_data"]["rooms"]
            updates = updates or bool(rooms) or any(a for a in batch.account_data.get("", ()))
        ephemeral = {
            room_id: ephemeral_events(
                NO_FILTER.room.ephemeral, batch.typing, batch.receipts, room_id
            )
            for room_id in window
        }
        for name, event_type in (("receipts", "m.receipt"), ("typing", "m.typing")):
            if getattr(asked, name):
                rooms = {
                    room_id: event
                    for room_id, events in ephemeral.items()
                    for event in events
                    if event["type"] == event_type
                }
                body[name] = {"rooms": rooms}
                updates = updates or bool(rooms)
        e2ee = self._e2ee(request, asked, batch)
        if asked.to_device:
            body["to_device"] = {
                "next_batch": str(e2ee.to_device_position),
                "events": e2ee.to_device,
            }
            updates = updates or bool(e2ee.to_device)
        if asked.e2ee:
            fields = e2ee.fields()
            body["e2ee"] = {
                k: fields[k]
                for k in (
                    "device_lists",
                    "device_one_time_keys_count",
                    "device_unused_fallback_key_types",
                )
            }
            updates = updates or bool(e2ee.changed or e2ee.left)
        whole = not asked.to_device or e2ee.to_device_position >= batch.positions.to_device
        return ExtensionsPart(body, updates, e2ee.to_device_position, whole)

    def _account_data(self, request: SyncRequest, batch: SyncBatch) -> dict:
        rooms = {
            room_id: [{"type": a.type, "content": a.content} for a in items]
            for room_id, items in batch.account_data.items()
            if room_id and items
        }
        found = global_account_data(
            NO_FILTER.account_data,
            batch.account_data,
            lambda: self.sync.ruleset(request.user_id),
            request.since is None,
        )
        return {"global": found, "rooms": rooms}

    def _e2ee(self, request: SyncRequest, asked: Extensions, batch: SyncBatch) -> E2eeSyncPart:
        e2ee = self.sync.e2ee
        if e2ee is None or not (asked.e2ee or asked.to_device):
            return E2eeSyncPart()
        since: SyncToken | None = request.since
        positions = batch.positions
        # The client's to_device `since` acknowledges what it holds, as /sync's token does;
        # without the extension nothing is read, nor acknowledged.
        to_device_after = (asked.to_device_since or 0) if asked.to_device else 0
        span = Range(
            since.events if since else None,
            positions.events,
            since.device_lists if since else 0,
            positions.device_lists,
            to_device_after,
            positions.to_device if asked.to_device else 0,
        )
        return e2ee.part(request.requester, span, batch.read_ahead.member_moves)
