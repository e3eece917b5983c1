"""Link previews: `GET /_matrix/client/v1/media/preview_url` (and the legacy media paths).

A preview makes us fetch a URL a user named, so it is a client-triggered outbound call
(ADR-0079; docs/architecture.md, "Budgets"):

1. Quick answers first, with no slot and no byte sent: previews switched off (404
   M_UNRECOGNIZED, as from Synapse, which has no such route then), a URL that is not
   http(s) (400), one the blacklist names (403), and a preview already had: the newest
   fetched at or before `ts` and fresh then (storage/url_previews.py), or without `ts` (or
   none that old) the latest while fresh, from memory or the database.
2. One `client_outbound_budget` slot per request, 429 at once past the caps; one total
   deadline (`url_preview.deadline`) over DNS, connects, redirects, the body, parsing and
   the og:image's fetch. One fetch per URL (`SingleFlight`): requests for a URL being
   fetched wait for that fetch, each holding its own slot.
3. The fetch (media/web_fetch.py): the IP filter on every address and redirect, TLS
   verified, HTML and images only, at most `url_preview.max_spider_size` read. An image is
   stored as local media and described by its mxc:// URI, type, size and dimensions (probed
   with Pillow); HTML gives its Open Graph object (media/preview_html.py), parsed on a
   native thread, whose og:image is then fetched and stored the same way (dropped if that
   fails). A type we do not preview is 502, as from Synapse. An answer is kept
   `CACHE_SECONDS`, a failure `FAILURE_CACHE_SECONDS` (answered again without a slot).
"""

from __future__ import annotations

import fnmatch
import logging
import time
from urllib.parse import urlsplit

from gevent.threadpool import ThreadPool

from budget import InFlightBudget, OutboundDeadline
from homeserver.config import UrlPreviewConfig
from homeserver.core.caching import TtlCache
from homeserver.core.clock import now_ms
from homeserver.core.concurrency import SingleFlight
from homeserver.core.errors import Codes, MatrixError, invalid_param, unrecognized
from homeserver.federation.admission import Caller, admitted, count_failure
from homeserver.federation.errors import (
    FederationError,
    RemoteError,
    ResponseTooLarge,
    to_client_error,
)
from homeserver.media.preview_html import open_graph
from homeserver.media.service import MediaService
from homeserver.media.web_fetch import NotPreviewable, WebFetcher, WebPage
from homeserver.metrics import Metrics
from homeserver.storage.url_previews import UrlPreviewStore

log = logging.getLogger(__name__)

# How long a preview is answered again without a fetch (Synapse's default too).
CACHE_SECONDS = 3600
# A URL that failed is not fetched again for this long (Synapse keeps failures an hour): a
# tarpit's link in a busy room costs one deadline a minute, not one per reader.
FAILURE_CACHE_SECONDS = 60
CACHE_ENTRIES = 1000
MAX_URL_CHARS = 4096
CALL = "url_preview"  # the label of this call in the metrics


class UrlPreviewer:
    def __init__(
        self,
        config: UrlPreviewConfig,
        fetcher: WebFetcher,
        store: UrlPreviewStore,
        media: MediaService,
        parse_pool: ThreadPool,
        budget: InFlightBudget,
        metrics: Metrics,
    ):
        self.config = config
        self._fetcher = fetcher
        self._store = store
        self._media = media
        self._parse_pool = parse_pool
        self._budget = budget
        self._metrics = metrics
        self._flight = SingleFlight()
        self._cache = TtlCache(time.monotonic, CACHE_ENTRIES)  # url -> (fetched_ts, og)
        self._failures = TtlCache(time.monotonic, CACHE_ENTRIES)  # url -> (status, errcode, error)

    def preview(self, user_id: str, url: str, ts: int | None, caller: Caller) -> dict:
        if not self.config.enabled:
            raise unrecognized()
        host = self._checked(url)
        if ts is not None:
            stored = self._store.valid_at(url, ts)
            if stored is not None:
                return stored.og
        fresh = self._fresh(url)
        if fresh is not None:
            return fresh
        self._raise_if_failed(url)
        with admitted(self._budget, caller):
            deadline = OutboundDeadline(self.config.deadline, what=f"preview of {host}")
            return self._flight.run(url, lambda: self._fetched(user_id, url, host, deadline))

    def _checked(self, url: str) -> str:
        """The URL's host, or the client's error for a URL we will not fetch."""
        parts = urlsplit(url)
        try:
            host = parts.hostname
            _ = parts.port  # a port out of range raises ValueError
        except ValueError:
            host = None
        if len(url) > MAX_URL_CHARS or parts.scheme not in ("http", "https") or not host:
            raise invalid_param("url must be an absolute http or https URL")
        if self._blocked(url, host):
            raise MatrixError(403, Codes.UNKNOWN, "URL blocked")
        return host

    def _blocked(self, url: str, host: str) -> bool:
        return any(
            fnmatch.fnmatchcase(host, pattern.lower()) or fnmatch.fnmatchcase(url, pattern)
            for pattern in self.config.url_blacklist
        )

    def _fresh(self, url: str) -> dict | None:
        cached = self._cache.get(url)
        if cached is not None:
            return cached[1]
        stored = self._store.valid_at(url, now_ms())
        if stored is None:
            return None
        left = (stored.expires_ts - now_ms()) / 1000
        self._cache.put(url, (stored.fetched_ts, stored.og), max(left, 0.001))
        return stored.og

    def _fetched(self, user_id: str, url: str, host: str, deadline: OutboundDeadline) -> dict:
        """Leads the one fetch of `url`: fetched, described, stored and kept; a failure is
        kept too, briefly."""
        fresh = self._fresh(url)  # a fetch that just ended, before this caller led
        if fresh is not None:
            return fresh
        self._raise_if_failed(url)
        try:
            og = self._described(user_id, url, deadline)
        except Exception as e:
            if not isinstance(e, MatrixError):
                count_failure(self._metrics, CALL, e)
            error = self._client_error(e, host)
            self._failures.put(
                url, (error.status, error.errcode, error.error), FAILURE_CACHE_SECONDS
            )
            raise error from None
        self._metrics.outbound_calls.labels(CALL, "ok").inc()
        fetched = now_ms()
        self._store.add(url, fetched, fetched + CACHE_SECONDS * 1000, og)
        self._cache.put(url, (fetched, og), CACHE_SECONDS)
        return og

    def _raise_if_failed(self, url: str) -> None:
        failed = self._failures.get(url)
        if failed is not None:
            raise MatrixError(*failed)

    @staticmethod
    def _client_error(e: Exception, host: str) -> MatrixError:
        """As Synapse answers: 502 for whatever the site did (an error status, a type we do
        not preview), 504 for the deadline. Named by the URL the client gave: where its
        redirects led is for the log."""
        if isinstance(e, MatrixError):
            return e
        if isinstance(e, FederationError):
            log.info("preview of %s failed at %s: %s", host, e.destination, e)
            e.destination = host
        if isinstance(e, RemoteError):
            return MatrixError(502, Codes.UNKNOWN, f"{host} answered HTTP {e.status}")
        if isinstance(e, NotPreviewable):
            return MatrixError(502, Codes.UNKNOWN, f"{host} answered with no previewable type")
        return to_client_error(e, host)

    def _described(self, user_id: str, url: str, deadline: OutboundDeadline) -> dict:
        page = self._fetcher.fetch(url, deadline, self.config.max_spider_size)
        if page.is_image:
            return self._stored_image(user_id, page)
        with deadline:
            og = self._parse_pool.apply(open_graph, (page.body, page.charset, page.url))
        image_url = og.pop("og:image", None)
        if image_url is None:
            return og
        try:
            image_host = urlsplit(image_url).hostname or ""
            if self._blocked(image_url, image_host):
                raise NotPreviewable(image_host, "og:image blocked")
            image = self._fetcher.fetch(image_url, deadline, self.config.max_spider_size)
            if not image.is_image:
                raise NotPreviewable(image_host, "og:image not an image")
            image_og = self._stored_image(user_id, image)
        except Exception as e:
            # The page is still described: only its image is left out.
            log.info("og:image of %s left out: %s", url[:200], e)
            return {k: v for k, v in og.items() if not k.startswith("og:image")}
        return {**og, **image_og}

    def _stored_image(self, user_id: str, page: WebPage) -> dict:
        """An image kept as local media, described as the spec's preview says."""
        if page.truncated:
            raise ResponseTooLarge(urlsplit(page.url).hostname or "", self.config.max_spider_size)
        mxc = self._media.upload(user_id, [page.body], len(page.body), page.content_type, None)
        og: dict = {
            "og:image": mxc,
            "og:image:type": page.content_type,
            "matrix:image:size": len(page.body),
        }
        size = self._media.image_size(mxc.rsplit("/", 1)[1])
        if size is not None:
            og["og:image:width"], og["og:image:height"] = size
        return og
