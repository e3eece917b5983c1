"""The two database engines behind one small interface.

Stores write plain functions `fn(tx, *args)` and run them with `db.write(fn, ...)` (one
transaction, committed on return, rolled back on an exception) or `db.read(fn, ...)`.
`tx.execute(sql, params)` takes SQL with `?` placeholders on both engines.

SQLite blocks the thread that runs it, so every SQLite call runs on a native threadpool:
one writer connection (SQLite has one writer anyway) plus read-only readers, in WAL mode,
so no query ever blocks the gevent hub. While every reader is busy, reads queue, and a
freed reader takes up to READ_BATCH of them in one transaction: a trip through the
threadpool costs far more than a short SELECT, and a wake of a thousand syncs is a burst
of short reads. PostgreSQL goes through psycopg 3, which waits on its socket
cooperatively once gevent has patched the standard library.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
from collections import deque
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from typing import Any, Callable, Iterator

import gevent
from gevent import monkey
from gevent.event import AsyncResult
from gevent.lock import BoundedSemaphore
from gevent.threadpool import ThreadPool

log = logging.getLogger(__name__)

# Values per `IN (...)` list: well under SQLite's limit on bound parameters.
IN_LIST_CHUNK = 500
# Queued reads a freed SQLite reader runs in one transaction.
READ_BATCH = 32


def in_lists(values: list) -> Iterator[tuple[list, str]]:
    """`values` in chunks for `IN (...)` lists, each with its `?, ?, ...` placeholders."""
    for start in range(0, len(values), IN_LIST_CHUNK):
        chunk = values[start : start + IN_LIST_CHUNK]
        yield chunk, ", ".join("?" for _ in chunk)


class Tx:
    """One transaction on one connection; `?` placeholders on both engines."""

    def __init__(self, conn, dialect: str, announce_as: str | None = None):
        self.conn = conn
        self.dialect = dialect
        # The instance that announces this transaction's stream positions to the others
        # at its commit (storage/streams.py); None with one instance.
        self.announce_as = announce_as

    def execute(self, sql: str, params: tuple | list = ()):
        if self.dialect == "postgres":
            sql = sql.replace("?", "%s")
        cur = self.conn.cursor()
        cur.execute(sql, tuple(params))
        return cur

    def fetchone(self, sql: str, params: tuple | list = ()) -> tuple | None:
        return self.execute(sql, params).fetchone()

    def fetchall(self, sql: str, params: tuple | list = ()) -> list[tuple]:
        return self.execute(sql, params).fetchall()

    def executemany(self, sql: str, rows: list) -> None:
        if self.dialect == "postgres":
            sql = sql.replace("?", "%s")
        self.conn.cursor().executemany(sql, [tuple(r) for r in rows])


class Database:
    dialect = ""

    # Other instances write to this database too (PostgreSQL, cluster.instances > 1).
    shared = False

    # Greenlets waiting for a connection to read or write on: the queues /metrics shows.
    waiting_reads = 0
    waiting_writes = 0
    readers = 0

    def write(self, fn: Callable[..., Any], *args) -> Any:
        raise NotImplementedError

    def write_pipelined(self, fn: Callable[..., Callable[[], Any]], *args) -> Any:
        """`write`, with the whole transaction in PostgreSQL's pipeline mode: a statement
        waits for nothing unless its result is fetched, and the COMMIT goes out with the
        statements after the last fetch. So a lock taken after the last fetch is held for
        the server's work alone, never for turns of our hub (storage/streams.py). `fn`
        returns a function, called once the transaction has committed, whose result is
        this call's: it reads what `fn` did not wait for. `fn` must not read `rowcount`; an
        error in a statement is raised at the next fetch or at the end, and rolls the whole
        transaction back. SQLite: `write`, with the function called before the commit."""
        return self.write(lambda tx, *a: fn(tx, *a)(), *args)

    def read(self, fn: Callable[..., Any], *args) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def is_unique_violation(self, exc: BaseException) -> bool:
        raise NotImplementedError


class _QueuedRead:
    __slots__ = ("fn", "args", "result", "waiting")

    def __init__(self, fn: Callable[..., Any], args: tuple):
        self.fn = fn
        self.args = args
        self.result = AsyncResult()
        self.waiting = True  # until a reader takes it


class SqliteDatabase(Database):
    dialect = "sqlite"

    # Six readers: a burst of cache lookups (each remote media request reads the cache
    # before it may be refused) queued behind three and made 429s slow under load.
    def __init__(self, path: str, readers: int = 6):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self.readers = readers
        # A thread per connection: a query waits for a connection, never for a thread, and
        # no other kind of work (password hashing has its own pool) runs here.
        self._pool = ThreadPool(readers + 1)
        self._writer = self._connect(readonly=False)
        self._writer_lock = BoundedSemaphore(1)
        self._idle_readers = [self._connect(readonly=True) for _ in range(readers)]
        # Reads waiting for a reader, oldest first; only while no reader is idle.
        self._queued: deque[_QueuedRead] = deque()

    def _connect(self, readonly: bool) -> sqlite3.Connection:
        if readonly:
            conn = sqlite3.connect(
                f"file:{self.path}?mode=ro",
                uri=True,
                check_same_thread=False,
                isolation_level=None,
                timeout=30,
            )
        else:
            conn = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None, timeout=30
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    @staticmethod
    def _transaction(conn: sqlite3.Connection, begin: str, fn, args):
        conn.execute(begin)
        try:
            result = fn(Tx(conn, "sqlite"), *args)
        except BaseException:
            if conn.in_transaction:  # some errors (a trigger's RAISE(ROLLBACK)) end it themselves
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    def _run(self, conn, begin: str, fn, args, give_back: Callable[[], None]):
        return self._in_thread(give_back, self._transaction, conn, begin, fn, args)

    def _in_thread(self, give_back: Callable[[], None], job_fn, *args):
        """`job_fn(*args)` on the threadpool; `give_back` returns its connection once the
        thread is done with it, even if the waiting greenlet was killed (a Timeout) in the
        meantime, or the job could not be started."""
        try:
            job = self._pool.spawn(job_fn, *args)
        except BaseException:
            give_back()
            raise
        try:
            return job.get()
        finally:
            if job.ready():
                give_back()
            else:
                job.rawlink(lambda _job: give_back())

    def write(self, fn, *args):
        self.waiting_writes += 1
        try:
            self._writer_lock.acquire()
        finally:
            self.waiting_writes -= 1
        return self._run(self._writer, "BEGIN IMMEDIATE", fn, args, self._writer_lock.release)

    def read(self, fn, *args):
        if self._idle_readers and not self._queued:
            conn = self._idle_readers.pop()
            return self._run(conn, "BEGIN", fn, args, lambda: self._reader_freed(conn))
        queued = _QueuedRead(fn, args)
        self._queued.append(queued)
        self.waiting_reads += 1
        try:
            return queued.result.get()
        finally:
            if queued.waiting:  # gave up (a Timeout, a hang-up) before a reader took it
                self._queued.remove(queued)
                self.waiting_reads -= 1

    def _reader_freed(self, conn: sqlite3.Connection) -> None:
        """May run in the hub (a rawlink), which must not wait: a batch gets a greenlet."""
        if self._queued:
            gevent.spawn(self._run_batch, conn)
        else:
            self._idle_readers.append(conn)

    def _run_batch(self, conn: sqlite3.Connection) -> None:
        batch: list[_QueuedRead] = []
        while self._queued and len(batch) < READ_BATCH:
            queued = self._queued.popleft()
            queued.waiting = False
            batch.append(queued)
        self.waiting_reads -= len(batch)
        if not batch:  # every one gave up meanwhile
            self._reader_freed(conn)
            return
        calls = [(q.fn, q.args) for q in batch]
        try:
            outcomes = self._in_thread(
                lambda: self._reader_freed(conn), self._read_batch, conn, calls
            )
        except BaseException as e:  # every read of the batch is told, so none waits forever
            outcomes = [(False, e)] * len(batch)
        for queued, (ok, value) in zip(batch, outcomes):
            if ok:
                queued.result.set(value)
            else:
                queued.result.set_exception(value)

    @staticmethod
    def _read_batch(conn: sqlite3.Connection, calls: list) -> list[tuple[bool, Any]]:
        """On the threadpool: every call in one read transaction, each with its own outcome."""
        outcomes: list[tuple[bool, Any]] = []
        conn.execute("BEGIN")
        try:
            for fn, args in calls:
                try:
                    outcomes.append((True, fn(Tx(conn, "sqlite"), *args)))
                except Exception as e:
                    outcomes.append((False, e))
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")  # a read: nothing to keep
        return outcomes

    def close(self) -> None:
        self._pool.kill()
        while self._idle_readers:
            self._idle_readers.pop().close()
        self._writer.close()

    def is_unique_violation(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.IntegrityError)


def _prompt_connection(psycopg) -> type:
    """psycopg's Connection, except that a wait for its socket asks the kernel first, without
    blocking (the unpatched `poll`, 0 ms), and goes through gevent's hub only if the socket
    is not ready. A send that fits, and an answer already in, then go on at once instead of
    after every other ready greenlet has run: in a pipelined write, statements sent after
    the events stream's row was taken no longer hold it for turns of the hub."""
    poll, pollin, pollout = monkey.get_original("select", ["poll", "POLLIN", "POLLOUT"])
    masks = {1: pollin, 2: pollout, 3: pollin | pollout}  # psycopg's Wait: R, W, RW

    def ready_first(gen, fileno):
        try:
            wait = next(gen)
        except StopIteration as done:
            return done.value
        poller = poll()
        poller.register(fileno, masks[wait])
        while True:
            events = poller.poll(0)
            flags = events[0][1] if events else 0
            ready = (1 if flags & pollin else 0) | (2 if flags & pollout else 0)
            if not ready:  # not yet, or an error psycopg's own wait reports
                ready = yield wait
            try:
                wait = gen.send(ready)
            except StopIteration as done:
                return done.value
            poller.modify(fileno, masks[wait])

    class PromptConnection(psycopg.Connection):
        def wait(self, gen, *args, **kwargs):
            return super().wait(ready_first(gen, self.pgconn.socket), *args, **kwargs)

    return PromptConnection


@contextmanager
def _pipelined_transaction(conn) -> Iterator[None]:
    """A transaction whose COMMIT goes out with its last statements (`write_pipelined`).
    Not psycopg's `transaction()`: inside a pipeline it opens a nested one, whose end
    waits for every answer before the COMMIT is even queued, so the row `streams.take`
    locked stayed held for that round trip and a turn of our hub (5-15 ms under load)."""
    try:
        with conn.pipeline():
            conn.execute("BEGIN")
            yield
            conn.execute("COMMIT")
    except Exception:
        # A statement's error skips the rest, the COMMIT too, and leaves the block failed.
        # (A Timeout or GreenletExit: `_run` cancels and closes the connection instead.)
        with suppress(Exception):  # a broken connection: the pool discards it
            conn.rollback()
        raise


class PostgresDatabase(Database):
    dialect = "postgres"

    def __init__(
        self,
        url: str,
        min_size: int = 1,
        max_size: int = 10,
        statement_timeout_ms: int = 30000,
        announce_as: str | None = None,
    ):
        # Imported here, never at module level: psycopg must see the patched socket module.
        import psycopg
        from psycopg_pool import ConnectionPool

        self._psycopg = psycopg
        self._announce_as = announce_as
        self.shared = announce_as is not None
        conninfo = re.sub(r"^postgres(ql)?://", "postgresql://", url)
        # A server-side statement timeout bounds every query even if the caller is killed
        # mid-wait; a gevent.Timeout alone would leave the query running on the server.
        self._pool = ConnectionPool(
            conninfo,
            min_size=min_size,
            max_size=max_size,
            open=True,
            timeout=30,
            connection_class=_prompt_connection(psycopg),
            kwargs={"options": f"-c statement_timeout={statement_timeout_ms}", "autocommit": True},
        )

    def _run(self, fn, args, scope: Callable[[Any], AbstractContextManager], then=False):
        """`fn` in `scope`; `then`: `fn` returned a function to call once out of it."""
        with self._pool.connection() as conn:
            try:
                with scope(conn):
                    result = fn(Tx(conn, "postgres", self._announce_as), *args)
                return result() if then else result
            except (gevent.Timeout, gevent.GreenletExit):
                # The query may still be running: cancel it and do not reuse the connection.
                try:
                    conn.cancel_safe()
                finally:
                    conn.close()
                raise

    def write(self, fn, *args):
        return self._run(fn, args, lambda conn: conn.transaction())

    def write_pipelined(self, fn, *args):
        return self._run(fn, args, _pipelined_transaction, then=True)

    def read(self, fn, *args):
        # No transaction block: at READ COMMITTED every statement reads a snapshot of its
        # own inside one too, and its BEGIN and COMMIT would be two more round trips.
        return self._run(fn, args, lambda conn: nullcontext())

    def close(self) -> None:
        self._pool.close()

    def is_unique_violation(self, exc: BaseException) -> bool:
        return isinstance(exc, self._psycopg.errors.UniqueViolation)


def open_database(url: str, announce_as: str | None = None) -> Database:
    """`announce_as`: this instance's name, when other instances share the (PostgreSQL)
    database and must hear of its writes."""
    if url.startswith("sqlite:///"):
        return SqliteDatabase(url[len("sqlite:///") :])
    return PostgresDatabase(url, announce_as=announce_as)
