"""Room versions: what differs between them, described once as data.

Code that depends on the room version (event format, redaction, auth rules) asks the
`RoomVersion` a question (`version.updated_redaction_rules`), never compares identifiers.
Adding a version is adding an entry here, plus code for any flag that is new.

Versions 1 to 12 are known, each the one after or before with a few flags changed (the
spec's room version pages). Versions 1 and 2 events carry their own `$opaque:server` IDs
and name other events as [ID, hashes] pairs (rooms/events.py); version 1 resolves state by
the first algorithm (rooms/state_res_v1.py); version 3's IDs are standard base64, whose `/`
request paths carry escaped (http/routing.py).

Room version 12 (spec v1.16, "Room Version 12") is 11 with three changes, one flag each:
room IDs from the create event (MSC4291), creators with infinite power (MSC4289), and
state resolution v2.1 (MSC4297).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class RoomVersion:
    identifier: str
    # Event IDs are `$` + the reference hash (v3 and later); before, the event carries its
    # own `event_id`, `$opaque:server`, and names prev and auth events as [id, hashes] pairs.
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
    # v5: a signature counts only with a key valid at the event's origin_server_ts.
    enforce_key_validity: bool = True
    # Before v6: m.room.aliases has an auth rule of its own (the sender's server is its
    # state key), and redaction keeps its `aliases`.
    special_case_aliases: bool = False
    # v6: power levels' `notifications` map is checked as `events` is.
    notifications_power_levels: bool = True
    # v8: redaction keeps the join rules' `allow`; v9: a member event's
    # `join_authorised_via_users_server`.
    redaction_keeps_allow: bool = True
    redaction_keeps_join_authoriser: bool = True
    # Listed as stable in /capabilities; 1 to 5 are unstable: new rooms should not use them.
    stable: bool = True
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
    # v4: the reference hash is URL-safe base64; v3's is standard base64 (it may hold `/`).
    url_safe_event_ids: bool = True
    # v1: state resolution v1 (rooms/state_res_v1.py) instead of v2.
    state_resolution_v1: bool = False


# Room version 4: events refer to each other by URL-safe reference hashes; state
# resolution v2.
ROOM_V4 = RoomVersion(
    identifier="4",
    event_id_is_reference_hash=True,
    strict_canonical_json=False,
    integer_power_levels=False,
    knock_join_rule=False,
    restricted_join_rule=False,
    knock_restricted_join_rule=False,
    implicit_room_creator=False,
    updated_redaction_rules=False,
    enforce_key_validity=False,
    special_case_aliases=True,
    notifications_power_levels=False,
    redaction_keeps_allow=False,
    redaction_keeps_join_authoriser=False,
    stable=False,
)
# Room version 3: event IDs are the standard-base64 reference hash.
ROOM_V3 = dataclasses.replace(ROOM_V4, identifier="3", url_safe_event_ids=False)
# Room version 2: events carry their IDs; state resolution v2.
ROOM_V2 = dataclasses.replace(ROOM_V3, identifier="2", event_id_is_reference_hash=False)
# Room version 1: as 2, with state resolution v1.
ROOM_V1 = dataclasses.replace(ROOM_V2, identifier="1", state_resolution_v1=True)
ROOM_V5 = dataclasses.replace(ROOM_V4, identifier="5", enforce_key_validity=True)
ROOM_V6 = dataclasses.replace(
    ROOM_V5,
    identifier="6",
    special_case_aliases=False,
    strict_canonical_json=True,
    notifications_power_levels=True,
    stable=True,
)
ROOM_V7 = dataclasses.replace(ROOM_V6, identifier="7", knock_join_rule=True)
ROOM_V8 = dataclasses.replace(
    ROOM_V7, identifier="8", restricted_join_rule=True, redaction_keeps_allow=True
)
ROOM_V9 = dataclasses.replace(ROOM_V8, identifier="9", redaction_keeps_join_authoriser=True)
ROOM_V10 = dataclasses.replace(
    ROOM_V9, identifier="10", integer_power_levels=True, knock_restricted_join_rule=True
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
    v.identifier: v
    for v in (
        ROOM_V1,
        ROOM_V2,
        ROOM_V3,
        ROOM_V4,
        ROOM_V5,
        ROOM_V6,
        ROOM_V7,
        ROOM_V8,
        ROOM_V9,
        ROOM_V10,
        ROOM_V11,
        ROOM_V12,
    )
}

# createRoom's default, as the spec recommends and Synapse does.
DEFAULT_ROOM_VERSION = ROOM_V12
