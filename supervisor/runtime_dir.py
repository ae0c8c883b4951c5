"""The supervisor's private runtime folder: made with its PID in the name, checked for room, and those of dead
supervisors removed.

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
# What one process's metric files may take, from an API server's with every endpoint in use (measured: five
# files, 512 KiB; the engine's and the supervisor's take less): the supervisor warns below this much room.
METRICS_BYTES_PER_PROCESS = 1024 * 1024
METRICS_FILES_PER_PROCESS = 8
# poolserve-<supervisor pid>-<mkdtemp's random suffix>
NAME = re.compile(rf"{PREFIX}(\d+)-[A-Za-z0-9_]+")


def create_runtime_dir() -> str:
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")  # mode 0700


def room_shortfall(path: str, processes: int) -> str | None:
    """What the filesystem of `path` lacks for the metric files of `processes` processes, in a sentence; None
    if it has room. Too little room costs metric series, never serving (poolserve/metric_files.py)."""
    stats = os.statvfs(path)
    free = stats.f_bavail * stats.f_frsize
    needed = processes * METRICS_BYTES_PER_PROCESS
    if free < needed:
        return f"{path} has {free // 1024} KiB free, less than {needed // 1024} KiB for {processes} processes' metrics"
    if stats.f_files and stats.f_favail < processes * METRICS_FILES_PER_PROCESS:  # f_files 0: no inode limit
        return f"{path} has {stats.f_favail} inodes free, too few for {processes} processes' metric files"
    return None


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
