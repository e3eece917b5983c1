"""Media metadata: local uploads, the remote media cache, thumbnail sources and thumbnails.

Rows are keyed by the mxc:// URI's parts: `media_id` for local media, `(origin, media_id)`
for cached remote media and for what the thumbnailer keeps, so that thumbnails of local and
remote originals share those tables.
"""

from __future__ import annotations

from dataclasses import dataclass

from homeserver.storage.database import Database


@dataclass(frozen=True)
class LocalMedia:
    media_id: str
    user_id: str
    content_type: str | None
    upload_name: str | None
    media_length: int | None  # None: created with /create, content not uploaded yet
    sha256: str | None
    created_ts: int
    authenticated: bool

    @property
    def uploaded(self) -> bool:
        return self.media_length is not None


@dataclass(frozen=True)
class RemoteMedia:
    """A cached copy of another server's media."""

    origin: str
    media_id: str
    content_type: str
    upload_name: str | None
    media_length: int
    sha256: str
    fetched_ts: int
    authenticated: bool


@dataclass(frozen=True)
class ThumbnailSource:
    """What probing an original found: its oriented size, or why it cannot be thumbnailed."""

    width: int | None
    height: int | None
    animated: bool
    refusal: str | None  # None, "too_large" or "not_an_image"


@dataclass(frozen=True)
class StoredThumbnail:
    width: int
    height: int
    method: str
    content_type: str
    animated: bool
    length: int


_LOCAL_COLUMNS = (
    "media_id, user_id, content_type, upload_name, media_length, sha256, created_ts, authenticated"
)


def _local_media(row) -> LocalMedia:
    return LocalMedia(row[0], row[1], row[2], row[3], row[4], row[5], row[6], bool(row[7]))


_REMOTE_COLUMNS = (
    "origin, media_id, content_type, upload_name, media_length, sha256, fetched_ts, authenticated"
)


class MediaStore:
    def __init__(self, db: Database):
        self.db = db

    # --- local media ---------------------------------------------------------------------

    def is_quarantined(self, origin: str, media_id: str) -> bool:
        """An admin quarantined the file (0066_admin.sql, storage/admin.py)."""
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT 1 FROM quarantined_media WHERE origin = ? AND media_id = ?",
                (origin, media_id),
            )
        )
        return row is not None

    def get_local_media(self, media_id: str) -> LocalMedia | None:
        row = self.db.read(
            lambda tx: tx.fetchone(
                f"SELECT {_LOCAL_COLUMNS} FROM local_media WHERE media_id = ?", (media_id,)
            )
        )
        return _local_media(row) if row else None

    def insert_local_media(self, media: LocalMedia, now_ms: int) -> bool:
        """Records an upload; False if the id is taken."""

        def tx(tx):
            cur = tx.execute(
                f"INSERT INTO local_media ({_LOCAL_COLUMNS}, uploaded_ts)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (media_id) DO NOTHING",
                (
                    media.media_id,
                    media.user_id,
                    media.content_type,
                    media.upload_name,
                    media.media_length,
                    media.sha256,
                    media.created_ts,
                    int(media.authenticated),
                    now_ms,
                ),
            )
            return cur.rowcount == 1

        return self.db.write(tx)

    def create_pending(
        self,
        media_id: str,
        user_id: str,
        now_ms: int,
        live_since_ms: int,
        max_pending: int,
        authenticated: bool,
    ) -> int | None:
        """Creates an id awaiting content, unless the user already has `max_pending` ids
        created after `live_since_ms` and still without content. Returns None when created,
        otherwise the creation time of the user's oldest live pending id."""

        def tx(tx):
            if tx.dialect == "postgres":
                # Serialises one user's concurrent creates, so both cannot pass the count.
                tx.execute("SELECT pg_advisory_xact_lock(hashtext(?))", (user_id,))
            count, oldest = tx.fetchone(
                "SELECT COUNT(*), MIN(created_ts) FROM local_media"
                " WHERE user_id = ? AND media_length IS NULL AND created_ts > ?",
                (user_id, live_since_ms),
            )
            if count >= max_pending:
                return oldest
            tx.execute(
                "INSERT INTO local_media (media_id, user_id, created_ts, authenticated)"
                " VALUES (?, ?, ?, ?)",
                (media_id, user_id, now_ms, int(authenticated)),
            )
            return None

        return self.db.write(tx)

    def complete_pending(
        self,
        media_id: str,
        content_type: str,
        upload_name: str | None,
        media_length: int,
        sha256: str,
        now_ms: int,
    ) -> bool:
        """Fills in the content of a pending id; False if it already has content."""

        def tx(tx):
            cur = tx.execute(
                "UPDATE local_media SET content_type = ?, upload_name = ?, media_length = ?,"
                " sha256 = ?, uploaded_ts = ? WHERE media_id = ? AND media_length IS NULL",
                (content_type, upload_name, media_length, sha256, now_ms, media_id),
            )
            return cur.rowcount == 1

        return self.db.write(tx)

    # --- remote media cache --------------------------------------------------------------

    def get_remote_media(self, origin: str, media_id: str) -> RemoteMedia | None:
        row = self.db.read(
            lambda tx: tx.fetchone(
                f"SELECT {_REMOTE_COLUMNS} FROM remote_media_cache"
                " WHERE origin = ? AND media_id = ?",
                (origin, media_id),
            )
        )
        if row is None:
            return None
        return RemoteMedia(row[0], row[1], row[2], row[3], row[4], row[5], row[6], bool(row[7]))

    def insert_remote_media(self, media: RemoteMedia) -> bool:
        """Records a fetched copy if there is no row yet; False (and the earlier row stays)
        if there is one."""

        def tx(tx):
            cur = tx.execute(
                f"INSERT INTO remote_media_cache ({_REMOTE_COLUMNS})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (origin, media_id) DO NOTHING",
                (
                    media.origin,
                    media.media_id,
                    media.content_type,
                    media.upload_name,
                    media.media_length,
                    media.sha256,
                    media.fetched_ts,
                    int(media.authenticated),
                ),
            )
            return cur.rowcount == 1

        return self.db.write(tx)

    # --- thumbnails ----------------------------------------------------------------------

    def get_thumbnail_source(self, origin: str, media_id: str) -> ThumbnailSource | None:
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT width, height, animated, refusal FROM thumbnail_sources"
                " WHERE origin = ? AND media_id = ?",
                (origin, media_id),
            )
        )
        return ThumbnailSource(row[0], row[1], bool(row[2]), row[3]) if row else None

    def record_thumbnail_source(self, origin: str, media_id: str, source: ThumbnailSource) -> None:
        self.db.write(
            lambda tx: tx.execute(
                "INSERT INTO thumbnail_sources (origin, media_id, width, height, animated, refusal)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (origin, media_id) DO NOTHING",
                (
                    origin,
                    media_id,
                    source.width,
                    source.height,
                    int(source.animated),
                    source.refusal,
                ),
            )
        )

    def get_thumbnails(self, origin: str, media_id: str) -> list[StoredThumbnail]:
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT width, height, method, content_type, animated, length FROM thumbnails"
                " WHERE origin = ? AND media_id = ?",
                (origin, media_id),
            )
        )
        return [StoredThumbnail(r[0], r[1], r[2], r[3], bool(r[4]), r[5]) for r in rows]

    def add_thumbnail(
        self, origin: str, media_id: str, thumbnail: StoredThumbnail, now_ms: int
    ) -> None:
        """Records a stored thumbnail; a row already there (a concurrent twin) is kept."""
        self.db.write(
            lambda tx: tx.execute(
                "INSERT INTO thumbnails (origin, media_id, width, height, method, content_type,"
                " animated, length, created_ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (origin, media_id, width, height, method, content_type, animated)"
                " DO NOTHING",
                (
                    origin,
                    media_id,
                    thumbnail.width,
                    thumbnail.height,
                    thumbnail.method,
                    thumbnail.content_type,
                    int(thumbnail.animated),
                    thumbnail.length,
                    now_ms,
                ),
            )
        )
