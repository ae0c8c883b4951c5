"""An OpenAI batch file through `launch run-batch`'s job (launch's own `main`) against the real API server and engine,
in this process (tests/run_batch/in_process_job.py): answered line by line as the HTTP endpoint answers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.in_process.stack_server import InProcessServer, served
from tests.run_batch.in_process_job import assert_same_answer, batch_line, run_job, write_lines
from tests.sentences import SENTENCES
from tests.utils import FLOAT32_CPU


@pytest.fixture(scope="module")
def server() -> Iterator[InProcessServer]:
    with served(*FLOAT32_CPU) as started:
        yield started


def test_openai_batch_file_answers_as_the_http_endpoint(
    tmp_path: Path, server: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
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

    assert run_job(server, monkeypatch, "--input", str(source), "--output", str(output)) == 0

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
    served_lines = [a for a in answers if a["response"] is not None]
    with server.client() as client:
        for answer, body in zip(served_lines, bodies, strict=True):
            http = client.post("/v1/embeddings", json=body)
            assert answer["response"]["status_code"] == http.status_code
            assert answer["response"]["request_id"]
            assert_same_answer(answer["response"]["body"], http.json())
            if http.status_code == 200:
                assert answer["error"] is None
            else:  # an answer the endpoint refused: its body as the endpoint wrote it, its message as the error
                assert answer["response"]["body"] == http.json()
                assert answer["error"]["message"] == http.json()["error"]["message"]
