"""Reading multipart/mixed bodies in tests with python-multipart, the parser Synapse uses."""

from __future__ import annotations

import json

from python_multipart.multipart import MultipartParser, parse_options_header


def parse_multipart(content_type: str, body: bytes) -> list[tuple[dict, bytes]]:
    """Parts as (headers, data), by python-multipart's streaming parser."""
    _, params = parse_options_header(content_type)
    parts: list[tuple[dict, bytes]] = []
    state = {"field": b"", "value": b"", "headers": {}, "data": b""}

    def on_part_begin():
        state.update(headers={}, data=b"")

    def on_header_field(data, start, end):
        state["field"] += data[start:end]

    def on_header_value(data, start, end):
        state["value"] += data[start:end]

    def on_header_end():
        state["headers"][state["field"].decode().lower()] = state["value"].decode()
        state.update(field=b"", value=b"")

    def on_part_data(data, start, end):
        state["data"] += data[start:end]

    def on_part_end():
        parts.append((state["headers"], state["data"]))

    parser = MultipartParser(
        params[b"boundary"],
        {
            "on_part_begin": on_part_begin,
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
        },
    )
    assert parser.write(body) == len(body)
    parser.finalize()
    return parts


def media_file_part(content_type: str, body: bytes) -> tuple[dict, bytes]:
    """(headers, data) of the file part of a federation media response, after checking the
    spec's shape: exactly two parts, the first `{}` as application/json."""
    assert content_type.startswith("multipart/mixed; boundary=")
    (json_headers, json_data), (file_headers, file_data) = parse_multipart(content_type, body)
    assert json_headers == {"content-type": "application/json"}
    assert json.loads(json_data) == {}
    return file_headers, file_data
