"""A real server shared by a test module (SQLite and PostgreSQL, from tests/rooms)."""

from tests.rooms.conftest import server, user  # noqa: F401 - fixtures shared with rooms
