"""The flight recorder: what it reads back, and a full disk that costs records, never the engine."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from engine_core.flight_recorder import RESERVED_BYTES, FlightRecorder


def test_records_read_back_as_suspects_and_a_cleared_one_as_none(tmp_path: Path) -> None:
    recorder = FlightRecorder(str(tmp_path / "flight"))
    recorder.open()
    try:
        assert (tmp_path / "flight").stat().st_blocks * 512 >= RESERVED_BYTES  # its blocks taken at open
        recorder.record([(b"api-0", 7), (b"api-1", 9)])
        assert recorder.read_suspects() == {b"api-0": [7], b"api-1": [9]}
        recorder.clear()
        assert recorder.read_suspects() == {}
    finally:
        recorder.close()


def test_a_record_that_cannot_be_written_is_lost_and_logged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = FlightRecorder(str(tmp_path / "flight"))
    recorder.open()

    def no_room(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", no_room)
    try:
        for request_id in range(3):
            recorder.record([(b"api-0", request_id)])
            recorder.clear()
    finally:
        recorder.close()
    assert recorder.read_suspects() == {}
    assert len([r for r in caplog.records if "flight recorder: cannot write" in r.getMessage()]) == 1
