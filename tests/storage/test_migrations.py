"""Instances that start together on one empty PostgreSQL database migrate it once: each
migration is applied by one of them, and both start."""

import gevent

from homeserver.storage.database import PostgresDatabase
from homeserver.storage.migrations import available_migrations, migrate


def test_two_instances_migrating_one_database_at_once_both_succeed(pg_cluster):
    url = pg_cluster.new_database(empty=True)
    first, second = PostgresDatabase(url), PostgresDatabase(url)
    try:
        both = [gevent.spawn(migrate, db) for db in (first, second)]
        gevent.joinall(both, raise_error=True)
        newest = available_migrations()[-1][0]
        assert [g.value for g in both] == [newest, newest]
        applied = first.read(lambda tx: tx.fetchall("SELECT version FROM schema_version"))
        assert sorted(v for (v,) in applied) == [v for v, _, _ in available_migrations()]
    finally:
        first.close()
        second.close()
