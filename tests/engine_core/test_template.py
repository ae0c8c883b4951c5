"""engine_core/template.py's refusal to fork a process that is not safe to fork. Its forks themselves, at start and at
each restart: tests/e2e/test_faults.py."""

from __future__ import annotations

import threading

import torch  # noqa: F401  # fork_hazard reads torch's CUDA state from the loaded module, as the template has it

from engine_core.template import PRELOADED, fork_hazard


def test_a_python_thread_makes_the_template_refuse_to_fork() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert "Python thread(s) started while importing" in fork_hazard()
    finally:
        stop.set()
        thread.join()


def test_the_template_preloads_torch_and_transformers_modeling_stack_and_nothing_of_poolserves_engine() -> None:
    """poolserve's engine modules make Prometheus metrics when imported, which must be made in the engine itself."""
    assert {"torch", "transformers.modeling_utils"} <= set(PRELOADED)
    assert not [name for name in PRELOADED if name.split(".")[0] in ("engine_core", "poolserve", "prometheus_client")]
