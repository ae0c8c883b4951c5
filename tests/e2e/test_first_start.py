"""A first start under --runtime auto (the default), whose ONNX graph is not cached yet: the engine serves through
torch at once while a process of its own exports the graph (engine_core/later_graph.py, export_graph.py); that
process dies with its engine, and the next engine starts another."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from bench.harness.server_process import PoolserveProcess, cmdline, module_of, process_tree, wait_until
from tests.utils import is_alive, ready_line_time

EXPORTED = "exported, optimised and packed in"


def exports_of(engine: int) -> list[int]:
    """The engine's export process (started by a thread other than its main one)."""
    return [pid for pid in process_tree(engine) if module_of(cmdline(pid)) == "engine_core.export_graph"]


def test_a_first_start_serves_through_torch_while_its_graph_is_exported_by_a_process_that_dies_with_the_engine(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "onnx"
    # float32 pinned: where the CPU has bfloat16, --dtype auto serves it, and the graph is float32's
    with PoolserveProcess("--dtype", "float32", "--onnx-cache-dir", str(cache)) as server:
        server.wait_ready(graph=False)
        assert "BertModel's ONNX graph is not cached yet; torch serves until" in server.stderr()
        (engine,) = server.child_pid("engine_core")
        assert wait_until(lambda: exports_of(engine), 30), server.log()
        (export,) = exports_of(engine)
        assert "--nice 5" in cmdline(export)
        with server.client() as client:  # answered meanwhile, through torch
            assert client.post("/v1/embeddings", json={"input": "while the graph is made"}).status_code == 200
        assert EXPORTED not in server.stderr()
        mark = len(server.stderr())
        os.kill(engine, signal.SIGKILL)
        assert wait_until(lambda: not is_alive(export), 5), "the export outlived its engine"
        ready_line_time(server, "engine", engine, timeout=60, since=mark)
        # The next engine finds no graph either (nothing was renamed into place) and exports it again, serving
        # meanwhile. (The graph taking over: tests/engine_core/test_onnx_runtime.py, with the same export process.)
        assert "not cached yet" in server.stderr()[mark:]
        with server.client() as client:
            assert client.post("/v1/embeddings", json={"input": "after the restart"}).status_code == 200
    assert not is_alive(export)
