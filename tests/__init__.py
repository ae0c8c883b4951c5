"""The suite's package: imported before its first conftest, so its environment is in place before anything of the
suite imports torch, transformers or huggingface_hub (which read theirs at import)."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# `make test` runs the suite over several workers on 2 cores. OpenMP's worker threads spin while they wait for work, and
# with torch in both workers (and in the servers their tests start, which inherit this) each process's spinning took
# the cores from the other: the whole suite's CPU went from 548 s run serially to 700-783 s over two workers, and
# back to 523 s with waiting threads asleep. OpenMP reads this once, when torch loads its runtime.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Bytecode is cached (in each package's __pycache__, which git ignores) even where the environment says not to
# (PYTHONDONTWRITEBYTECODE, which the hosts this project runs on set): without it each pytest process rewrote every test
# module's asserts again (collection 7.1-7.7 s against 5.8-6.0 s cached, 2026-11-28), and each interpreter the suite
# starts (every launch's supervisor, template and API servers, the bench scripts) compiled the project's modules
# again (~0.1 s of CPU a launch).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
