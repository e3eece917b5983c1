"""The media half of the composition root: local and remote media, thumbnails and link
previews, on the infrastructure alone (runtime/infrastructure.py)."""

from __future__ import annotations

import os

from gevent.threadpool import ThreadPool

from homeserver.core.components import component
from homeserver.core.threads import CountedThreadPool
from homeserver.media.files import MediaFileStore
from homeserver.media.preview import UrlPreviewer
from homeserver.media.remote import (
    FetchAdmission,
    InlineFetchAdmission,
    RemoteMediaRepository,
)
from homeserver.media.service import MediaService
from homeserver.runtime.infrastructure import Infrastructure
from homeserver.storage.media import MediaStore
from homeserver.storage.url_previews import UrlPreviewStore


class MediaComponents(Infrastructure):
    @component
    def media_store(self) -> MediaStore:
        return MediaStore(self.db)

    @component
    def media_files(self) -> MediaFileStore:
        return MediaFileStore(os.path.join(self.config.data_dir, "media"), self.server_name)

    @component
    def remote_media(self) -> RemoteMediaRepository:
        """Pool mode hands a fetch off to the media pool; inline, it falls under ADR-0079."""
        admission: FetchAdmission = self.media_handoff or InlineFetchAdmission(
            self.client_outbound_budget
        )
        remote = RemoteMediaRepository(
            self.config.media,
            self.config.security.media,
            self.media_store,
            self.media_files,
            self.federation_client,
            admission,
            self.remote_media_rate_limiter,
            self.address_cooldown,
            self.metrics,
        )
        self.metrics.track_gauge(
            "weir_remote_media_fetches", "Remote files being fetched", lambda: len(remote.coalescer)
        )
        return remote

    @component
    def thumbnail_pool(self) -> ThreadPool:
        """Pillow decoding and encoding is CPU-bound and would block the hub: native threads."""
        pool = CountedThreadPool(self.config.media.thumbnail_threads)
        self.metrics.track_threadpool("thumbnails", pool)
        return pool

    @component
    def media(self) -> MediaService:
        return MediaService(
            self.config.media,
            self.server_name,
            self.media_store,
            self.media_files,
            self.thumbnail_pool,
            self.remote_media,
        )

    @component
    def url_previewer(self) -> UrlPreviewer:
        """Link previews: a client-triggered fetch of any web URL (ADR-0079)."""
        return UrlPreviewer(
            self.config.url_preview,
            self.web_fetcher,
            UrlPreviewStore(self.db),
            self.media,
            self.thumbnail_pool,
            self.client_outbound_budget,
            self.metrics,
        )
