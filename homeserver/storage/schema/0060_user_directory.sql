-- The user directory (POST /user_directory/search): one row per user a search may find,
-- local users from their profile, other servers' users from their latest join event.
-- Written with the profile change or the membership that changes it
-- (storage/user_directory.py); who may see whom is read from current_state at search time.
CREATE TABLE user_directory (
    user_id TEXT PRIMARY KEY,
    display_name TEXT,
    avatar_url TEXT,
    -- The lower-cased words of the display name, then of the user ID, each after a space:
    -- ' alice smith alice example org', so `LIKE '% ali%'` matches a word's start.
    search_text TEXT NOT NULL
);

-- Joined members of ours (rows of `users`), kept with joined_members (storage/room_stats.py):
-- a room none of ours is in any more has a current state frozen when the last one left, so
-- its members are not found through it.
ALTER TABLE room_stats ADD COLUMN local_joined_members INTEGER NOT NULL DEFAULT 0;
UPDATE room_stats SET local_joined_members = (
    SELECT COUNT(*) FROM current_state c JOIN users u ON u.user_id = c.state_key
    WHERE c.room_id = room_stats.room_id AND c.type = 'm.room.member' AND c.membership = 'join'
);
