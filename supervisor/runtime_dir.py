"""The supervisor's private runtime folder: made with its PID in the name, and those of dead supervisors removed.

The folder (mode 0700, in the temporary directory) holds the engine's ipc socket, the flight file and the
metrics directory; the supervisor removes it when it stops. A supervisor killed with SIGKILL cannot, so each
start removes the folders its predecessors left: only folders named as poolserve names them, owned by this
user, whose supervisor PID no longer runs. A folder whose PID runs (another live server, or any process that
reuses the PID) is kept: a leftover kept is harmless, another server's folder removed would break it.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import tempfile

logger = logging.getLogger(__name__)

PREFIX = "poolserve-"
# poolserve-<supervisor pid>-<mkdtemp's random suffix>
NAME = re.compile(rf"{PREFIX}(\d+)-[A-Za-z0-9_]+")


def create_runtime_dir() -> str:
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")  # mode 0700


def remove_stale_runtime_dirs(parent: str | None = None) -> list[str]:
    """Remove the runtime folders of supervisors that no longer run; the paths removed."""
    parent = parent or tempfile.gettempdir()
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    removed = []
    for name in names:
        match = NAME.fullmatch(name)
        if match is None or is_running(int(match.group(1))):
            continue
        path = os.path.join(parent, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():  # not a folder of ours (or a link)
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            logger.info("removed %s, left by a supervisor (pid %s) that no longer runs", path, match.group(1))
            removed.append(path)
    return removed


def is_running(pid: int) -> bool:
    """Whether a process with this PID exists. This supervisor's own PID counts as not running: its folder
    does not exist yet, so a folder with its PID was left by an earlier process that had the same PID."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: running
        return True
    return True
