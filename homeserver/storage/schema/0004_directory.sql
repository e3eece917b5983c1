-- Room aliases and the published room directory.

CREATE TABLE room_aliases (
    room_alias TEXT PRIMARY KEY,
    room_id TEXT NOT NULL REFERENCES rooms(room_id),
    creator TEXT NOT NULL,
    created_ts BIGINT NOT NULL
);
CREATE INDEX room_aliases_by_room ON room_aliases (room_id);

-- Positions in the 'directory' stream order publications, so a public room list paging
-- session can leave out rooms published after its first page (see storage/directory.py).
INSERT INTO stream_positions (stream_name, position) VALUES ('directory', 0);

CREATE TABLE published_rooms (
    room_id TEXT PRIMARY KEY REFERENCES rooms(room_id),
    published_at BIGINT NOT NULL,
    published_ts BIGINT NOT NULL
);
