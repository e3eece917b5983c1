"""Checks response bodies against the Matrix spec's OpenAPI schemas.

The spec lives outside the repository, at `<repo>/../shared/matrix-spec/`; when it is absent
the check is skipped (the rest of the test still runs). The validator covers the part of JSON
Schema those files use: type (one or a list), properties, required, items, enum, allOf,
anyOf, oneOf, additionalProperties, patternProperties and pattern. `format` is descriptive
there and is not checked.
"""

from __future__ import annotations

import functools
import json
import os
import re

from tests.support.server import REPO

SPEC_DIR = os.path.join(REPO, "..", "shared", "matrix-spec")

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "null": lambda v: v is None,
}


@functools.cache
def load_spec(api: str) -> dict | None:
    path = os.path.join(SPEC_DIR, f"{api}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def response_schema(api: str, method: str, path: str, status: int) -> dict | None:
    """The schema of one operation's JSON response, or None without the spec files."""
    spec = load_spec(api)
    if spec is None:
        return None
    operation = spec["paths"][path][method.lower()]
    return operation["responses"][str(status)]["content"]["application/json"]["schema"]


def schema_errors(schema: dict, value, where: str = "$") -> list[str]:
    errors: list[str] = []
    for sub in schema.get("allOf", []):
        errors += schema_errors(sub, value, where)
    for keyword in ("anyOf", "oneOf"):
        # oneOf is checked as anyOf: the spec's alternatives may overlap in what they allow.
        if keyword in schema and all(schema_errors(s, value, where) for s in schema[keyword]):
            errors.append(f"{where}: matches none of the {keyword} alternatives")
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](value) for t in types):
            return errors + [f"{where}: expected {'/'.join(types)}, got {value!r:.80}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} not one of {schema['enum']}")
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(f"{where}: {value!r} does not match {schema['pattern']}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += schema_errors(schema["items"], item, f"{where}[{i}]")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{where}: missing required {key!r}")
        for key, item in value.items():
            if key in properties:
                errors += schema_errors(properties[key], item, f"{where}.{key}")
                continue
            matched = False
            for pattern, sub in schema.get("patternProperties", {}).items():
                if re.search(pattern, key):
                    matched = True
                    errors += schema_errors(sub, item, f"{where}.{key}")
            extra = schema.get("additionalProperties", True)
            if not matched and extra is False:
                errors.append(f"{where}: unexpected property {key!r}")
            elif not matched and isinstance(extra, dict):
                errors += schema_errors(extra, item, f"{where}.{key}")
    return errors


def assert_matches_spec(response, method: str, path: str, api: str = "client-server"):
    """Asserts the response's JSON body fits the spec's schema for `path` (the spec's
    template, e.g. /_matrix/client/v3/rooms/{roomId}/messages) and its status code."""
    schema = response_schema(api, method, path, response.status_code)
    if schema is None:
        return
    errors = schema_errors(schema, response.json())
    assert not errors, f"{method} {path} {response.status_code}: " + "; ".join(errors[:10])
