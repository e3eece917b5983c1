"""Logging setup: human-readable text, or one JSON object per line for log shippers.

Every record logged while a request is served carries that request's id (`request_id`):
the access log line and every line its work writes, outbound federation calls included, so
one grep finds them all. The id lives in a context variable that the request middleware
sets; each greenlet has its own context, so concurrent requests never see each other's.
Work that leaves the request's greenlet keeps the id only if it is spawned through
`with_request_context` (which runs it in a copy of the request's context).

The access log (`ACCESS_LOG`) writes a line per request, so it skips what a record costs
(a LogRecord, the logger and handler chain, a write and a flush per line: about 15 µs,
loadtests/request_path_bench.py). The handler buffers its entries and writes them once per
turn of the hub; only then is each one formatted, by the same formatter, from the same
fields, so that the request itself pays for an append. Every other record is written at
once, after any buffered lines, so the order is kept.
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import re
import sys
import time

import gevent

# The id of the request the current greenlet is serving (None outside a request).
current_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "weir_request_id", default=None
)

# Buffered access lines past this many are written at once, without waiting for the hub.
MAX_PENDING_LINES = 512


def with_request_context(fn):
    """`fn`, to run in a copy of the current context: a greenlet spawned with it logs under
    the id of the request that spawned it."""
    return functools.partial(contextvars.copy_context().run, fn)


class RequestIdFilter(logging.Filter):
    """Stamps each record with the id of the request being served, if any."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = current_request_id.get()
        return True


# C0 and C1 controls, DEL, and the Unicode line and paragraph separators: any of them in a
# logged path or value could end a line, and forge the next one.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escape_controls(text: str) -> str:
    """`text` with every control character as a visible escape (`\\n`, `\\x1b`)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


class _SecondStamp:
    """A time as `strftime` writes it, then milliseconds: the strftime is done once per
    second, not once per line."""

    def __init__(self, converter, fmt: str, msec_format: str):
        self._converter = converter
        self._format = fmt
        self._msec_format = msec_format
        self._second = -1
        self._text = ""

    def __call__(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._text = time.strftime(self._format, self._converter(created))
            self._second = second
        # As LogRecord.msecs: truncated, never rounded up to 1000.
        return self._msec_format % (self._text, int((created - second) * 1000))


class _LineFormatter(logging.Formatter):
    """A formatter whose line is built from plain fields (`line`), so that the access log
    and a LogRecord give the same line; a traceback follows the line, as logging adds it."""

    def line(
        self, created: float, level: str, name: str, request_id: str | None, message: str
    ) -> str:
        raise NotImplementedError

    def format(self, record: logging.LogRecord) -> str:
        text = self.line(
            record.created,
            record.levelname,
            record.name,
            getattr(record, "request_id", None),
            record.getMessage(),
        )
        return self._with_traceback(text, record)

    def _with_traceback(self, text: str, record: logging.LogRecord) -> str:
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            text += "\n" + record.exc_text
        if record.stack_info:
            text += "\n" + self.formatStack(record.stack_info)
        return text


class TextFormatter(_LineFormatter):
    """One line per record: the message has its control characters escaped, so only a
    traceback (which the code adds, never a client) spans lines."""

    def __init__(self, process: str = ""):
        super().__init__()
        self._label = f"[{process}] " if process else ""
        # logging's default asctime: local time, "2024-05-01 12:00:00,123".
        self._stamp = _SecondStamp(time.localtime, "%Y-%m-%d %H:%M:%S", "%s,%03d")

    def line(
        self, created: float, level: str, name: str, request_id: str | None, message: str
    ) -> str:
        tag = f" [{request_id}]" if request_id else ""
        return (
            f"{self._stamp(created)} {level} {self._label}{name}{tag}: {escape_controls(message)}"
        )


# A JSON string as json.dumps(..., ensure_ascii=False) writes it.
_json_string = json.encoder.encode_basestring


class JsonFormatter(_LineFormatter):
    """One JSON object per line: ts, level, logger, message, then process, request_id and
    exc when there are any (the same text as json.dumps of that dict)."""

    def __init__(self, process: str = ""):
        super().__init__()
        self.process = process
        self._process_field = f', "process": {_json_string(process)}' if process else ""
        self._stamp = _SecondStamp(time.gmtime, "%Y-%m-%dT%H:%M:%S", "%s.%03dZ")

    def line(
        self, created: float, level: str, name: str, request_id: str | None, message: str
    ) -> str:
        request_field = f', "request_id": {_json_string(request_id)}' if request_id else ""
        return (
            f'{{"ts": "{self._stamp(created)}", "level": {_json_string(level)}, '
            f'"logger": {_json_string(name)}, "message": {_json_string(message)}'
            f"{self._process_field}{request_field}}}"
        )

    def _with_traceback(self, text: str, record: logging.LogRecord) -> str:
        if not record.exc_info:
            return text
        return f'{text[:-1]}, "exc": {_json_string(self.formatException(record.exc_info))}}}'


class LineHandler(logging.StreamHandler):
    """The one handler: writes each record's line at once, and buffers the access log's
    entries (`write_entry`) until the hub's next turn, so that the lines of the requests
    served in one turn cost one write between them."""

    formatter: _LineFormatter

    def __init__(self, stream, formatter: _LineFormatter):
        super().__init__(stream)
        self.setFormatter(formatter)
        # Formatted lines, and access log entries to format: (created, logger, request id,
        # message).
        self._pending: list[str | tuple[float, str, str | None, object]] = []
        self._scheduled = False

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._pending.append(self.format(record))
            self.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def write_entry(self, created: float, name: str, request_id: str | None, message) -> None:
        """An INFO line, formatted and written on the hub's next turn; `message` is whatever
        str() makes the message of."""
        self._pending.append((created, name, request_id, message))
        if len(self._pending) >= MAX_PENDING_LINES:
            try:
                self.flush()
            except Exception:  # as logging does: a failed write never fails the request
                self._pending.clear()
        elif not self._scheduled:
            self._scheduled = True
            gevent.get_hub().loop.run_callback(self._flush_turn)

    def _flush_turn(self) -> None:
        # This runs in the hub, which must never wait: if the lock is held (a thread writing
        # a record), a greenlet waits for it instead.
        self._scheduled = False
        if not self.lock or not self.lock.acquire(blocking=False):
            gevent.spawn(self.flush)
            return
        try:
            self._write_pending()
        except Exception:  # stderr is gone: there is nowhere left to say so
            self._pending.clear()
        finally:
            self.lock.release()

    def flush(self) -> None:
        # Under the handler's lock, as logging writes: a native thread may log too.
        self.acquire()
        try:
            self._write_pending()
        finally:
            self.release()

    def _write_pending(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            line = self.formatter.line
            lines = [
                item
                if isinstance(item, str)
                else line(item[0], "INFO", item[1], item[2], str(item[3]))
                for item in pending
            ]
            lines.append("")
            self.stream.write(self.terminator.join(lines))
        if hasattr(self.stream, "flush"):
            self.stream.flush()


class AccessLog:
    """The `weir.access` logger's line per request. While `configure_logging`'s handler is
    the only one, the line goes to it without a LogRecord; otherwise (a test capturing
    records) it is logged as a record, with the same message and request id."""

    def __init__(self, name: str = "weir.access"):
        self.logger = logging.getLogger(name)

    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)

    def write(self, message: object, request_id: str | None) -> None:
        """`message` is a string, or an object whose str() is one: it is made only when the
        line is written."""
        handler = _handler
        if handler is not None and logging.root.handlers == [handler]:
            handler.write_entry(time.time(), self.logger.name, request_id, message)
        else:
            self.logger.info("%s", message, extra={"request_id": request_id})


ACCESS_LOG = AccessLog()

# configure_logging's handler, while it is installed.
_handler: LineHandler | None = None


def configure_logging(config, process: str = "", stream=None) -> None:
    """`process` names a worker process ("shard 2") in every line it logs. The lines go to
    stderr, or to `stream` (a bench)."""
    global _handler
    formatter = JsonFormatter(process) if config.format == "json" else TextFormatter(process)
    handler = LineHandler(stream or sys.stderr, formatter)
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.level)
    _handler = handler
