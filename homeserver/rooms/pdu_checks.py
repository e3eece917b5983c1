"""Checks on the PDUs of an inbound transaction before they are authorised: spec v1.16,
"Checks performed on receipt of a PDU", steps 1 to 3.

1. A valid event of its room's version, for a room this server is in; else dropped.
2. Signed by the sender's server (and, for a restricted join, by the server of the user who
   authorised it), with keys valid at its ``origin_server_ts``; else dropped.
3. A content hash that matches; else it is replaced by its redacted copy.

A worker shard runs these under its share of the key-resolution budget, and main runs them
again under its own for every relayed PDU: keys are resolved through the keyring
and nowhere else, with the source IP of the inbound request. A refused key resolution
refuses the whole transaction (``KeyResolutionRefused``), before anything is applied.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import gevent
import gevent.pool
from unpaddedbase64 import decode_base64

from homeserver.core import strict_json
from homeserver.core.concurrency import in_turns
from homeserver.core.events import Event
from homeserver.core.identifiers import server_of
from homeserver.federation.errors import InvalidSignature, KeyResolutionRefused
from homeserver.federation.key_documents import verify_with_keys
from homeserver.federation.keyring import Keyring
from homeserver.rooms.events import (
    InvalidEvent,
    check_pdu_format,
    compute_content_hash,
    event_id_for,
    redact,
)
from homeserver.rooms.out_of_room import OutOfRoomEnds
from homeserver.rooms.server_acl import ServerAcls
from homeserver.rooms.service import RoomService
from homeserver.rooms.versions import (
    DEFAULT_ROOM_VERSION,
    KNOWN_ROOM_VERSIONS,
    RoomVersion,
)

log = logging.getLogger(__name__)

# A PDU's content may nest as deep as any kept value; the PDU is one level more.
MAX_PDU_DEPTH = strict_json.MAX_DEPTH + 1


@dataclass(frozen=True)
class CheckedPdu:
    """One PDU after the checks. ``error`` set: it is dropped, and the sender is told why.
    Otherwise ``event`` is what is to be authorised (the redacted copy if the hash did not
    match) and ``signed_by`` the servers whose signatures were verified."""

    event_id: str
    pdu: dict
    version: RoomVersion
    event: Event | None = None
    signed_by: frozenset = frozenset()
    error: str | None = None
    hash_mismatch: bool = False  # kept redacted: its content hash did not match


def _identify(pdu: dict, rooms: dict) -> CheckedPdu:
    """The PDU's room version and event ID, and the checks that need no key (step 1)."""
    room_id = pdu.get("room_id")
    version = rooms.get(room_id) if isinstance(room_id, str) else None
    # A room we do not know has no known version; its event ID is computed the way our
    # default version would, so the sender is still told something about it.
    event_id = event_id_for(version or DEFAULT_ROOM_VERSION, pdu)
    checked = CheckedPdu(event_id, pdu, version or DEFAULT_ROOM_VERSION)
    if strict_json.nested_deeper_than(pdu, MAX_PDU_DEPTH):
        return _failed(checked, f"invalid event: nested deeper than {MAX_PDU_DEPTH} levels")
    if version is None:
        return _failed(checked, "this server is not in the room")
    try:
        check_pdu_format(version, Event(event_id, pdu))
    except InvalidEvent as e:
        return _failed(checked, f"invalid event: {e}")
    return checked


def _failed(checked: CheckedPdu, error: str) -> CheckedPdu:
    return CheckedPdu(checked.event_id, checked.pdu, checked.version, error=error)


def signing_servers(pdu: dict, version: RoomVersion) -> list[str]:
    """The servers that must have signed the event: the sender's, in v1 and v2 the server
    its event ID names (it chose the ID), and for a restricted join the server of the user
    named as authorising it."""
    servers = [server_of(pdu["sender"])]
    if not version.event_id_is_reference_hash and server_of(pdu["event_id"]) not in servers:
        servers.append(server_of(pdu["event_id"]))
    content = pdu["content"]
    authoriser = content.get("join_authorised_via_users_server")
    if (
        version.restricted_join_rule
        and pdu["type"] == "m.room.member"
        and content.get("membership") == "join"
        and isinstance(authoriser, str)
        and server_of(authoriser) not in servers
        and server_of(authoriser)
    ):
        servers.append(server_of(authoriser))
    return servers


def signers(items: list[CheckedPdu]) -> tuple[dict[str, set[str]], int]:
    """({server: the key IDs its signatures name}, the newest origin_server_ts) over the
    well-formed of `items`: the keys their checks will look up (`Keyring.prefetch`)."""
    wanted: dict[str, set[str]] = {}
    newest = 0
    for item in in_turns(items, SIGNERS_PER_PAUSE):  # a big room's answer: 100,000 events
        pdu = item.pdu
        try:
            servers = signing_servers(pdu, item.version)
            signatures = pdu["signatures"]
            newest = max(newest, int(pdu["origin_server_ts"]))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue  # malformed: its own check says so
        for server in servers:
            key_ids = signatures.get(server) if isinstance(signatures, dict) else None
            if isinstance(key_ids, dict):
                wanted.setdefault(server, set()).update(
                    k for k in key_ids if isinstance(k, str) and k.startswith("ed25519:")
                )
    return wanted, newest


class PduChecker:
    def __init__(
        self,
        keyring: Keyring,
        rooms: RoomService,
        out_of_room: OutOfRoomEnds | None = None,
        acls: ServerAcls | None = None,
    ):
        self.keyring = keyring
        self.rooms = rooms
        # The rooms' server ACLs, for PDUs sent by an origin (a transaction's).
        self._acls = acls
        # Where a PDU of a room we are not in may end a kept invite or knock (out_of_room.py).
        self._out_of_room = out_of_room

    def check(
        self,
        pdus: list[dict],
        source_ip: str | None,
        origin: str | None = None,
        wanted: set[str] | None = None,
    ) -> list[CheckedPdu]:
        """The checked PDUs, in order; a PDU too broken to have an event ID is left out.
        Signatures of all PDUs are verified at once, each server's keys fetched once.
        Raises ``KeyResolutionRefused`` as soon as one key fetch is refused. `origin`: the
        server that sent them, whom each room's server ACL must allow (before any key is
        fetched for its PDUs). `wanted`: the event IDs asked for; others are dropped
        before their signatures are checked."""
        room_versions = self._room_versions(pdus)
        allowed: dict[str, bool] = {}  # by room: its ACL, read once for all its PDUs
        checked: list[CheckedPdu] = []
        for pdu in pdus:
            try:
                item = _identify(pdu, room_versions)
            except Exception as e:  # not even an event ID: nothing to tell the sender
                log.info("dropping a PDU without an event ID: %s", e)
                continue
            if (
                item.error is None
                and origin is not None
                and not self._acl_allows(item, origin, allowed)
            ):
                item = _failed(item, f"{origin} is denied by the room's server ACL")
            if item.error is None and wanted is not None and item.event_id not in wanted:
                item = _failed(item, "not an event that was asked for")
            checked.append(item)
        return self.verify_all(checked, source_ip)

    def verify_all(
        self, items: list[CheckedPdu], source_ip: str | None, wait_for_slots: bool = False
    ) -> list[CheckedPdu]:
        """Steps 2 and 3 for each of `items` not failed already, in order. Keys are resolved
        in greenlets, every server's fetched once; signatures and content hashes, pure
        work, are checked on native threads in batches of `VERIFY_BATCH`, so that many
        events (a room's state) never hold the hub. Raises ``KeyResolutionRefused`` as soon
        as one key fetch is refused, unless `wait_for_slots`: then a fetch the budget
        refused is tried again until the caller's deadline (a join's, over a room's many
        servers)."""
        pool = gevent.pool.Pool(KEY_LOOKUPS_AT_ONCE)
        jobs: list[gevent.Greenlet | None] = []
        running: list[gevent.Greenlet] = []
        try:
            # Spawning waits for a place in the pool: inside the `try`, so that a caller
            # stopped meanwhile (its deadline) leaves no lookup behind.
            for item in items:
                job = (
                    pool.spawn(self._signing_keys, item, source_ip, wait_for_slots)
                    if item.error is None
                    else None
                )
                jobs.append(job)
                if job is not None:
                    running.append(job)
            for job in gevent.iwait(running):
                if job.exception is not None:
                    raise job.exception
                if isinstance(job.value, KeyResolutionRefused):
                    raise job.value
        finally:
            # Waiters only: a fetch in flight runs on in its own greenlet and fills the cache.
            gevent.killall([job for job in running if not job.ready()])
        results = list(items)
        todo = [
            (i, job.value)
            for i, job in enumerate(jobs)
            if job is not None and isinstance(job.value, dict)
        ]
        for i, job in enumerate(jobs):
            if job is not None and isinstance(job.value, CheckedPdu):
                results[i] = job.value  # no key to check a signature with
        threads = gevent.get_hub().threadpool
        for at in range(0, len(todo), VERIFY_BATCH):
            batch = todo[at : at + VERIFY_BATCH]
            work = [(items[i], keys) for i, keys in batch]
            # A transaction's few PDUs are checked here: a thread's round trip would cost
            # them more than it spares the hub.
            inline = len(todo) <= INLINE_VERIFY
            checked = _verify_batch(work) if inline else threads.apply(_verify_batch, (work,))
            for (i, _), result in zip(batch, checked):
                results[i] = _logged(result)
        return results

    def _acl_allows(self, item: CheckedPdu, origin: str, allowed: dict[str, bool]) -> bool:
        if self._acls is None:
            return True
        room_id = item.pdu["room_id"]
        if room_id not in allowed:
            allowed[room_id] = self._acls.allows(room_id, origin)
        return allowed[room_id]

    def _room_versions(self, pdus: list[dict]) -> dict[str, RoomVersion]:
        """The version of each room the PDUs name that this server is in (joined)."""
        versions: dict[str, RoomVersion] = {}
        named = (p.get("room_id") for p in pdus)
        for room_id in {r for r in named if isinstance(r, str)}:
            room = self.rooms.store.get_room(room_id)
            if room is not None and self.rooms.is_joined_here(room_id):
                versions[room_id] = KNOWN_ROOM_VERSIONS[room.room_version]
        ends = self._out_of_room
        for pdu in pdus:
            named_room = pdu.get("room_id")
            if ends is not None and isinstance(named_room, str) and named_room not in versions:
                version = ends.version_for(pdu)
                if version is not None:
                    versions[named_room] = version
        return versions

    def verify(self, item: CheckedPdu, source_ip: str | None) -> CheckedPdu | KeyResolutionRefused:
        """Steps 2 and 3 for one PDU. A refusal is returned, not raised: the caller raises
        it (a greenlet dying of it would only be logged as a crash)."""
        keys = self._signing_keys(item, source_ip)
        if not isinstance(keys, dict):
            return keys
        return _logged(_verify_locally(item, keys))

    def _signing_keys(
        self, item: CheckedPdu, source_ip: str | None, wait_for_slots: bool = False
    ) -> dict[str, dict] | CheckedPdu | KeyResolutionRefused:
        """The keys of each server that must have signed the PDU, or why there are none."""
        found: dict[str, dict] = {}
        servers = list(signing_servers(item.pdu, item.version))
        while servers:
            server = servers[0]
            try:
                found[server] = self.keyring.signing_keys(
                    item.pdu, server, source_ip, at_ts=_keys_valid_at(item)
                )
            except InvalidSignature as e:
                return _failed(item, f"signature of {server} not valid: {e}")
            except KeyResolutionRefused as e:
                if not wait_for_slots:
                    return e
                gevent.sleep(min(e.retry_after_ms, SLOT_RETRY_MS) / 1000)
                continue
            servers.pop(0)
        return found


# Events `signers` looks at between two pauses for the hub.
SIGNERS_PER_PAUSE = 2_000
# Key lookups running at once for one set of PDUs: each may wait on a fetch of another
# server's keys (a room's state names many servers).
KEY_LOOKUPS_AT_ONCE = 16
# How soon a key fetch the budget refused is tried again, for a caller that waits for a slot.
SLOT_RETRY_MS = 200
# Up to this many PDUs are checked in the calling greenlet, without a thread.
INLINE_VERIFY = 8
# PDUs checked per native-thread task: each costs a redaction, a canonical encoding and a
# signature check (about 0.1 ms), so a batch is a few milliseconds of work.
VERIFY_BATCH = 64


def _keys_valid_at(item: CheckedPdu) -> int:
    """When the signing keys must still be valid: at the event's origin_server_ts from
    room version 5 on; before it, any key the server ever had."""
    return item.pdu["origin_server_ts"] if item.version.enforce_key_validity else 0


def _verify_batch(batch: list[tuple[CheckedPdu, dict]]) -> list[CheckedPdu]:
    return [_verify_locally(item, keys) for item, keys in batch]


def _verify_locally(item: CheckedPdu, keys: dict[str, dict]) -> CheckedPdu:
    """Signatures (of the redacted form) and content hash: pure work, safe on a native
    thread. A hash that does not match keeps the event redacted (step 3)."""
    pdu, version = item.pdu, item.version
    redacted = redact(version, pdu)
    for server, server_keys in keys.items():
        try:
            verify_with_keys(redacted, server, server_keys)
        except InvalidSignature as e:
            return _failed(item, f"signature of {server} not valid: {e}")
    stored = {k: v for k, v in pdu.items() if k != "unsigned"}
    mismatched = compute_content_hash(pdu) != _decoded_hash(pdu)
    return CheckedPdu(
        item.event_id,
        pdu,
        version,
        Event(item.event_id, redacted if mismatched else stored),
        frozenset(keys),
        hash_mismatch=mismatched,
    )


def _logged(result: CheckedPdu) -> CheckedPdu:
    """Logs, in the hub's thread, what a check on a native thread found worth saying."""
    if result.hash_mismatch:
        log.warning(
            "event %s does not match its content hash: keeping it redacted", result.event_id
        )
    return result


def _decoded_hash(pdu: dict) -> bytes | None:
    try:
        return decode_base64(pdu["hashes"]["sha256"])
    except Exception:
        return None
