"""Fetching web pages for link previews (media/preview.py): plain http and https URLs, any
host a user names, so every rule of the federation transport holds here too
(homeserver/federation/transport.py):

- each hop's host is resolved here (an IP literal, or A/AAAA through `DnsResolver`) and every
  address is filtered (`IpFilter`) before a connection; the connection goes to that IP
  itself (`connect_pinned`), so neither a DNS answer nor a redirect reaches a denied address;
- TLS is verified against the URL's host; at most `MAX_REDIRECTS` redirects, each hop
  checked like the first;
- the content type is judged on the response head, before any of the body is read: HTML
  and images only;
- the body is read up to `max_bytes`, then the connection is closed: a page cut there is
  used as read (`WebPage.truncated`);
- everything runs inside the caller's one `OutboundDeadline`.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
    SSLError,
)

from budget import OutboundDeadline
from homeserver.federation.discovery import DnsResolver, ip_literal
from homeserver.federation.errors import DestinationUnreachable, MalformedResponse, RemoteError
from homeserver.federation.ip_filter import IpFilter
from homeserver.federation.transport import (
    CONNECT_TIMEOUT_CAP,
    STREAM_CHUNK,
    USER_AGENT,
    connect_pinned,
    discard,
)

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


class _PinnedHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        return connect_pinned(self)


class _PinnedHTTPSConnection(HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        return connect_pinned(self)


class _PinnedHTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _PinnedHTTPConnection


class _PinnedHTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _PinnedHTTPSConnection


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
    def __init__(
        self,
        dns: DnsResolver,
        ip_filter: IpFilter,
        ssl_context: ssl.SSLContext,
        *,
        verify_tls: bool = True,
    ):
        self._dns = dns
        self.ip_filter = ip_filter
        self._ssl_context = ssl_context
        self._verify_tls = verify_tls

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

    def _targets(self, host: str, deadline: OutboundDeadline) -> list[str]:
        literal = ip_literal(host)
        addresses = [literal] if literal is not None else self._dns.addresses(host, deadline)[0]
        if not addresses:
            raise DestinationUnreachable(host, "no address")
        allowed = [a for a in addresses if self.ip_filter.allows(a)]
        if not allowed:
            raise DestinationUnreachable(host, f"denied address {', '.join(addresses)}")
        return allowed

    def _get(self, url: str, deadline: OutboundDeadline):
        """The response head of one hop, from the first allowed address that connects, and
        the pool to close once its body is done with."""
        parts = urlsplit(url)
        host = parts.hostname
        if parts.scheme not in ("http", "https") or not host:
            raise MalformedResponse(host or url[:100], "not an http(s) URL")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        headers = {
            "Host": parts.netloc.rpartition("@")[2],
            "User-Agent": USER_AGENT,
            "Accept": ACCEPT,
            "Accept-Encoding": "identity",
        }
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        reason = "no address"
        for ip in self._targets(host, deadline):
            pool = self._pool(parts.scheme, ip, port, host)
            timeout = urllib3.Timeout(
                connect=deadline.step_timeout(CONNECT_TIMEOUT_CAP), read=deadline.step_timeout()
            )
            try:
                response = pool.urlopen(
                    "GET",
                    target,
                    headers=headers,
                    retries=False,
                    redirect=False,
                    timeout=timeout,
                    preload_content=False,
                    release_conn=False,
                    assert_same_host=False,
                )
            except (NewConnectionError, ConnectTimeoutError, SSLError) as e:
                pool.close()
                reason = f"cannot connect to {ip}:{port}: {e}"
                continue  # nothing was sent: the next address may do
            except ReadTimeoutError:
                pool.close()
                deadline.check(0.05)
                raise DestinationUnreachable(host, f"{ip}:{port} did not answer") from None
            except (ProtocolError, HTTPError, OSError) as e:
                pool.close()
                raise DestinationUnreachable(host, f"{ip}:{port} failed: {e}") from None
            except BaseException:
                pool.close()
                raise
            return response, pool
        raise DestinationUnreachable(host, reason)

    def _pool(self, scheme: str, ip: str, port: int, host: str) -> urllib3.HTTPConnectionPool:
        # A pool per hop, closed after it: previews go to ever new hosts, and a kept
        # connection would outlive the preview's deadline.
        if scheme == "http":
            return _PinnedHTTPPool(ip, port, maxsize=1, retries=False)
        return _PinnedHTTPSPool(
            ip,
            port,
            maxsize=1,
            retries=False,
            ssl_context=self._ssl_context,
            server_hostname=host,
            assert_hostname=host if self._verify_tls else False,
            cert_reqs=ssl.CERT_REQUIRED if self._verify_tls else ssl.CERT_NONE,
        )

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
