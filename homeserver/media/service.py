"""The media repository: uploads, async uploads, downloads and thumbnails.

Local media is ours; another server's media (remote) comes from `RemoteMediaRepository`, which
fetches and caches the original (media/remote.py). Either way a download serves the stored
original, and a thumbnail is made from it by the same code, whatever its origin.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Iterable

from gevent.threadpool import ThreadPool

from homeserver.config import MediaConfig
from homeserver.core.clock import now_ms
from homeserver.core.errors import Codes, MatrixError, limit_exceeded, not_found
from homeserver.media.files import (
    FileTooLarge,
    MediaFile,
    MediaFileStore,
    ThumbnailKey,
    is_valid_media_id,
    new_media_id,
    safe_content_type,
)
from homeserver.media.remote import MediaRequest, RemoteMediaRepository
from homeserver.media.thumbnails import (
    ImageTooLarge,
    NotAnImage,
    SourceImage,
    is_thumbnailable,
    key_for,
    pregenerated_keys,
    probe,
    refusal_returned,
    render,
    select_thumbnail,
)
from homeserver.media.waiters import UploadWaiters
from homeserver.storage.media import (
    LocalMedia,
    MediaStore,
    RemoteMedia,
    StoredThumbnail,
    ThumbnailSource,
)

log = logging.getLogger(__name__)

# How long a download of not-yet-uploaded media waits: the spec's default, and our cap.
DEFAULT_TIMEOUT_MS = 20_000
MAX_TIMEOUT_MS = 60_000

# Thumbnails kept per original, pre-generated ones included. Past it, a request is served the
# nearest stored one: a client looping over sizes cannot fill the disk.
MAX_STORED_THUMBNAILS = 32

THUMBNAIL_METHODS = ("crop", "scale")


def _cannot_thumbnail() -> MatrixError:
    return MatrixError(400, Codes.UNKNOWN, "Cannot generate thumbnails for the requested content")


class MediaService:
    def __init__(
        self,
        config: MediaConfig,
        server_name: str,
        store: MediaStore,
        files: MediaFileStore,
        thumbnail_pool: ThreadPool,
        remote: RemoteMediaRepository,
    ):
        self.config = config
        self.server_name = server_name
        self.store = store
        self.files = files
        self.thumbnail_pool = thumbnail_pool
        self.remote = remote
        self.waiters = UploadWaiters()
        self._uploading: set[str] = set()  # async uploads in progress, by media id

    def upload_config(self) -> dict:
        return {"m.upload.size": self.config.max_upload_size}

    def _mxc(self, media_id: str) -> str:
        return f"mxc://{self.server_name}/{media_id}"

    # --- uploads -------------------------------------------------------------------------

    def upload(
        self,
        user_id: str,
        body: Iterable[bytes],
        declared_length: int | None,
        content_type: str | None,
        filename: str | None,
    ) -> str:
        """Stores new content; returns its mxc:// URI."""
        self._check_declared_length(declared_length)
        content_type = safe_content_type(content_type)
        media_id = new_media_id()
        now = now_ms()

        def record(stored):
            media = LocalMedia(
                media_id,
                user_id,
                content_type,
                filename or None,
                stored.length,
                stored.sha256,
                now,
                self.config.enable_authenticated_media,
            )
            if not self.store.insert_local_media(media, now):
                raise MatrixError(500, Codes.UNKNOWN, "Media id collision")

        self._store_original(media_id, body, record)
        self._pregenerate_thumbnails(self.server_name, media_id, content_type)
        return self._mxc(media_id)

    def create(self, user_id: str) -> dict:
        """Reserves an mxc:// URI whose content comes later (async upload)."""
        now = now_ms()
        lifetime_ms = int(self.config.unused_expiration_time * 1000)
        media_id = new_media_id()
        oldest = self.store.create_pending(
            media_id,
            user_id,
            now,
            now - lifetime_ms,
            self.config.max_pending_uploads,
            self.config.enable_authenticated_media,
        )
        if oldest is not None:
            raise limit_exceeded(oldest + lifetime_ms - now, "Too many pending media uploads")
        return {"content_uri": self._mxc(media_id), "unused_expires_at": now + lifetime_ms}

    def upload_to(
        self,
        user_id: str,
        server_name: str,
        media_id: str,
        body: Iterable[bytes],
        declared_length: int | None,
        content_type: str | None,
        filename: str | None,
    ) -> None:
        """Gives content to an mxc:// URI from `create`."""
        if server_name != self.server_name or not is_valid_media_id(media_id):
            raise not_found("Unknown media ID")
        if media_id in self._uploading:
            raise MatrixError(409, Codes.CANNOT_OVERWRITE_MEDIA, "Media ID is being uploaded")
        self._uploading.add(media_id)
        try:
            media = self.store.get_local_media(media_id)
            if media is None or self._expired(media):
                raise not_found("Unknown media ID")
            if media.user_id != user_id:
                raise MatrixError(
                    403, Codes.FORBIDDEN, "Only the creator of the media ID can upload to it"
                )
            if media.uploaded:
                raise MatrixError(409, Codes.CANNOT_OVERWRITE_MEDIA, "Media ID already has content")
            self._check_declared_length(declared_length)
            content_type = safe_content_type(content_type)
            # A file here is a leftover of an upload that died before its row was written:
            # a pending id is never served, so nobody reads it.
            self.files.remove(self.files.original_path(self.server_name, media_id))

            def record(stored):
                if not self.store.complete_pending(
                    media_id, content_type, filename or None, stored.length, stored.sha256, now_ms()
                ):
                    raise MatrixError(
                        409, Codes.CANNOT_OVERWRITE_MEDIA, "Media ID already has content"
                    )

            self._store_original(media_id, body, record)
        finally:
            self._uploading.discard(media_id)
        self.waiters.uploaded(media_id)
        self._pregenerate_thumbnails(self.server_name, media_id, content_type)

    def _check_declared_length(self, declared_length: int | None) -> None:
        if declared_length is not None and declared_length > self.config.max_upload_size:
            raise _too_large(self.config.max_upload_size)

    def _store_original(self, media_id: str, body: Iterable[bytes], record) -> None:
        path = self.files.original_path(self.server_name, media_id)
        try:
            self.files.store_file(path, body, self.config.max_upload_size, record)
        except FileTooLarge:
            raise _too_large(self.config.max_upload_size) from None

    # --- downloads -----------------------------------------------------------------------

    def original(
        self, server_name: str, media_id: str, request: MediaRequest
    ) -> LocalMedia | RemoteMedia:
        """The stored original of an mxc:// URI: ours, or another server's fetched and cached."""
        if self.store.is_quarantined(server_name, media_id):
            raise not_found("Media not found")  # as Synapse answers for quarantined media
        if server_name != self.server_name:
            return self.remote.original(server_name, media_id, request)
        return self.local_media(media_id, legacy=request.legacy, timeout_ms=request.timeout_ms)

    def download(
        self, server_name: str, media_id: str, filename: str | None, request: MediaRequest
    ) -> MediaFile:
        media = self.original(server_name, media_id, request)
        return MediaFile(
            self.files.original_path(server_name, media_id),
            media.content_type,
            filename or media.upload_name,
        )

    def local_media(self, media_id: str, *, legacy: bool, timeout_ms: int) -> LocalMedia:
        """Local media with its content, waiting up to `timeout_ms` for an async upload.

        Legacy (unauthenticated) requests get 404 for media stored after the freeze, as from
        Synapse: the media exists, but not for them. They learn it at once, without waiting.
        """
        if not is_valid_media_id(media_id):
            raise not_found("Media not found")
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            # Watch before reading, so content that lands in between still wakes us.
            with self.waiters.watching(media_id) as uploaded:
                media = self.store.get_local_media(media_id)
                if media is None or self._expired(media):
                    raise not_found("Media not found")
                if legacy and self.config.enable_authenticated_media and media.authenticated:
                    raise not_found(
                        "Media not found: use the authenticated /_matrix/client/v1/media API"
                    )
                if media.uploaded:
                    return media
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise MatrixError(
                        504, Codes.NOT_YET_UPLOADED, "Media has not been uploaded yet"
                    )
                # Woken or timed out, read again: content uploaded through another process
                # (a federation shard's downloads) wakes nobody here.
                uploaded.wait(remaining)

    def _expired(self, media: LocalMedia) -> bool:
        lifetime_ms = self.config.unused_expiration_time * 1000
        return not media.uploaded and media.created_ts + lifetime_ms < now_ms()

    # --- thumbnails ----------------------------------------------------------------------

    def thumbnail(
        self,
        server_name: str,
        media_id: str,
        width: int,
        height: int,
        method: str,
        animated: bool,
        request: MediaRequest,
    ) -> MediaFile:
        media = self.original(server_name, media_id, request)
        return self.thumbnail_of(
            server_name, media_id, media.content_type, width, height, method, animated
        )

    def thumbnail_of(
        self,
        origin: str,
        media_id: str,
        content_type: str | None,
        width: int,
        height: int,
        method: str,
        animated: bool,
    ) -> MediaFile:
        """A thumbnail of a stored original (local, or a cached remote copy): the nearest
        stored one at least as large, or one made now and kept."""
        if not is_thumbnailable(content_type):
            raise _cannot_thumbnail()
        source = self._thumbnail_source(origin, media_id)
        wanted = key_for(source, content_type, width, height, method, animated)
        stored = self.store.get_thumbnails(origin, media_id)
        chosen = select_thumbnail(stored, wanted)
        if chosen is None and len(stored) >= MAX_STORED_THUMBNAILS:
            # A still request must never get an animation (the spec's MUST NOT).
            chosen = max(
                (t for t in stored if t.method == method and (wanted.animated or not t.animated)),
                key=lambda t: t.width * t.height,
                default=None,
            )
        if chosen is not None:
            key = ThumbnailKey(
                chosen.width, chosen.height, chosen.method, chosen.content_type, chosen.animated
            )
            served = self._thumbnail_file(origin, media_id, key)
            if os.path.exists(served.path):
                return served
            wanted = key  # its row outlived the file: make it again
        self._render_and_store(origin, media_id, [wanted])
        return self._thumbnail_file(origin, media_id, wanted)

    def image_size(self, media_id: str) -> tuple[int, int] | None:
        """(width, height) of a local image, probed once and remembered; None if it is no
        image we can read (a link preview's og:image)."""
        try:
            source = self._thumbnail_source(self.server_name, media_id)
        except MatrixError:
            return None
        return source.width, source.height

    def _thumbnail_file(self, origin: str, media_id: str, key: ThumbnailKey) -> MediaFile:
        path = self.files.thumbnail_path(origin, media_id, key)
        return MediaFile(path, key.content_type, "thumbnail." + path.rsplit(".", 1)[1])

    def _thumbnail_source(self, origin: str, media_id: str) -> SourceImage:
        """The original's size and animation, probed once (header only) and remembered."""
        source = self.store.get_thumbnail_source(origin, media_id)
        if source is None:
            path = self.files.original_path(origin, media_id)
            try:
                image = self._decode(probe, path, self.config.max_image_pixels)
                source = ThumbnailSource(image.width, image.height, image.animated, None)
            except ImageTooLarge:
                source = ThumbnailSource(None, None, False, "too_large")
            except NotAnImage:
                source = ThumbnailSource(None, None, False, "not_an_image")
            self.store.record_thumbnail_source(origin, media_id, source)
        if source.refusal == "too_large":
            raise _image_too_large()
        if source.refusal is not None:
            raise _cannot_thumbnail()
        if source.width is None or source.height is None:
            # Only a refused probe is recorded without a size.
            raise ValueError(f"thumbnail source of {origin}/{media_id} has no size recorded")
        return SourceImage(source.width, source.height, source.animated)

    def _decode(self, fn, *args):
        """`fn(*args)` on the thumbnail pool; a refused image raised here, in the caller."""
        value, refusal = self.thumbnail_pool.apply(refusal_returned, (fn, *args))
        if refusal is not None:
            raise refusal
        return value

    def _render_and_store(self, origin: str, media_id: str, keys: list[ThumbnailKey]) -> None:
        original = self.files.original_path(origin, media_id)
        try:
            encoded = self._decode(render, original, keys, self.config.max_image_pixels)
        except ImageTooLarge:
            raise _image_too_large() from None
        except NotAnImage:
            raise _cannot_thumbnail() from None
        for key, data in zip(keys, encoded):

            def record(stored, key=key):
                self.store.add_thumbnail(
                    origin,
                    media_id,
                    StoredThumbnail(
                        key.width,
                        key.height,
                        key.method,
                        key.content_type,
                        key.animated,
                        stored.length,
                    ),
                    now_ms(),
                )

            self.files.store_file(
                self.files.thumbnail_path(origin, media_id, key), [data], len(data), record
            )

    def _pregenerate_thumbnails(self, origin: str, media_id: str, content_type: str | None) -> None:
        """The spec's sizes, made once at upload. The upload succeeds whatever happens here."""
        if not is_thumbnailable(content_type):
            return
        try:
            source = self._thumbnail_source(origin, media_id)
            self._render_and_store(origin, media_id, pregenerated_keys(source, content_type))
        except MatrixError as e:
            log.info("no thumbnails for %s/%s: %s", origin, media_id, e.error)
        except Exception:
            log.exception("thumbnailing %s/%s failed", origin, media_id)


def _too_large(max_bytes: int) -> MatrixError:
    # The server closes the connection rather than read the rest (http/server.py).
    return MatrixError(413, Codes.TOO_LARGE, f"Upload over {max_bytes} bytes")


def _image_too_large() -> MatrixError:
    return MatrixError(413, Codes.TOO_LARGE, "Image too large to thumbnail")
