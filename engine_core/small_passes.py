"""`--runtime hybrid`: torch's runner for most passes, ONNX Runtime's graph (engine_core/onnx_runtime.py) for small
ones.

Why (docs/benchmarks.md, "Small passes through ONNX Runtime"): on an AVX2 CPU ONNX Runtime's fused graph answers one
or two sentences in about half the time of torch's packed float32 modules (5-9 ms against 12-20 for a lone MiniLM
sentence), where a full batch runs faster through torch's packed layers, which skip the padding ONNX Runtime
computes. So a pass of at most SMALL_BATCH_TOKENS padded tokens (one to four short sentences: a lone client's, two
clients' each on a lane of its own, or a small batch with work queued behind it) runs through the graph, on its
session of as many threads as the pass has, any other pass through torch. On an AVX-512 CPU torch's packed layers ran
two to four sentences faster than the graph and --runtime auto gives the graph a lone sentence's pass only
(engine_core/loader.py's graph_inputs). Both answer float32 vectors held to torch
float32's on the probe set at start-up; with `--dtype int8` the small passes are float32, where int8's own row
thresholds (engine_core/int8_linear.py) run most of such a pass's layers unquantized anyway. The graph's sessions stop
spin-waiting as a pass returns (onnx_runtime.py): their spinning threads would take the cores of the torch pass that
follows (twice its time, measured).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from engine_core.runner import F32, ModelRunner, Rows
from engine_core.threads import SMALL_BATCH_TOKENS


class SmallPassRunner:
    """`small` (ONNX Runtime's graph, engine_core/onnx_runtime.py's OnnxEncoder, whose sessions of one thread and of
    every engine thread take the pass as torch's thread count for it says: engine_core/threads.py) for a batch of at
    most `most_tokens` padded tokens and, where `most_inputs` is given, at most that many inputs
    (engine_core/loader.py's graph_inputs: one on an AVX-512 CPU); `large` (torch) for the rest."""

    def __init__(
        self,
        large: ModelRunner,
        small: ModelRunner,
        most_tokens: int = SMALL_BATCH_TOKENS,
        *,
        most_inputs: int | None = None,
    ):
        self.large = large
        self.small = small
        self.most_tokens = most_tokens
        self.most_inputs = most_inputs

    def runner_for(self, rows: Rows) -> ModelRunner:
        padded = len(rows) * max((len(row) for row in rows), default=0)
        fits = padded <= self.most_tokens and (self.most_inputs is None or len(rows) <= self.most_inputs)
        return self.small if fits else self.large

    def run_texts(self, rows: Rows, type_rows: Rows | None) -> F32:
        return self.runner_for(rows).run_texts(rows, type_rows)

    def run_texts_per_token(
        self, rows: Rows, type_rows: Rows | None, per_token: Sequence[bool], pool_from: Sequence[int] | None = None
    ) -> list[F32]:
        return self.runner_for(rows).run_texts_per_token(rows, type_rows, per_token, pool_from)

    def run_images(self, pixels: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
        return self.large.run_images(pixels)
