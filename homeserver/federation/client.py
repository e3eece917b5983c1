"""The one outbound federation client (``runtime.federation_client``).

Every call to another server goes through here, and so through discovery, the IP filter,
TLS verification, X-Matrix signing, response size caps and one ``OutboundDeadline`` that
discovery and the request both draw from. Failures are the types in ``federation.errors``;
map them for a client with ``federation.errors.to_client_error``.

    client = runtime.federation_client
    deadline = client.deadline(10, what=f"publicRooms from {server}")   # start it early
    rooms = client.get_json(server, "/_matrix/federation/v1/publicRooms",
                            {"limit": 20}, deadline=deadline)

    with client.open_stream(origin, path, deadline=deadline, max_bytes=cap) as response:
        for chunk in response.stream(): ...
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator
from urllib.parse import urlencode, urlsplit

from canonicaljson import encode_canonical_json

from budget import OutboundDeadline
from homeserver.core import strict_json
from homeserver.core.concurrency import let_io_run
from homeserver.federation.discovery import DnsResolver, ServerDiscovery
from homeserver.federation.errors import FederationError, MalformedResponse, RemoteError
from homeserver.federation.ip_filter import IpFilter
from homeserver.federation.signing import sign_request
from homeserver.federation.transport import (
    OutboundTransport,
    StreamingResponse,
    TargetHealth,
    discard,
    make_ssl_context,
    read_body,
)

log = logging.getLogger(__name__)

# The largest JSON response read unless a call says otherwise.
JSON_MAX_BYTES = 10 * 1024 * 1024
# The longest item of an array `put_json_streamed` decodes an item at a time.
STREAMED_ITEM_MAX_BYTES = 128 * 1024
# How much of an error response is read to find its errcode.
ERROR_BODY_MAX_BYTES = 64 * 1024


class FederationClient:
    def __init__(
        self,
        server_name: str,
        signing_key,
        discovery: ServerDiscovery,
        transport: OutboundTransport,
        remote_timeout: float,
    ):
        self.server_name = server_name
        self.signing_key = signing_key
        self.discovery = discovery
        self.transport = transport
        self.remote_timeout = remote_timeout

    @classmethod
    def from_config(
        cls,
        config,
        signing_key,
        *,
        target_health: TargetHealth | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> FederationClient:
        """The client as the runtime builds it from ``[federation]``. ``clock`` drives the
        discovery caches (tests pass a fake one to cross TTLs without waiting)."""
        fed = config.federation
        if not fed.verify_tls:
            log.warning("federation.verify_tls is false: outbound TLS is NOT verified (tests only)")
        ip_filter = IpFilter(fed.ip_range_denylist, fed.ip_range_allowlist)
        transport = OutboundTransport(
            make_ssl_context(fed.verify_tls, fed.ca_file),
            ip_filter,
            verify_tls=fed.verify_tls,
            target_health=target_health,
        )
        discovery = ServerDiscovery(
            transport, ip_filter, DnsResolver(fed.dns_nameservers, clock), clock
        )
        return cls(config.server_name, signing_key, discovery, transport, fed.remote_timeout)

    @property
    def ip_filter(self) -> IpFilter:
        return self.transport.ip_filter

    def deadline(self, seconds: float | None = None, what: str = "") -> OutboundDeadline:
        """A new deadline of ``seconds``, never longer than ``federation.remote_timeout``.
        Its clock starts now: make it as soon as the request is known."""
        limit = self.remote_timeout if seconds is None else min(seconds, self.remote_timeout)
        return OutboundDeadline(limit, what=what)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> FederationClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- JSON API calls --------------------------------------------------------------------

    def get_json(
        self,
        destination: str,
        path: str,
        query: dict | None = None,
        *,
        deadline: OutboundDeadline | None = None,
        max_bytes: int = JSON_MAX_BYTES,
        signed: bool = True,
        target_health: TargetHealth | None = None,
    ) -> Any:
        return self.request_json(
            "GET",
            destination,
            path,
            query=query,
            deadline=deadline,
            max_bytes=max_bytes,
            signed=signed,
            target_health=target_health,
        )

    def post_json(
        self,
        destination: str,
        path: str,
        content: Any,
        query: dict | None = None,
        *,
        deadline: OutboundDeadline | None = None,
        max_bytes: int = JSON_MAX_BYTES,
        target_health: TargetHealth | None = None,
    ) -> Any:
        return self.request_json(
            "POST",
            destination,
            path,
            query=query,
            content=content,
            deadline=deadline,
            max_bytes=max_bytes,
            target_health=target_health,
        )

    def put_json(
        self,
        destination: str,
        path: str,
        content: Any,
        query: dict | None = None,
        *,
        deadline: OutboundDeadline | None = None,
        max_bytes: int = JSON_MAX_BYTES,
        target_health: TargetHealth | None = None,
    ) -> Any:
        return self.request_json(
            "PUT",
            destination,
            path,
            query=query,
            content=content,
            deadline=deadline,
            max_bytes=max_bytes,
            target_health=target_health,
        )

    def request_json(
        self,
        method: str,
        destination: str,
        path: str,
        *,
        query: dict | None = None,
        content: Any = None,
        deadline: OutboundDeadline | None = None,
        max_bytes: int = JSON_MAX_BYTES,
        signed: bool = True,
        target_health: TargetHealth | None = None,
    ) -> Any:
        """One signed request with a JSON body (``content``, optional) and a JSON answer.

        ``path`` is already percent-encoded. ``target_health`` (optional) is told this
        call's per-address outcomes instead of the client's default, e.g. an address
        cool-down that only client-triggered calls use. Raises ``DeadlineExceeded``,
        ``DestinationUnreachable``, ``RemoteError`` (non-2xx), ``MalformedResponse`` or
        ``ResponseTooLarge``.
        """
        deadline = deadline or self.deadline(what=f"{method} {destination}{path}")
        with deadline:
            response = self._send(
                method, destination, path, query, content, deadline, signed, target_health
            )
            self._raise_for_status(destination, response)
            body = read_body(destination, response, max_bytes)
        with _decoding(destination):
            # A large answer (a room's state) is decoded a piece at a time, the hub free
            # in between; one of tiny values is refused early (core/strict_json.py).
            return strict_json.loads_in_pieces(body, strict_json.MAX_BODY_DEPTH, let_io_run).value

    def put_json_streamed(
        self,
        destination: str,
        path: str,
        content: Any,
        *,
        arrays: tuple[str, ...],
        max_items: int,
        deadline: OutboundDeadline,
        max_bytes: int,
        target_health: TargetHealth | None = None,
    ) -> dict[str, Any]:
        """`put_json` for an answer that is an object with long arrays of small values (a
        send_join answer's state and auth chain): decoded as it arrives, an item of
        `arrays` at a time, so that neither its bytes nor its text are ever held whole.
        Each item is at most `STREAMED_ITEM_MAX_BYTES` (a PDU is at most 64 KiB), at most
        `max_items` in all; any other member is at most `JSON_MAX_BYTES`."""
        with deadline:
            response = self._send(
                "PUT", destination, path, None, content, deadline, True, target_health
            )
            self._raise_for_status(destination, response)
            with StreamingResponse(destination, response, max_bytes, deadline) as stream:
                with _decoding(destination):
                    return strict_json.loads_streamed_object(
                        stream.stream(),
                        arrays=arrays,
                        max_items=max_items,
                        item_max_chars=STREAMED_ITEM_MAX_BYTES,
                        value_max_chars=JSON_MAX_BYTES,
                        pause=let_io_run,
                    )

    # -- streams (media) -------------------------------------------------------------------

    def open_stream(
        self,
        destination: str,
        path: str,
        query: dict | None = None,
        *,
        deadline: OutboundDeadline | None = None,
        max_bytes: int,
        signed: bool = True,
        target_health: TargetHealth | None = None,
    ) -> StreamingResponse:
        """A signed GET whose 2xx body the caller reads (``read(n)``/``stream()``), at most
        ``max_bytes`` of it and within ``deadline``. The caller must close it (``with``).
        A non-2xx answer raises ``RemoteError`` here."""
        deadline = deadline or self.deadline(what=f"GET {destination}{path}")
        with deadline:
            response = self._send(
                "GET", destination, path, query, None, deadline, signed, target_health
            )
            self._raise_for_status(destination, response)
        return StreamingResponse(destination, response, max_bytes, deadline)

    def open_url(
        self,
        url: str,
        *,
        deadline: OutboundDeadline | None = None,
        max_bytes: int,
        headers: dict | None = None,
        target_health: TargetHealth | None = None,
    ) -> StreamingResponse:
        """An unsigned GET of an https URL (a media ``Location``): resolved with plain DNS,
        with the same IP filter, TLS verification and size cap, redirects followed up to 5
        times with the same checks. Same contract as :meth:`open_stream`."""
        deadline = deadline or self.deadline(what=f"GET {url[:100]}")
        with deadline:
            response = self.transport.get_following_redirects(
                url,
                resolve=self.discovery.resolve_host,
                deadline=deadline,
                headers=headers,
                target_health=target_health,
            )
            host = urlsplit(url).hostname or url
            self._raise_for_status(host, response)
        return StreamingResponse(host, response, max_bytes, deadline)

    # -- insides ---------------------------------------------------------------------------

    def _send(
        self, method, destination, path, query, content, deadline, signed, target_health=None
    ):
        if not path.startswith("/"):
            raise ValueError(f"path must start with /: {path!r}")
        uri = f"{path}?{urlencode(query, doseq=True)}" if query else path
        body = None
        headers = {}
        if content is not None:
            body = encode_canonical_json(content)
            headers["Content-Type"] = "application/json"
        if signed:
            headers["Authorization"] = sign_request(
                self.signing_key, self.server_name, destination, method, uri, content
            )
        resolved = self.discovery.resolve(destination, deadline)
        log.debug("%s %s%s via %s", method, destination, uri, resolved.targets)
        return self.transport.send(
            destination,
            resolved.endpoint,
            method,
            uri,
            headers=headers,
            body=body,
            deadline=deadline,
            target_health=target_health,
        )

    @staticmethod
    def _raise_for_status(destination: str, response) -> None:
        if 200 <= response.status < 300:
            return
        errcode, body = None, None
        try:
            raw = read_body(destination, response, ERROR_BODY_MAX_BYTES)
            body = strict_json.loads(raw)
            if isinstance(body, dict) and isinstance(body.get("errcode"), str):
                errcode = body["errcode"]
        except (FederationError, ValueError):
            pass
        finally:
            discard(response)
        raise RemoteError(
            destination, response.status, errcode, body, response.headers.get("Location")
        )


@contextmanager
def _decoding(destination: str) -> Iterator[None]:
    """A JSON answer that does not decode by the strict rules is a `MalformedResponse`."""
    try:
        yield
    except strict_json.TooManyValues as e:
        raise MalformedResponse(destination, f"response refused: {e}") from None
    except ValueError:  # not strict JSON, or nested too deep
        raise MalformedResponse(destination, "response is not JSON") from None
