"""Every curl example in docs/api.md runs against a live server of the kind it names and gets a 200."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.in_process.stack_server import InProcessServer

DOCS = Path(__file__).parents[2] / "docs" / "api.md"
EXAMPLE = re.compile(r"<!-- model: (?P<kind>[\w-]+) -->\n```sh\n(?P<command>.*?)```", re.DOTALL)
SERVERS = {
    "bundled": "server",
    "cross-encoder": "cross_encoder_server",
    "classifier": "classifier_server",
    "clip": "clip_server",
    "splade": "splade_server",
}
EXAMPLES = [(m["kind"], m["command"]) for m in EXAMPLE.finditer(DOCS.read_text())]


def test_every_endpoint_has_an_example() -> None:
    documented = {re.search(r"localhost:8000(/[\w/.]*)", command)[1] for _, command in EXAMPLES}  # type: ignore[index]
    assert documented >= {
        "/v1/embeddings", "/v1/models", "/pooling", "/score", "/v1/rerank", "/rerank", "/classify", "/tokenize",
        "/detokenize", "/embed", "/embed_sparse", "/predict", "/info", "/version", "/health", "/openapi.json",
    }  # fmt: skip


@pytest.mark.parametrize(("kind", "command"), EXAMPLES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(EXAMPLES)])
def test_example_runs(kind: str, command: str, request: pytest.FixtureRequest) -> None:
    server: InProcessServer = request.getfixturevalue(SERVERS[kind])
    live = command.replace("localhost:8000", f"127.0.0.1:{server.port}").replace("curl -s", "curl -sS --fail-with-body")
    result = subprocess.run(["bash", "-c", live], capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, f"{live}\n{result.stdout}\n{result.stderr}"
    json.loads(result.stdout)
