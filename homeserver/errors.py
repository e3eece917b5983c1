"""Matrix errors: what a refusal looks like, wherever in the server it is decided.

Services raise these; the HTTP layer renders them as `{"errcode", "error", ...}` JSON.
"""

from __future__ import annotations


class MatrixError(Exception):
    def __init__(self, status: int, errcode: str, error: str, headers: dict | None = None,
                 **extra):
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
    return MatrixError(429, "M_LIMIT_EXCEEDED", error, headers={"Retry-After": str(seconds)},
                       retry_after_ms=retry_after_ms)


def not_found(error: str = "Not found") -> MatrixError:
    return MatrixError(404, "M_NOT_FOUND", error)


def forbidden(error: str) -> MatrixError:
    return MatrixError(403, "M_FORBIDDEN", error)


def bad_json(error: str) -> MatrixError:
    return MatrixError(400, "M_BAD_JSON", error)


def invalid_param(error: str) -> MatrixError:
    return MatrixError(400, "M_INVALID_PARAM", error)


def missing_param(error: str) -> MatrixError:
    return MatrixError(400, "M_MISSING_PARAM", error)


def unrecognized(status: int = 404, error: str = "Unrecognized request") -> MatrixError:
    return MatrixError(status, "M_UNRECOGNIZED", error)
