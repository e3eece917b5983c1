"""/sync's entry for a room this server is not in (storage/remote_invites.py): an invite
or a knock as its stripped state (the spec's `invite_state` and `knock_state`), and its end
(an invite rejected, a knock rescinded or refused) as a left room whose timeline is the
leave: the only event of the room we hold."""

from __future__ import annotations

from homeserver.core.events import Event
from homeserver.rooms.pagination import stream_token
from homeserver.sync.filters import SyncFilter
from homeserver.sync.tokens import SyncToken

_CLIENT_KEYS = ("type", "state_key", "sender", "content", "origin_server_ts")


def out_of_room(
    sync_filter: SyncFilter,
    since: SyncToken | None,
    membership: str,
    shown: list[dict] | Event,
    changed_at: int,
) -> tuple[str, dict | None]:
    """(section, entry). `shown` is the stripped state of an invite or a knock, or the
    leave that ended one. Sent when it changed after `since`; a leave to an initial sync
    only with include_leave, as any left room."""
    changed = since is None or changed_at > since.events
    if not isinstance(shown, Event):
        return membership, {f"{membership}_state": {"events": shown}} if changed else None
    if not changed or (since is None and not sync_filter.room.include_leave):
        return "leave", None
    return "leave", _left(sync_filter, shown, changed_at)


def _left(sync_filter: SyncFilter, shown: Event, changed_at: int) -> dict:
    if sync_filter.event_format == "federation":
        event = dict(shown.pdu)
    else:
        event = {k: shown.pdu[k] for k in _CLIENT_KEYS if k in shown.pdu}
        event.update(event_id=shown.event_id, unsigned={"membership": "leave"})
    return {
        "timeline": {
            "events": [event],
            "limited": False,
            "prev_batch": stream_token(changed_at - 1),
        },
        "state": {"events": []},
        "account_data": {"events": []},
    }
