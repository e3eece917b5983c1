"""Matrix identifier grammar (spec appendices, "Identifier Grammar"): server names, user
IDs, room IDs and room aliases. Pure functions; nothing here touches storage."""

from __future__ import annotations

import ipaddress
import re
import secrets
import string

MAX_IDENTIFIER_BYTES = 255

# Used with fullmatch: `$` would also match before a final newline. Labels are never empty:
# "..", ".a", "a." and "a..b" name no host (Synapse's grammar refuses them too).
_DNS_NAME = re.compile(r"[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*")
_IPV6_CHARS = re.compile(r"[0-9A-Fa-f:.]{2,45}")
_ROOM_ID_ALPHABET = string.ascii_letters
# A sha256 in URL-safe unpadded base64 is 43 characters.
_HASH_ROOM_ID = re.compile(r"![A-Za-z0-9_\-]{43}")


def is_valid_server_name(name: str) -> bool:
    """server_name = hostname [":" port], hostname an IPv4 or [IPv6] literal or a DNS name."""
    if name.startswith("["):
        end = name.find("]")
        if end < 0:
            return False
        host, rest = name[1:end], name[end + 1 :]
        if not _IPV6_CHARS.fullmatch(host):
            return False
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return False
    else:
        host, sep, port = name.partition(":")
        rest = sep + port
        if len(host) > 255 or not _DNS_NAME.fullmatch(host):
            return False
    if rest:
        port = rest[1:]
        return (
            rest[0] == ":"
            and port.isascii()
            and port.isdigit()
            and 1 <= len(port) <= 5
            and 0 < int(port) < 65536
        )
    return True


def _split(identifier: str, sigil: str) -> tuple[str, str] | None:
    """(localpart, server name) of `sigil localpart : server`, or None if malformed."""
    if not identifier.startswith(sigil) or len(identifier.encode("utf-8")) > MAX_IDENTIFIER_BYTES:
        return None
    localpart, sep, server = identifier[1:].partition(":")
    if not sep or "\x00" in localpart or not is_valid_server_name(server):
        return None
    return localpart, server


def parse_user_id(user_id: str) -> tuple[str, str] | None:
    """(localpart, server) of a user ID. Historical localparts (any code point but `:` and
    NUL) are accepted, as the spec requires for IDs already in rooms."""
    return _split(user_id, "@")


def is_valid_user_id(user_id: str) -> bool:
    return parse_user_id(user_id) is not None


def is_server_event_id(event_id: str) -> bool:
    """`$opaque:server`: an event ID of room versions 1 and 2, which names its server."""
    parts = _split(event_id, "$")
    return parts is not None and bool(parts[0])


def parse_room_alias(alias: str) -> tuple[str, str] | None:
    """(localpart, server) of `#localpart:server`; the localpart may not be empty."""
    parts = _split(alias, "#")
    if parts is None or not parts[0]:
        return None
    return parts


def is_valid_room_id(room_id: str) -> bool:
    """`!localpart:server` (room versions 1 to 11) or `!hash` (version 12 and later)."""
    if ":" not in room_id:
        return is_hash_room_id(room_id)
    parts = _split(room_id, "!")
    return parts is not None and bool(parts[0])


def is_hash_room_id(room_id: str) -> bool:
    """A room ID that is a create event's reference hash (room version 12 and later): `!`
    and 43 characters of URL-safe unpadded base64, no server part."""
    return _HASH_ROOM_ID.fullmatch(room_id) is not None


def room_id_server(room_id: str) -> str | None:
    """The server a room ID names, or None for a v12 room ID, which names none: a room's
    origin is then not in its ID, and only the room's state tells where it lives."""
    if is_hash_room_id(room_id):
        return None
    return server_of(room_id) or None


def room_id_for_create_event(create_event_id: str) -> str:
    """A v12 room's ID: its create event's ID with the sigil `!` instead of `$`."""
    return "!" + create_event_id[1:]


def create_event_id_for_room(room_id: str) -> str:
    """The ID of the create event a v12 room ID names (the inverse of
    `room_id_for_create_event`)."""
    return "$" + room_id[1:]


def host_of(server_name: str) -> str:
    """The host part of a server name: `[::1]:8008` -> `[::1]`, `a.b:80` -> `a.b`."""
    if server_name.startswith("["):
        return server_name[: server_name.index("]") + 1]
    return server_name.rsplit(":", 1)[0] if server_name.count(":") == 1 else server_name


def server_of(identifier: str) -> str:
    """The server part of `&localpart:server` ("" when there is none). For room IDs use
    `room_id_server`: a v12 room ID has no server part."""
    return identifier.partition(":")[2]


def new_room_id(server_name: str) -> str:
    # 18 letters: ~100 bits, as unguessable as Synapse's room IDs.
    localpart = "".join(secrets.choice(_ROOM_ID_ALPHABET) for _ in range(18))
    return f"!{localpart}:{server_name}"
