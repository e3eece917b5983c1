"""The spec-schema checker used by the API tests must actually reject wrong shapes."""

import pytest

from tests.support.spec import load_spec, response_schema, schema_errors


def test_schema_keywords():
    schema = {
        "type": "object",
        "required": ["a"],
        "properties": {
            "a": {"type": "integer"},
            "b": {"type": ["string", "null"], "pattern": "^#"},
            "c": {"type": "array", "items": {"enum": ["x", "y"]}},
            "d": {"allOf": [{"type": "object", "required": ["e"]}]},
            "f": {"type": "object", "additionalProperties": False, "properties": {}},
            "g": {"type": "object", "patternProperties": {"^m\\.": {"type": "integer"}}},
            "h": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        },
    }
    good = {"a": 1, "b": "#x", "c": ["x"], "d": {"e": 1}, "f": {}, "g": {"m.z": 1}, "h": 3}
    assert schema_errors(schema, good) == []
    assert schema_errors(schema, dict(good, b=None)) == []
    for bad in (
        {"b": "x"},
        {"a": True},
        {"a": 1.5},
        {"c": ["z"]},
        {"d": {}},
        {"f": {"k": 1}},
        {"g": {"m.z": "s"}},
        {"h": []},
    ):
        assert schema_errors(schema, {**good, **bad}), bad
    assert schema_errors(schema, {"b": "#x"}) == ["$: missing required 'a'"]


def test_public_rooms_schema_from_the_spec():
    if load_spec("client-server") is None:
        pytest.skip("the Matrix spec files are not in ../shared/matrix-spec")
    schema = response_schema("client-server", "get", "/_matrix/client/v3/publicRooms", 200)
    entry = {
        "room_id": "!r:x",
        "num_joined_members": 1,
        "world_readable": False,
        "guest_can_join": False,
    }
    assert schema_errors(schema, {"chunk": [entry]}) == []
    missing = {k: v for k, v in entry.items() if k != "num_joined_members"}
    assert schema_errors(schema, {"chunk": [missing]})
    assert schema_errors(schema, {"chunk": [dict(entry, room_id="no-sigil")]})
