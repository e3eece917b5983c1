"""The log's lines: the access log's line, written without a LogRecord, is the line a record
would give in both formats; buffered lines keep their order and reach the stream within one
turn of the hub; while another handler listens, the access line is a record."""

from __future__ import annotations

import io
import json
import logging
import time
from types import SimpleNamespace

import gevent
import pytest

from homeserver import logs
from homeserver.logs import ACCESS_LOG, MAX_PENDING_LINES, configure_logging, escape_controls

# A path a client chose: a newline and an escape that would forge a line, quotes, non-ASCII,
# a line separator, and a % that is not a format.
HOSTILE = 'GET /a\nINFO forged "q" é\u2028\x1b[31m 100% 200 0.1ms 127.0.0.1'


@pytest.fixture
def stream():
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logs._handler)
    # No request of an earlier test is current here: lines carry no request id.
    outside_requests = logs.current_request_id.set(None)
    out = io.StringIO()
    yield out
    logs.current_request_id.reset(outside_requests)
    root.handlers[:], level, logs._handler = saved
    root.setLevel(level)


def _configure(out: io.StringIO, fmt: str, process: str = "") -> logs.LineHandler:
    configure_logging(SimpleNamespace(level="INFO", format=fmt), process)
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logs.LineHandler)
    handler.setStream(out)
    return handler


def _record(created: float, message: str, request_id: str | None) -> logging.LogRecord:
    record = logging.LogRecord("weir.access", logging.INFO, __file__, 1, "%s", (message,), None)
    record.created = created
    record.msecs = int((created - int(created)) * 1000) + 0.0
    record.request_id = request_id
    return record


# Three seconds apart and back, so a cached second is never reused for the wrong one; a
# time whose milliseconds would round up to 1000.
TIMES = [1_700_000_000.9996, 1_700_000_003.25, 1_700_000_000.001]


@pytest.mark.parametrize("process", ["", "shard 1"])
def test_text_line_is_the_line_logging_formats(stream, process):
    formatter = _configure(stream, "text", process).formatter
    label = f"[{process}] " if process else ""
    for created in TIMES:
        record = _record(created, HOSTILE, "abc123")
        asctime = logging.Formatter().formatTime(record)
        expected = f"{asctime} INFO {label}weir.access [abc123]: {escape_controls(HOSTILE)}"
        assert formatter.line(created, "INFO", "weir.access", "abc123", HOSTILE) == expected
        assert formatter.format(record) == expected
    assert "\n" not in expected and "\\n" in expected and "\\x1b[31m" in expected
    without_id = formatter.line(TIMES[0], "INFO", "weir.access", None, "m")
    assert without_id.endswith(f" INFO {label}weir.access: m")


@pytest.mark.parametrize("process", ["", "shard 1"])
def test_json_line_is_json_dumps_of_the_fields(stream, process):
    formatter = _configure(stream, "json", process).formatter
    for created in TIMES:
        record = _record(created, HOSTILE, "abc123")
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
            + f".{int(record.msecs):03d}Z",
            "level": "INFO",
            "logger": "weir.access",
            "message": HOSTILE,
        }
        if process:
            entry["process"] = process
        entry["request_id"] = "abc123"
        expected = json.dumps(entry, ensure_ascii=False)
        assert formatter.line(created, "INFO", "weir.access", "abc123", HOSTILE) == expected
        assert formatter.format(record) == expected
        assert json.loads(expected) == entry


def test_a_traceback_follows_its_line_in_both_formats(stream):
    for fmt in ("text", "json"):
        stream.seek(0)
        stream.truncate()
        _configure(stream, fmt)
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("weir.test").exception("failed")
        written = stream.getvalue()
        if fmt == "text":
            first, rest = written.split("\n", 1)
            assert first.endswith("ERROR weir.test: failed")
            assert rest.startswith("Traceback") and "ValueError: boom" in rest
        else:
            entry = json.loads(written)
            assert entry["message"] == "failed" and "ValueError: boom" in entry["exc"]
            assert list(entry) == ["ts", "level", "logger", "message", "exc"]


def test_access_lines_wait_for_the_hub_and_keep_their_order(stream):
    _configure(stream, "text")
    ACCESS_LOG.write("GET /first 200 0.1ms 127.0.0.1", "id1")
    assert stream.getvalue() == ""  # buffered until the hub's next turn
    logging.getLogger("weir.test").warning("between")  # written at once, after the first
    ACCESS_LOG.write("GET /last 200 0.1ms 127.0.0.1", "id2")
    lines = stream.getvalue().splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == [
        "GET /first 200 0.1ms 127.0.0.1",
        "between",
    ]
    assert "weir.access [id1]:" in lines[0]
    gevent.sleep(0)  # one turn of the hub
    assert (
        stream.getvalue()
        .splitlines()[2]
        .endswith("weir.access [id2]: GET /last 200 0.1ms 127.0.0.1")
    )


def test_a_full_buffer_is_written_without_waiting(stream):
    _configure(stream, "json")
    for n in range(MAX_PENDING_LINES):
        ACCESS_LOG.write(f"GET /{n} 200 0.1ms 127.0.0.1", f"id{n}")
    entries = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [e["message"].split()[1] for e in entries] == [f"/{n}" for n in range(MAX_PENDING_LINES)]
    assert entries[-1]["request_id"] == f"id{MAX_PENDING_LINES - 1}"


def test_with_another_handler_the_access_line_is_a_record(stream):
    _configure(stream, "text")
    records: list[logging.LogRecord] = []

    class Listener(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logging.getLogger().addHandler(Listener())
    ACCESS_LOG.write(HOSTILE, "abc123")
    assert [(r.name, r.getMessage(), r.request_id) for r in records] == [  # type: ignore[attr-defined]
        ("weir.access", HOSTILE, "abc123")
    ]
    # The configured handler still writes it, at once, as any record.
    assert stream.getvalue().rstrip("\n").endswith(f"[abc123]: {escape_controls(HOSTILE)}")


def test_the_hub_never_waits_for_the_handlers_lock(stream):
    handler = _configure(stream, "text")
    handler.acquire()  # as a thread writing a record would hold it
    try:
        ACCESS_LOG.write("GET /held 200 0.1ms 127.0.0.1", "id1")
        gevent.sleep(0)  # the hub's turn: it cannot take the lock, and does not wait for it
        gevent.sleep(0)
        assert stream.getvalue() == ""
    finally:
        handler.release()
    with gevent.Timeout(5):
        while not stream.getvalue():
            gevent.sleep(0)  # the greenlet that waited for the lock writes the line
    assert stream.getvalue().endswith("weir.access [id1]: GET /held 200 0.1ms 127.0.0.1\n")


def test_a_failed_write_never_fails_the_request(stream):
    handler = _configure(stream, "text")
    handler.setStream(closed := io.StringIO())
    closed.close()
    for n in range(MAX_PENDING_LINES + 1):  # one write at once, then one on the hub's turn
        ACCESS_LOG.write(f"GET /{n} 200 0.1ms 127.0.0.1", "id")
    gevent.sleep(0)
    handler.setStream(stream)
    ACCESS_LOG.write("GET /after 200 0.1ms 127.0.0.1", "id")
    gevent.sleep(0)
    assert stream.getvalue().endswith("GET /after 200 0.1ms 127.0.0.1\n")
    assert stream.getvalue().count("\n") == 1  # what could not be written is dropped
