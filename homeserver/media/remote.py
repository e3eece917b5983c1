"""Remote media: other servers' mxc:// URIs, fetched once and kept (ADR-0121;
docs/architecture.md, "Processes").

`RemoteMediaRepository.original` is the one way to another server's file, for downloads and
thumbnails alike (a thumbnail is made here, from the cached original, by the local code):

1. Quick checks, before any discovery: remote fetching switched off, `allow_remote=false`, a
   blocked origin (even for a cached copy) or an id outside the grammar give 404.
2. The cache: a stored copy is served at once, with no slot and no outbound call.
3. On a miss: an origin whose every known address is cooling down (federation/cooldown.py)
   is refused at once; then admission, which differs by mode:
   - pool mode (`python app.py`): the request leaves the main pool (http/handoff.py). Only a
     request that starts a fetch takes a `media_fetch_budget` ticket: one of its client's
     running fetches, or a place in its client's short queue (429 at once past either, or
     past the global cap); it alone takes a media-pool place, once its turn comes;
   - inline mode (no pools): a `client_outbound_budget` slot (ADR-0079), in the request's
     greenlet; any request that may wait on the remote holds one, waiters included.
   Once admitted, the request spends one `ratelimiting.remote_media` token (once, however
   often it retries a fetch whose leader went away), so a refusal by a budget costs none.
4. `RemoteMediaFetchCoalescer`: one fetch per (origin, media id). Everyone else asking for the
   file meanwhile waits within their own deadline, then reads the stored copy. A failure wakes
   them with the error and is not cached.
5. The fetch, under one 30 s deadline (capped by `remote_timeout`) covering the queue for a
   media-pool place, discovery, the download and a `Location`:
   `/_matrix/federation/v1/media/download/{id}`, signed, its multipart body parsed as it
   streams (media/multipart.py) and the file part written straight to disk under
   `max_upload_size`; a `Location` part followed once with the same IP filter, TLS and size
   rules; on 404/405 M_UNRECOGNIZED the legacy
   `/_matrix/media/v3/download/{server}/{id}?allow_remote=false&allow_redirect=true`.
   The file is stored whole or not at all (temp file, fsync, link; never over a copy that
   can be read), then its row is inserted if absent.
"""

from __future__ import annotations

import contextlib
import logging
import os
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol
from urllib.parse import quote

from budget import DeadlineExceeded, InFlightBudget, OutboundDeadline, RateLimiter, Ticket
from homeserver.config import MediaConfig, MediaSecurityConfig
from homeserver.core.clock import now_ms
from homeserver.core.concurrency import SingleFlight
from homeserver.core.errors import (
    Codes,
    ContentTooLarge,
    MatrixError,
    limit_exceeded,
    not_found,
)
from homeserver.federation.admission import (
    MEDIA_DEADLINE_SECONDS,
    Caller,
    admitted,
    count_failure,
)
from homeserver.federation.client import FederationClient
from homeserver.federation.cooldown import AddressCooldown
from homeserver.federation.discovery import split_server_name
from homeserver.federation.errors import (
    AddressCoolingDown,
    FederationError,
    RemoteError,
    to_client_error,
)
from homeserver.media.files import MediaFileStore, is_valid_media_id, safe_content_type
from homeserver.media.multipart import MultipartMediaReader, upload_name_from
from homeserver.metrics import Metrics
from homeserver.storage.media import MediaStore, RemoteMedia

log = logging.getLogger(__name__)

FEDERATION_DOWNLOAD_PATH = "/_matrix/federation/v1/media/download/"
LEGACY_DOWNLOAD_PATH = "/_matrix/media/v3/download/"
# Beyond the file itself, a multipart body carries the JSON part and the part headers.
MULTIPART_OVERHEAD_BYTES = 64 * 1024
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
CALL = "remote_media"  # the label of this call in the metrics


@dataclass(frozen=True)
class MediaRequest:
    """How a client asked for media: what the local and remote paths need to answer it."""

    legacy: bool  # /_matrix/media/v3 (unauthenticated), not /_matrix/client/v1
    timeout_ms: int  # how long to wait for an async upload's content
    allow_remote: bool = True  # the legacy API's allow_remote
    # Whom a remote fetch is for: its budget and rate-limit key, and the connection to watch.
    caller: Caller = field(default_factory=lambda: Caller(""))


class FetchAdmission(Protocol):
    """How a remote fetch is admitted: `MediaFetchHandoff` in pool mode
    (homeserver/http/handoff.py), `InlineFetchAdmission` otherwise."""

    def admitted(self, caller: Caller) -> AbstractContextManager[object]:
        """Around every request that may wait on a fetch, its own or another's."""
        ...

    def new_fetch(self, caller: Caller) -> AbstractContextManager[Ticket | None]:
        """Around a fetch this request starts; refuses at once, and never yields to the hub
        before it enters (the coalescer's `admit`)."""
        ...

    def fetch_place(
        self, ticket: Ticket | None, deadline: OutboundDeadline
    ) -> AbstractContextManager[object]:
        """Where the fetch runs, once its turn comes."""
        ...


class InlineFetchAdmission:
    """Inline mode: the fetch runs in the request's own greenlet under ADR-0079's
    `client_outbound_budget`, since there is no media pool to hand it to."""

    def __init__(self, client_outbound_budget: InFlightBudget):
        self.budget = client_outbound_budget

    def admitted(self, caller: Caller):
        return admitted(self.budget, caller)

    def new_fetch(self, caller: Caller):
        return contextlib.nullcontext(None)

    def fetch_place(self, ticket: Ticket | None, deadline: OutboundDeadline):
        return contextlib.nullcontext()


class RemoteMediaFetchCoalescer:
    """At most one fetch per remote file, (origin, media id), whatever asked for it: a
    download and a thumbnail of one image cost one fetch. The fetch runs in the greenlet of
    the request that started it; see concurrency.SingleFlight for how waiters fare."""

    def __init__(self):
        self._flight = SingleFlight()

    def fetch(
        self,
        origin: str,
        media_id: str,
        fetch: Callable[[], RemoteMedia],
        on_wait: Callable[[], None],
        admit: Callable[[], AbstractContextManager[object]],
    ) -> RemoteMedia:
        """`admit` is entered by a request about to start the fetch, `on_wait` called by one
        about to wait on it."""
        return self._flight.run((origin, media_id), fetch, on_wait, admit)

    def __len__(self) -> int:
        """Fetches in flight."""
        return len(self._flight)


@dataclass
class _RemoteFile:
    """A remote file being received: what it is, and its bytes as they arrive."""

    content_type: str | None
    upload_name: str | None
    chunks: Iterable[bytes]


class RemoteMediaRepository:
    def __init__(
        self,
        config: MediaConfig,
        security: MediaSecurityConfig,
        store: MediaStore,
        files: MediaFileStore,
        client: FederationClient,
        admission: FetchAdmission,
        rate_limiter: RateLimiter,
        cooldown: AddressCooldown,
        metrics: Metrics,
    ):
        self.config = config
        self.security = security
        self.store = store
        self.files = files
        self.client = client
        self.admission = admission  # MediaFetchHandoff (pool mode) or InlineFetchAdmission
        self.rate_limiter = rate_limiter
        self.cooldown = cooldown  # client-triggered calls feed and consult it (cooldown.py)
        self.metrics = metrics
        self.coalescer = RemoteMediaFetchCoalescer()
        self._blocked = {name.lower() for name in security.blocked_servers}

    def original(self, origin: str, media_id: str, request: MediaRequest) -> RemoteMedia:
        """The cached copy of another server's file, fetched first if need be."""
        self._refuse_early(origin, media_id, request)
        media = self._cached(origin, media_id)
        if media is not None:
            self.metrics.cache_hits.labels(CALL).inc()
        else:
            self.metrics.cache_misses.labels(CALL).inc()
            media = self._fetch_for(request, origin, media_id)
        if request.legacy and self.config.enable_authenticated_media and media.authenticated:
            raise not_found("Media not found: use the authenticated /_matrix/client/v1/media API")
        return media

    def _refuse_early(self, origin: str, media_id: str, request: MediaRequest) -> None:
        if not self.security.remote_fetch_enabled:
            raise not_found("This server does not serve remote media")
        if not request.allow_remote:
            raise not_found("Media not found: it is remote, and allow_remote is false")
        try:
            host, _ = split_server_name(origin)
        except ValueError:
            raise not_found("Media not found: not a server name") from None
        # A blocked name without a port blocks that host on every port.
        host = f"[{host}]" if ":" in host else host
        if origin.lower() in self._blocked or host.lower() in self._blocked:
            raise not_found("Media from this server is not served here")
        if not is_valid_media_id(media_id):
            raise not_found("Media not found")

    def _cached(self, origin: str, media_id: str) -> RemoteMedia | None:
        media = self.store.get_remote_media(origin, media_id)
        # A row whose file is gone (removed by hand) is a miss: the fetch puts it back.
        if media is None or not os.path.exists(self.files.original_path(origin, media_id)):
            return None
        return media

    # --- admission ---------------------------------------------------------------------------

    def _fetch_for(self, request: MediaRequest, origin: str, media_id: str) -> RemoteMedia:
        """The file, fetched under admission, the rate limit and the coalescer."""
        try:
            self._refuse_if_cooling(origin)
        except AddressCoolingDown as e:
            count_failure(self.metrics, CALL, e)
            raise to_client_error(e, origin) from None
        caller = request.caller
        deadline = self.client.deadline(MEDIA_DEADLINE_SECONDS, what=f"media {origin}/{media_id}")
        authenticated = not request.legacy and self.config.enable_authenticated_media
        spend_token = self._token_spender(caller.client_key)
        ticket: Ticket | None = None

        @contextlib.contextmanager
        def admit():
            nonlocal ticket
            with self.admission.new_fetch(caller) as ticket:
                spend_token()
                yield

        def wait() -> None:
            spend_token()
            self.metrics.coalesced.labels(CALL).inc()

        def fetch() -> RemoteMedia:
            return self._fetch_in_place(ticket, origin, media_id, deadline, authenticated)

        try:
            with self.admission.admitted(caller), deadline:
                return self.coalescer.fetch(origin, media_id, fetch, wait, admit)
        except (FederationError, DeadlineExceeded, ContentTooLarge) as e:
            raise self._client_error(e, origin) from None

    def _token_spender(self, client_key: str) -> Callable[[], None]:
        """Spends one rate-limit token for a request, the first time it is called: once the
        request is admitted, to start a fetch or to wait on one."""
        spent = False

        def spend() -> None:
            nonlocal spent
            if spent:
                return
            spent = True
            decision = self.rate_limiter.check(client_key)
            if not decision.allowed:
                raise limit_exceeded(decision.retry_after_ms, "Too many remote media requests")

        return spend

    def _fetch_in_place(
        self,
        ticket: Ticket | None,
        origin: str,
        media_id: str,
        deadline: OutboundDeadline,
        authenticated: bool,
    ) -> RemoteMedia:
        with contextlib.ExitStack() as place:
            try:
                place.enter_context(self.admission.fetch_place(ticket, deadline))
            except DeadlineExceeded as e:
                # Out of time waiting for its turn or a media-pool place: as costly to the
                # client as a silent peer, and a sign the pool is saturated.
                count_failure(self.metrics, CALL, e)
                raise
            # A fetch that ended between our cache miss and now has left the copy.
            media = self._cached(origin, media_id)
            if media is not None:
                return media
            return self._fetch_counted(origin, media_id, deadline, authenticated)
        # Reached only if a context manager in `place` swallowed an exception (an
        # AbstractContextManager may); neither fetch_place does.
        raise RuntimeError(f"media fetch {origin}/{media_id} ended without a result")

    def _refuse_if_cooling(self, origin: str) -> None:
        """An origin whose every known address just timed out or refused us is refused before
        anything is spent on it: no slot, no rate-limit token, no place."""
        known = self.client.discovery.known_targets(origin)
        if known:
            self.cooldown.refuse_if_all_cooling(origin, known)

    def _client_error(self, e: Exception, origin: str) -> MatrixError:
        if isinstance(e, ContentTooLarge):
            return MatrixError(
                502,
                Codes.TOO_LARGE,
                f"Media from {origin} is larger than this "
                f"server accepts ({self.config.max_upload_size} bytes)",
            )
        return to_client_error(e, origin)

    # --- fetching ----------------------------------------------------------------------------

    def _fetch_counted(
        self, origin: str, media_id: str, deadline: OutboundDeadline, authenticated: bool
    ) -> RemoteMedia:
        try:
            # The deadline is entered here too, so that its expiry reaches the waiters as a
            # shared failure (DeadlineExceeded) rather than as a leader that vanished, which
            # would make each of them try the silent peer again.
            with deadline:
                media = self._fetch(origin, media_id, deadline, authenticated)
        except Exception as e:
            count_failure(self.metrics, CALL, e)
            log.info("fetching %s/%s failed: %s", origin, media_id, e)
            raise
        self.metrics.outbound_calls.labels(CALL, "ok").inc()
        return media

    def _fetch(
        self, origin: str, media_id: str, deadline: OutboundDeadline, authenticated: bool
    ) -> RemoteMedia:
        with contextlib.ExitStack() as responses:
            remote = self._open(origin, media_id, deadline, responses)
            content_type = safe_content_type(remote.content_type)

            def record(stored) -> None:
                self.store.insert_remote_media(
                    RemoteMedia(
                        origin,
                        media_id,
                        content_type,
                        remote.upload_name,
                        stored.length,
                        stored.sha256,
                        now_ms(),
                        authenticated,
                    )
                )

            self.files.store_file(
                self.files.original_path(origin, media_id),
                remote.chunks,
                self.config.max_upload_size,
                record,
            )
        # Our row, or one an earlier fetch left (its file was kept, ours dropped).
        media = self.store.get_remote_media(origin, media_id)
        assert media is not None
        return media

    def _open(
        self,
        origin: str,
        media_id: str,
        deadline: OutboundDeadline,
        responses: contextlib.ExitStack,
    ) -> _RemoteFile:
        max_bytes = self.config.max_upload_size + MULTIPART_OVERHEAD_BYTES
        try:
            response = responses.enter_context(
                self.client.open_stream(
                    origin,
                    FEDERATION_DOWNLOAD_PATH + media_id,
                    _timeout_query(deadline),
                    deadline=deadline,
                    max_bytes=max_bytes,
                    target_health=self.cooldown,
                )
            )
        except RemoteError as e:
            if e.status in (404, 405) and e.errcode == Codes.UNRECOGNIZED:
                return self._open_legacy(origin, media_id, deadline, responses)
            raise
        reader = MultipartMediaReader(
            origin, response.headers.get("Content-Type"), response.stream()
        )
        part = reader.file_part()
        if part.location is None:
            return _RemoteFile(part.content_type, part.upload_name, reader.file_chunks())
        response.close()  # the rest of this body is of no use
        return self._open_url(part.location, deadline, responses)

    def _open_legacy(
        self,
        origin: str,
        media_id: str,
        deadline: OutboundDeadline,
        responses: contextlib.ExitStack,
    ) -> _RemoteFile:
        """The remote has no federation media endpoint: its client API's download, told not to
        fetch from elsewhere (no loops) and allowed to redirect."""
        query = {"allow_remote": "false", "allow_redirect": "true", **_timeout_query(deadline)}
        try:
            response = responses.enter_context(
                self.client.open_stream(
                    origin,
                    f"{LEGACY_DOWNLOAD_PATH}{quote(origin, safe=':')}/{media_id}",
                    query,
                    deadline=deadline,
                    max_bytes=self.config.max_upload_size,
                    target_health=self.cooldown,
                )
            )
        except RemoteError as e:
            if e.status in REDIRECT_STATUSES and e.location:
                return self._open_url(e.location, deadline, responses)
            raise
        return _plain_file(response)

    def _open_url(
        self, url: str, deadline: OutboundDeadline, responses: contextlib.ExitStack
    ) -> _RemoteFile:
        """Where a `Location` points: the same IP filter, TLS verification and size cap."""
        response = responses.enter_context(
            self.client.open_url(
                url,
                deadline=deadline,
                max_bytes=self.config.max_upload_size,
                target_health=self.cooldown,
            )
        )
        return _plain_file(response)


def _plain_file(response) -> _RemoteFile:
    return _RemoteFile(
        response.headers.get("Content-Type"),
        upload_name_from(response.headers.get("Content-Disposition")),
        response.stream(),
    )


def _timeout_query(deadline: OutboundDeadline) -> dict:
    # How long the remote may wait for an async upload's content: no longer than we wait.
    return {"timeout_ms": str(int(deadline.remaining() * 1000))}
