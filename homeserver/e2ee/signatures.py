"""Signature checks on keys clients upload (spec: "Signing JSON"): ed25519 over canonical
JSON without `signatures` and `unsigned`, through signedjson."""

from __future__ import annotations

from signedjson.key import decode_verify_key_bytes
from signedjson.sign import SignatureVerifyException, verify_signed_json
from unpaddedbase64 import decode_base64

from homeserver.core.errors import Codes, MatrixError


def invalid_signature(error: str) -> MatrixError:
    return MatrixError(400, Codes.INVALID_SIGNATURE, error)


def has_valid_signature(signed: dict, user_id: str, key_id: str, public_key: str) -> bool:
    """Whether `signed` carries a good signature of `user_id` by `key_id` (`ed25519:...`)
    whose public key is `public_key` (unpadded base64)."""
    if not key_id.startswith("ed25519:"):
        return False
    if not isinstance(signed.get("signatures", {}).get(user_id, {}).get(key_id), str):
        return False
    try:
        verify_key = decode_verify_key_bytes(key_id, decode_base64(public_key))
        verify_signed_json(signed, user_id, verify_key)
    except (SignatureVerifyException, ValueError, TypeError):
        return False
    return True


def single_key(key: dict, what: str) -> tuple[str, str]:
    """(`ed25519:<pub>`, pub) of a cross-signing key, which holds exactly one key."""
    keys = key.get("keys")
    if not isinstance(keys, dict) or len(keys) != 1:
        raise MatrixError(400, Codes.INVALID_PARAM, f"{what} must hold exactly one key")
    key_id, public = next(iter(keys.items()))
    if not isinstance(public, str) or key_id != f"ed25519:{public}":
        raise MatrixError(400, Codes.INVALID_PARAM, f"{what}: key ID must be ed25519:<key>")
    return key_id, public


def new_signatures(signed: dict, signer: str) -> dict[str, str]:
    """{key_id: signature} that `signer` put on `signed`."""
    by_signer = signed.get("signatures", {}).get(signer, {}) if isinstance(signed, dict) else {}
    if not isinstance(by_signer, dict):
        return {}
    return {k: v for k, v in by_signer.items() if isinstance(v, str)}
