"""The user directory (`user_directory`, 0060_user_directory.sql): a row per user a search
may find, written where what it shows changes, and its search.

Local users' rows follow their profile (storage/accounts.py, storage/profiles.py); other
servers' users' rows follow their latest join that became current state (storage/rooms.py,
storage/event_state.py, storage/redactions.py). A search matches words with LIKE on a
normalised column, the same SQL on both engines, and reads who may be seen from
current_state and room_stats, so a membership or join rule change needs no other write."""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass

from homeserver.core.events import Event
from homeserver.storage.database import Database

_WORD = re.compile(r"\w+")
# Longer names and avatar URLs in a remote join are not shown: the same caps as our own
# profiles (accounts/profile.py).
MAX_NAME_LENGTH = 256
MAX_AVATAR_URL_LENGTH = 1024
_PROFILE_FIELDS = ("displayname", "avatar_url")


def normalised_words(text: str) -> list[str]:
    """The words of `text` as the directory compares them: accents dropped, case folded."""
    decomposed = unicodedata.normalize("NFKD", text)
    bare = "".join(c for c in decomposed if not unicodedata.combining(c))
    return _WORD.findall(bare.casefold())


def search_text(user_id: str, display_name: str | None) -> str:
    """The display name's words, then the user ID's, each once, each after a space."""
    words = normalised_words(display_name or "") + normalised_words(user_id)
    return "".join(f" {w}" for w in dict.fromkeys(words))


def _name(value) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= MAX_NAME_LENGTH else None


def _avatar(value) -> str | None:
    ok = isinstance(value, str) and value.startswith("mxc://")
    return value if ok and len(value) <= MAX_AVATAR_URL_LENGTH else None


def _upsert(
    tx, user_id: str, name: str | None, avatar: str | None, local: bool, replace: bool = True
) -> None:
    """The user's row, written only if the user is (`local`) or is not one of ours, and
    over an existing one only if `replace`. SQLite needs the WHERE: without one,
    `ON CONFLICT` after a SELECT would not parse."""
    update = (
        "UPDATE SET display_name = excluded.display_name, avatar_url = excluded.avatar_url,"
        " search_text = excluded.search_text"
        if replace
        else "NOTHING"
    )
    tx.execute(
        "INSERT INTO user_directory (user_id, display_name, avatar_url, search_text)"
        f" SELECT ?, ?, ?, ? WHERE {'' if local else 'NOT '}EXISTS"
        f" (SELECT 1 FROM users WHERE user_id = ?) ON CONFLICT (user_id) DO {update}",
        (user_id, name, avatar, search_text(user_id, name), user_id),
    )


def index_local_user(tx, user_id: str) -> None:
    """The row of a local user, from their profile: at registration and each change of
    their displayname or avatar_url."""
    rows = tx.fetchall(
        "SELECT field, value FROM profile_fields WHERE user_id = ? AND field IN (?, ?)",
        (user_id, *_PROFILE_FIELDS),
    )
    profile = {field: json.loads(value) for field, value in rows}
    name, avatar = _name(profile.get("displayname")), _avatar(profile.get("avatar_url"))
    _upsert(tx, user_id, name, avatar, local=True)


def index_member(tx, event: Event) -> None:
    entry = member_entry(tx, event)
    if entry is not None:
        entry.write(tx)


@dataclass(frozen=True)
class MemberEntry:
    """What a remote join writes to its user's row."""

    user_id: str
    name: str | None
    avatar: str | None
    replace: bool

    def write(self, tx) -> None:
        _upsert(tx, self.user_id, self.name, self.avatar, local=False, replace=self.replace)


def member_entry(tx, event: Event) -> MemberEntry | None:
    """What a member event that became current state writes, read as the room's stats are
    now: another server's user's join in a public or world-readable room gives their row
    its display name and avatar. A join elsewhere may carry a name meant for that room only
    (Synapse takes none from there either): it makes a row without one, found by user ID,
    and changes no existing row. Local users keep their profile's, never a room's."""
    if event.type != "m.room.member" or event.membership != "join" or not event.state_key:
        return None
    row = tx.fetchone(
        "SELECT join_rule, history_visibility FROM room_stats WHERE room_id = ?",
        (event.room_id,),
    )
    if row is None or (row[0] != "public" and row[1] != "world_readable"):
        return MemberEntry(event.state_key, None, None, replace=False)
    content = event.content
    name, avatar = _name(content.get("displayname")), _avatar(content.get("avatar_url"))
    return MemberEntry(event.state_key, name, avatar, replace=True)


@dataclass(frozen=True)
class DirectoryUser:
    user_id: str
    display_name: str | None
    avatar_url: str | None


def _like(word: str) -> str:
    """A pattern for a word's start; `_` is a word character and LIKE's wildcard."""
    return word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


_JOINED = "{a}.type = 'm.room.member' AND {a}.membership = 'join'"
# Joined to a room whose join rule is public or whose history is world-readable, and that a
# user of ours is still in: without one, its state stopped following the room.
_IN_PUBLIC_ROOM = (
    "EXISTS (SELECT 1 FROM current_state m JOIN room_stats r ON r.room_id = m.room_id"
    f" WHERE m.state_key = d.user_id AND {_JOINED.format(a='m')}"
    " AND (r.join_rule = 'public' OR r.history_visibility = 'world_readable')"
    " AND r.local_joined_members > 0)"
)
# Joined to a room the searcher is joined to.
_SHARES_A_ROOM = (
    "EXISTS (SELECT 1 FROM current_state m JOIN current_state s ON s.room_id = m.room_id"
    f" AND s.state_key = ? AND {_JOINED.format(a='s')}"
    f" WHERE m.state_key = d.user_id AND {_JOINED.format(a='m')})"
)
_LOCAL = "u.user_id IS NOT NULL"


class UserDirectoryStore:
    def __init__(self, db: Database):
        self.db = db

    def search(
        self, searcher: str, words: list[str], limit: int, all_local: bool
    ) -> tuple[list[DirectoryUser], bool]:
        """Up to `limit` users whose words start with every one of `words`, that `searcher`
        may find (`all_local`: every local user too), deactivated users never; and whether
        more matched. First those whose first word matches the first word, then those with
        a display name, then with an avatar, then by name."""
        if not words:
            return [], False
        matches = " AND ".join("d.search_text LIKE ? ESCAPE '\\'" for _ in words)
        visible = " OR ".join([_IN_PUBLIC_ROOM, _SHARES_A_ROOM] + ([_LOCAL] if all_local else []))
        sql = (
            "SELECT d.user_id, d.display_name, d.avatar_url FROM user_directory d"
            " LEFT JOIN users u ON u.user_id = d.user_id"
            f" WHERE {matches} AND (u.deactivated IS NULL OR u.deactivated = 0) AND ({visible})"
            " ORDER BY CASE WHEN d.search_text LIKE ? ESCAPE '\\' THEN 0 ELSE 1 END,"
            " CASE WHEN d.display_name IS NULL THEN 1 ELSE 0 END,"
            " CASE WHEN d.avatar_url IS NULL THEN 1 ELSE 0 END, d.search_text, d.user_id"
            " LIMIT ?"
        )
        params: list = [f"% {_like(w)}" for w in words]
        params += [searcher, f" {_like(words[0])}", limit + 1]
        rows = self.db.read(lambda tx: tx.fetchall(sql, params))
        return [DirectoryUser(*row) for row in rows[:limit]], len(rows) > limit
