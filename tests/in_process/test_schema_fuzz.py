"""schemathesis against /openapi.json of live servers (the API server and engine of `launch`, in the test's process:
stack_server.py, with the API server's own HTTP protocol): generated requests, valid and not, get no 5xx and no
answer that breaks the published schema.

The schemathesis CLI runs as a subprocess: its pytest plugin does not work with the pytest this suite pins,
and the CLI's coverage phase (boundary values, undeclared methods) finds what plain fuzzing misses.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import API_KEY
from tests.in_process.stack_server import InProcessServer

# Generated cases per endpoint in the fuzzing phase; the coverage phase adds its own boundary cases. 10, not
# 25, since the TEI routes added operations: the four runs took 124 s at 25.
EXAMPLES = 10
SEED = 20261121

# Every check but "a request the schema allows is accepted": the schema cannot say that `input` must not
# be empty or that `dimensions` must not exceed the model's size, and refusing those with a 400 is right.
EXCLUDED_CHECKS = "positive_data_acceptance"
# Operations that only repeat another one (same request type, same code), and /embed_sparse, which refuses
# every request: fuzzing them again costs time and finds nothing new.
REPEATS = ["--exclude-path", "/embeddings", "--exclude-path", "/invocations", "--exclude-path", "/embed_sparse"]
REPEATS += ["--exclude-operation-id", "get_root"]


def run_schemathesis(
    server: InProcessServer, headers: list[str], cwd: Path, examples: int
) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-c", "import sys; from schemathesis.cli import schemathesis; sys.exit(schemathesis())",
        "run", f"{server.url}/openapi.json",
        "--checks", "all", "--exclude-checks", EXCLUDED_CHECKS,
        "--phases", "coverage,fuzzing",
        "--max-examples", str(examples), "--seed", str(SEED),
        "--request-timeout", "30", "--no-color", "--warnings", "off",
        *REPEATS, *headers,
    ]  # fmt: skip
    # In a temporary folder: schemathesis keeps a cache of crashes in `.schemathesis/` where it runs.
    return subprocess.run(command, capture_output=True, text=True, timeout=240, check=False, cwd=cwd)


FIXTURES = {
    "bundled": "server",
    "cross-encoder": "cross_encoder_server",
    "clip": "clip_server",
    # Behind a key: schemathesis also checks that every operation the schema marks as secured refuses
    # requests without it.
    "api-key": "guarded_server",
}


@pytest.mark.parametrize("kind", list(FIXTURES))
def test_generated_requests_get_no_5xx_and_no_answer_outside_the_schema(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    server: InProcessServer = request.getfixturevalue(FIXTURES[kind])
    headers = ["--header", f"Authorization: Bearer {API_KEY}"] if kind == "api-key" else []
    # The bundled model's run fuzzes hardest; the others mostly repeat its request types on another model kind
    # (or behind the key), so their coverage phase and a few generated cases each find what they add.
    examples = EXAMPLES if kind == "bundled" else EXAMPLES // 2
    result = run_schemathesis(server, headers, tmp_path, examples)
    assert result.returncode == 0, f"{result.stdout[-20000:]}\n{result.stderr[-2000:]}"
    counts = re.search(r"(\d+) generated, (\d+) passed", result.stdout)
    assert counts is not None, result.stdout[-3000:]
    generated, passed = map(int, counts.groups())
    assert generated == passed > 16 * examples
