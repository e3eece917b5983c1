-- Rooms a user has forgotten (POST /rooms/:room_id/forget): left or banned, and hidden from
-- their /sync from then on. The row names the member event that was the user's latest when
-- they forgot the room, so any later member event of theirs (a join, a new invite, even an
-- unban) is not forgotten: the flag is cleared by the next membership, with no write.
CREATE TABLE forgotten_rooms (
    user_id TEXT NOT NULL,
    room_id TEXT NOT NULL,
    event_id TEXT NOT NULL,         -- the member event (or remote invite's end) forgotten
    forgotten_ts BIGINT NOT NULL,
    PRIMARY KEY (user_id, room_id)
);
