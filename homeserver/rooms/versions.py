"""Room versions: what differs between them, described once as data.

Code that depends on the room version (event format, redaction, auth rules) asks the
`RoomVersion` a question (`version.updated_redaction_rules`), never compares identifiers.
Adding a version is adding an entry here, plus code for any flag that is new.

Room version 12 (spec v1.16, "Room Version 12") is 11 with three changes, one flag each:
room IDs from the create event (MSC4291), creators with infinite power (MSC4289), and
state resolution v2.1 (MSC4297). Weir has no state resolution yet; the third flag says
which algorithm the room needs for whoever writes it.
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
    # v12: the room ID is the create event's ID with `!` for `$` (no server part); the
    # create event has no room_id and is never listed in auth_events (the room ID implies
    # it); an event whose room ID names no accepted create event is rejected.
    room_id_is_create_event_id: bool = False
    # v12: the create event's sender and its content's `additional_creators` are the
    # creators, whose power level is infinite; power levels may not list them in `users`.
    creators_have_infinite_power: bool = False
    # v12: state resolution v2.1 (iterative auth checks start from an empty state, and the
    # full conflicted set includes the conflicted state subgraph).
    state_resolution_v2_1: bool = False


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

# Room version 12 is version 11 with hashed room IDs, all-powerful creators and state
# resolution v2.1.
ROOM_V12 = dataclasses.replace(
    ROOM_V11,
    identifier="12",
    room_id_is_create_event_id=True,
    creators_have_infinite_power=True,
    state_resolution_v2_1=True,
)

KNOWN_ROOM_VERSIONS: dict[str, RoomVersion] = {
    v.identifier: v for v in (ROOM_V10, ROOM_V11, ROOM_V12)
}

# createRoom's default stays 10 for now, though the spec says servers SHOULD default to 12:
# joins across servers and state resolution (v2, and v12's v2.1) are not in Weir yet, and a
# room made today should be one every peer can join. Switch to ROOM_V12 once they are.
DEFAULT_ROOM_VERSION = ROOM_V10
