"""The media files on disk, under `data_dir/media`.

Every path is built from a media id that matched the spec's grammar and from hashes (of the id,
and of a remote origin), never from other request text, so no request can name a file outside
the store. Files appear only whole: `store_file` writes a temp file, fsyncs it, and links it
into place.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import string
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import gevent

from homeserver.core.errors import ContentTooLarge

# The spec's media-id grammar. Anything else is refused before a path is built.
_MEDIA_ID = re.compile(r"[A-Za-z0-9_-]{1,255}")
_NEW_ID_ALPHABET = string.ascii_letters + string.digits
NEW_MEDIA_ID_LENGTH = 24  # ~143 random bits, as long as Synapse's

# A temp file older than this at start is a leftover of a crash, not an upload in progress.
STALE_TEMP_SECONDS = 24 * 3600

THUMBNAIL_EXTENSIONS = {"image/jpeg": "jpg", "image/png": "png", "image/webp": "webp"}

DEFAULT_CONTENT_TYPE = "application/octet-stream"
# A header-safe media type; anything else (control characters, non-ASCII) is not trusted.
_SAFE_CONTENT_TYPE = re.compile(r"[!-~][ -~]{0,254}")


def is_valid_media_id(media_id: str) -> bool:
    return bool(_MEDIA_ID.fullmatch(media_id))  # fullmatch: `$` would allow a final \n


def new_media_id() -> str:
    return "".join(secrets.choice(_NEW_ID_ALPHABET) for _ in range(NEW_MEDIA_ID_LENGTH))


def safe_content_type(content_type: str | None) -> str:
    """The stored type if it can go out as a header, else application/octet-stream."""
    if not content_type or not _SAFE_CONTENT_TYPE.fullmatch(content_type):
        return DEFAULT_CONTENT_TYPE
    return content_type


class FileTooLarge(ContentTooLarge):
    """The content passed the size cap; nothing was kept."""


@dataclass(frozen=True)
class MediaFile:
    """A stored file to serve, and what to call it."""

    path: str
    content_type: str | None
    filename: str | None


@dataclass(frozen=True)
class StoredFile:
    path: str
    length: int
    sha256: str


@dataclass(frozen=True)
class ThumbnailKey:
    """Names one thumbnail file of an original."""

    width: int
    height: int
    method: str  # "crop" or "scale"
    content_type: str  # one of THUMBNAIL_EXTENSIONS
    animated: bool


class MediaFileStore:
    def __init__(self, root: str, server_name: str):
        self.root = root
        self.server_name = server_name
        self.temp_dir = os.path.join(root, "tmp")
        os.makedirs(self.temp_dir, exist_ok=True)
        self._remove_stale_temp_files()

    # --- paths ---------------------------------------------------------------------------

    def _media_dir(self, origin: str, media_id: str) -> str:
        if not is_valid_media_id(media_id):
            raise ValueError(f"not a media id: {media_id!r}")
        if origin == self.server_name:
            base = os.path.join(self.root, "local")
        else:
            # The origin is a remote's word: it names a folder only through its hash.
            base = os.path.join(
                self.root, "remote", hashlib.sha256(origin.encode("utf-8")).hexdigest()[:32]
            )
        # Two levels of shards from a hash of the id keep directories small and evenly filled,
        # whatever the ids look like (a remote's may be short, or all alike).
        shard = hashlib.sha256(media_id.encode("ascii")).hexdigest()
        return os.path.join(base, shard[:2], shard[2:4], media_id)

    def original_path(self, origin: str, media_id: str) -> str:
        return os.path.join(self._media_dir(origin, media_id), "original")

    def thumbnail_path(self, origin: str, media_id: str, key: ThumbnailKey) -> str:
        name = (
            f"{int(key.width)}x{int(key.height)}-{'crop' if key.method == 'crop' else 'scale'}"
            f"{'-animated' if key.animated else ''}.{THUMBNAIL_EXTENSIONS[key.content_type]}"
        )
        return os.path.join(self._media_dir(origin, media_id), "thumbnails", name)

    # --- writing -------------------------------------------------------------------------

    def store_file(
        self,
        path: str,
        chunks: Iterable[bytes],
        max_bytes: int,
        record: Callable[[StoredFile], object],
    ) -> StoredFile:
        """Stores `chunks` at `path` whole or not at all, then calls `record` (the caller's
        "insert the row if absent").

        The bytes go to a temp file, which is fsynced and then hard-linked to `path`. A file
        already at `path` is never displaced: a reader may have it open, and media at one
        path is immutable, so the new copy is dropped. Past `max_bytes`, or on any error,
        the temp file is removed and `FileTooLarge` (or the error) propagates.
        """
        fd, temp_path = tempfile.mkstemp(dir=self.temp_dir, prefix="upload-")
        try:
            digest = hashlib.sha256()
            length = 0
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    length += len(chunk)
                    if length > max_bytes:
                        raise FileTooLarge(f"over {max_bytes} bytes")
                    digest.update(chunk)
                    f.write(chunk)
                f.flush()
                _fsync_off_hub(f.fileno())
            stored = StoredFile(path, length, digest.hexdigest())
            self._link_into_place(temp_path, path)
            record(stored)
            return stored
        finally:
            _unlink_quietly(temp_path)

    def _link_into_place(self, temp_path: str, path: str) -> None:
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        try:
            os.link(temp_path, path)
        except FileExistsError:
            return  # an earlier copy stays
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            # A filesystem without hard links: rename, still never over an existing file.
            if os.path.exists(path):
                return
            os.rename(temp_path, path)
        # The new directory entry must be durable too, not just the file's bytes.
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            _fsync_off_hub(dir_fd)
        finally:
            os.close(dir_fd)

    def remove(self, path: str) -> None:
        _unlink_quietly(path)

    def _remove_stale_temp_files(self) -> None:
        cutoff = time.time() - STALE_TEMP_SECONDS
        for entry in os.scandir(self.temp_dir):
            try:
                if entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)
            except OSError:
                pass


def _fsync_off_hub(fd: int) -> None:
    """fsync can take tens of ms on a busy disk: run it on a native thread, not the hub.

    The thread syncs a duplicate that it closes itself: if the waiting greenlet is killed,
    the caller closes its own descriptor at once, and the number may be reused meanwhile."""
    gevent.get_hub().threadpool.apply(_fsync_and_close, (os.dup(fd),))


def _fsync_and_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
