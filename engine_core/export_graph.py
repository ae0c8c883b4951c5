"""`python -m engine_core.export_graph`: a model's ONNX graph exported, optimised and packed into the cache
(engine_core/onnx_runtime.py, packed_graph.py) by a process of its own, which the engine starts and waits for.

Why a process: the export's peak memory (the float32 weights again, the traced graph, the optimiser's copies) stayed
in the engine that made it, whose heap does not give it back: the bundled model's engine held 888 MB after a first
start that exported in-process against 606 MB after one that read the cached graph (bench/first_start.py; 1149 MB
where a thread of a serving engine exported it). Its Python (tracing, the
optimiser's fusions) also held the engine's GIL for up to 0.85 s at a time, which an engine that serves meanwhile
(`--runtime auto`'s first start, engine_core/later_graph.py) answered with stalls of up to 1.5 s. Here both end with the
process. The cost is the imports again (~4-5 s of CPU on a 2-core host) on a start that exports, once per graph.

It dies with the thread that started it (PR_SET_PDEATHSIG: the engine gone, or its export thread), runs `--nice`
below the engine (whose own priority it inherits), and prints the packed graph's path as its last line; on a
failure, one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from poolserve.boot import exit_with_parent


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m engine_core.export_graph", description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the transformer's folder (config.json and weights)")
    parser.add_argument("auto_class", help="the transformers Auto class it is loaded with (engine_core/loader.py)")
    parser.add_argument("cache_dir", type=Path)
    parser.add_argument("--parent", type=int, required=True, help="the engine's pid")
    parser.add_argument("--nice", type=int, default=0)
    args = parser.parse_args()
    exit_with_parent(args.parent)  # as the engine with its supervisor (poolserve/boot.py)
    os.nice(args.nice)
    try:
        # The few modules it needs (engine_core.loader's imports alone took 7.7 s on a 2-core host): a folder that
        # reaches here loaded in the engine already, with no code of its own (which no graph is exported for).
        import torch
        import transformers

        from engine_core.onnx_runtime import cached_graph

        transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        auto = getattr(transformers, args.auto_class)
        model = auto.from_pretrained(args.folder, dtype=torch.float32).eval()
        graph = cached_graph(model, args.folder, args.cache_dir)
    except Exception as exc:
        said = str(exc).strip().splitlines()
        print(said[0] if said else type(exc).__name__, file=sys.stderr)
        sys.exit(1)
    print(graph)


if __name__ == "__main__":
    main()
