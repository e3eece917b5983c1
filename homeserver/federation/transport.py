"""Outbound HTTPS on urllib3 pools, to addresses discovery has already resolved and filtered.

This is the one place that opens connections to other servers. It connects to the IP
itself (never re-resolving a name, so DNS rebinding cannot slip past the IP filter), sends
the right Host header and SNI, verifies the certificate against the right name, never follows
redirects by itself, and reads bodies only up to a cap. Every call must run inside the
caller's ``OutboundDeadline`` (``with deadline:``); socket timeouts are set to what is left.
"""

from __future__ import annotations

import errno
import socket
import ssl
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol
from urllib.parse import urljoin, urlsplit

import gevent
import urllib3
from gevent import ssl as gevent_ssl
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
    SSLError,
)

from budget import DeadlineExceeded, OutboundDeadline
from homeserver import __version__
from homeserver.federation.errors import (
    DestinationUnreachable,
    MalformedResponse,
    ResponseTooLarge,
)
from homeserver.federation.ip_filter import IpFilter

USER_AGENT = f"Weir/{__version__}"
# A connect is a handshake: longer than this means the address is not answering, and the
# next one (if any) deserves the rest of the deadline.
CONNECT_TIMEOUT_CAP = 10.0
# Idle connections kept per (ip, port, TLS name), and pools kept in all.
CONNECTIONS_PER_POOL = 10
MAX_POOLS = 1000
STREAM_CHUNK = 64 * 1024
# Redirects followed by open_url and the well-known fetch (spec: "at most 5" for well-known).
MAX_REDIRECTS = 5
# A socket timeout that fires with this little left of the deadline is the deadline's.
TIMER_SLACK_SECONDS = 0.05
# A timeout is an address's silence only if the address had a fair chance to answer: this
# long, or half the call's whole deadline if that is shorter. Otherwise a call that spent its
# deadline elsewhere (a slow DNS of its own, a tarpit listed first) could cool an honest
# address down for everyone with the moment it had left.
FAIR_WAIT_SECONDS = 5.0
# Connect failures that mean no connection can be had at that address from here: refused,
# or no route to it (an ICMP unreachable, no such host on the link). They cool it down. Any
# other connect error (out of local ports, descriptors or buffers) is our own trouble and
# says nothing about the address: load on us must not cool honest peers down.
_UNREACHED_ERRNOS = frozenset(
    {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN}
)

# resolve(host, port, deadline) -> [(ip, port), ...], already filtered
Resolve = Callable[[str, int, OutboundDeadline], list]


class TargetHealth(Protocol):
    """Told what connection attempts say about a resolved address (docs/architecture.md,
    "Budgets").

    ``check`` runs before connecting and may raise ``DestinationUnreachable`` to skip an
    address known to be bad (an address cool-down; the next address, if any, is tried, and
    the last such reason is what the caller sees). ``record`` is called only for an attempt
    that says something about the address itself:

    - ``ok=True``: a response head came back (any status; the body may still fail);
    - ``ok=False, timed_out=False``: it gave no connection (refused, or no route to it);
    - ``ok=False, timed_out=True``: it stayed silent, with a fair chance to answer
      (``FAIR_WAIT_SECONDS``): no TCP connection, no TLS handshake, or no response head in
      time (a socket timeout, or the deadline's while connecting or waiting for the head).

    Anything else is not recorded: the address answered, only not as we wanted (a TLS
    failure that is no timeout, such as a certificate for another name; a connection
    closed or reset after it was accepted), or the failure was not the address's (a local
    error, a client hang-up, a deadline spent before the address had its fair chance).
    """

    def check(self, ip: str, port: int) -> None: ...

    def record(self, ip: str, port: int, ok: bool, timed_out: bool) -> None: ...


class NoTargetHealth:
    """The default: every address is tried, nothing is remembered."""

    def check(self, ip: str, port: int) -> None:
        return None

    def record(self, ip: str, port: int, ok: bool, timed_out: bool) -> None:
        return None


@dataclass(frozen=True)
class Endpoint:
    """Where and how to connect: candidate (ip, port) targets in order, the Host header, and
    the name the certificate must match (also sent as SNI unless it is an IP)."""

    host_header: str
    tls_server_name: str
    targets: tuple[tuple[str, int], ...]


# A gevent.Timeout (a BaseException) that interrupts a connect or a TLS handshake must not
# leave the socket open until garbage collection: the standard library and gevent close it
# only on OSError. These two classes close it on anything.


class _HandshakeClosingSocket(gevent_ssl.SSLSocket):
    def do_handshake(self, *args, **kwargs):
        try:
            return super().do_handshake(*args, **kwargs)
        except BaseException:
            self.close()
            raise


class _ClientSSLContext(gevent_ssl.SSLContext):
    __slots__ = ()
    sslsocket_class = _HandshakeClosingSocket


def connect_pinned(conn: HTTPConnection) -> socket.socket:
    """A urllib3 connection's socket to its host, which is always an IP address the caller
    allowed: no name is resolved here, and the socket is closed on any failure."""
    family = socket.AF_INET6 if ":" in conn._dns_host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(conn.timeout)
        sock.connect((conn._dns_host, conn.port))
    except socket.timeout as e:
        sock.close()
        raise ConnectTimeoutError(conn, f"connect to {conn._dns_host}:{conn.port} timed out") from e
    except OSError as e:
        sock.close()
        raise NewConnectionError(conn, f"Failed to establish a new connection: {e}") from e
    except BaseException:
        sock.close()
        raise
    return sock


class _PinnedHTTPSConnection(HTTPSConnection):
    """Connects to the pool's host, which is always an IP address discovery allowed."""

    def _new_conn(self) -> socket.socket:
        return connect_pinned(self)


class _PinnedPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _PinnedHTTPSConnection


def make_ssl_context(verify: bool, ca_file: str = "") -> ssl.SSLContext:
    """The client TLS context: TLS 1.2 or later, the system's CAs plus ``ca_file``;
    verification on unless ``verify`` is False (tests only). The certificate's name is
    matched by urllib3 against the pool's TLS server name."""
    ctx = _ClientSSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION
    ctx.check_hostname = False
    if verify:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_default_certs()
        if ca_file:
            ctx.load_verify_locations(cafile=ca_file)
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


@dataclass(frozen=True)
class _Request:
    """One request, as `OutboundTransport.send` tries it on each address in turn."""

    destination: str
    method: str
    uri: str
    headers: dict
    body: bytes | None
    deadline: OutboundDeadline


class _NotConnected(Exception):
    """No connection was made to one address, so nothing was sent: the next may be tried."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class OutboundTransport:
    def __init__(
        self,
        ssl_context: ssl.SSLContext,
        ip_filter: IpFilter,
        *,
        verify_tls: bool = True,
        target_health: TargetHealth | None = None,
    ):
        self.ssl_context = ssl_context
        self.ip_filter = ip_filter
        self.verify_tls = verify_tls
        self.target_health: TargetHealth = target_health or NoTargetHealth()
        self._pools: OrderedDict[tuple[str, int, str], _PinnedPool] = OrderedDict()

    # -- pools -----------------------------------------------------------------------------

    def _pool(self, ip: str, port: int, tls_server_name: str) -> _PinnedPool:
        key = (ip, port, tls_server_name)
        pool = self._pools.get(key)
        if pool is not None:
            self._pools.move_to_end(key)
            return pool
        pool = _PinnedPool(
            ip,
            port,
            maxsize=CONNECTIONS_PER_POOL,
            block=False,
            retries=False,
            ssl_context=self.ssl_context,
            server_hostname=tls_server_name,
            assert_hostname=tls_server_name if self.verify_tls else False,
            cert_reqs=ssl.CERT_REQUIRED if self.verify_tls else ssl.CERT_NONE,
        )
        self._pools[key] = pool
        while len(self._pools) > MAX_POOLS:
            _, old = self._pools.popitem(last=False)
            old.close()
        return pool

    def close(self) -> None:
        while self._pools:
            self._pools.popitem()[1].close()

    # -- requests --------------------------------------------------------------------------

    def send(
        self,
        destination: str,
        endpoint: Endpoint,
        method: str,
        uri: str,
        *,
        headers: dict,
        body: bytes | None,
        deadline: OutboundDeadline,
        target_health: TargetHealth | None = None,
    ) -> urllib3.BaseHTTPResponse:
        """Sends one request to the first target that accepts a connection, and returns the
        response with its body unread (read it with :func:`read_body` or wrap it in a
        :class:`StreamingResponse`). Raises ``DestinationUnreachable``; the deadline's own
        timeout propagates to the caller's ``with deadline``. ``target_health`` replaces
        the transport's own for this call.
        """
        health = target_health or self.target_health
        headers = {
            "Host": endpoint.host_header,
            "User-Agent": USER_AGENT,
            "Accept-Encoding": "identity",
            **headers,
        }
        request = _Request(destination, method, uri, headers, body, deadline)
        reason = "no address"
        skipped: DestinationUnreachable | None = None
        for ip, port in endpoint.targets:
            if not self.ip_filter.allows(ip):
                # Discovery filtered already; this guards every other way an address gets here.
                reason = "denied address"
                continue
            try:
                health.check(ip, port)
            except DestinationUnreachable as e:
                skipped = e  # refused without trying (a cool-down): the next one may do
                reason = e.reason
                continue
            skipped = None
            try:
                return self._send_to(request, ip, port, endpoint.tls_server_name, health)
            except _NotConnected as e:
                reason = e.reason
        if skipped is not None:
            # Every address left was refused by `check`: say so in the check's own terms.
            skipped.destination = destination
            raise skipped
        raise DestinationUnreachable(destination, reason)

    def _send_to(
        self, request: _Request, ip: str, port: int, tls_server_name: str, health: TargetHealth
    ) -> urllib3.BaseHTTPResponse:
        """One attempt at one address; `health` is told what it says of the address
        (`TargetHealth`). Raises `_NotConnected` when no connection was made (nothing was
        sent, so the next address may be tried), and ``DestinationUnreachable`` when the
        request may have gone out."""
        deadline = request.deadline
        pool = self._pool(ip, port, tls_server_name)
        started = deadline.elapsed()
        try:
            timeout = urllib3.Timeout(
                connect=deadline.step_timeout(CONNECT_TIMEOUT_CAP), read=deadline.step_timeout()
            )
            response = pool.urlopen(
                request.method,
                request.uri,
                body=request.body,
                headers=request.headers,
                retries=False,
                redirect=False,
                timeout=timeout,
                preload_content=False,
                release_conn=False,
                assert_same_host=False,
            )
        except BaseException as e:
            fair = min(FAIR_WAIT_SECONDS, deadline.seconds / 2)
            silent = _silence(e, deadline.elapsed() - started >= fair)
            if silent is not None:
                health.record(ip, port, False, silent)
            _raise_as_unreachable(e, request, ip, port)
            raise  # the deadline's timeout, or a hang-up: the caller's to handle
        health.record(ip, port, True, False)
        return response

    def get_following_redirects(
        self,
        url: str,
        *,
        resolve: Resolve,
        deadline: OutboundDeadline,
        max_redirects: int = MAX_REDIRECTS,
        headers: dict | None = None,
        target_health: TargetHealth | None = None,
    ) -> urllib3.BaseHTTPResponse:
        """GET an https URL, following up to ``max_redirects`` redirects (never a loop), each
        hop resolved with ``resolve(host, port, deadline) -> targets`` and filtered like any
        other address. Returns the final non-redirect response, body unread.
        """
        seen: set[str] = set()
        for _ in range(max_redirects + 1):
            parts = urlsplit(url)
            host = parts.hostname
            if parts.scheme != "https" or not host:
                raise MalformedResponse(host or url, f"not an https URL: {url[:200]}")
            if url in seen:
                raise MalformedResponse(host, "redirect loop")
            seen.add(url)
            port = parts.port or 443
            host_header = parts.netloc.rpartition("@")[2]
            endpoint = Endpoint(host_header, host, tuple(resolve(host, port, deadline)))
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            response = self.send(
                host,
                endpoint,
                "GET",
                target,
                headers=headers or {},
                body=None,
                deadline=deadline,
                target_health=target_health,
            )
            if response.status not in (301, 302, 303, 307, 308):
                return response
            location = response.headers.get("Location")
            discard(response)
            if not location:
                raise MalformedResponse(host, f"HTTP {response.status} without a Location")
            url = urljoin(url, location)
        raise MalformedResponse(urlsplit(url).hostname or url, "too many redirects")


def _silence(e: BaseException, had_fair_chance: bool) -> bool | None:
    """What a failed attempt says of its address, for `TargetHealth.record`: True if the
    address stayed silent, False if it gave no connection, None if it says nothing."""
    if isinstance(e, NewConnectionError):  # first: urllib3 makes it a ConnectTimeoutError
        cause = e.__cause__
        return False if isinstance(cause, OSError) and cause.errno in _UNREACHED_ERRNOS else None
    # urllib3 raises ReadTimeoutError for a TLS handshake that times out as well as for a
    # response head that does not come; SSLError is never a timeout (the peer answered).
    if isinstance(e, (ConnectTimeoutError, ReadTimeoutError, gevent.Timeout, DeadlineExceeded)):
        return True if had_fair_chance else None
    return None


def _raise_as_unreachable(e: BaseException, request: _Request, ip: str, port: int) -> None:
    """Raises what a failed attempt is to the caller, or returns for an exception that is
    to propagate as it is. The reason carries the detail, for the log only: a client is
    never told an address (`errors.to_client_error`)."""
    if isinstance(e, NewConnectionError):  # first, as in _silence
        raise _NotConnected(f"cannot connect to {ip}:{port}: {e.__cause__ or e}") from None
    if isinstance(e, ConnectTimeoutError):
        raise _NotConnected(f"connecting to {ip}:{port} timed out") from None
    if isinstance(e, SSLError):
        raise _NotConnected(f"TLS failure with {ip}:{port}: {e.__cause__ or e}") from None
    if isinstance(e, ReadTimeoutError):
        request.deadline.check(TIMER_SLACK_SECONDS)
        raise DestinationUnreachable(request.destination, f"{ip}:{port} did not answer") from None
    if isinstance(e, (ProtocolError, HTTPError, OSError)):
        # The request may have been sent: not retried on another address.
        raise DestinationUnreachable(
            request.destination, f"connection to {ip}:{port} failed: {e}"
        ) from None


def discard(response: urllib3.BaseHTTPResponse) -> None:
    """Closes a response whose body we will not read; its connection is not reused."""
    try:
        response.close()
    finally:
        response.release_conn()


def read_body(destination: str, response: urllib3.BaseHTTPResponse, max_bytes: int) -> bytes:
    """The whole body, refused with ``ResponseTooLarge`` past ``max_bytes`` (checked on the
    Content-Length first, then on the bytes actually read). The connection goes back to the
    pool only after a complete read."""
    stream = StreamingResponse(destination, response, max_bytes, deadline=None)
    try:
        return b"".join(stream.stream())
    finally:
        stream.close()


class StreamingResponse:
    """A response whose body the caller reads, bounded by ``max_bytes`` and by the deadline.

    Use it as a context manager, or call ``close()``: the connection is returned to the pool
    only after the body was read to its end, otherwise it is closed.
    """

    def __init__(
        self,
        destination: str,
        response: urllib3.BaseHTTPResponse,
        max_bytes: int,
        deadline: OutboundDeadline | None,
    ):
        self.destination = destination
        self._response = response
        self.max_bytes = max_bytes
        self._deadline = deadline
        self._read = 0
        self._done = False
        self._closed = False
        length = response.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > max_bytes:
            self.close()
            raise ResponseTooLarge(destination, max_bytes)

    @property
    def status(self) -> int:
        return self._response.status

    @property
    def headers(self):
        return self._response.headers

    @property
    def bytes_read(self) -> int:
        return self._read

    def read(self, n: int = STREAM_CHUNK) -> bytes:
        """Up to ``n`` bytes; b"" at the end of the body."""
        if self._done or self._closed:
            return b""
        try:
            if self._deadline is not None:
                with self._deadline:
                    data = self._response.read(n, decode_content=False)
            else:
                data = self._response.read(n, decode_content=False)
        except ReadTimeoutError:
            if self._deadline is not None:
                self._deadline.check(TIMER_SLACK_SECONDS)
            raise DestinationUnreachable(self.destination, "read timed out") from None
        except (ProtocolError, HTTPError, OSError) as e:
            raise DestinationUnreachable(self.destination, f"connection failed: {e}") from None
        if not data:
            self._done = True
            return b""
        self._read += len(data)
        if self._read > self.max_bytes:
            self.close()
            raise ResponseTooLarge(self.destination, self.max_bytes)
        return data

    def stream(self, chunk_size: int = STREAM_CHUNK) -> Iterator[bytes]:
        while True:
            data = self.read(chunk_size)
            if not data:
                return
            yield data

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._done:
            self._response.release_conn()
        else:
            discard(self._response)

    def __enter__(self) -> StreamingResponse:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
