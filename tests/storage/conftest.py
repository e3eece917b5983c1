"""The storage tests' database: `database_url` (tests/conftest.py), on each engine in turn,
opened and migrated, and closed after the test."""

import pytest

from homeserver.storage.database import open_database
from homeserver.storage.migrations import migrate


@pytest.fixture
def db(database_url):
    database = open_database(database_url)
    migrate(database)
    yield database
    database.close()
