"""How the ``icesink`` command logs: the level and the line format (``text`` or ``json``), from
``--log-level`` / ``--log-format`` or ``ICESINK_LOG_LEVEL`` / ``ICESINK_LOG_FORMAT``."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Final

LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS: Final = ("text", "json")
TEXT: Final = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
#: Libraries that log every connection and rebalance at INFO: WARNING and up unless DEBUG.
NOISY: Final = ("aiokafka", "faust", "mode", "py4j", "pyiceberg")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, and the exception
    and stack text when there are some (already redacted by the handlers' filters)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
                "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = record.stack_info
        return json.dumps(line, ensure_ascii=False)


def setup_logging(level: str, fmt: str) -> None:
    """The root logger's one handler, on stderr, at ``level`` in format ``fmt``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level))
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


class _Nowhere:
    """The stream of the handlers once the last line is out."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def last_line(logger: logging.Logger, message: object) -> None:
    """Log ``message`` at ERROR as the process's last line. Holding the handlers' locks, it is
    written, no new record is made, and the handlers then write nowhere: a record another thread
    (the Spark session's start) made before this one waits for a lock and is not written after it."""
    handlers = logging.getLogger().handlers[:]
    for handler in handlers:
        handler.acquire()
    try:
        logger.error("%s", message)
        logging.disable(logging.CRITICAL)
        for handler in handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.setStream(_Nowhere())
    finally:
        for handler in reversed(handlers):
            handler.release()
