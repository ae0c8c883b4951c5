"""One-line log records from every process, each naming the process it came from: text or JSON."""

from __future__ import annotations

import logging
import sys

import msgspec

TEXT_FORMAT = "%(asctime)s %(levelname)s [{name} %(process)d] %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers: time, level, process, logger, message."""

    def __init__(self, process_name: str):
        super().__init__()
        self.process_name = process_name
        self._encoder = msgspec.json.Encoder()

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "process": self.process_name,
            "pid": record.process,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return self._encoder.encode(entry).decode()


def configure_logging(process_name: str, level: str, log_format: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter(process_name))
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT.format(name=process_name)))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
