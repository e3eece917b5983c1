"""The media repository: file store, thumbnails, response builders and the media service."""
