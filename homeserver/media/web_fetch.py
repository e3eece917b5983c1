"""Fetching web pages for link previews (media/preview.py): plain http and https URLs, any
host a user names, so every rule of the federation transport holds here too
(homeserver/federation/transport.py):

- each hop goes through `WebClient` (federation/web_client.py): its host resolved and every
  address filtered (`IpFilter`) before a connection pinned to that IP, so neither a DNS
  answer nor a redirect reaches a denied address; TLS verified against the URL's host;
- at most `MAX_REDIRECTS` redirects, each hop checked like the first;
- the content type is judged on the response head, before any of the body is read: HTML
  and images only;
- the body is read up to `max_bytes`, then the connection is closed: a page cut there is
  used as read (`WebPage.truncated`);
- everything runs inside the caller's one `OutboundDeadline`.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from urllib3.exceptions import HTTPError, ProtocolError, ReadTimeoutError

from budget import OutboundDeadline
from homeserver.federation.errors import DestinationUnreachable, MalformedResponse, RemoteError
from homeserver.federation.transport import STREAM_CHUNK, discard
from homeserver.federation.web_client import WebClient

MAX_REDIRECTS = 5
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
ACCEPT = "text/html,application/xhtml+xml,image/*;q=0.9"


class NotPreviewable(MalformedResponse):
    """The URL answered with a type we do not preview (neither HTML nor an image)."""


@dataclass(frozen=True)
class WebPage:
    url: str  # where the body came from, after redirects
    content_type: str  # the base type, lower case
    charset: str | None
    body: bytes
    truncated: bool  # the body went on past max_bytes; what was read is here

    @property
    def is_html(self) -> bool:
        return self.content_type in HTML_TYPES

    @property
    def is_image(self) -> bool:
        return self.content_type.startswith("image/")


def _content_type(header: str | None) -> tuple[str, str | None]:
    """(base type, charset) of a Content-Type header."""
    base, _, params = (header or "").partition(";")
    charset = None
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip():
            charset = value.strip().strip("\"'")
    return base.strip().lower(), charset


class WebFetcher:
    def __init__(self, client: WebClient):
        self.client = client

    def fetch(self, url: str, deadline: OutboundDeadline, max_bytes: int) -> WebPage:
        """GET `url`, following redirects, and read what it answers (see the module's rules).
        Raises `DestinationUnreachable`, `RemoteError` (an HTTP error status),
        `NotPreviewable`, `MalformedResponse`; the deadline's `DeadlineExceeded`."""
        seen: set[str] = set()
        for _ in range(MAX_REDIRECTS + 1):
            if url in seen:
                raise MalformedResponse(urlsplit(url).hostname or url, "redirect loop")
            seen.add(url)
            with deadline:
                response, pool = self._get(url, deadline)
                if response.status not in REDIRECT_STATUSES:
                    try:
                        return self._page(url, response, deadline, max_bytes)
                    finally:
                        pool.close()
                location = response.headers.get("Location")
                discard(response)
                pool.close()
            if not location:
                raise MalformedResponse(urlsplit(url).hostname or url, "redirect without Location")
            url = urljoin(url, location)
        raise MalformedResponse(urlsplit(url).hostname or url, "too many redirects")

    def _get(self, url: str, deadline: OutboundDeadline):
        """The response head of one hop, and the pool to close once its body is done with."""
        return self.client.request("GET", url, deadline, {"Accept": ACCEPT})

    def _page(self, url: str, response, deadline: OutboundDeadline, max_bytes: int) -> WebPage:
        host = urlsplit(url).hostname or url
        if response.status // 100 != 2:
            discard(response)
            raise RemoteError(host, response.status)
        content_type, charset = _content_type(response.headers.get("Content-Type"))
        if content_type not in HTML_TYPES and not content_type.startswith("image/"):
            discard(response)
            raise NotPreviewable(host, f"content type {content_type[:100]!r}")
        chunks: list[bytes] = []
        read = 0
        truncated = False
        try:
            while read < max_bytes:
                data = response.read(min(STREAM_CHUNK, max_bytes - read), decode_content=False)
                if not data:
                    break
                chunks.append(data)
                read += len(data)
            else:
                # At the cap: one more byte says whether the page went on.
                truncated = bool(response.read(1, decode_content=False))
        except ReadTimeoutError:
            deadline.check(0.05)
            raise DestinationUnreachable(host, "read timed out") from None
        except (ProtocolError, HTTPError, OSError) as e:
            raise DestinationUnreachable(host, f"connection failed: {e}") from None
        finally:
            discard(response)  # never back to a pool: closed, which ends a page we cut
        return WebPage(url, content_type, charset, b"".join(chunks), truncated)
