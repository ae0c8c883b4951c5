"""Entry point of an API-server process, started by the supervisor: `python -m apiserver`."""

from __future__ import annotations

import sys

from apiserver.server import run
from poolserve.boot import exit_with_parent, read_child_spec


def main() -> int:
    spec = read_child_spec()
    exit_with_parent(spec)
    return run(spec)


if __name__ == "__main__":
    sys.exit(main())
