"""Entry point of an API-server process, started by the supervisor: `python -m apiserver`."""

from __future__ import annotations

import sys

from poolserve.boot import exit_with_parent, read_child_spec
from poolserve.metric_files import reserve_metric_files


def main() -> int:
    spec = read_child_spec()
    exit_with_parent(spec.supervisor_pid)
    reserve_metric_files()
    # Imported after: importing the server makes its metrics, which open their files.
    from apiserver.process import run

    return run(spec)


if __name__ == "__main__":
    sys.exit(main())
