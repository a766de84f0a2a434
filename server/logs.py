"""The server's logs on stderr: short text lines on a terminal, one JSON object per line
otherwise (``--log-format`` / ``SHARDSTREAM_LOG_FORMAT`` chooses).

Both formats carry the same fields: time, level, logger, message and the record's
``extra`` fields. uvicorn's ``color_message`` (the message again, with terminal colour
codes) is dropped, and colour codes are stripped from messages.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import datetime, timezone
from typing import Any, Literal, TextIO

LogFormat = Literal["auto", "text", "json"]

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
_DROPPED = {"color_message"}
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _message(record: logging.LogRecord) -> str:
    return _ANSI.sub("", record.getMessage())


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a record was given with ``extra=``, less uvicorn's coloured duplicate."""
    return {
        key: value
        for key, value in record.__dict__.items()
        if key not in _STANDARD and key not in _DROPPED and not key.startswith("_")
    }


class JSONFormatter(logging.Formatter):
    """Format a record as JSON: time, level, logger, message, and any ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": _message(record),
            **_extras(record),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """Format a record as one line for people: ``time level logger: message key=value``.

    >>> record = logging.makeLogRecord({"name": "shardstream.server", "msg": "server ready",
    ...                                 "levelname": "INFO", "created": 0, "database": "x"})
    >>> TextFormatter().format(record).split(" ", 2)[2]
    'INFO shardstream.server: server ready database=x'
    """

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created).strftime("%Y-%m-%d %H:%M:%S")
        fields = "".join(f" {key}={value}" for key, value in _extras(record).items())
        line = f"{when} {record.levelname} {record.name}: {_message(record)}{fields}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def resolve_format(log_format: LogFormat, stream: TextIO) -> Literal["text", "json"]:
    """``auto`` is text on a terminal and JSON anywhere else (a file, a pipe, a collector)."""
    if log_format != "auto":
        return log_format
    isatty = getattr(stream, "isatty", None)
    return "text" if isatty is not None and isatty() else "json"


def configure_logging(
    level: str = "INFO", *, log_format: LogFormat = "auto", stream: TextIO | None = None
) -> None:
    """Send every log of the server process to ``stream`` (stderr) in one format.

    shardstream's and uvicorn's loggers log at ``level``; other libraries at WARNING and
    above. alembic's step-by-step migration lines show only at ``DEBUG`` (``-v``): the
    server logs one line with the schema revision instead.
    """
    out = stream if stream is not None else sys.stderr
    handler = logging.StreamHandler(out)
    if resolve_format(log_format, out) == "json":
        handler.setFormatter(JSONFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    debug = level.upper() == "DEBUG"
    for name in ("shardstream", "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers.clear()  # propagate to the root handler, once
        logger.setLevel(level.upper())
        logger.propagate = True
    logging.getLogger("alembic").setLevel(logging.INFO if debug else logging.WARNING)
