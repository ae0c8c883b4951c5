r"""What the end-to-end tests add to the bench's harness (bench/harness/server_process.py,
bench/harness/steady_load.py): /proc readers and the tests' shared flags.

Each `launch` is 10-20 s of the suite on a 2-core host (torch imported by its engine): a test that only sends
requests uses a server already started (tests/conftest.py's session `server` and `guarded_server`,
tests/e2e/conftest.py's `recycling_server`, a module's shared one) or tests/in_process/stack_server.py, and a new
place that starts one is for what needs processes of its own (signals, crashes, start-up and stop, flags no shared
server can have). The places, counted (issue 29; a helper's own body counts beside its callers): 12, from 36
(docs/architecture.md, "Tests moved off their own `launch`"):

    grep -rnE 'PoolserveProcess\(|"-m", "supervisor"|launched(_faulty)?\(|run_batch(_argv)?\(|yield from serve\(' \
        tests/*.py tests/e2e tests/fidelity | grep -vE ':\s*(def|class) |core\.run_batch|grep |import ' | wc -l
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from bench.harness.models import CRASH_TOKEN
from bench.harness.server_process import PoolserveProcess, wait_until
from poolserve.model_card import CLASSIFIER, TASK_SCORE, ModelCard

# For servers whose tests hold answers to a float32 reference (Sentence-Transformers, transformers) at
# cosine 0.9999 or 1e-5: `--dtype auto` serves bfloat16 on a CPU with native bf16 (engine_core/cpu_precision.py),
# so on such a host the suite would test a different precision than on one without. The auto choice has its
# own tests (tests/engine_core/test_cpu_precision.py).
FLOAT32_CPU = ("--device", "cpu", "--dtype", "float32")


def is_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def api_server_pids(server: PoolserveProcess) -> dict[str, int]:
    """Index -> pid of the live API servers, from the `[api-N pid]` prefix of their log lines."""
    live = set(server.child_pid("apiserver"))
    return {index: int(pid) for index, pid in re.findall(r"\[api-(\d+) (\d+)\]", server.stderr()) if int(pid) in live}


def engine_pids(server: PoolserveProcess) -> dict[str, int]:
    """Index -> pid of the live engines of a server with --engine-count > 1, from their `[engine-N pid]` log prefix."""
    live = set(server.child_pid("engine_core"))
    return {
        index: int(pid) for index, pid in re.findall(r"\[engine-(\d+) (\d+)\]", server.stderr()) if int(pid) in live
    }


def ready_line_time(server: PoolserveProcess, name: str, pid_not: int, timeout: float, since: int = 0) -> float:
    """Seconds until the supervisor logs `name` ready with a pid other than `pid_not`, in its log from
    character `since` on (a server shared by several tests has ready lines of earlier restarts)."""
    pattern = re.compile(rf"{name} \(pid (\d+)\) is ready")
    started = time.monotonic()
    found = wait_until(
        lambda: any(int(pid) != pid_not for pid in pattern.findall(server.stderr()[since:])), timeout, interval=0.02
    )
    assert found, f"{name} not back within {timeout}s\n{server.log()}"
    return time.monotonic() - started


def pill_is_failed_and_its_neighbours_served(server: PoolserveProcess, model: str = "") -> None:
    """The crashing input (bench/harness/models.py's faulty BERT; `model`: its name on a server of several) sent beside
    4 innocent requests: it gets 500 poison_pill, they get 200, and the server serves the next request."""
    named = {"model": model} if model else {}
    with server.client() as client:
        bystanders: list[int] = []

        def innocent() -> None:
            with server.client() as other:
                bystanders.append(other.post("/v1/embeddings", json={"input": ["harmless"] * 8, **named}).status_code)

        threads = [threading.Thread(target=innocent) for _ in range(4)]
        for thread in threads:
            thread.start()
        poisoned = client.post("/v1/embeddings", json={"input": [[101, CRASH_TOKEN, 102]], **named})
        for thread in threads:
            thread.join(60)
        assert poisoned.status_code == 500, poisoned.text
        assert poisoned.json()["error"]["code"] == "poison_pill"
        assert "likely cause" in poisoned.json()["error"]["message"]
        assert bystanders == [200] * 4
        assert client.post("/v1/embeddings", json={"input": "the next request", **named}).status_code == 200


def mapped_libraries(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def socket_inodes(pid: int) -> set[str]:
    """Inodes of the sockets a process has open, as /proc/net/* lists them."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def runtime_dirs_of(pid: int) -> set[str]:
    """Runtime folders a process has open ipc sockets in, read from /proc/net/unix via its fds."""
    inodes = socket_inodes(pid)
    dirs = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[6] in inodes and "poolserve-" in fields[7]:
            dirs.add(str(Path(fields[7]).parent))
    return dirs


def reranker_card(
    hf_tokenizer: Any, max_model_len: int, architecture: str = "Qwen3ForCausalLM", **fields: Any
) -> ModelCard:
    """An LLM reranker's card over a transformers tokenizer; `fields`: its pair_template or pair_format."""
    return ModelCard(
        path="x", architecture=architecture, kind=CLASSIFIER, tasks=[TASK_SCORE], max_model_len=max_model_len,
        output_size=1, vocab_size=len(hf_tokenizer), pooling="none", normalize=False, pad_token_id=0,
        tokenizer_json=hf_tokenizer.backend_tokenizer.to_str(), device="cpu", dtype="float32",
        template_tokens=dict(hf_tokenizer.special_tokens_map), **fields,
    )  # fmt: skip
