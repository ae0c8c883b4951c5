"""Runtime folders: stale ones (only poolserve's, only this user's, only those whose supervisor is gone), and room."""

from __future__ import annotations

import errno
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from poolserve.config import Config
from supervisor import arbiter
from supervisor.runtime_dir import create_runtime_dir, remove_stale_runtime_dirs, room_shortfall


def dead_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def test_only_folders_named_for_a_dead_supervisor_are_removed(tmp_path: Path) -> None:
    dead = dead_pid()
    stale = tmp_path / f"poolserve-{dead}-x1y2"
    (stale / "metrics").mkdir(parents=True)
    kept = [
        tmp_path / f"poolserve-{os.getppid()}-x1y2",  # a running process
        tmp_path / "poolserve-x1y2",  # no PID in the name
        tmp_path / f"other-{dead}-x1y2",  # not ours
    ]
    for path in kept:
        path.mkdir()
    a_file = tmp_path / f"poolserve-{dead}-file"
    a_file.write_text("")
    target = tmp_path / "target"
    target.mkdir()
    a_link = tmp_path / f"poolserve-{dead}-link"
    a_link.symlink_to(target)
    assert remove_stale_runtime_dirs(str(tmp_path)) == [str(stale)]
    assert all(path.exists() for path in [*kept, a_file, a_link, target])


def test_a_new_folder_carries_the_supervisors_pid_and_is_private(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = Path(create_runtime_dir())
    assert folder.parent == tmp_path and folder.name.startswith(f"poolserve-{os.getpid()}-")
    assert folder.stat().st_mode & 0o777 == 0o700


def test_a_folder_named_for_this_process_is_a_predecessors_with_the_same_pid(tmp_path: Path) -> None:
    # Cleaning runs before this supervisor makes its own folder, so one with its PID is stale.
    earlier = tmp_path / f"poolserve-{os.getpid()}-x1y2"
    earlier.mkdir()
    assert remove_stale_runtime_dirs(str(tmp_path)) == [str(earlier)]


def test_too_little_room_for_the_processes_metrics_is_said_in_a_sentence(tmp_path: Path) -> None:
    assert room_shortfall(str(tmp_path), 1) is None
    said = room_shortfall(str(tmp_path), 1 << 40)
    assert said is not None and said.startswith(f"{tmp_path} has ") and "for 1099511627776 processes' metric" in said


def test_a_runtime_folder_that_cannot_be_made_halts_the_start_with_one_sentence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_room() -> str:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/tmp/poolserve-1-x")

    monkeypatch.setattr(arbiter, "create_runtime_dir", no_room)
    with pytest.raises(arbiter.StartFailed, match=r"^cannot create the runtime folder /tmp/poolserve-1-x: No space"):
        arbiter.Supervisor(Config(api_server_count=1)).start()
