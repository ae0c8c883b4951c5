"""`launch run-batch` through the real command: the HTTP endpoint's answers, bad lines, a killed job resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.harness.server_process import REPO, PoolserveProcess
from tests.sentences import SENTENCES
from tests.utils import FLOAT32_CPU, is_alive

pytestmark = pytest.mark.timeout(600)
JOB_FLAGS = ("--api-server-count", "1", *FLOAT32_CPU)


def run_batch_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "supervisor", "run-batch", *args, *JOB_FLAGS]


def run_batch(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        run_batch_argv(*args, "--no-progress"), check=False, capture_output=True, text=True, timeout=timeout, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    return done


def batch_line(custom_id: str, body: Any, url: str = "/v1/embeddings") -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def assert_same_answer(ours: Any, http: Any) -> None:
    """Equal JSON, vectors within float32 rounding: the job's batches are not the HTTP request's batches."""
    if isinstance(http, dict):
        assert isinstance(ours, dict) and ours.keys() == http.keys()
        for key in http:
            if key == "embedding" and isinstance(http[key], list):
                np.testing.assert_allclose(ours[key], http[key], rtol=0, atol=2e-6)
            else:
                assert_same_answer(ours[key], http[key])
    elif isinstance(http, list):
        assert isinstance(ours, list) and len(ours) == len(http)
        for a, b in zip(ours, http, strict=True):
            assert_same_answer(a, b)
    else:
        assert ours == http


def test_openai_batch_file_answers_as_the_http_endpoint(tmp_path: Path, server: PoolserveProcess) -> None:
    bodies: list[Any] = [
        {"input": SENTENCES[0]},
        {"input": SENTENCES[1:4], "encoding_format": "base64"},
        {"input": SENTENCES[4], "dimensions": 64},
        {"input": 5},  # the endpoint's 400
        {"input": SENTENCES[5], "model": "no-such-model"},  # its 404
        {"input": SENTENCES[6:9]},
    ]
    lines = [batch_line(f"req-{i}", body) for i, body in enumerate(bodies)]
    lines.insert(3, "{not json")
    lines.insert(5, json.dumps({"custom_id": "get", "method": "GET", "url": "/v1/embeddings", "body": {}}))
    source = write_lines(tmp_path / "requests.jsonl", lines)
    output = tmp_path / "answers.jsonl"

    run_batch("--input", str(source), "--output", str(output))

    answers = [json.loads(line) for line in output.read_text().splitlines()]
    assert [a["custom_id"] for a in answers] == ["req-0", "req-1", "req-2", None, "req-3", "get", "req-4", "req-5"]
    assert len({a["id"] for a in answers}) == len(answers)
    assert "line 4" in answers[3]["error"]["message"] and answers[3]["response"] is None
    assert "GET" in answers[5]["error"]["message"] and answers[5]["response"] is None
    # The bad lines alone, beside the output, with their line numbers in the input file.
    errors = [json.loads(line) for line in (tmp_path / "answers.errors.jsonl").read_text().splitlines()]
    assert [(e["line"], e["index"], e["custom_id"]) for e in errors] == [
        (4, 3, None), (5, 4, "req-3"), (6, 5, "get"), (7, 6, "req-4"),
    ]  # fmt: skip
    assert [e["error"].get("status_code") for e in errors] == [None, 400, None, 404]
    assert errors[1]["error"]["message"] == answers[4]["error"]["message"]
    served = [a for a in answers if a["response"] is not None]
    with server.client() as client:
        for answer, body in zip(served, bodies, strict=True):
            http = client.post("/v1/embeddings", json=body)
            assert answer["response"]["status_code"] == http.status_code
            assert answer["response"]["request_id"]
            assert_same_answer(answer["response"]["body"], http.json())
            if http.status_code == 200:
                assert answer["error"] is None
            else:  # an answer the endpoint refused: its body as the endpoint wrote it, its message as the error
                assert answer["response"]["body"] == http.json()
                assert answer["error"]["message"] == http.json()["error"]["message"]


def test_killed_job_resumed_writes_the_uninterrupted_file(tmp_path: Path, server: PoolserveProcess) -> None:
    texts = [f"{SENTENCES[i % len(SENTENCES)]} (passage {i})" for i in range(600)]
    rows: list[Any] = [{"text": text, "doc": f"d{i}"} for i, text in enumerate(texts)]
    rows[300] = {"doc": "d300"}  # no text: an error line, and the job goes on
    source = write_lines(tmp_path / "texts.jsonl", [json.dumps(row) for row in rows])
    job = ("--input", str(source), "--id-column", "doc", "--texts-per-request", "16")

    # The uninterrupted job runs beside the one to be killed: most of each is its server's start (torch imported),
    # which two can share the host's cores for.
    whole = tmp_path / "whole.jsonl"
    with (tmp_path / "whole.err").open("w") as log:
        uninterrupted = subprocess.Popen(
            run_batch_argv(*job, "--output", str(whole), "--no-progress"),
            stdout=subprocess.DEVNULL,
            stderr=log,
            cwd=REPO,
        )
    try:
        resumed = tmp_path / "resumed.jsonl"
        errors = tmp_path / "errors" / "bad.jsonl"
        errors.parent.mkdir()
        with (tmp_path / "killed.err").open("w") as log:
            killed = subprocess.Popen(
                run_batch_argv(*job, "--output", str(resumed), "--errors", str(errors)),
                stdout=subprocess.DEVNULL,
                stderr=log,
                cwd=REPO,
            )
        deadline = time.monotonic() + 240
        while lines_in(resumed) < 100:
            assert killed.poll() is None, (tmp_path / "killed.err").read_text()
            assert time.monotonic() < deadline, "the job wrote no 100 lines in time"
            time.sleep(0.05)
        supervisors = children_of(killed.pid)
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(10)
        written = lines_in(resumed)
        assert 100 <= written < len(rows)
        with resumed.open("ab") as f:  # as a write cut short would leave it
            f.write(b'{"index":' + str(written).encode() + b',"id":"d')
        deadline = time.monotonic() + 60
        while any(is_alive(pid) for pid in supervisors):  # the job's server goes with it
            assert time.monotonic() < deadline, "the killed job's server is still running"
            time.sleep(0.1)

        assert uninterrupted.wait(240) == 0, (tmp_path / "whole.err").read_text()
        done = run_batch(*job, "--output", str(resumed), "--errors", str(errors))

        assert f"resuming after the {written} lines" in done.stderr
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
            assert f"1 with an error (listed in {errors})" in done.stderr
        with server.client() as client:
            http = client.post("/v1/embeddings", json={"input": texts[500:516]}).json()["data"]
        assert_same_answer(
            [{"embedding": a["embedding"]} for a in ours[500:516]], [{"embedding": d["embedding"]} for d in http]
        )
    finally:
        if uninterrupted.poll() is None:  # the test failed first: its server goes with it, as the killed one's did
            uninterrupted.kill()
            uninterrupted.wait(10)


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
