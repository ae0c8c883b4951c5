"""`--runtime auto` on a model whose ONNX graph is not cached yet: torch serves at once, the graph follows.

Why: exporting, optimising and packing the graph took 8.5-12 s on the first start of the bundled model on a 2-core
CPU, more than the rest of the start together (9.5 s from launch to ready with the graph cached, 21.3 s when the
engine waited for it). A first start, or every start of a pod whose cache is an emptyDir, paid it before answering
anything. Instead the engine is ready as soon as torch is, and a thread of the engine has the graph exported by a
process of its own at a lower priority (engine_core/export_graph.py: the export's memory and GIL are not the
engine's), holds it to torch float32 on the probe set as a start would, and swaps it in: the next pass runs through
it. A graph that fails or strays leaves torch serving, with the warning a start would give.

The thread itself runs at the engine's priority: the graph's sessions, made on it, start the threads that then run
every pass.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from engine_core.folder_choices import first_line
from engine_core.runner import F32, ModelRunner, Rows

logger = logging.getLogger("poolserve.engine")

# What the log says when the graph has replaced torch, or could not.
TAKES_OVER = "--runtime auto: the ONNX graph takes over from torch"
FAILED = "--runtime auto: torch serves on, the ONNX graph failed: "
# How much lower the export's process runs than the engine it serves beside (engine_core/export_graph.py).
EXPORT_NICENESS = 5


class LaterGraph:
    """`now` (torch) runs every pass until `make` (run once, in a thread of its own, from `start`) gives the runner
    that replaces it; an error leaves `now` (`failure` says why). `switched` is set when it has ended either way."""

    def __init__(self, now: ModelRunner, make: Callable[[], ModelRunner]):
        self.current = now
        self.make = make
        self.switched = threading.Event()
        self.failure = ""
        self.thread = threading.Thread(target=self._switch, name="onnx-export", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _switch(self) -> None:
        try:
            self.current = self.make()
            logger.info("%s", TAKES_OVER)
        except Exception as exc:  # auto chose the graph; a graph it cannot have costs only its speed
            self.failure = first_line(exc)
            logger.warning("%s%s", FAILED, self.failure)
        finally:
            self.make = _made  # the closure holds torch's runner, which the graph may have replaced
            self.switched.set()

    def run_texts(self, rows: Rows, type_rows: Rows | None) -> F32:
        return self.current.run_texts(rows, type_rows)

    def run_texts_per_token(
        self, rows: Rows, type_rows: Rows | None, per_token: Sequence[bool], pool_from: Sequence[int] | None = None
    ) -> list[F32]:
        return self.current.run_texts_per_token(rows, type_rows, per_token, pool_from)

    def run_images(self, pixels: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
        return self.current.run_images(pixels)


def _made() -> ModelRunner:
    raise RuntimeError("the graph was made once")
