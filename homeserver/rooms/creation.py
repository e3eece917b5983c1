"""POST /createRoom: the events a new room starts with, in the order the spec gives.

`plan_room` is pure: request in, list of planned events out. `RoomCreator` checks what must
be checked before anything is written (room version, alias, invitees), then has the room
service build, authorise and store every event, the alias and the directory entry in one
transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from homeserver.core.errors import Codes, MatrixError, invalid_param, not_found
from homeserver.core.identifiers import is_valid_user_id, server_of
from homeserver.federation.admission import Caller
from homeserver.rooms.remote_membership import RemoteMembership
from homeserver.rooms.service import PlannedEvent, RoomService
from homeserver.rooms.versions import (
    DEFAULT_ROOM_VERSION,
    KNOWN_ROOM_VERSIONS,
    RoomVersion,
)


@dataclass(frozen=True)
class Preset:
    join_rule: str
    history_visibility: str
    guest_access: str
    invitees_are_admins: bool
    invite_level: int


PRESETS = {
    "private_chat": Preset("invite", "shared", "can_join", False, 0),
    "trusted_private_chat": Preset("invite", "shared", "can_join", True, 0),
    "public_chat": Preset("public", "shared", "forbidden", False, 50),
}

# Other servers' invitees are invited one after another under one deadline: a DM or a small
# group fits, a long list would mostly run out of time.
MAX_REMOTE_INVITEES = 10

# Types a client may not put in initial_state: the server writes these itself.
_RESERVED_INITIAL_STATE = ("m.room.create", "m.room.member")


@dataclass(frozen=True)
class CreateRoomRequest:
    visibility: str = "private"
    preset: str | None = None
    room_alias_name: str | None = None
    name: str | None = None
    topic: str | None = None
    invite: tuple = ()
    is_direct: bool = False
    room_version: str | None = None
    creation_content: dict = field(default_factory=dict)
    initial_state: tuple = ()  # ({type, state_key, content}, ...)
    power_level_content_override: dict | None = None


def default_power_levels(
    version: RoomVersion, creator: str, preset: Preset, invitees: tuple
) -> dict:
    # v12: creators are above every level and may not be listed; a trusted chat's invitees
    # are made creators instead (`_create_content`).
    users = {} if version.creators_have_infinite_power else {creator: 100}
    if preset.invitees_are_admins and not version.creators_have_infinite_power:
        users.update({user: 100 for user in invitees})
    return {
        "users": users,
        "users_default": 0,
        "events": {
            "m.room.name": 50,
            "m.room.power_levels": 100,
            "m.room.history_visibility": 100,
            "m.room.canonical_alias": 50,
            "m.room.avatar": 50,
            # v12: only creators may upgrade the room (Synapse's default too).
            "m.room.tombstone": 150 if version.creators_have_infinite_power else 100,
            "m.room.server_acl": 100,
            "m.room.encryption": 100,
        },
        "events_default": 0,
        "state_default": 50,
        "ban": 50,
        "kick": 50,
        "redact": 50,
        "invite": preset.invite_level,
    }


def plan_room(
    version: RoomVersion,
    creator: str,
    request: CreateRoomRequest,
    alias: str | None,
    profile: dict | None = None,
) -> list[PlannedEvent]:
    """`profile`: the creator's displayname and avatar_url, for their join event."""
    preset = _preset(request)
    initial: dict[tuple[str, str], dict] = {}
    for item in request.initial_state:
        initial[(item["type"], item.get("state_key", ""))] = item["content"]

    def state(event_type: str, content: dict, state_key: str = "") -> PlannedEvent:
        return PlannedEvent(creator, event_type, content, state_key)

    planned = [
        state("m.room.create", _create_content(version, creator, request)),
        state("m.room.member", {**(profile or {}), "membership": "join"}, creator),
    ]

    power_levels = initial.pop(("m.room.power_levels", ""), None)
    if power_levels is None:
        power_levels = default_power_levels(version, creator, preset, request.invite)
    power_levels = {**power_levels, **(request.power_level_content_override or {})}
    planned.append(state("m.room.power_levels", power_levels))

    if alias is not None:
        planned.append(state("m.room.canonical_alias", {"alias": alias}))

    # The preset's state, unless initial_state sets the same thing.
    planned += [
        state(event_type, content)
        for event_type, content in _preset_state(preset)
        if (event_type, "") not in initial
    ]

    # The request's name and topic replace initial_state's, and come after it.
    named = _name_and_topic(request)
    for event_type, _ in named:
        initial.pop((event_type, ""), None)
    planned += [state(t, content, key) for (t, key), content in initial.items()]
    planned += [state(event_type, content) for event_type, content in named]

    # Another server's user is invited after the room exists (it must countersign).
    planned += [
        state("m.room.member", invite_content(request), invitee)
        for invitee in request.invite
        if server_of(invitee) == server_of(creator)
    ]
    return planned


def _preset(request: CreateRoomRequest) -> Preset:
    return PRESETS[
        request.preset or ("public_chat" if request.visibility == "public" else "private_chat")
    ]


def _create_content(version: RoomVersion, creator: str, request: CreateRoomRequest) -> dict:
    content = dict(request.creation_content)
    content["room_version"] = version.identifier
    if version.implicit_room_creator:
        content.pop("creator", None)  # v11: the creator is the create event's sender
    else:
        content["creator"] = creator
    if (
        version.creators_have_infinite_power
        and _preset(request).invitees_are_admins
        and request.invite
    ):
        # v12: a trusted private chat's invitees become creators, as Synapse makes them.
        given = content.get("additional_creators", [])
        if isinstance(given, list):  # anything else is refused by the auth rules
            content["additional_creators"] = list(dict.fromkeys([*given, *request.invite]))
    return content


def _preset_state(preset: Preset) -> list[tuple[str, dict]]:
    return [
        ("m.room.join_rules", {"join_rule": preset.join_rule}),
        ("m.room.history_visibility", {"history_visibility": preset.history_visibility}),
        ("m.room.guest_access", {"guest_access": preset.guest_access}),
    ]


def _name_and_topic(request: CreateRoomRequest) -> list[tuple[str, dict]]:
    named: list[tuple[str, dict]] = []
    if request.name is not None:
        named.append(("m.room.name", {"name": request.name}))
    if request.topic is not None:
        named.append(
            (
                "m.room.topic",
                {
                    "topic": request.topic,
                    "m.topic": {"m.text": [{"mimetype": "text/plain", "body": request.topic}]},
                },
            )
        )
    return named


def invite_content(request: CreateRoomRequest) -> dict:
    content: dict = {"membership": "invite"}
    if request.is_direct:
        content["is_direct"] = True
    return content


class RoomCreator:
    def __init__(
        self, rooms: RoomService, directory, server_name: str, remote_membership: RemoteMembership
    ):
        self.rooms = rooms
        self.directory = directory
        self.server_name = server_name
        self.remote_membership = remote_membership

    def create(self, creator: str, request: CreateRoomRequest, caller: Caller | None = None) -> str:
        """The new room's ID. Other servers' users are invited once it exists, under one
        client-triggered slot and deadline taken first (for `caller`: in-process callers
        without one invite local users only); a failed invite fails the request, as
        Synapse's does, and the room stays."""
        version = self._room_version(request.room_version)
        for item in request.initial_state:
            if item["type"] in _RESERVED_INITIAL_STATE:
                raise invalid_param(f"initial_state may not contain {item['type']}")
        invitees = self._invitees(creator, request.invite)
        request = CreateRoomRequest(**{**request.__dict__, "invite": invitees})

        alias = None
        if request.room_alias_name is not None:
            alias = self.directory.check_new_alias(
                f"#{request.room_alias_name}:{self.server_name}", taken_errcode=Codes.ROOM_IN_USE
            )

        def extra_writes(room_id: str) -> list:
            writes = []
            if alias is not None:
                writes.append(self.directory.alias_writer(alias, room_id, creator))
            if request.visibility == "public":
                writes.append(self.directory.publish_writer(room_id))
            return writes

        # The spec asks servers to put their users' profile in their member events.
        profiles = self.rooms.profiles
        profile = profiles.member_fields(creator) if profiles is not None else {}
        planned = plan_room(version, creator, request, alias, profile)
        remote = [u for u in invitees if server_of(u) != self.server_name]
        if not remote:
            return self.rooms.create_room(version, creator, planned, extra_writes)
        if caller is None:
            raise ValueError("inviting other servers' users needs the client's Caller")
        with self.remote_membership.inviting(caller, remote) as invite:
            room_id = self.rooms.create_room(version, creator, planned, extra_writes)
            for target in remote:
                invite(creator, room_id, target, invite_content(request))
        return room_id

    def _invitees(self, creator: str, invite: tuple) -> tuple:
        """The users to invite, once each: local users that exist, and other servers' users
        (checked by their servers when invited), at most MAX_REMOTE_INVITEES of those."""
        invitees = tuple(dict.fromkeys(u for u in invite if u != creator))
        remote = 0
        for user_id in invitees:
            if not is_valid_user_id(user_id):
                raise invalid_param(f"Not a valid user ID: {user_id}")
            if server_of(user_id) != self.server_name:
                remote += 1
            elif not self.rooms.accounts.user_exists(user_id):
                raise not_found(f"Unknown user {user_id}")
        if remote > MAX_REMOTE_INVITEES:
            raise invalid_param(
                f"createRoom invites at most {MAX_REMOTE_INVITEES} users of other servers;"
                " invite the others with /invite"
            )
        return invitees

    @staticmethod
    def _room_version(identifier: str | None) -> RoomVersion:
        return DEFAULT_ROOM_VERSION if identifier is None else supported_version(identifier)


def supported_version(identifier: str) -> RoomVersion:
    """A version new rooms may have (createRoom's, an upgrade's), or 400 as the spec says."""
    version = KNOWN_ROOM_VERSIONS.get(identifier)
    if version is None:
        raise MatrixError(
            400, Codes.UNSUPPORTED_ROOM_VERSION, f"Room version {identifier!r} is not supported"
        )
    return version
