"""`python -m engine_core.prepare`, which `launch prepare [launch's flags]` runs: what a start of those flags would
cache, made now, for each model they name, then exit.

That is the model's files (into Hugging Face's cache, where the hub can be reached) and, where the engine would serve
the model through ONNX Runtime's graph (`--runtime auto` on a CPU for a BERT embedder in float32 or int8, or hybrid
and onnxruntime by name), the graph exported, optimised and packed into `--onnx-cache-dir` and held to torch float32
on the probe set as a start holds it. Each model is loaded exactly as an engine loads it (engine_core/load_model.py),
so the flags decide what is made, the loader's log says what it chose, and a model a server could not serve fails
here. Where an image is built, or in an init container on the volume the servers' cache is, it spares every start
the export: a first start serves through torch until its graph is made (engine_core/later_graph.py), at about twice
the graph's latency on a 2-core host for the 55 s that took under load.

The configs come from `launch` (supervisor/cli.py) as JSON on stdin. Exit status 0 when every model is prepared, 1
with one line (`<model>: <why>`) at the first that cannot be.
"""

from __future__ import annotations

import gc
import sys
import time

import msgspec

from poolserve.config import Config
from poolserve.logs import configure_logging

EXIT_FAILED = 1


def prepare(config: Config) -> str:
    """Load `config`'s model as an engine does and wait for a graph made behind torch (the loader's log says which
    runtime serves it, and the graph's path); raises LoadError, or RuntimeError for a graph that failed."""
    from engine_core.later_graph import LaterGraph
    from engine_core.load_model import load_model

    started = time.monotonic()
    loaded = load_model(config)
    runner = loaded.runner
    if isinstance(runner, LaterGraph):
        runner.switched.wait()
        if runner.failure:
            raise RuntimeError(f"the ONNX graph failed: {runner.failure}")
    card = loaded.card
    del loaded, runner  # the next model's load does not hold this one's weights beside its own
    gc.collect()
    return (
        f"prepared in {time.monotonic() - started:.1f} s ({card.architecture}, {card.kind}, {card.device} {card.dtype})"
    )


def main() -> int:
    configs = msgspec.json.decode(sys.stdin.buffer.read(), type=list[Config])
    configure_logging("prepare", configs[0].log_level, configs[0].log_format)
    from engine_core.folder_choices import LoadError, first_line

    for config in configs:
        name = config.model_names[0] if config.model_names else config.model
        try:
            said = prepare(config)
        except (LoadError, RuntimeError) as exc:
            print(f"{name}: {first_line(exc)}", file=sys.stderr, flush=True)
            return EXIT_FAILED
        print(f"{name}: {said}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
