"""Server ACLs (client-server spec, `m.room.server_acl`; server-server spec, "Server Access
Control Lists"): which servers may take part in a room, by its current state.

The rules, as the spec gives them: the server name is matched without its port; with
`allow_ip_literals` false (it is true unless it is the boolean false), a name that is an
IP literal is denied; a name that matches any `deny` glob is denied; otherwise it is allowed
only if it matches an `allow` glob (no `allow` list allows nobody). In a glob `*` matches any
run of characters and `?` one; names are compared without regard to case, as DNS names are.
Entries that are not strings are ignored.

The origin of a request (the server X-Matrix authenticated) is what is matched, never a
server named inside a PDU. Where it applies: inbound PDUs and typing and receipt EDUs of a
transaction (rooms/pdu_checks.py, sync/edus.py), make_*/send_* and invites
(rooms/federation_membership.py), and every read of a room's events
(rooms/federation_reads.py).
"""

from __future__ import annotations

import ipaddress
import re

from homeserver.core.errors import forbidden
from homeserver.federation.discovery import split_server_name
from homeserver.storage.rooms import RoomStore

SERVER_ACL = ("m.room.server_acl", "")
# Parsed ACLs kept, by event ID (an event's content never changes once it is stored).
_CACHED_ACLS = 256


class ServerAcl:
    """One ACL event's rules, parsed once."""

    def __init__(self, content: dict):
        self.allow_ip_literals = content.get("allow_ip_literals") is not False
        self._deny = _globs(content.get("deny"))
        self._allow = _globs(content.get("allow"))

    def allows(self, server_name: str) -> bool:
        try:
            host, _ = split_server_name(server_name)
        except ValueError:
            return False  # not a server name: nothing it could be allowed as
        if ":" in host:
            host = f"[{host}]"  # an IPv6 literal, as server names write it
        if not self.allow_ip_literals and _is_ip_literal(host):
            return False
        if self._deny is not None and self._deny.fullmatch(host):
            return False
        return self._allow is not None and self._allow.fullmatch(host) is not None


def _globs(value) -> re.Pattern | None:
    """One pattern for a list of globs; None when the list has none."""
    if not isinstance(value, list):
        return None
    parts = [
        re.escape(glob).replace(r"\*", ".*").replace(r"\?", ".")
        for glob in value
        if isinstance(glob, str)
    ]
    return (
        re.compile("|".join(f"(?:{p})" for p in parts), re.IGNORECASE | re.DOTALL)
        if parts
        else None
    )


def _is_ip_literal(host: str) -> bool:
    if host.startswith("["):
        return True
    try:
        ipaddress.IPv4Address(host)
        return True
    except ValueError:
        return False


class ServerAcls:
    """The ACL of each room, from its current state."""

    def __init__(self, store: RoomStore):
        self.store = store
        self._parsed: dict[str, ServerAcl] = {}

    def allows(self, room_id: str, server_name: str) -> bool:
        """May `server_name` take part in `room_id` now? A room without an ACL allows all."""
        found = self.store.current_state(room_id, [SERVER_ACL]).get(SERVER_ACL)
        if found is None:
            return True
        acl = self._parsed.get(found.event.event_id)
        if acl is None:
            if len(self._parsed) >= _CACHED_ACLS:
                self._parsed.pop(next(iter(self._parsed)))
            content = found.event.content
            acl = self._parsed[found.event.event_id] = ServerAcl(
                content if isinstance(content, dict) else {}
            )
        return acl.allows(server_name)

    def check(self, room_id: str, server_name: str) -> None:
        """403 unless `server_name` may take part in `room_id`."""
        if not self.allows(room_id, server_name):
            raise forbidden(f"Server {server_name} is denied by the room's server ACL")
