"""`launch run-batch` killed, its private `launch` gone with it, and resumed. (An OpenAI batch file answered as the
HTTP endpoint answers, and every job but the killed one: `launch`'s own `main` in the test's process,
tests/run_batch/.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.harness.server_process import REPO, PoolserveProcess
from tests.in_process.stack_server import InProcessServer, served
from tests.run_batch.in_process_job import assert_same_answer, run_job, write_lines
from tests.sentences import SENTENCES
from tests.utils import FLOAT32_CPU, is_alive

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def in_process() -> Iterator[InProcessServer]:
    """The server the resumed and the uninterrupted jobs run against, in this process."""
    with served(*FLOAT32_CPU) as started:
        yield started


def test_killed_job_resumed_writes_the_uninterrupted_file(
    tmp_path: Path,
    server: PoolserveProcess,
    in_process: InProcessServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The job killed is the real command, whose private `launch` must go with it; the resumed and the uninterrupted
    jobs are the same command's `main` in this process (tests/run_batch/in_process_job.py): resuming is the job's work,
    not its server's, and the rows of all three are held to the session's `launch` (float32 on the CPU each)."""
    texts = [f"{SENTENCES[i % len(SENTENCES)]} (passage {i})" for i in range(600)]
    rows: list[Any] = [{"text": text, "doc": f"d{i}"} for i, text in enumerate(texts)]
    rows[300] = {"doc": "d300"}  # no text: an error line, and the job goes on
    source = write_lines(tmp_path / "texts.jsonl", [json.dumps(row) for row in rows])
    job = ("--input", str(source), "--id-column", "doc", "--texts-per-request", "16")

    resumed = tmp_path / "resumed.jsonl"
    errors = tmp_path / "errors" / "bad.jsonl"
    errors.parent.mkdir()
    with (tmp_path / "killed.err").open("w") as log:
        killed = subprocess.Popen(
            [sys.executable, "-m", "supervisor", "run-batch", *job, "--output", str(resumed), "--errors", str(errors),
             "--api-server-count", "1", *FLOAT32_CPU],
            stdout=subprocess.DEVNULL, stderr=log, cwd=REPO,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while lines_in(resumed) < 100:
            assert killed.poll() is None, (tmp_path / "killed.err").read_text()
            assert time.monotonic() < deadline, "the job wrote no 100 lines in time"
            time.sleep(0.05)
        supervisors = children_of(killed.pid)
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(10)
    finally:
        if killed.poll() is None:  # the test failed first
            killed.kill()
            killed.wait(10)
    written = lines_in(resumed)
    assert 100 <= written < len(rows)
    with resumed.open("ab") as f:  # as a write cut short would leave it
        f.write(b'{"index":' + str(written).encode() + b',"id":"d')
    deadline = time.monotonic() + 60
    while any(is_alive(pid) for pid in supervisors):  # the job's server goes with it
        assert time.monotonic() < deadline, "the killed job's server is still running"
        time.sleep(0.1)

    whole = tmp_path / "whole.jsonl"
    assert run_job(in_process, monkeypatch, *job, "--output", str(whole)) == 0
    capsys.readouterr()
    assert run_job(in_process, monkeypatch, *job, "--output", str(resumed), "--errors", str(errors)) == 0
    said = capsys.readouterr().err

    assert f"resuming after the {written} lines" in said
    ours = [json.loads(line) for line in resumed.read_text().splitlines()]
    reference = [json.loads(line) for line in whole.read_text().splitlines()]
    assert [(a["index"], a["id"]) for a in ours] == [(i, f"d{i}") for i in range(len(rows))]
    assert_same_answer(ours, reference)
    assert ours[300]["error"]["line"] == 301 and "'text' is missing" in ours[300]["error"]["message"]
    # The bad line listed once, whichever run met it; the uninterrupted job lists it beside its output.
    listed = [json.loads(line) for line in errors.read_text().splitlines()]
    assert listed == [json.loads(line) for line in (tmp_path / "whole.errors.jsonl").read_text().splitlines()]
    assert [(e["line"], e["index"], e["id"]) for e in listed] == [(301, 300, "d300")]
    assert "'text' is missing" in listed[0]["error"]["message"]
    if written <= 300:
        assert f"1 with an error (listed in {errors})" in said
    with server.client() as client:
        for first in (0, 500):  # a row the killed job's server wrote, and one the resumed job's
            http = client.post("/v1/embeddings", json={"input": texts[first : first + 16]}).json()["data"]
            assert_same_answer(
                [{"embedding": a["embedding"]} for a in ours[first : first + 16]],
                [{"embedding": d["embedding"]} for d in http],
            )


def lines_in(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found
