"""Entry point of the engine-core process, started by the supervisor: `python -m engine_core`."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from types import FrameType

from poolserve.boot import (
    EXIT_BOOT_ERROR,
    BootReport,
    engine_endpoint,
    exit_with_parent,
    read_child_spec,
    report_boot,
    send_heartbeat,
)
from poolserve.collector import settle
from poolserve.flight_record import flight_record_path
from poolserve.logs import configure_logging
from poolserve.metric_files import reserve_metric_files

logger = logging.getLogger("poolserve.engine")

# On the CPU the engine shares cores with the API servers, whose event loops must answer in
# milliseconds: a lower priority lets them preempt the forward pass at once. Measured on 2 cores
# (docs/benchmarks.md): /health p99 under load ~6.8 -> ~5.1 ms, images +16%, text unchanged.
ENGINE_NICE_ON_CPU = 5


def yield_cpu(niceness: int) -> None:
    """Lower every thread of this process (on Linux niceness is per thread, and torch's pool exists
    by now). Threads started later inherit it from the thread that starts them; one that a not yet
    lowered thread starts while this runs is caught by the next pass, until a pass finds none."""
    target = os.getpriority(os.PRIO_PROCESS, 0) + niceness
    try:
        for _ in range(10):
            behind = 0
            for tid in map(int, os.listdir("/proc/self/task")):
                try:
                    if os.getpriority(os.PRIO_PROCESS, tid) < target:
                        os.setpriority(os.PRIO_PROCESS, tid, target)
                        behind += 1
                except ProcessLookupError:  # the thread ended after the listing
                    pass
            if not behind:
                return
    except OSError as exc:
        logger.warning("could not lower the engine's CPU priority: %s", exc)


def main() -> int:
    spec = read_child_spec()
    exit_with_parent(spec.supervisor_pid)
    # Ctrl-C reaches the whole process group; the supervisor decides when the engine stops,
    # after the API servers have drained.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(spec.name, spec.config.log_level, spec.config.log_format)
    reserve_metric_files()  # before the engine's modules make their metrics
    from engine_core.metrics import set_engine_index

    set_engine_index(spec.index, spec.config.model_names[0])
    started = time.perf_counter()
    # Imported here so that the boot report above is possible even if torch itself fails to import.
    try:
        from engine_core.admission import AdmissionLimit
        from engine_core.embedding_cache import EmbeddingCache
        from engine_core.engine import EngineProcess
        from engine_core.flight_recorder import FlightRecorder
        from engine_core.folder_choices import LoadError
        from engine_core.load_model import load_model
        from engine_core.scheduler import PriorityPolicy
    except Exception as exc:
        report_boot(spec, BootReport(status="failed", message=f"cannot import the engine: {exc}"))
        raise
    try:
        config = spec.config
        loaded = load_model(config)
        # Several models: `index` counts across them (EngineLayout); the queue limits are shared by the model's own.
        layout = spec.layout
        engine = EngineProcess(
            loaded,
            engine_endpoint(spec.runtime_dir, spec.index, layout.total),
            admission=AdmissionLimit.for_engine(
                config.max_queued_inputs, config.max_queued_tokens, layout.local_index(spec.index), config.engine_count
            ),
            # Its own file: a restarted engine names what it was running, not what a sibling was.
            recorder=FlightRecorder(flight_record_path(spec.runtime_dir, spec.name)),
            beat=lambda: send_heartbeat(spec),
            cache=EmbeddingCache(config.cache_bytes),
            priority=PriorityPolicy(config.min_priority, config.priority_max_wait),
        )
    except LoadError as exc:
        report_boot(spec, BootReport(status="failed", message=str(exc)))
        return EXIT_BOOT_ERROR
    except Exception as exc:
        logger.exception("engine failed to start")
        report_boot(spec, BootReport(status="failed", message=f"{type(exc).__name__}: {exc}"))
        return EXIT_BOOT_ERROR

    settle()  # the garbage collector, after the model's load (poolserve/collector.py)

    def handle_term(signum: int, frame: FrameType | None) -> None:
        engine.request_exit()

    signal.signal(signal.SIGTERM, handle_term)
    card = loaded.card
    if card.device == "cpu":
        yield_cpu(ENGINE_NICE_ON_CPU)
    shape = f"{len(card.labels)} labels" if card.labels else f"{card.pooling} pooling, {card.output_size} dims"
    summary = f"{card.architecture} ({card.kind}), {shape}, on {card.device} {card.dtype}"
    if card.device == "cpu":
        import torch

        summary += f", {torch.get_num_threads()} torch threads"
    cutting = (
        "filled to the caps (token packing)"
        if loaded.packs_tokens
        else f"cut where padding costs more than a forward pass, as much as {loaded.batch_overhead_tokens:.0f} tokens"
    )
    logger.info(
        "model %s loaded in %.1fs: %s%s, max %d tokens, batches of <= %d inputs / %d tokens, %s",
        card.path,
        time.perf_counter() - started,
        summary,
        ", normalized" if card.normalize else "",
        card.max_model_len,
        card.max_batch_size,
        card.max_batch_tokens,
        cutting,
    )
    from engine_core.metrics import publish_model_info

    publish_model_info(card, model_name=spec.config.model_names[0])
    report_boot(spec, BootReport(status="ready", message=summary))
    engine.run()
    logger.info("engine stopped")
    return 0


def exit_now(code: int) -> None:
    """Exit without the interpreter's teardown. With torch and the model loaded, that teardown runs
    the cyclic garbage collector over the whole heap again and again while modules are cleared: 5-8 s
    of CPU on 2 cores (profiled: ~70% in gc_collect_main), which every stop, rolling or not, waited for.
    Nothing in it matters here: the sockets and the flight recorder are closed by now and metric files
    are shared memory maps. Only buffered output would be lost, so it is flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
