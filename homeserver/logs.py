"""Logging setup: human-readable text, or one JSON object per line for log shippers.

Every record logged while a request is served carries that request's id (`request_id`):
the access log line and every line its work writes, outbound federation calls included, so
one grep finds them all. The id lives in a context variable that the request middleware
sets; each greenlet has its own context, so concurrent requests never see each other's.
Work that leaves the request's greenlet keeps the id only if it is spawned through
`with_request_context` (which runs it in a copy of the request's context).
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import re
import sys
import time

# The id of the request the current greenlet is serving (None outside a request).
current_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "weir_request_id", default=None
)


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


class TextFormatter(logging.Formatter):
    """One line per record: the message has its control characters escaped, so only a
    traceback (which the code adds, never a client) spans lines."""

    def __init__(self, process: str = ""):
        label = f"[{process}] " if process else ""
        super().__init__(f"%(asctime)s %(levelname)s {label}%(name)s%(request_tag)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", None)
        record.request_tag = f" [{request_id}]" if request_id else ""
        return super().format(record)

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    def __init__(self, process: str = ""):
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.process:
            entry["process"] = self.process
        request_id = getattr(record, "request_id", None)
        if request_id:
            entry["request_id"] = request_id
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(config, process: str = "") -> None:
    """`process` names a worker process ("shard 2") in every line it logs."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter(process) if config.format == "json" else TextFormatter(process)
    )
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.level)
