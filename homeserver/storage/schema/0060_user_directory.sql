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
