"""Room versions: what differs between them, described once as data.

Code that depends on the room version (event format, redaction, auth rules) asks the
`RoomVersion` a question (`version.updated_redaction_rules`), never compares identifiers.
Adding a version is adding an entry here, plus code for any flag that is new.

Room version 12 is left open: it would set `room_id_is_create_event_hash` (the room ID is
the create event's reference hash, and the create event is not listed in `auth_events`)
and `creators_have_infinite_power`. Neither is implemented yet, so 12 is not listed in
`KNOWN_ROOM_VERSIONS` and asking for it is `M_UNSUPPORTED_ROOM_VERSION`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class RoomVersion:
    identifier: str
    # Event IDs are `$` + the URL-safe reference hash (v4 and later).
    event_id_is_reference_hash: bool
    # Integers outside +-(2**53 - 1), and floats, are rejected (v6 and later).
    strict_canonical_json: bool
    # Power level values must be integers, never strings (v10 and later).
    integer_power_levels: bool
    # Join rules this version knows.
    knock_join_rule: bool
    restricted_join_rule: bool
    knock_restricted_join_rule: bool
    # v11: the create event has no `creator`; the creator is the create event's sender.
    implicit_room_creator: bool
    # v11: `redacts` lives in content; redaction keeps the whole create content, the
    # redaction's `redacts`, power levels' `invite` and third_party_invite.signed, and no
    # longer keeps the top-level `origin`, `membership` and `prev_state`.
    updated_redaction_rules: bool
    # v12 (not implemented; see the module docstring).
    room_id_is_create_event_hash: bool = False
    creators_have_infinite_power: bool = False


ROOM_V10 = RoomVersion(
    identifier="10",
    event_id_is_reference_hash=True,
    strict_canonical_json=True,
    integer_power_levels=True,
    knock_join_rule=True,
    restricted_join_rule=True,
    knock_restricted_join_rule=True,
    implicit_room_creator=False,
    updated_redaction_rules=False,
)

# Room version 11 is version 10 with the clarified redaction rules and no `creator`.
ROOM_V11 = dataclasses.replace(
    ROOM_V10, identifier="11", implicit_room_creator=True, updated_redaction_rules=True
)

KNOWN_ROOM_VERSIONS: dict[str, RoomVersion] = {v.identifier: v for v in (ROOM_V10, ROOM_V11)}

DEFAULT_ROOM_VERSION = ROOM_V10
