"""Key documents (server-server spec, "Retrieving server keys"), checked as pure functions:
no store, no network, safe on a native thread. The keyring (federation/keyring.py) fetches
and stores them."""

from __future__ import annotations

from homeserver.federation.errors import InvalidSignature, MalformedResponse
from homeserver.federation.signing import decode_verify_key, verify_signature
from homeserver.storage.keys import StoredKey


def verify_with_keys(obj: dict, server_name: str, keys: dict) -> None:
    """Checks ``obj``'s signatures by ``server_name`` with each of ``keys``; raises
    ``InvalidSignature``. Pure: safe on a native thread."""
    for key in keys.values():
        verify_signature(obj, server_name, key)


def current_verify_keys(server_name: str, verify_keys: dict) -> dict:
    """A key document's `verify_keys`, decoded: the ed25519 ones must all be valid."""
    current = {}
    for kid, value in verify_keys.items():
        try:
            current[kid] = decode_verify_key(kid, value["key"])
        except Exception:
            if kid.startswith("ed25519:"):
                raise MalformedResponse(server_name, f"bad verify key {kid}") from None
            # Other algorithms are not ours to use; the document may still be good.
    return current


def check_self_signed(document: dict, server_name: str, current: dict) -> dict:
    """Checks that the document is signed by its server, with its own current keys only;
    returns the server's signatures."""
    # Any JSON may arrive here: a `signatures` of the wrong type is a bad document like
    # any other, not an error that would stop the notaries from being asked.
    all_signatures = document.get("signatures")
    signatures = all_signatures.get(server_name) if isinstance(all_signatures, dict) else None
    if not isinstance(signatures, dict):
        raise InvalidSignature(f"key document of {server_name} is not self-signed")
    signed_by = [k for k in signatures if k.startswith("ed25519:")]
    if not signed_by:
        raise InvalidSignature(f"key document of {server_name} is not self-signed")
    for kid in signed_by:
        if kid not in current:
            raise InvalidSignature(f"{server_name} signed with {kid}, not one of its keys")
        verify_signature(document, server_name, current[kid])
    return signatures


def expired_keys(old_keys: dict, current: dict) -> list[StoredKey]:
    """A document's `old_verify_keys` that are well formed and not also current, stored as
    valid until they expired."""
    keys = []
    for kid, value in old_keys.items():
        if kid in current or not isinstance(value, dict):
            continue
        expired = value.get("expired_ts")
        if isinstance(expired, int) and isinstance(value.get("key"), str):
            keys.append(StoredKey(kid, value["key"], expired, expired))
    return keys
