"""The user directory (client-server spec, "User directory"): the users a searcher may find
whose display name or user ID has words starting with each word of the term, case and
accents aside. A searcher finds the users they share a room with and the users joined to
public or world-readable rooms, and with `user_directory.search_all_users` every local
user too, as Synapse's setting of that name does. The index is storage/user_directory.py."""

from __future__ import annotations

from homeserver.core.requester import Requester
from homeserver.storage.user_directory import UserDirectoryStore, normalised_words

DEFAULT_LIMIT = 10
# Synapse's bounds too (0 to 50): a client asking for more is told `limited`.
MAX_LIMIT = 50
# The most words of a term used: each is one LIKE over the table.
MAX_WORDS = 10


class UserDirectory:
    def __init__(self, store: UserDirectoryStore, search_all_users: bool):
        self.store = store
        self.search_all_users = search_all_users

    def search(self, requester: Requester, term: str, limit: int) -> dict:
        words = normalised_words(term)[:MAX_WORDS]
        found, limited = self.store.search(
            requester.user_id, words, max(0, min(limit, MAX_LIMIT)), self.search_all_users
        )
        results = []
        for user in found:
            result = {"user_id": user.user_id}
            if user.display_name is not None:
                result["display_name"] = user.display_name
            if user.avatar_url is not None:
                result["avatar_url"] = user.avatar_url
            results.append(result)
        return {"results": results, "limited": limited}
