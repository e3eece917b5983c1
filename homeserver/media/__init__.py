"""The media repository: files on disk, thumbnails, uploads and downloads, and other
servers' media fetched once under ADR-0121's budget."""
