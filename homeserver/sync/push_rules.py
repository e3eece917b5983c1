"""The server-default push rules (client-server spec v1.16, "Predefined Rules"), in the
spec's order. Users cannot change them yet: GET only."""

from __future__ import annotations

KINDS = ("override", "content", "room", "sender", "underride")

_SOUND = {"set_tweak": "sound", "value": "default"}
_HIGHLIGHT = {"set_tweak": "highlight"}


def _match(key: str, pattern: str) -> dict:
    return {"kind": "event_match", "key": key, "pattern": pattern}


def _rule(rule_id: str, conditions: list, actions: list, enabled: bool = True) -> dict:
    return {
        "rule_id": rule_id,
        "default": True,
        "enabled": enabled,
        "conditions": conditions,
        "actions": actions,
    }


def default_ruleset(user_id: str) -> dict:
    """The global ruleset for `user_id`: {kind: [rule, ...]}."""
    localpart = user_id[1:].split(":", 1)[0]
    return {
        "override": _override_rules(user_id),
        "content": [
            {
                "rule_id": ".m.rule.contains_user_name",
                "default": True,
                "enabled": True,
                "pattern": localpart,
                "actions": ["notify", _SOUND, _HIGHLIGHT],
            }
        ],
        "room": [],
        "sender": [],
        "underride": _underride_rules(),
    }


def _override_rules(user_id: str) -> list[dict]:
    """In the spec's order: the user's own rules first, then the room-wide ones."""
    return _personal_override_rules(user_id) + _room_wide_override_rules()


def _personal_override_rules(user_id: str) -> list[dict]:
    return [
        _rule(".m.rule.master", [], [], enabled=False),
        _rule(".m.rule.suppress_notices", [_match("content.msgtype", "m.notice")], []),
        _rule(
            ".m.rule.invite_for_me",
            [
                _match("type", "m.room.member"),
                _match("content.membership", "invite"),
                _match("state_key", user_id),
            ],
            ["notify", _SOUND],
        ),
        _rule(".m.rule.member_event", [_match("type", "m.room.member")], []),
        _rule(
            ".m.rule.is_user_mention",
            [
                {
                    "kind": "event_property_contains",
                    "key": "content.m\\.mentions.user_ids",
                    "value": user_id,
                }
            ],
            ["notify", _SOUND, _HIGHLIGHT],
        ),
        _rule(
            ".m.rule.contains_display_name",
            [{"kind": "contains_display_name"}],
            ["notify", _SOUND, _HIGHLIGHT],
        ),
    ]


def _room_wide_override_rules() -> list[dict]:
    return [
        _rule(
            ".m.rule.is_room_mention",
            [
                {"kind": "event_property_is", "key": "content.m\\.mentions.room", "value": True},
                {"kind": "sender_notification_permission", "key": "room"},
            ],
            ["notify", _HIGHLIGHT],
        ),
        _rule(
            ".m.rule.roomnotif",
            [
                _match("content.body", "@room"),
                {"kind": "sender_notification_permission", "key": "room"},
            ],
            ["notify", _HIGHLIGHT],
        ),
        _rule(
            ".m.rule.tombstone",
            [_match("type", "m.room.tombstone"), _match("state_key", "")],
            ["notify", _HIGHLIGHT],
        ),
        _rule(".m.rule.reaction", [_match("type", "m.reaction")], []),
        _rule(
            ".m.rule.room.server_acl",
            [_match("type", "m.room.server_acl"), _match("state_key", "")],
            [],
        ),
        _rule(
            ".m.rule.suppress_edits",
            [
                {
                    "kind": "event_property_is",
                    "key": "content.m\\.relates_to.rel_type",
                    "value": "m.replace",
                }
            ],
            [],
        ),
    ]


def _underride_rules() -> list[dict]:
    return [
        _rule(
            ".m.rule.call",
            [_match("type", "m.call.invite")],
            ["notify", {"set_tweak": "sound", "value": "ring"}],
        ),
        _rule(
            ".m.rule.encrypted_room_one_to_one",
            [{"kind": "room_member_count", "is": "2"}, _match("type", "m.room.encrypted")],
            ["notify", _SOUND],
        ),
        _rule(
            ".m.rule.room_one_to_one",
            [{"kind": "room_member_count", "is": "2"}, _match("type", "m.room.message")],
            ["notify", _SOUND],
        ),
        _rule(".m.rule.message", [_match("type", "m.room.message")], ["notify"]),
        _rule(".m.rule.encrypted", [_match("type", "m.room.encrypted")], ["notify"]),
    ]
