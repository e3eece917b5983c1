"""Query parameters that the client and federation media routes share."""

from __future__ import annotations

from dataclasses import dataclass

from flask import request

from homeserver.core.errors import invalid_param, missing_param
from homeserver.http.parsing import query_bool, query_int
from homeserver.media.service import (
    DEFAULT_TIMEOUT_MS,
    MAX_TIMEOUT_MS,
    THUMBNAIL_METHODS,
)


@dataclass(frozen=True)
class ThumbnailQuery:
    width: int
    height: int
    method: str
    animated: bool


def timeout_ms() -> int:
    """How long a download may wait for an async upload's content (the spec's timeout_ms)."""
    return query_int("timeout_ms", DEFAULT_TIMEOUT_MS, minimum=0, maximum=MAX_TIMEOUT_MS)


def thumbnail_query() -> ThumbnailQuery:
    width = query_int("width", minimum=1)
    height = query_int("height", minimum=1)
    if width is None or height is None:
        raise missing_param("width and height are required")
    method = request.args.get("method", "scale")
    if method not in THUMBNAIL_METHODS:
        raise invalid_param("method must be crop or scale")
    return ThumbnailQuery(width, height, method, query_bool("animated", False))
