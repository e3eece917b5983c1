"""Link previews as fetched (0062), on SQLite and on a real PostgreSQL cluster: the one
answered for a time is the newest fetched at or before it and still fresh then."""

import pytest

from homeserver.storage.database import open_database
from homeserver.storage.migrations import migrate
from homeserver.storage.url_previews import StoredPreview, UrlPreviewStore

URL = "https://example.org/news"


@pytest.fixture
def database(database_url):
    database = open_database(database_url)
    migrate(database)
    yield database
    database.close()


def test_the_preview_of_a_time_is_the_newest_fresh_one_fetched_by_then(database):
    store = UrlPreviewStore(database)
    store.add(URL, 1_000, 2_000, {"og:title": "morning"})
    store.add(URL, 5_000, 6_000, {"og:title": "evening"})
    store.add("https://example.org/other", 5_500, 9_000, {"og:title": "other"})
    assert store.valid_at(URL, 999) is None  # nothing fetched yet then
    assert store.valid_at(URL, 1_000) == StoredPreview(1_000, 2_000, {"og:title": "morning"})
    assert store.valid_at(URL, 1_999).og == {"og:title": "morning"}
    assert store.valid_at(URL, 3_000) is None  # the morning's had expired, none newer yet
    assert store.valid_at(URL, 5_999).og == {"og:title": "evening"}
    assert store.valid_at(URL, 6_000) is None
