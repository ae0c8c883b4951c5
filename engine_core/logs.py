"""One-line log records from every process, each naming the process it came from."""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)s [{name} %(process)d] %(name)s: %(message)s"


def configure_logging(process_name: str, level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT.format(name=process_name)))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
