"""What can go wrong when this server calls another one, and what a client then sees.

Every outbound failure is one of a few types, so that a handler maps them all the same way
with :func:`to_client_error` (docs/architecture.md, "Budgets"). The deadline is
``budget.DeadlineExceeded``.
"""

from __future__ import annotations

import logging
import math

from budget import DeadlineExceeded
from homeserver.core.errors import Codes, ContentTooLarge, MatrixError, limit_exceeded

__all__ = [
    "DeadlineExceeded",
    "AddressCoolingDown",
    "DestinationUnreachable",
    "FederationError",
    "InvalidSignature",
    "EventResolutionRefused",
    "KeyResolutionRefused",
    "MalformedResponse",
    "RemoteError",
    "ResponseTooLarge",
    "to_client_error",
]

log = logging.getLogger(__name__)


class FederationError(Exception):
    """An outbound call to ``destination`` (a server name, or a URL's host) failed."""

    def __init__(self, destination: str, message: str = ""):
        super().__init__(f"{destination}: {message}" if message else destination)
        self.destination = destination


class DestinationUnreachable(FederationError):
    """No answer could be had: DNS failure, refused or reset connection, TLS failure, or every
    address of the destination is denied by the IP filter. ``reason`` says which, with the
    addresses involved: it is for logs, never for a client (:func:`to_client_error`)."""

    def __init__(self, destination: str, reason: str):
        super().__init__(destination, reason)
        self.reason = reason


class AddressCoolingDown(DestinationUnreachable):
    """Refused without trying: every address of the destination recently never answered a
    client-triggered call (refused or stayed silent), and is cooling down
    (``federation.cooldown``)."""

    def __init__(self, destination: str, address: str, seconds_left: float, timed_out: bool):
        super().__init__(
            destination,
            f"{address} is cooling down for {seconds_left:.0f}s after"
            f" {'a timeout' if timed_out else 'a connection failure'}",
        )
        self.address = address
        self.seconds_left = seconds_left
        self.timed_out = timed_out


class RemoteError(FederationError):
    """The remote answered with an HTTP error (or a redirect, which API calls never follow;
    ``location`` then says where it pointed, for a caller that follows one itself)."""

    def __init__(
        self,
        destination: str,
        status: int,
        errcode: str | None = None,
        body: object = None,
        location: str | None = None,
    ):
        super().__init__(destination, f"HTTP {status} {errcode or ''}".rstrip())
        self.status = status
        self.errcode = errcode
        self.body = body
        self.location = location


class MalformedResponse(FederationError):
    """The remote answered, but not with what the protocol says: bad JSON, wrong shape."""


class ResponseTooLarge(MalformedResponse, ContentTooLarge):
    """The response body was longer than the caller's cap; reading stopped at the cap."""

    def __init__(self, destination: str, max_bytes: int):
        super().__init__(destination, f"response over {max_bytes} bytes")
        self.max_bytes = max_bytes


class KeyResolutionRefused(FederationError):
    """A network key fetch was refused by the key-resolution budget or the per-IP rate
    (docs/architecture.md, "Budgets"). The inbound request that needed it gets 429 and is
    retried later."""

    def __init__(self, destination: str, retry_after_ms: int, why: str):
        super().__init__(destination, f"key resolution refused: {why}")
        self.retry_after_ms = retry_after_ms


class EventResolutionRefused(KeyResolutionRefused):
    """A call an inbound PDU needs (its missing events, its state) was refused by the
    event-resolution budget or the origin's rate (homeserver/federation/event_resolution.py).
    Answered like a refused key resolution, which is why it is one: the whole transaction
    gets 429, with nothing applied, and the sender retries."""

    def __init__(self, destination: str, retry_after_ms: int, why: str):
        FederationError.__init__(self, destination, f"event resolution refused: {why}")
        self.retry_after_ms = retry_after_ms


class InvalidSignature(Exception):
    """A signed object (a request, a key document) does not carry a valid signature."""


def to_client_error(exc: Exception, destination: str | None = None) -> MatrixError:
    """The client-facing error for an outbound failure (the table in docs/architecture.md,
    "Budgets").

    ``destination`` names the server in the message when the exception does not. A server
    that cannot be reached is only named: whether its name has no address, only denied ones
    (a private network's), or addresses that refuse, fail TLS or are cooling down would tell
    anyone what a name resolves to. That detail goes to the log, one line.
    """
    server = getattr(exc, "destination", None) or destination or "the remote server"
    if isinstance(exc, DeadlineExceeded):
        return MatrixError(504, Codes.UNKNOWN, f"Timed out waiting for {server}")
    if isinstance(exc, KeyResolutionRefused):
        return limit_exceeded(exc.retry_after_ms)
    if isinstance(exc, DestinationUnreachable):
        log.info("cannot reach %s: %s", server, exc.reason)
        if isinstance(exc, AddressCoolingDown):
            # As the failure that started the cool-down would have been answered.
            status = 504 if exc.timed_out else 502
            seconds = math.ceil(exc.seconds_left)
            return MatrixError(
                status,
                Codes.UNKNOWN,
                f"Cannot reach {server}: cooling down, not trying again for {seconds} s",
            )
        return MatrixError(502, Codes.UNKNOWN, f"Cannot reach {server}")
    if isinstance(exc, RemoteError):
        if exc.status == 404 or exc.errcode == Codes.NOT_FOUND:
            return MatrixError(404, Codes.NOT_FOUND, f"{server} has no such resource")
        if exc.status == 403:
            return MatrixError(403, Codes.FORBIDDEN, f"{server} refused the request")
        return MatrixError(502, Codes.UNKNOWN, f"{server} answered HTTP {exc.status}")
    if isinstance(exc, ResponseTooLarge):
        return MatrixError(502, Codes.UNKNOWN, f"{server} sent a response that is too large")
    if isinstance(exc, MalformedResponse):
        return MatrixError(502, Codes.UNKNOWN, f"{server} sent a malformed response")
    return MatrixError(502, Codes.UNKNOWN, f"Federation with {server} failed")
