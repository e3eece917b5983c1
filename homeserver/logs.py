"""Logging setup: human-readable text, or one JSON object per line for log shippers."""

from __future__ import annotations

import json
import logging
import sys
import time


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
    if config.format == "json":
        handler.setFormatter(JsonFormatter(process))
    else:
        label = f"[{process}] " if process else ""
        handler.setFormatter(logging.Formatter(
            f"%(asctime)s %(levelname)s {label}%(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.level)
