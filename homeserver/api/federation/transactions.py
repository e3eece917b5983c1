"""Inbound transactions: ``PUT /_matrix/federation/v1/send/{txnId}``."""

from __future__ import annotations

from flask import Blueprint

from homeserver.api.context import client_key, runtime
from homeserver.api.federation_auth import (
    TRANSACTION_MAX_BODY_BYTES,
    current_origin,
    requires_server_auth,
)
from homeserver.core.errors import bad_json, limit_exceeded
from homeserver.federation.errors import EventResolutionRefused, KeyResolutionRefused
from homeserver.http.parsing import MAX_BODY_DEPTH, json_object
from homeserver.http.responses import json_response
from homeserver.rooms.transactions import MAX_EDUS, MAX_PDUS

bp = Blueprint("federation_transactions", __name__)


def _objects(body: dict, name: str, limit: int, required: bool) -> list:
    value = body.get(name)
    if value is None and not required:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise bad_json(f"{name} must be a list of objects")
    # Synapse answers 400 to a transaction over the spec's counts; so do we, as M_BAD_JSON.
    if len(value) > limit:
        raise bad_json(f"A transaction may carry at most {limit} {name}")
    return value


@bp.put("/_matrix/federation/v1/send/<txn_id>")
@requires_server_auth(max_body_bytes=TRANSACTION_MAX_BODY_BYTES)
def send_transaction(txn_id: str):
    # A PDU nested too deep is refused alone (rooms/pdu_checks.py), so the body may nest
    # as deep as any body.
    body = json_object(TRANSACTION_MAX_BODY_BYTES, max_depth=MAX_BODY_DEPTH)
    pdus = _objects(body, "pdus", MAX_PDUS, required=True)
    edus = _objects(body, "edus", MAX_EDUS, required=False)
    try:
        answer = runtime().inbound_transactions.receive(
            current_origin(), txn_id, pdus, client_key(), edus=edus
        )
    except EventResolutionRefused as e:  # a PDU's missing events (rooms/gaps.py)
        raise limit_exceeded(e.retry_after_ms, f"Cannot fetch events now: {e}") from None
    except KeyResolutionRefused as e:
        raise limit_exceeded(
            e.retry_after_ms, f"Cannot fetch the keys of {e.destination} now"
        ) from None
    return json_response(answer)
