"""Bundled aggregations (client-server spec, "Aggregations of child events"): what an event's
children add to its `unsigned.m.relations` when a client is given it, from /sync's timeline,
/messages, /event, /relations and /threads. `Aggregations.add_to` is the one call: a page's
events in, their client form filled in, three queries for the whole page (the edits, the
threads and the references), and one more for the edits of the threads' latest events.

- `m.replace`: the most recent valid edit (by origin_server_ts, then event ID), sent by the
  original's sender with its type; a redacted edit has no relation any more
  (storage/redactions.py), so the one before it applies again.
- `m.thread`: `latest_event` as this reader sees it (the latest they may see, with its own
  edit), `count` and `current_user_participated`.
- `m.reference`: the `chunk` of the referencing events' IDs.

An edit or latest event the reader's device sent carries its `transaction_id`, as every
event given to the device that sent it does (rooms/format.py).

Like Synapse, no aggregation is bundled with a state event, a redacted event, or an event
that is itself an edit or an annotation.
"""

from __future__ import annotations

from typing import Callable

from homeserver.core.requester import Requester
from homeserver.rooms.format import client_event
from homeserver.rooms.visibility import HistoryView
from homeserver.storage.event_rows import THREAD, relation_of
from homeserver.storage.relations import REFERENCE, REPLACE, RelationStore, ThreadRow
from homeserver.storage.rooms import StoredEvent

RELATIONS = "m.relations"
ANNOTATION = "m.annotation"
# (user ID, device ID, event IDs) -> {event ID: transaction ID} (storage/rooms.py, txn_ids_for)
TxnIds = Callable[[str, str, list[str]], dict[str, str]]
# Looked through for a thread's latest event a reader may see, when it is not its latest.
_THREAD_LOOKBACK = 50


def _may_have_bundle(stored: StoredEvent) -> bool:
    event = stored.event
    if event.is_state or "redacted_because" in stored.unsigned:
        return False
    relation = relation_of(event.content)
    return relation is None or relation[0] not in (REPLACE, ANNOTATION)


def _valid_edit(original: StoredEvent, edit: StoredEvent) -> bool:
    """The spec's rules the query has not applied: the original is no state event and no
    edit itself, and a plain (unencrypted) edit carries its new content."""
    if original.event.is_state or edit.event.is_state:
        return False
    relation = relation_of(original.event.content)
    if relation is not None and relation[0] == REPLACE:
        return False
    if edit.event.type != "m.room.encrypted":
        return isinstance(edit.event.content.get("m.new_content"), dict)
    return True


def _bundled_events(bundles: dict[str, dict]):
    """The events in `bundles`: edits, latest events and the latest events' edits."""
    for bundle in bundles.values():
        if REPLACE in bundle:
            yield bundle[REPLACE]
        latest = bundle.get(THREAD, {}).get("latest_event")
        if latest is not None:
            yield latest
            edit = latest["unsigned"].get(RELATIONS, {}).get(REPLACE)
            if edit is not None:
                yield edit


class Aggregations:
    def __init__(self, store: RelationStore, txn_ids: TxnIds):
        self.store = store
        self.txn_ids = txn_ids

    def add_to(
        self,
        requester: Requester,
        view: HistoryView | None,
        stored: list[StoredEvent],
        formatted: list[dict],
        now: int,
    ) -> None:
        """Puts the bundled aggregations of `stored` (events of one room) into their client
        forms `formatted` (the same order), for `requester`, who sees history as `view`
        (None: every event of the room)."""
        bundles = self.bundles(requester.user_id, view, stored, now)
        if not bundles:
            return
        self._add_txn_ids(requester, bundles)
        for source, out in zip(stored, formatted):
            bundle = bundles.get(source.event.event_id)
            if bundle is not None:
                unsigned = out.setdefault("unsigned", {})
                unsigned[RELATIONS] = {**unsigned.get(RELATIONS, {}), **bundle}

    def _add_txn_ids(self, requester: Requester, bundles: dict[str, dict]) -> None:
        """The requester's own transaction IDs on the bundled edits and latest events; a
        query only when the requester sent any of them."""
        own = {
            event["event_id"]: event
            for event in _bundled_events(bundles)
            if event["sender"] == requester.user_id
        }
        if not own:
            return
        found = self.txn_ids(requester.user_id, requester.device_id, list(own))
        for event_id, txn_id in found.items():
            own[event_id]["unsigned"]["transaction_id"] = txn_id

    def bundles(
        self, user_id: str, view: HistoryView | None, stored: list[StoredEvent], now: int
    ) -> dict[str, dict]:
        """{event ID: its `m.relations`} for those of `stored` that have any."""
        parents = {s.event.event_id: s for s in stored if _may_have_bundle(s)}
        if not parents:
            return {}
        room_id = stored[0].event.room_id
        edits, threads, references = self.store.aggregation_rows(room_id, list(parents), user_id)
        out: dict[str, dict] = {}
        for parent_id, edit in edits.items():
            if _valid_edit(parents[parent_id], edit):
                out.setdefault(parent_id, {})[REPLACE] = client_event(edit, now)
        for parent_id, thread in self._threads(room_id, user_id, view, parents, threads, now):
            out.setdefault(parent_id, {})[THREAD] = thread
        for parent_id, children in references.items():
            chunk = [{"event_id": e} for e in children]
            out.setdefault(parent_id, {})[REFERENCE] = {"chunk": chunk}
        return out

    def _threads(
        self,
        room_id: str,
        user_id: str,
        view: HistoryView | None,
        roots: dict[str, StoredEvent],
        threads: dict[str, ThreadRow],
        now: int,
    ) -> list[tuple[str, dict]]:
        if not threads:
            return []
        latest = {root: row.latest for root, row in threads.items()}
        if view is not None:
            hidden = [root for root, event in latest.items() if not view.can_see(event)]
            if hidden:  # rare: a reader who left sees roots from before, not the latest
                earlier = self.store.thread_events(room_id, hidden, _THREAD_LOOKBACK)
                for root in hidden:
                    seen = [e for e in earlier.get(root, []) if view.can_see(e)]
                    if seen:
                        latest[root] = seen[0]
                    else:
                        del latest[root]
        edits = self.store.edits(room_id, [e.event.event_id for e in latest.values()])
        out = []
        for root, event in latest.items():
            row = threads[root]
            shown = client_event(event, now)
            edit = edits.get(event.event.event_id)
            if edit is not None and _valid_edit(event, edit):
                shown["unsigned"][RELATIONS] = {REPLACE: client_event(edit, now)}
            participated = row.participated or roots[root].event.sender == user_id
            out.append(
                (
                    root,
                    {
                        "latest_event": shown,
                        "count": row.count,
                        "current_user_participated": participated,
                    },
                )
            )
        return out
