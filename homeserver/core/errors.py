"""Matrix errors: what a refusal looks like, wherever in the server it is decided.

Services raise these; the HTTP layer renders them as `{"errcode", "error", ...}` JSON.
"""

from __future__ import annotations


class Codes:
    """The Matrix error codes this server sends (`errcode`).

    Spec: "Standard error response"; each name is the code without its `M_`."""

    BAD_ALIAS = "M_BAD_ALIAS"
    BAD_JSON = "M_BAD_JSON"
    BAD_STATE = "M_BAD_STATE"
    CANNOT_OVERWRITE_MEDIA = "M_CANNOT_OVERWRITE_MEDIA"
    FORBIDDEN = "M_FORBIDDEN"
    GUEST_ACCESS_FORBIDDEN = "M_GUEST_ACCESS_FORBIDDEN"
    INCOMPATIBLE_ROOM_VERSION = "M_INCOMPATIBLE_ROOM_VERSION"
    INVALID_PARAM = "M_INVALID_PARAM"
    INVALID_SIGNATURE = "M_INVALID_SIGNATURE"
    INCOMPATIBLE_ROOM_VERSION = "M_INCOMPATIBLE_ROOM_VERSION"
    INVALID_ROOM_STATE = "M_INVALID_ROOM_STATE"
    INVALID_USERNAME = "M_INVALID_USERNAME"
    KEY_TOO_LARGE = "M_KEY_TOO_LARGE"
    LIMIT_EXCEEDED = "M_LIMIT_EXCEEDED"
    MISSING_PARAM = "M_MISSING_PARAM"
    MISSING_TOKEN = "M_MISSING_TOKEN"
    NOT_FOUND = "M_NOT_FOUND"
    NOT_JSON = "M_NOT_JSON"
    NOT_YET_UPLOADED = "M_NOT_YET_UPLOADED"
    PROFILE_TOO_LARGE = "M_PROFILE_TOO_LARGE"
    ROOM_IN_USE = "M_ROOM_IN_USE"
    THREEPID_AUTH_FAILED = "M_THREEPID_AUTH_FAILED"
    THREEPID_DENIED = "M_THREEPID_DENIED"
    TOO_LARGE = "M_TOO_LARGE"
    UNABLE_TO_AUTHORISE_JOIN = "M_UNABLE_TO_AUTHORISE_JOIN"
    UNABLE_TO_GRANT_JOIN = "M_UNABLE_TO_GRANT_JOIN"
    UNAUTHORIZED = "M_UNAUTHORIZED"
    UNKNOWN = "M_UNKNOWN"
    UNKNOWN_POS = "M_UNKNOWN_POS"  # MSC4186: a sliding sync pos the server no longer knows
    UNKNOWN_TOKEN = "M_UNKNOWN_TOKEN"
    UNRECOGNIZED = "M_UNRECOGNIZED"
    UNSUPPORTED_ROOM_VERSION = "M_UNSUPPORTED_ROOM_VERSION"
    USER_DEACTIVATED = "M_USER_DEACTIVATED"
    USER_IN_USE = "M_USER_IN_USE"
    WRONG_ROOM_KEYS_VERSION = "M_WRONG_ROOM_KEYS_VERSION"


class ContentTooLarge(Exception):
    """A body or file went past its size cap (ours, or one a peer sent)."""


class MatrixError(Exception):
    def __init__(self, status: int, errcode: str, error: str, headers: dict | None = None, **extra):
        super().__init__(f"{status} {errcode}: {error}")
        self.status = status
        self.errcode = errcode
        self.error = error
        self.headers = headers or {}
        self.extra = extra

    def to_json(self) -> dict:
        return {"errcode": self.errcode, "error": self.error, **self.extra}


def limit_exceeded(retry_after_ms: int, error: str = "Too many requests") -> MatrixError:
    """429 with both the body field and the header, so any client backs off."""
    retry_after_ms = max(1, int(retry_after_ms))
    seconds = max(1, -(-retry_after_ms // 1000))
    return MatrixError(
        429,
        Codes.LIMIT_EXCEEDED,
        error,
        headers={"Retry-After": str(seconds)},
        retry_after_ms=retry_after_ms,
    )


def not_found(error: str = "Not found") -> MatrixError:
    return MatrixError(404, Codes.NOT_FOUND, error)


def forbidden(error: str) -> MatrixError:
    return MatrixError(403, Codes.FORBIDDEN, error)


def bad_json(error: str) -> MatrixError:
    return MatrixError(400, Codes.BAD_JSON, error)


def invalid_param(error: str) -> MatrixError:
    return MatrixError(400, Codes.INVALID_PARAM, error)


def missing_param(error: str) -> MatrixError:
    return MatrixError(400, Codes.MISSING_PARAM, error)


def unrecognized(status: int = 404, error: str = "Unrecognized request") -> MatrixError:
    return MatrixError(status, Codes.UNRECOGNIZED, error)
