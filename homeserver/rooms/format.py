"""Events as clients see them (client-server spec, "ClientEvent")."""

from __future__ import annotations

from homeserver.storage.rooms import StoredEvent


def client_event(
    stored: StoredEvent, now_ms: int, txn_id: str | None = None, membership: str | None = None
) -> dict:
    """`membership`: the requesting user's membership just after this event, when known."""
    out = client_event_fields(stored)
    out["unsigned"] = client_unsigned(stored, now_ms, txn_id, membership)
    return out


def client_event_fields(stored: StoredEvent) -> dict:
    """The event as every client sees it, all but its `unsigned`, which is for one reader at
    one time (client_unsigned)."""
    pdu = stored.event.pdu
    out = {
        "event_id": stored.event.event_id,
        "type": pdu["type"],
        "content": pdu["content"],
        "sender": pdu["sender"],
        "origin_server_ts": pdu["origin_server_ts"],
        "room_id": stored.event.room_id,  # a v12 create event has none in its PDU
    }
    if "state_key" in pdu:
        out["state_key"] = pdu["state_key"]
    if pdu["type"] == "m.room.redaction":
        _both_redacts(pdu, out)
    return out


def client_unsigned(
    stored: StoredEvent, now_ms: int, txn_id: str | None = None, membership: str | None = None
) -> dict:
    unsigned = {"age": max(0, now_ms - stored.event.pdu["origin_server_ts"]), **stored.unsigned}
    if txn_id is not None:
        unsigned["transaction_id"] = txn_id  # only ever given to the device that sent it
    if membership is not None:
        unsigned["membership"] = membership
    return unsigned


def _both_redacts(pdu: dict, out: dict) -> None:
    """A redaction names its target at the top level before room version 11 and in content
    from 11: clients get it in both places, whichever they read (as Synapse serves it)."""
    top, inner = pdu.get("redacts"), pdu["content"].get("redacts")
    target = top if isinstance(top, str) else inner
    if not isinstance(target, str):
        return
    out["redacts"] = target
    if inner is None:
        out["content"] = {**pdu["content"], "redacts": target}
