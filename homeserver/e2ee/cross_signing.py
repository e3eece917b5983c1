"""Cross-signing keys and the signatures users make with them (client-server spec,
"Cross-signing"): POST /keys/device_signing/upload and /keys/signatures/upload.

Checked here, as the spec asks: a master key's `user_id` and usage; self-signing and
user-signing keys signed by the master key (uploaded with them, or the stored one); a
signature on one's own device by the self-signing key; on one's own master key by one of
one's devices; on another user's master key by one's user-signing key. A signature that
fails lands in `failures`, the others are stored.

Another server's user is signed against their master key as their server gives it
(`remote_master`: our copy of their device list, or a /keys/query of their server). The
signature stays here, shown to its signer in /keys/query: the spec keeps a user-signing
key's signatures the signer's own business, and Synapse sends them to no server either.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Iterable, Protocol

from homeserver.core.errors import Codes, MatrixError, invalid_param
from homeserver.core.identifiers import server_of
from homeserver.core.requester import Requester
from homeserver.e2ee.signatures import (
    has_valid_signature,
    invalid_signature,
    new_signatures,
    single_key,
)
from homeserver.storage.e2ee import E2eeStore, Signature

KEY_TYPES = ("master", "self_signing", "user_signing")


class KeysChanged(Protocol):
    """Told that a user's keys changed: which devices' keys, and whether the master or
    self-signing key did (`signing`). The runtime wakes syncs and tells other servers."""

    def __call__(
        self, user_id: str, devices: Iterable[str] = (), signing: bool = False
    ) -> None: ...


def _failure(errcode: str, error: str) -> dict:
    return {"errcode": errcode, "error": error}


class CrossSigning:
    def __init__(self, store: E2eeStore, server_name: str, on_keys_changed: KeysChanged):
        self.store = store
        self.server_name = server_name
        self.on_keys_changed = on_keys_changed
        # remote_master(user_id, caller): another server's user's master key, or None
        # (KeyService sets it: e2ee/keys.py).
        self.remote_master: Callable[[str, Any], dict | None] = lambda user_id, caller: None

    # --- reading ------------------------------------------------------------------------

    def visible_signatures(self, requester: str, target: str) -> dict[str, list[Signature]]:
        """Uploaded signatures on `target`'s keys that `requester` sees, by key ID: the
        target's own, and the requester's (a user-signing signature is the signer's
        business, as in Synapse)."""
        out: dict[str, list[Signature]] = {}
        for s in self.store.signatures_on(target):
            if s.signer_user_id in (target, requester):
                out.setdefault(s.target_key_id, []).append(s)
        return out

    @staticmethod
    def with_signatures(signed: dict, signatures: Iterable[Signature]) -> dict:
        out = copy.deepcopy(signed)
        for s in signatures:
            out.setdefault("signatures", {}).setdefault(s.signer_user_id, {})[s.signer_key_id] = (
                s.signature
            )
        return out

    def keys_for(self, requester: str, user_id: str) -> dict[str, dict]:
        """{key_type: key} as /keys/query shows them: a user-signing key to its owner only."""
        keys = self.store.cross_signing_keys(user_id)
        if requester != user_id:
            keys.pop("user_signing", None)
        master = keys.get("master")
        if master is not None:
            _, public = single_key(master, "master_key")
            signatures = self.visible_signatures(requester, user_id).get(public, ())
            keys["master"] = self.with_signatures(master, signatures)
        return keys

    # --- device_signing/upload ------------------------------------------------------------

    def needs_auth(self, requester: Requester, body: dict) -> bool:
        """User-interactive auth is asked for unless this is the user's first master key or
        the same keys again (a client retrying), as Synapse and clients expect."""
        stored = self.store.cross_signing_keys(requester.user_id)
        if "master" not in stored:
            return False
        uploaded = {t: body.get(f"{t}_key") for t in KEY_TYPES if body.get(f"{t}_key")}
        return any(stored.get(t) != key for t, key in uploaded.items())

    def upload_keys(self, requester: Requester, body: dict) -> None:
        user_id = requester.user_id
        uploaded: dict[str, dict] = {}
        for key_type in KEY_TYPES:
            key = body.get(f"{key_type}_key")
            if key is None:
                continue
            if not isinstance(key, dict) or key.get("user_id") != user_id:
                raise invalid_param(f"{key_type}_key must be an object with the uploader's user_id")
            usage = key.get("usage")
            if not isinstance(usage, list) or key_type not in usage:
                raise invalid_param(f"{key_type}_key.usage must include {key_type!r}")
            single_key(key, f"{key_type}_key")
            uploaded[key_type] = key
        if not uploaded:
            return
        master = uploaded.get("master") or self.store.cross_signing_keys(user_id).get("master")
        if master is None:
            raise invalid_param("No master key uploaded or stored")
        master_id, master_public = single_key(master, "master_key")
        for key_type in ("self_signing", "user_signing"):
            key = uploaded.get(key_type)
            if key is not None and not has_valid_signature(key, user_id, master_id, master_public):
                raise invalid_signature(f"{key_type}_key is not signed by the master key")
        self.store.put_cross_signing_keys(user_id, uploaded)
        # A user-signing key alone is the user's own business: no other server sees it.
        self.on_keys_changed(user_id, signing=bool(uploaded.keys() - {"user_signing"}))

    # --- signatures/upload --------------------------------------------------------------

    def upload_signatures(self, requester: Requester, body: dict, caller: Any = None) -> dict:
        """`caller`: the client's admission, for asking another server for its user's
        master key (federation/admission.py)."""
        failures: dict[str, dict] = {}
        accepted: list[Signature] = []
        for user_id, by_key in body.items():
            if not isinstance(by_key, dict):
                raise invalid_param("Each user maps key IDs to signed objects")
            for key_id, signed in by_key.items():
                try:
                    accepted += self._check_signed(requester, user_id, key_id, signed, caller)
                except MatrixError as e:
                    failures.setdefault(user_id, {})[key_id] = _failure(e.errcode, e.error)
        self.store.put_signatures(accepted)
        for user_id in {s.target_user_id for s in accepted}:
            own = [s for s in accepted if s.target_user_id == user_id == requester.user_id]
            devices = {
                s.target_key_id for s in own if self.store.device_keys(user_id, s.target_key_id)
            }
            self.on_keys_changed(user_id, devices=devices, signing=len(devices) < len(own))
        return {"failures": failures}

    def _check_signed(
        self, requester: Requester, user_id: str, key_id: str, signed: object, caller: Any
    ) -> list[Signature]:
        if not isinstance(signed, dict):
            raise invalid_param("A signed object must be an object")
        me = requester.user_id
        stored, signer, what = self._target(me, user_id, key_id, caller)
        if _unsigned(signed) != _unsigned(stored):
            raise invalid_signature(f"The signed object is not the stored {what}")
        out = []
        for signer_key_id, signature in new_signatures(signed, me).items():
            if signer_key_id in (stored.get("signatures", {}).get(me) or {}):
                continue
            public = self._signer_public(me, signer_key_id, signer)
            if public is None or not has_valid_signature(signed, me, signer_key_id, public):
                raise invalid_signature(f"Bad signature by {signer_key_id} on the {what}")
            out.append(Signature(user_id, key_id, me, signer_key_id, signature))
        return out

    def _target(
        self, me: str, user_id: str, key_id: str, caller: Any
    ) -> tuple[dict, dict | None, str]:
        """(the stored key signed, the cross-signing key that must have signed it or None
        for one of `me`'s devices, what it is)."""
        own = self.store.cross_signing_keys(me)
        device = self.store.device_keys(me, key_id) if user_id == me else None
        if device is not None:
            stored, signer, what = device, own.get("self_signing"), "device keys"
            if signer is None:
                raise invalid_signature("No self-signing key to sign a device with")
        else:
            if server_of(user_id) == self.server_name:
                master = self.store.cross_signing_keys(user_id).get("master")
            else:
                master = self.remote_master(user_id, caller)
            if master is None or single_key(master, "master_key")[1] != key_id:
                raise MatrixError(404, Codes.NOT_FOUND, "No such key")
            stored, signer, what = master, None, "master key"
            if user_id != me:
                signer = own.get("user_signing")
                if signer is None:
                    raise invalid_signature("No user-signing key to sign another user with")
        return stored, signer, what

    def _signer_public(self, me: str, signer_key_id: str, signer: dict | None) -> str | None:
        """The public key behind `signer_key_id`: the named cross-signing key, or (signer
        None: one's own master key is signed by a device) one of one's devices."""
        if signer is not None:
            key_id, public = single_key(signer, "signing key")
            return public if key_id == signer_key_id else None
        device = self.store.device_keys(me, signer_key_id.removeprefix("ed25519:"))
        public = (device or {}).get("keys", {}).get(signer_key_id)
        return public if isinstance(public, str) else None


def _unsigned(signed: dict) -> dict:
    return {k: v for k, v in signed.items() if k not in ("signatures", "unsigned")}
