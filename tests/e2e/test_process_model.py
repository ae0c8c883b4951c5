"""The process model itself: torch only in the engine, a clean stop, no hangs. (A fresh server ready within 10 s
of its engine template's imports, and SIGTERM leaving nothing behind: tests/e2e/test_faults.py's SIGTERM test, on
its own launch; a SIGKILLed supervisor's children leaving by themselves: test_faults.py, on the full-TMPDIR test's
launch. A model that cannot load: tests/fidelity/test_refused.py's launch, and tests/engine_core/test_loader.py.)

The supervisor's decisions on their own (a port in use, a crash loop that makes it give up, boot failures,
restarts, scaling) are tested on stub children in tests/supervisor/test_arbiter.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.harness.server_process import PoolserveProcess
from tests.utils import mapped_libraries

HEAVY_MODULES = ("torch", "transformers")
# Imports every module an API server or the supervisor can load, in a fresh interpreter, and prints
# the top-level packages that came in with them. `__main__` modules start a server when imported; what
# they import is imported here anyway.
IMPORT_EVERYTHING = """
import importlib, json, pkgutil, sys
for package in ("poolserve", "supervisor", "apiserver", "engine_client"):
    importlib.import_module(package)
    for module in pkgutil.walk_packages(sys.modules[package].__path__, package + "."):
        if not module.name.endswith(".__main__"):
            importlib.import_module(module.name)
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def test_api_servers_and_supervisor_map_no_torch(server: PoolserveProcess) -> None:
    api_pids = server.child_pid("apiserver")
    assert len(api_pids) == 2
    for pid in [*api_pids, server.pid]:
        assert "libtorch" not in mapped_libraries(pid), f"process {pid} has torch loaded"
    for pid in api_pids:  # the check can see a Python extension at all
        assert "tokenizers.abi3.so" in mapped_libraries(pid)
    engine_pids = server.child_pid("engine_core")
    assert len(engine_pids) == 1
    assert "libtorch" in mapped_libraries(engine_pids[0])


def test_no_api_server_or_supervisor_module_imports_torch_or_transformers() -> None:
    """transformers is pure Python, invisible in /proc/<pid>/maps: its absence is checked on the imports."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERYTHING], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    packages = json.loads(done.stdout)
    assert "apiserver" in packages and "tokenizers" in packages
    assert [name for name in HEAVY_MODULES if name in packages] == []


def test_on_the_cpu_every_engine_thread_yields_to_the_api_servers(server: PoolserveProcess) -> None:
    def niceness(pid: int) -> set[int]:
        return {
            int((task / "stat").read_text().rsplit(")", 1)[1].split()[16])
            for task in Path(f"/proc/{pid}/task").iterdir()
        }

    (engine,) = server.child_pid("engine_core")
    assert niceness(engine) == {5}
    assert all(niceness(pid) == {0} for pid in server.child_pid("apiserver"))
