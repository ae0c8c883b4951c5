"""`launch run-batch` through `launch`'s own `main` in the test's process, in front of a server this process already
started (tests/in_process/stack_server.py) instead of the private `launch` the job starts (run_batch/private_server.py):
the job's reading, requests, output and errors files and resume are the product's own; the private server's start and
its stop with the job are shown on a real one by tests/e2e/test_run_batch.py's killed job."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from supervisor.cli import main as launch
from tests.in_process.stack_server import InProcessServer


class StartedServer:
    """What `run_batch.cli.main` reads of its PrivateServer, on a server already started (and stopped by its fixture,
    not by the job)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.api_key = "unused"  # the server was started without a key: the job's bearer header is ignored
        self.log = SimpleNamespace(name="(the in-process server logs to the test's process)")

    def wait_ready(self, timeout: float) -> None:
        return None

    def stop(self) -> int:
        return 0

    def remove_log(self) -> None:
        return None


def run_job(server: InProcessServer, monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    """`launch run-batch ARGS --no-progress` with `server` as its private server: the job's exit code."""
    monkeypatch.setattr("run_batch.cli.PrivateServer", lambda launch_args, api_key="": StartedServer(server.url))
    with pytest.raises(SystemExit) as exited:
        launch(["run-batch", *args, "--no-progress"])
    code = exited.value.code
    assert isinstance(code, int)
    return code


def batch_line(custom_id: str, body: Any, url: str = "/v1/embeddings") -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def as_floats(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<f4")


def assert_same_answer(ours: Any, http: Any) -> None:
    """Equal JSON, vectors within float32 rounding (base64 ones decoded): the job's batches are not the HTTP request's
    batches, and a pass of a few inputs alone in the engine may run through --runtime auto's ONNX graph where a larger
    one runs through torch."""
    if isinstance(http, dict):
        assert isinstance(ours, dict) and ours.keys() == http.keys()
        for key in http:
            if key == "embedding" and isinstance(http[key], list):
                np.testing.assert_allclose(ours[key], http[key], rtol=0, atol=2e-6)
            elif key == "embedding" and isinstance(http[key], str):  # base64 of little-endian float32
                assert isinstance(ours[key], str)
                np.testing.assert_allclose(as_floats(ours[key]), as_floats(http[key]), rtol=0, atol=2e-6)
            else:
                assert_same_answer(ours[key], http[key])
    elif isinstance(http, list):
        assert isinstance(ours, list) and len(ours) == len(http)
        for a, b in zip(ours, http, strict=True):
            assert_same_answer(a, b)
    else:
        assert ours == http
