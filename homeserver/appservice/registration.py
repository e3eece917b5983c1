"""Registration files (Application Service API, "Registration"): YAML, read at start.

Each file the operator lists in `app_service_config_files` is validated here with
marshmallow; a bad one is a ConfigError naming the file and the key, so the server exits 2
with one line before it serves (app.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml  # type: ignore[import-untyped]
from marshmallow import EXCLUDE, Schema, ValidationError, fields, validate, validates

from homeserver.config import ConfigError, _first_error

# The unstable names bridges still write (MSC2409 ephemeral events, MSC3202 devices).
MSC2409_PUSH_EPHEMERAL = "de.sorunome.msc2409.push_ephemeral"
MSC3202 = "org.matrix.msc3202"


class _Namespace(Schema):
    class Meta:
        unknown = EXCLUDE

    exclusive = fields.Boolean(required=True)
    regex = fields.String(required=True, validate=validate.Length(min=1))

    @validates("regex")
    def _compiles(self, value: str, **kwargs) -> None:
        try:
            re.compile(value)
        except re.error as e:
            raise ValidationError(f"Not a valid regular expression: {e}.") from None


class _Namespaces(Schema):
    class Meta:
        unknown = EXCLUDE

    users = fields.List(fields.Nested(_Namespace), load_default=list)
    aliases = fields.List(fields.Nested(_Namespace), load_default=list)
    rooms = fields.List(fields.Nested(_Namespace), load_default=list)


class _RegistrationSchema(Schema):
    class Meta:
        unknown = EXCLUDE  # bridges write keys of their own

    id = fields.String(required=True, validate=validate.Length(min=1))
    # Required but may be null: an appservice that only registers users gets no pushes.
    url = fields.Url(required=True, allow_none=True, schemes={"http", "https"}, require_tld=False)
    as_token = fields.String(required=True, validate=validate.Length(min=1))
    hs_token = fields.String(required=True, validate=validate.Length(min=1))
    sender_localpart = fields.String(required=True, validate=validate.Length(min=1))
    namespaces = fields.Nested(_Namespaces, load_default=dict)
    rate_limited = fields.Boolean(load_default=True)
    receive_ephemeral = fields.Boolean(load_default=False)
    push_ephemeral = fields.Boolean(data_key=MSC2409_PUSH_EPHEMERAL, load_default=False)
    msc3202 = fields.Boolean(data_key=MSC3202, load_default=False)
    protocols = fields.List(fields.String(), load_default=list)


@dataclass(frozen=True)
class Namespace:
    exclusive: bool
    pattern: re.Pattern

    def matches(self, value: str) -> bool:
        return self.pattern.fullmatch(value) is not None


def _namespaces(items: list[dict]) -> tuple[Namespace, ...]:
    return tuple(Namespace(i["exclusive"], re.compile(i["regex"])) for i in items)


@dataclass(frozen=True)
class Registration:
    id: str
    url: str | None
    as_token: str
    hs_token: str
    sender: str  # the appservice's own user ID
    users: tuple[Namespace, ...]
    aliases: tuple[Namespace, ...]
    rooms: tuple[Namespace, ...]
    rate_limited: bool
    ephemeral: bool  # typing and receipts in its transactions (MSC2409)
    msc3202: bool  # to-device messages for its users, and masquerading as a device
    protocols: tuple[str, ...] = ()  # third-party protocols it answers lookups for

    def is_interested_in_user(self, user_id: str) -> bool:
        return user_id == self.sender or any(n.matches(user_id) for n in self.users)

    def owns_user(self, user_id: str) -> bool:
        """`user_id` is one it may register and masquerade as."""
        return self.is_interested_in_user(user_id)

    def exclusive_user(self, user_id: str) -> bool:
        return user_id == self.sender or any(n.exclusive and n.matches(user_id) for n in self.users)

    def is_interested_in_alias(self, alias: str) -> bool:
        return any(n.matches(alias) for n in self.aliases)

    def exclusive_alias(self, alias: str) -> bool:
        return any(n.exclusive and n.matches(alias) for n in self.aliases)

    def is_interested_in_room_id(self, room_id: str) -> bool:
        return any(n.matches(room_id) for n in self.rooms)


def parse_registration(data: object, server_name: str) -> Registration:
    """Raises ValidationError for a registration the spec would not accept."""
    if not isinstance(data, dict):
        raise ValidationError("Expected a mapping at the top level.")
    loaded = _RegistrationSchema().load(data)
    namespaces = loaded["namespaces"]
    return Registration(
        id=loaded["id"],
        url=loaded["url"].rstrip("/") if loaded["url"] else None,
        as_token=loaded["as_token"],
        hs_token=loaded["hs_token"],
        sender=f"@{loaded['sender_localpart']}:{server_name}",
        users=_namespaces(namespaces["users"]),
        aliases=_namespaces(namespaces["aliases"]),
        rooms=_namespaces(namespaces["rooms"]),
        rate_limited=loaded["rate_limited"],
        ephemeral=loaded["receive_ephemeral"] or loaded["push_ephemeral"],
        msc3202=loaded["msc3202"],
        protocols=tuple(loaded["protocols"]),
    )


def load_registrations(paths: tuple[str, ...], server_name: str) -> tuple[Registration, ...]:
    """Every file's registration; ConfigError (one line) for the first bad one, or for two
    that share an id or an as_token (a token must name one appservice)."""
    key = "app_service_config_files"
    found: list[Registration] = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                data = yaml.safe_load(f)
        except OSError as e:
            raise ConfigError(key, f"{path}: cannot be read: {e.strerror}") from None
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            reason = " ".join(str(e).split())
            raise ConfigError(key, f"{path}: not valid YAML: {reason}") from None
        try:
            registration = parse_registration(data, server_name)
        except ValidationError as e:
            field, reason = _first_error(e.messages)
            raise ConfigError(key, f"{path}: {field}: {reason}" if field else reason) from None
        for other in found:
            if other.id == registration.id or other.as_token == registration.as_token:
                raise ConfigError(key, f"{path}: its id or as_token is another file's too")
        found.append(registration)
    return tuple(found)
