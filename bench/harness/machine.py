"""Facts that make a result reproducible: the machine, package versions, the git commit, the command."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

PACKAGES = (
    "torch",
    "transformers",
    "tokenizers",
    "uvicorn",
    "uvloop",
    "httptools",
    "starlette",
    "msgspec",
    "pyzmq",
    "numpy",
    "pillow",
    "aiohttp",
    "httpx",
)
REPO = Path(__file__).resolve().parents[2]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return 0.0


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine_facts() -> dict[str, object]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "memory_gb": round(memory_gb(), 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_average_at_start": load_average(),
    }


def versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    found = {}
    for name in packages:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def git_facts() -> dict[str, object]:
    return {
        "commit": git("rev-parse", "HEAD"),
        "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def command_line() -> str:
    return shlex.join([Path(sys.executable).name, "-m", "bench.sweep", *sys.argv[1:]])
